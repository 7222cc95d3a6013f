"""fla's kernels timed beside ours (the wheel is carried to the GPU; its absence is reported, not fatal).

`fla_reference`: fla's recurrence over chains (final state only) against reconstruct's.
`none_rows`: the no-speculation baseline, one token a step, priced as vLLM runs it
(docs/vllm_gdn_decode.md). Where vLLM 0.17.1's Python files are carried, its own decode call:
`fused_recurrent_gated_delta_rule` as `Qwen3NextGatedDeltaNet._forward_core` makes it for a
decode-only batch (one token per request through `cu_seqlens`, each request's state by its
index in the pool, updated in place, q/k norms in the kernel; vLLM's launch: 32 state rows,
one warp), after the gates `fused_gdn_gating` computes (here by the same formula in torch,
outside the timing). Without them, fla's kernel in the shape of vLLM's later fused-gating kernel
(32 rows, 4 warps). fla's own shape (8 rows, 1 warp) goes to the provenance either way.
"""
from __future__ import annotations

import math
import time

import torch
import triton

from policies.kernels import reconstruct
from policies.kernels.bench_cases import (BATCHES, COLD_BYTES, MAX_COPIES, Case, DEVICE, MODELS, REHEARSAL,
                                          policy_bytes, sizes)
from policies.kernels.bench_policy import make_copy
from policies.kernels.bench_timing import recover, sync, time_eager, time_graph
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
            o_ours, ctx = reconstruct.verify(**{**xs[0], "state": xs[0]["state"].clone()}, check=False, chain=True)
            s_ours = reconstruct.commit(ctx, torch.full((B,), T - 1, dtype=torch.int32, device=DEVICE), check=False)
            res["rows"].append(dict(model=model, B=B, T=T, us=round(us, 2), bytes=nbytes,
                                    pct_of_copy_bw=round(100 * nbytes / (us * 1e-6) / copy_bw, 1),
                                    rel_err_o_vs_reconstruct=rel_err(o_ours.float(), o_fla.float()),
                                    rel_err_state_vs_reconstruct=rel_err(s_ours, s_fla)))
            del xs, calls
    return res


# Launch shapes of the one-token decode (state rows per program, warps): vLLM's
# fused_sigmoid_gating_delta_rule_update and fla's fused_recurrent_gated_delta_rule_fwd.
DECODE_SHAPES = {"vllm": (32, 4), "fla": (8, 1)}


def decode_inplace(kernel, x: dict, a_log: torch.Tensor, dt_bias: torch.Tensor, o: torch.Tensor, bv: int,
                   warps: int) -> torch.Tensor:
    """One decode step on x["state"] in place: x["g"] and x["beta"] are the raw gate inputs (a, b)."""
    B, T, H, K = x["k"].shape
    HV, V = x["v"].shape[2:]
    state = x["state"]
    kernel[(triton.cdiv(V, bv) * B * HV,)](
        q=x["q"], k=x["k"], v=x["v"], g=x["g"], gk=None, gv=None, beta=x["beta"], A_log=a_log, dt_bias=dt_bias,
        o=o, h0=state, ht=state, cu_seqlens=None, scale=K ** -0.5, T=T, H=H, HV=HV, K=K, V=V, BK=K, BV=bv,
        IS_BETA_HEADWISE=True, USE_QK_L2NORM_IN_KERNEL=True, APPLY_BETA_SIGMOID=True, ALLOW_NEG_EIGVAL=False,
        STATE_V_FIRST=True, num_warps=warps, num_stages=3)
    return o


def decode_reference(x: dict, a_log: torch.Tensor, dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same step in float64 (vLLM's gating: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b))."""
    f = {n: x[n].double() for n in ("q", "k", "v", "g", "beta", "state")}
    q = f["q"][:, 0] / (f["q"][:, 0].pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    k = f["k"][:, 0] / (f["k"][:, 0].pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    hv, hk = f["v"].shape[2], k.shape[1]
    q, k = q.repeat_interleave(hv // hk, 1), k.repeat_interleave(hv // hk, 1)
    decay = torch.exp(-a_log.double().exp() * torch.nn.functional.softplus(f["g"][:, 0] + dt_bias.double()))
    beta = torch.sigmoid(f["beta"][:, 0])
    s = decay[..., None, None] * f["state"]                                   # [B, HV, V, K]
    u = beta[..., None] * (f["v"][:, 0] - torch.einsum("bhvk,bhk->bhv", s, k))
    s = s + u[..., :, None] * k[..., None, :]
    return torch.einsum("bhvk,bhk->bhv", s, q) * q.shape[-1] ** -0.5, s


def load_vllm_decode():
    """vLLM 0.17.1's `fused_recurrent_gated_delta_rule` (carried as Python files), or None."""
    import sys
    import types
    try:
        if "vllm.platforms" not in sys.modules:
            # Resolving vLLM's platform loads its compiled extension, which does not travel; the kernel's
            # module asks it only whether the device is CUDA-like, which vLLM's CudaPlatform answers yes.
            stub = types.ModuleType("vllm.platforms")
            stub.current_platform = types.SimpleNamespace(is_cuda_alike=torch.cuda.is_available)
            sys.modules["vllm.platforms"] = stub
        from vllm.model_executor.layers.fla.ops.fused_recurrent import fused_recurrent_gated_delta_rule
    except Exception:  # not carried: fla's kernel stands in
        return None
    return fused_recurrent_gated_delta_rule


def none_rows(cs: list[Case], copy_bw: float, modes: tuple[str, ...], deadline: float, budget_note: str
              ) -> tuple[list[dict], dict]:
    """Rows of kernels.csv for policy `none` (verify = the decode step, commit 0) at each case, and
    what the provenance records (the kernel timed, the exactness check, fla's own launch shape)."""
    try:
        from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel as kernel
        import fla
    except Exception as exc:  # an outside package: its absence is reported, not fatal
        return [], {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    vllm_decode = load_vllm_decode()
    info: dict = {"available": True, "version": fla.__version__,
                  "kernel": ("vllm 0.17.1 model_executor/layers/fla/ops/fused_recurrent.py "
                             "fused_recurrent_gated_delta_rule (32 state rows, 1 warp)") if vllm_decode else
                  "fla fused_recurrent_gated_delta_rule_fwd_kernel (32 state rows, 4 warps)",
                  "launch": {k: {"state_rows": bv, "warps": w} for k, (bv, w) in DECODE_SHAPES.items()},
                  "checks": [], "fla_shape_us": [], "skipped": []}
    rows = []
    for c in cs:
        if time.time() > deadline:
            info["skipped"].append(f"{c.model} none B={c.B} {c.state_dtype}: not run ({budget_note})")
            continue
        try:
            rows += _none_case(kernel, c, copy_bw, modes, info, vllm_decode)
        except Exception as exc:  # one failing case is logged; the rest still run
            print(f"FAILED none {c}: {type(exc).__name__}: {exc}", flush=True)
            info["skipped"].append(f"{c.model} none B={c.B} {c.state_dtype}: {type(exc).__name__}: {exc}")
            recover()
    return rows, info


def vllm_decode_call(fn, x: dict, a_log: torch.Tensor, dt_bias: torch.Tensor, idx: torch.Tensor,
                     cu: torch.Tensor) -> torch.Tensor:
    """vLLM 0.17.1's decode-only GDN call on x["state"] (the pool, request b's state at idx[b]) in place;
    x["g"], x["beta"] are the raw gate inputs (a, b), gated as `fused_gdn_gating` does."""
    B = x["k"].shape[0]
    g = -a_log.float().exp() * torch.nn.functional.softplus(x["g"][:, 0].float() + dt_bias.float())
    beta = torch.sigmoid(x["beta"][:, 0].float())
    return vllm_decode_gated(fn, x, g, beta, idx, cu, B)


def vllm_decode_gated(fn, x: dict, g: torch.Tensor, beta: torch.Tensor, idx: torch.Tensor, cu: torch.Tensor,
                      B: int) -> torch.Tensor:
    o, _ = fn(q=x["q"].view(1, B, *x["q"].shape[2:]), k=x["k"].view(1, B, *x["k"].shape[2:]),
              v=x["v"].view(1, B, *x["v"].shape[2:]), g=g.view(1, B, -1), beta=beta.view(1, B, -1),
              initial_state=x["state"], inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=idx,
              use_qk_l2norm_in_kernel=True)
    return o


def _none_case(kernel, c: Case, copy_bw: float, modes: tuple[str, ...], info: dict, vllm_decode=None) -> list[dict]:
    vb, cb = policy_bytes(c, "none", 0, True)
    copies = min(MAX_COPIES, max(2, math.ceil(COLD_BYTES / vb)))
    xs = [make_copy(c, seed) for seed in range(copies)]
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    a_log = torch.rand(c.hv, device=DEVICE, generator=gen) - 0.5
    dt_bias = torch.rand(c.hv, device=DEVICE, generator=gen) - 0.5
    os_ = [torch.empty_like(x["v"]) for x in xs]
    bv, warps = DECODE_SHAPES["vllm"]
    x0 = {**xs[0], "state": xs[0]["state"].clone()}
    o_ref, s_ref = decode_reference(x0, a_log, dt_bias)
    idx = torch.arange(c.B, device=DEVICE, dtype=torch.int32)
    cu = torch.arange(c.B + 1, device=DEVICE, dtype=torch.int32)
    if vllm_decode is not None:
        o0 = vllm_decode_call(vllm_decode, x0, a_log, dt_bias, idx, cu)[0]
    else:
        o0 = decode_inplace(kernel, x0, a_log, dt_bias, os_[0], bv, warps)[:, 0]
    sync()
    info["checks"].append(dict(model=c.model, B=c.B, state_dtype=c.state_dtype,
                               rel_err_state=rel_err(x0["state"].float(), s_ref), rel_err_o=rel_err(o0.float(), o_ref)))
    rows = []
    calls = {shape: [lambda i=i, s=s: decode_inplace(kernel, xs[i], a_log, dt_bias, os_[i], *s)
                     for i in range(copies)] for shape, s in DECODE_SHAPES.items()}
    if vllm_decode is not None:
        gates = [(-a_log.exp() * torch.nn.functional.softplus(x["g"][:, 0] + dt_bias), torch.sigmoid(x["beta"][:, 0]))
                 for x in xs]
        calls["timed"] = [lambda i=i: vllm_decode_gated(vllm_decode, xs[i], *gates[i], idx, cu, c.B)
                          for i in range(copies)]
    else:
        calls["timed"] = calls["vllm"]
    for mode in modes:
        us = time_graph(calls["timed"]) if mode == "graph" else time_eager(lambda i: calls["timed"][i](), copies)
        rows.append(dict(model=c.model, policy="none", B=c.B, T=1, tree="", depth=0, replayed_tokens=0, flush=1,
                         mode=mode, verify_us=round(us, 2), commit_us=0.0, total_us=round(us, 2), verify_bytes=vb,
                         commit_bytes=cb, bytes=vb + cb, gbs=round((vb + cb) / us / 1e3, 1),
                         pct_of_copy_bw=round(100 * (vb + cb) / (us * 1e-6) / copy_bw, 1), extra_mem_bytes=0,
                         copies=copies, state_dtype=c.state_dtype))
    info["fla_shape_us"].append(dict(model=c.model, B=c.B, state_dtype=c.state_dtype,
                                     graph_us=round(time_graph(calls["fla"]), 2),
                                     fused_gating_shape_graph_us=round(time_graph(calls["vllm"]), 2)))
    del xs, calls, os_
    recover()
    return rows
