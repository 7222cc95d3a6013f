"""The replay's correctness check, and the synthetic steps of every kind that it and `--smoke` run.

Before timing, a mixed and a uniform-decode batch run eagerly, piecewise and as a full graph
from the same GDN state (activations poisoned with NaN first): the outputs must agree within
CHECK_TOLERANCE (replay_check.json).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from calibrate.executor.step_layout import query_tokens

CHECK_TOLERANCE = 2e-2  # relative L2 between modes: bf16 rounding differs with the padded GEMM shapes


def synthetic_steps(positions: int, depth: int, sizes: Sequence[int]) -> list[tuple[str, list]]:
    """Steps of every kind for --smoke and the correctness check (TracedRequest rows)."""
    from sim.engine.step_trace import TracedRequest as R

    tree = (1,) * depth if depth else ()
    acc = min(3, positions)

    def dec(rid: int, ctx: int) -> R:
        return R(rid, 0, ctx, tree, acc)
    top = sizes[-1] if sizes else 64
    return [
        ("uniform_decode", [dec(i, 300 + 37 * i) for i in range(3)]),
        ("uniform_decode", [dec(i, 1000 + 11 * i) for i in range(32)]),
        ("uniform_decode", [dec(i, 2000 + 5 * i) for i in range(max(1, top // max(1, positions)))]),
        ("mixed_graph", [dec(i, 500 + i) for i in range(3)] + [R(10, 37, 0, (), 0)]),
        ("mixed_graph", [dec(i, 800 + i) for i in range(16)] + [R(20, 100, 600, (), 0), R(21, 64, 0, (), 0)]),
        ("mixed_eager", [dec(i, 900 + i) for i in range(32)] + [R(30, 2048, 1024, (), 0)]),
        ("prefill_only", [R(40, 200, 0, (), 0)]),
        ("prefill_only", [R(41, 4096, 0, (), 0), R(42, 1000, 3000, (), 0)]),
    ]


def check_modes(ex: object, log: Callable[[str], None]) -> list[dict]:
    """Eager vs piecewise vs full graph on the same batches from the same state: outputs must agree."""
    import torch

    results = []
    cases = synthetic_steps(ex.positions, ex.depth, ex.sizes)
    for kind, reqs in (cases[0], cases[3]):
        saved = ex.snapshot(len(reqs) + 1)
        ref = None
        for mode in ("eager", "vllm"):
            ex.run(reqs, mode=mode)  # captures its graphs: their warm-up commits, so restore after
            n = sum(query_tokens(r) for r in reqs)
            ex.restore(saved)
            ex.poison(n)
            out = ex.run(reqs, mode=mode)
            x = ex.x[:n].float().clone()
            row = {"kind": kind, "mode": mode, "executed": out.mode, "finite": bool(torch.isfinite(x).all())}
            if ref is None:
                ref = (x, out.tokens)
            else:
                row["rel_err"] = float((x - ref[0]).norm() / ref[0].norm().clamp_min(1e-30))
                row["tokens_equal"] = round(sum(a == b for a, b in zip(out.tokens, ref[1])) / len(ref[1]), 3)
            row["ok"] = row["finite"] and row.get("rel_err", 0.0) <= CHECK_TOLERANCE
            results.append(row)
            log(f"  check {kind} {mode} ({out.mode}): finite {row['finite']}, rel err {row.get('rel_err', 0):.2e}, "
                f"tokens equal {row.get('tokens_equal', 1.0):.3f}{'' if row['ok'] else '  FAILED'}")
        ex.restore(saved)
    return results


def synthetic_traced(reqs: list, i: int) -> object:
    from sim.engine.step_trace import TracedStep

    return TracedStep(i, 0.0, "", tuple(reqs), math.nan, {})  # kind: as the executor dispatches it
