"""fla's kernels timed beside ours (the wheel is carried to the GPU; its absence is reported, not fatal)."""
from __future__ import annotations

import math

import torch

from policies.kernels import reconstruct
from policies.kernels.bench_cases import BATCHES, COLD_BYTES, Case, DEVICE, MODELS, REHEARSAL, sizes
from policies.kernels.bench_policy import make_copy
from policies.kernels.bench_timing import time_graph
from policies.kernels.inputs import chain, rel_err


def fla_reference(copy_bw: float, quick: bool = False) -> dict:
    """fla's fused_recurrent_gated_delta_rule on chains (final state only), if the wheel is there."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as exc:  # an outside reference: its absence is reported, not fatal
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    import fla
    res = {"available": True, "version": fla.__version__, "rows": []}
    model = "qwen3.5-35b-a3b"
    hk, hv = MODELS[model]
    for B in ((1, 128) if quick else BATCHES):
        if REHEARSAL and B > 2:
            B = 2
        for T in (4, 16):
            c = Case(model, hk, hv, B, "chain", tuple(chain(T)))
            s = sizes(c)
            nbytes = 2 * s["S"] + s["inp"] + s["o"]
            copies = max(2, math.ceil(COLD_BYTES / nbytes))
            xs = [make_copy(c, i) for i in range(copies)]
            calls = [lambda x=x: fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"],
                                                                  scale=1.0, initial_state=x["state"],
                                                                  output_final_state=True, state_v_first=True)
                     for x in xs]
            us = time_graph(calls)
            o_fla, s_fla = calls[0]()
            o_ours, ctx = reconstruct.verify(**{**xs[0], "state": xs[0]["state"].clone()}, check=False)
            s_ours = reconstruct.commit(ctx, torch.full((B,), T - 1, dtype=torch.int32, device=DEVICE), check=False)
            res["rows"].append(dict(model=model, B=B, T=T, us=round(us, 2), bytes=nbytes,
                                    pct_of_copy_bw=round(100 * nbytes / (us * 1e-6) / copy_bw, 1),
                                    rel_err_o_vs_reconstruct=rel_err(o_ours.float(), o_fla.float()),
                                    rel_err_state_vs_reconstruct=rel_err(s_ours, s_fla)))
            del xs, calls
    return res
