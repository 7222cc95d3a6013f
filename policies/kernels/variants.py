"""Candidate kernel tunings for the bench's `--variants` mode, and the exactness check each
must pass (against the float64 recurrence, at the models' head counts) before it is timed."""
from __future__ import annotations

import dataclasses

import torch

from policies.kernels import reconstruct, reconstruct_deferred, reference, treewy
from policies.kernels.inputs import chain, full, random_inputs, rel_err, star
from policies.kernels.treewy import Tuning

# Most informative first: a run cut by its time budget loses the tail. The default ("pp" in the
# first variants run, kernels_variants_2026-12-01-0944.csv): bf16x3 products, k and q packed and
# the prep fused for small trees; the others vary one axis from there.
VARIANTS: dict[str, Tuning] = {
    "default": Tuning(),
    "tf32x3": Tuning(prec="tf32x3", pack=False, prep=False),
    "bf16x3": Tuning(pack=False, prep=False),
    "pp-r0": Tuning(verify_maxnreg=0, commit_maxnreg=0),
    "pp-r96": Tuning(verify_maxnreg=96, commit_maxnreg=96),
    "pp-bv16-w2": Tuning(verify_bv=16, verify_warps=2, commit_bv=16, commit_warps=2),
    "pp-bv16-w4": Tuning(verify_bv=16, commit_bv=16),
    "pp-bv64-w4": Tuning(verify_bv=64, commit_bv=64),
    "pp-pending-loop": Tuning(pending="loop"),
    "run2": Tuning(verify="blocked", rows_max=4, commit="loop", verify_bv=32, commit_stages=1),
    "run5": Tuning(verify_bv=32, commit_stages=1),  # the default of runs 5-7
    "pp-bv32-w8": Tuning(verify_warps=8, commit_warps=8),
    "pp-bv128-w8": Tuning(verify_bv=128, verify_warps=8),
    "pp-commit-loop": Tuning(commit="loop"),
    "pp-stages3": Tuning(verify_stages=3, commit_stages=3),
    "fused-bv64-w8": Tuning(verify_bv=64, verify_warps=8),
    "ieee": Tuning(prec="ieee"),
    # Smaller programs, more of them in flight: the commit waits on its loads (PROFILE.md), and
    # the row verify's cross-thread reductions as fla's fused_recurrent runs them (16-32 rows, 1-2 warps).
    "pp-commit-bv16-w2": Tuning(commit_bv=16, commit_warps=2),
    "pp-commit-loop-bv16-w2": Tuning(commit="loop", commit_bv=16, commit_warps=2),
    "rows4-bv16-w1": Tuning(rows_max=4, verify_bv=16, verify_warps=1),
    "rows4-bv16-w2": Tuning(rows_max=4, verify_bv=16, verify_warps=2),
    # The block loop (trees of more than 8 positions) spills at 128 registers (ncu, results/calibration/h200/ncu/2026-12-01): no
    # cap (2 programs per SM, none spilled), a cap at the 3 programs its shared memory allows, or
    # smaller or wider programs.
    "loop-r0": Tuning(loop_maxnreg=0),
    "loop-r168": Tuning(loop_maxnreg=168),
    "loop-bv32-r168": Tuning(loop_bv=32, loop_maxnreg=168),
    "loop-bv32-r0": Tuning(loop_bv=32, loop_maxnreg=0),
    "loop-w8-r0": Tuning(loop_warps=8, loop_maxnreg=0),
    "loop-w8-r128": Tuning(loop_warps=8, loop_maxnreg=128),
    # The recurrent-form chain verify (`_chain_kernel`) against the fused kernel on chains: off
    # ("fused-chains"), on for every verify up to 8, 4, 16 or 64 positions, and its launch shape
    # (state rows per program, warps: fla's 8 x 1 by default, vLLM's decode kernel's 32 x 4, between).
    "fused-chains": Tuning(chain=False),
    "chain": Tuning(chain_max=8, chain_pending_max=8),
    "chain-bv16-w1": Tuning(chain_max=8, chain_pending_max=8, chain_bv=16, chain_warps=1),
    "chain-bv16-w2": Tuning(chain_max=8, chain_pending_max=8, chain_bv=16, chain_warps=2),
    "chain-bv32-w4": Tuning(chain_max=8, chain_pending_max=8, chain_bv=32, chain_warps=4),
    "chain-max4": Tuning(chain_max=4, chain_pending_max=4),
    "chain-max16": Tuning(chain_max=16, chain_pending_max=16),
    "chain-max64": Tuning(chain_max=64, chain_pending_max=64),
    "pending-chain-max8": Tuning(chain_pending_max=8),
    # The chain walk with every load issued before the first store (`_chain_prefetch_kernel`): for the
    # deferred verify (the default's chains of up to 4 with a pending path), also for reconstruct's
    # plain verify (max4), and its launch shape.
    "chain-prefetch": Tuning(chain_prefetch=True),
    "chain-prefetch-max4": Tuning(chain_prefetch=True, chain_max=4),
    "chain-prefetch-bv16-w1": Tuning(chain_prefetch=True, chain_max=4, chain_bv=16),
    "chain-prefetch-bv4-w1": Tuning(chain_prefetch=True, chain_max=4, chain_bv=4),
    "chain-prefetch-bv32-w4": Tuning(chain_prefetch=True, chain_max=4, chain_bv=32, chain_warps=4),
    # The fused verify skipping the ancestor-mask blocks without ancestors (wide trees' leaves).
    "sparse": Tuning(sparse=True),
    "chain-sparse": Tuning(chain_max=8, chain_pending_max=8, sparse=True),
    "chain-max4-sparse": Tuning(chain_max=4, chain_pending_max=4, sparse=True),
    "chain-max16-sparse": Tuning(chain_max=16, chain_pending_max=16, sparse=True),
}
# (tree name, parents, B) at 35B-A3B shapes: the cases with a target (policies/kernels/README.md).
VARIANT_CASES = (("1,1,1", tuple(full((1, 1, 1))), 128), ("3,3,3", tuple(full((3, 3, 3))), 128),
                 ("chain", tuple(chain(16)), 64), ("chain", tuple(chain(64)), 64))


def fastest(rows: list[dict]) -> tuple[str, dict[str, float]]:
    """The tuning a variants run (variants.csv rows: only tunings that passed their check have rows)
    found fastest: the least verify + commit summed over every case the run timed for each tuning
    (a tuning cut short by the time budget is not eligible); and each eligible tuning's sum."""
    cases: dict[str, set] = {}
    totals: dict[str, float] = {}
    for r in rows:
        cases.setdefault(r["variant"], set()).add((r["policy"], r["tree"], int(r["T"]), int(r["B"])))
        totals[r["variant"]] = totals.get(r["variant"], 0.0) + float(r["total_us"])
    if not totals:
        raise ValueError("no variant was timed")
    every = set().union(*cases.values())
    eligible = {v: round(t, 1) for v, t in totals.items() if cases[v] == every}
    if not eligible:
        raise ValueError("no variant was timed at every case")
    return min(eligible, key=eligible.get), dict(sorted(eligible.items(), key=lambda kv: kv[1]))


def _on(x: dict, device: str) -> dict:
    return {n: t.to(device) if isinstance(t, torch.Tensor) else t for n, t in x.items()}


def check_tuning(tuning: Tuning, hk: int, hv: int, d: int, device: str, exact_outputs: bool = True
                 ) -> dict[str, float]:
    """Largest relative errors of reconstruct (outputs, committed state) and of two
    reconstruct_deferred steps (second step's outputs, flushed state) under `tuning`, over two
    ragged batches: T = 40 ((3,3,3), chains of 16 and 4), T = 4 (chains, a star, a root) and
    T = 8 (chains only: the recurrent-form verify).
    Float32 state, bf16 q and k as served. exact_outputs: v in float32 (bf16 values), so the
    outputs stay float32; else bf16 v and outputs (the bench's kernels: no extra compiles),
    compared with the reference rounded to bf16."""
    errs: dict[str, float] = {}
    for trees, trees2, acc1, acc2 in (
            ([full((3, 3, 3)), chain(16), chain(4)], [chain(4), full((3, 3, 3)), chain(16)], [39, 15, 3], [3, 20, 9]),
            ([chain(4), star(4), [-1]], [star(3), chain(4), chain(2)], [3, 2, 0], [1, 3, 1]),
            ([chain(8), chain(4), [-1]], [chain(5), chain(8), chain(2)], [7, 2, 0], [4, 7, 1])):
        for name, err in _check_steps(tuning, trees, trees2, acc1, acc2, hk, hv, d, device, exact_outputs).items():
            errs[name] = max(errs.get(name, 0.0), err)
    return errs


def _check_steps(tuning: Tuning, trees: list, trees2: list, accepted1: list[int], accepted2: list[int], hk: int,
                 hv: int, d: int, device: str, exact_outputs: bool) -> dict[str, float]:
    T = max(len(t) for t in trees + trees2)
    x1, x2 = (_on(random_inputs(tr, hk=hk, hv=hv, dk=d, dv=d, seed=seed, T=T, dtype=torch.bfloat16), device)
              for tr, seed in ((trees, 70), (trees2, 71)))
    if exact_outputs:
        x1["v"], x2["v"] = x1["v"].float(), x2["v"].float()
    acc1, acc2 = (torch.tensor(a, dtype=torch.int32, device=device) for a in (accepted1, accepted2))
    rows = torch.arange(len(trees), device=device)
    o1_ref, st1 = reference.recurrence(**x1)
    truth1 = st1[rows, acc1.long()]
    o2_ref, st2 = reference.recurrence(**{**x2, "state": truth1})
    old = treewy.TUNING
    treewy.TUNING = tuning
    try:
        o1, ctx = reconstruct.verify(**{**x1, "state": x1["state"].clone()})
        s1 = reconstruct.commit(dataclasses.replace(ctx, state=x1["state"].clone()), acc1)
        ds = reconstruct_deferred.DeferredState.start(x1["state"].clone(), max_path=T, hk=hk, k_dtype=x1["k"].dtype)
        reconstruct_deferred.commit(reconstruct_deferred.verify(**{**x1, "state": ds})[1], acc1)
        o2, ctx2 = reconstruct_deferred.verify(**{**x2, "state": ds})
        reconstruct_deferred.commit(ctx2, acc2)
        s2 = reconstruct_deferred.flush(ds)
    finally:
        treewy.TUNING = old
    return dict(reconstruct_o=rel_err(o1, o1_ref.to(o1.dtype)), reconstruct_state=rel_err(s1, truth1),
                deferred_o=rel_err(o2, o2_ref.to(o2.dtype)), deferred_state=rel_err(s2, st2[rows, acc2.long()]))
