"""Timing the steps of one executor's runs: the runs taking turns, in passes, until the budget ends.

The runs of one executor take turns of INTERLEAVE_STEPS steps (`take_turns`), so a drift of the
host's speed over the replay falls on every run alike; with `--passes N` every picked step is timed
N times, in passes over them all. A host probe is taken right before each step, and each timed
step becomes one row of replay_steps.csv (`_step_row`), rewritten at least every PROGRESS_S.
"""
from __future__ import annotations

import math
import statistics
import time
import traceback
from typing import Callable, Sequence

from calibrate.replay.check import synthetic_steps, synthetic_traced
from calibrate.replay.pick import flushes, spread_order
from calibrate.replay.runs import Run, old_pricer, shape_columns
from calibrate.replay.timing import BudgetSpent, async_steps, check_deadline, time_step, time_step_async

PROGRESS_S = 5.0  # replay_steps.csv and the summary are rewritten at least this often
INTERLEAVE_STEPS = 8  # steps of one run per turn (take_turns)


def run_steps(ex: object, run: Run) -> list[tuple[object, bool]]:
    """(step, flush) to replay for one run: its picked steps in pick()'s order (none left when a
    --resume holds them all), or synthetic steps of every kind for --smoke."""
    if run.smoke:
        synthetic = [(synthetic_traced(reqs, j), False)
                     for j, (_, reqs) in enumerate(synthetic_steps(ex.positions, ex.depth, ex.sizes))]
        return [synthetic[i] for i in spread_order(len(synthetic))]
    return [(s, flushes(s)) for s in run.steps]


def take_turns(counts: dict[str, int], per_turn: int) -> list[tuple[str, int, int]]:
    """(run, first, stop) slices of each run's steps, the runs taking turns of `per_turn` steps:
    the host's speed drifts over a replay (calibrate/replay/README.md), and runs replayed one after the
    other would each get a different part of that drift (the 2,080-step replay of 2026-12-01: store_all's, replayed last)."""
    out, start = [], dict.fromkeys(counts, 0)
    while any(start[n] < c for n, c in counts.items()):
        for name, c in counts.items():
            if start[name] < c:
                out.append((name, start[name], min(c, start[name] + per_turn)))
                start[name] = out[-1][2]
    return out


def replay_group(ex: object, group: Sequence[Run], reps: int, warmup: int, end: float | None, gpu: str,
                 rows: list[dict], errors_: list[str], kernels: dict, log: Callable[[str], None],
                 on_progress: Callable[[], None], probe: Callable[[], float] | None = None, passes: int = 1) -> None:
    """Time the steps of an executor's runs, the runs taking turns (`take_turns`), until `end`,
    appending a row per step to `rows`; `probe` (calibrate.tables.host.HostProbe) is taken right before
    each step, and the executor switches policy when the run's differs. With `passes` > 1 every
    step is timed again in each later pass over them all (its rows numbered by `pass`), so a
    budget cut leaves whole passes first."""
    todo = {run.name: run_steps(ex, run) for run in group}
    by_name = {run.name: run for run in group}
    old = {run.name: old_pricer(run, gpu, log) if todo[run.name] and not run.smoke else None for run in group}
    tr = last_write = time.perf_counter()
    turns = take_turns({n: len(v) for n, v in todo.items()}, INTERLEAVE_STEPS)
    try:
        for p in range(1, passes + 1):
            done = dict.fromkeys(todo, 0)
            for name, first, stop in turns:
                run = by_name[name]
                if run.policy.name not in kernels or ex.policy != run.policy:
                    ex.use_policy(run.policy)
                    if run.policy.name not in kernels:
                        kernels[run.policy.name] = ex.kernel_sources()
                        log(f"[{run.name}] policy {run.policy.name}: kernels {kernels[run.policy.name]}")
                for j in range(first, stop):
                    step, flush = todo[name][j]
                    check_deadline(end)
                    try:
                        host_probe = probe() if probe is not None else math.nan
                        ts, o = time_step(ex, step.requests, flush, reps, warmup, end)
                        async_us = time_step_async(ex, step.requests, flush, async_steps(statistics.median(ts)), end)
                    except BudgetSpent:
                        raise
                    except Exception as e:  # one bad step must not cost the run
                        errors_.append(f"{name} step {step.step}: {type(e).__name__}: {e}")
                        log(f"  step {step.step} FAILED: {traceback.format_exc()}")
                        done[name] = j + 1
                        continue
                    rows.append({**_step_row(ex, run, step, o, ts, async_us, host_probe, old[name]), "pass": p})
                    done[name] = j + 1
                    if j % 25 == 0 or j == len(todo[name]) - 1:
                        r = rows[-1]
                        log(f"  {name} pass {p} {j + 1}/{len(todo[name])} step {step.step} {r['kind']}/{o.mode} "
                            f"{r['tokens']} tok: {r['measured_us']:.0f} us (pred {step.predicted_us:.0f}); "
                            f"{len(ex.graphs) if ex.graphs else 0} graphs, {time.perf_counter() - tr:.0f} s")
                    if time.perf_counter() - last_write > PROGRESS_S:
                        on_progress()  # a replay killed past its limit keeps what it measured
                        last_write = time.perf_counter()
    except BudgetSpent:
        for name, steps in todo.items():
            if done[name] < len(steps):
                errors_.append(f"{name}: pass {p} stopped after {done[name]} of {len(steps)} steps, time budget")
        log(f"  time budget: stopping in pass {p} of {passes} with {sum(done.values())} of "
            f"{sum(map(len, todo.values()))} steps replayed")
    on_progress()


def _step_row(ex: object, run: Run, step: object, o: object, ts: list[float], async_us: float, host_probe: float,
              old: Callable[[object], float] | None) -> dict:
    """replay_steps.csv's row of one timed step."""
    return {"run": run.name, "step": step.step, "kind": step.kind or o.kind, "mode": o.mode,
            **shape_columns(step), "padded_tokens": o.padded_tokens,
            "measured_us": async_us if run.meta.get("engine", {}).get("async_scheduling") else statistics.median(ts),
            "measured_sync_us": statistics.median(ts), "measured_async_us": async_us,
            "measured_sync_min_us": min(ts), "measured_sync_max_us": max(ts),
            "reps": len(ts), "host_probe_us": host_probe, "predicted_us": step.predicted_us,
            "old_predicted_us": old(step) if old else math.nan,
            **{f"pred_{k}": v for k, v in step.terms_us.items()}}
