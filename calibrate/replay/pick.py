"""Which traced steps a replay times, and in which order (pure Python).

`--max-steps` shares a quota per run equally among the step kinds it has (`pick`), so rare
kinds (prefill-only, mixed) are not drowned by decode steps; each kind's steps are spread evenly
over the run (`sample`), and the replay order interleaves the kinds, each in van der Corput order
(`spread_order`), so a replay cut short by its time budget still has every kind, each from the
run's start, middle and end. `--step-kinds` keeps only the kinds named (`chosen_steps`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from calibrate.replay.runs import Run


def sample(n_steps: int, quota: int | None) -> list[int]:
    """Indices of at most `quota` of n_steps, evenly spread over the run (first and last kept)."""
    if quota is None or quota >= n_steps:
        return list(range(n_steps))
    if quota <= 1:
        return [0][:quota]
    return sorted({round(i * (n_steps - 1) / (quota - 1)) for i in range(quota)})


def pick(kinds: Sequence[str], quota: int | None) -> list[int]:
    """Indices of at most `quota` of a run's steps (every step without a quota), in replay order.

    The quota is shared equally among the step kinds present, smallest kind first (a kind with
    fewer steps than its share leaves the rest to the others); each kind's steps are spread evenly
    over the run (`sample`). The order interleaves the kinds in proportion to their counts, each
    in van der Corput order (`spread_order`), so a replay cut short still has every kind, each
    from the run's start, middle and end."""
    by: dict[str, list[int]] = {}
    for i, k in enumerate(kinds):
        by.setdefault(k, []).append(i)
    left = len(kinds) if quota is None else min(quota, len(kinds))
    todo = sorted(by, key=lambda k: (len(by[k]), k))
    keyed: list[tuple[float, int]] = []
    for j, k in enumerate(todo):
        share = min(len(by[k]), left // (len(todo) - j))
        left -= share
        chosen = [by[k][i] for i in sample(len(by[k]), share)]
        keyed += [((r + 0.5) / len(chosen), chosen[i]) for r, i in enumerate(spread_order(len(chosen)))]
    return [i for _, i in sorted(keyed)]


def chosen_steps(run: Run, quota: int | None, done: set[tuple[str, int]],
                 step_kinds: Sequence[str] | None = None) -> list:
    """The run's steps to replay, in replay order: those of `step_kinds` (every kind by default),
    `pick`ed under `quota`, less those already measured (`done`: (run, step) of resumed rows)."""
    steps = [s for s in run.steps if step_kinds is None or s.kind in step_kinds]
    return [steps[i] for i in pick([s.kind for s in steps], quota) if (run.name, steps[i].step) not in done]


def spread_order(n: int) -> list[int]:
    """0..n-1 in van der Corput order: every prefix is spread over the whole run, so a replay
    cut short by its time budget still samples the run's start, middle and end."""
    order: list[int] = []
    seen: set[int] = set()
    k = 0
    while len(order) < n:
        x, f, j = 0.0, 0.5, k
        while j:
            x += f * (j & 1)
            j >>= 1
            f /= 2
        i = int(x * n)
        if i not in seen:
            seen.add(i)
            order.append(i)
        k += 1
    return order


def flushes(step: object) -> bool:
    """The replay kernels flush a whole batch or none: flush when most speculating requests do."""
    spec = [r for r in step.requests if r.prefill == 0 and r.tree]
    return bool(spec) and 2 * sum(r.flush for r in spec) >= len(spec)
