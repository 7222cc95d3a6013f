"""The fused MoE of calibrate/kernels/fused_moe.py with block-FP8 experts, as vLLM's
`fused_moe_kernel` runs a `use_fp8_w8a8` checkpoint with `block_shape` [128, 128]
(`vllm/model_executor/layers/fused_moe/fused_moe.py`; on Hopper with tensor parallelism vLLM
picks this Triton path first, docs/vllm_kernels.md): the tokens quantised per group of 128
channels before the gate+up GEMM, each K-block's partial product times the token's group scale
and the weight block's scale, accumulated in fp32. The GEMMs are fused_moe.py's kernels with
their FP8 switch on; routing (bf16 router and shared-expert gate, as the checkpoint keeps them),
the pair grouping and the final combine are fused_moe.py's too.

Two differences from vLLM, both saving a pass over the intermediate: SiLU(gate) * up is
quantised in the gate+up GEMM's epilogue, one scale per row and `block_n` columns (vLLM runs
`per_token_group_quant_fp8` on it with groups of 128: ours are as fine or finer), and the shared
expert, when given, rides along as expert E (vLLM runs it as a dense block-FP8 MLP: the calibrator's
MoE layer does too, passing none here).
"""
from __future__ import annotations

import torch
import triton

from calibrate.kernels import fused_moe as FM
from calibrate.kernels.fp8_gemm import EPS, FP8, FP8_MAX, GROUP, dequantize_weight_blocks, group_quant, group_quant_ref
from calibrate.kernels.naive import route_ref


def default_config(tokens: int) -> FM.MoEConfig:
    """vLLM's default for block-FP8 experts where it ships no tuned table (`get_default_config`,
    `dtype == "fp8_w8a8" and block_shape is not None`; vLLM 0.17.1 has none for E=256, N=512 on
    the H200): BLOCK_SIZE_M 16 up to 64 tokens, else 64; BLOCK_SIZE_N and BLOCK_SIZE_K the scale
    block (128); GROUP_SIZE_M 1 up to 16 tokens, else 32; 4 warps, 3 stages. vLLM's N tile of 128
    columns of [gate | up] is 64 gate and 64 up columns in ours (two tiles of block_n); the down
    GEMM's N tile is vLLM's 128. Up to 16 tokens, fused_moe's one pair per M-block (unsorted)."""
    return FM.MoEConfig(sorted=tokens > 16, block_m=16 if tokens <= 64 else 64, block_n=GROUP // 2, block_k=GROUP,
                        num_warps=4, num_stages=3, group_m=1 if tokens <= 16 else 32, down_block_n=GROUP)


def fused_moe_fp8(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w13_s: torch.Tensor,
                  w2: torch.Tensor, w2_s: torch.Tensor, top_k: int,
                  shared_w13: torch.Tensor | None, shared_w13_s: torch.Tensor | None, shared_w2: torch.Tensor | None,
                  shared_w2_s: torch.Tensor | None, shared_gate_w: torch.Tensor | None,
                  config: FM.MoEConfig | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, hidden] bf16; router_w [E, hidden] and shared_gate_w [1, hidden] bf16; w13 [E, 2I, hidden]
    and w2 [E, hidden, I] fp8 with float32 block scales w13_s [E, 2I/128, hidden/128], w2_s
    [E, hidden/128, I/128]; the shared expert's likewise, width I, or all None. Returns [T, hidden]
    bf16, plus `residual` [T, hidden] when given (added in the final reduction)."""
    T, H = x.shape
    E, I = w13.shape[0], w13.shape[1] // 2
    cfg = config or default_config(T)
    if GROUP % cfg.block_k or GROUP % cfg.block_n or I % cfg.block_n or H % GROUP or I % GROUP:
        raise ValueError(f"fused_moe_fp8: block_k {cfg.block_k} and block_n {cfg.block_n} must divide {GROUP}, "
                         f"and hidden {H}, width {I} be multiples of {GROUP} and block_n")
    if w13.dtype != FP8 or w2.dtype != FP8 or w13_s.shape != (E, 2 * I // GROUP, H // GROUP) \
            or w2_s.shape != (E, H // GROUP, I // GROUP):
        raise ValueError("fused_moe_fp8: w13, w2 must be float8_e4m3fn with [E, N/128, K/128] float32 scales")
    shared = (shared_w13, shared_w13_s, shared_w2, shared_w2_s, shared_gate_w)
    if any(t is None for t in shared) and any(t is not None for t in shared):
        raise ValueError("fused_moe_fp8: the shared expert's weights, scales and gate must be all given or all None")
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"fused_moe_fp8: residual {tuple(residual.shape)} must be contiguous and match x {tuple(x.shape)}")
    if T == 0:
        return torch.empty_like(x) if residual is None else residual.clone()
    if shared_w13 is None:  # the kernels' shared-expert pointers are never followed without pairs of expert E
        shared_w13, shared_w13_s, shared_w2, shared_w2_s = w13, w13_s, w2, w2_s
    dev = x.device
    r = FM.route(x, router_w, shared_gate_w, top_k, E, cfg)
    xq, xs = group_quant(x)
    act = torch.empty(r.act_rows, I, dtype=FP8, device=dev)
    act_s = torch.empty(r.act_rows, I // cfg.block_n, dtype=torch.float32, device=dev)
    FM._gate_up_kernel[(r.num_m * triton.cdiv(I, cfg.block_n),)](
        xq, w13, shared_w13, act, r.sorted_pair, r.block_expert, r.ids, r.num_pairs, r.num_m, H, I,
        xq.stride(0), w13.stride(0), act.stride(0),
        E=E, NP=r.pairs_per_token, SORTED=cfg.sorted, GROUP_M=cfg.group_m,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        x_s=xs, w13_s=w13_s, shared13_s=shared_w13_s, act_s=act_s, stride_se=w13_s.stride(0),
        FP8=True, G=GROUP, FMAX=FP8_MAX, EPS_=EPS, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    y = torch.empty(r.num_pairs, H, dtype=x.dtype, device=dev)
    dn = cfg.down_block_n or cfg.block_n
    # The down GEMM's K-blocks are the intermediate's scale groups: block_k = the gate+up block_n.
    FM._down_kernel[(r.num_m * triton.cdiv(H, dn),)](
        act, w2, shared_w2, y, r.weights, r.sorted_pair, r.block_expert, r.ids, r.num_pairs, r.num_m, H, I,
        act.stride(0), w2.stride(0), y.stride(0),
        E=E, SORTED=cfg.sorted, GROUP_M=cfg.group_m, BLOCK_M=cfg.block_m, BLOCK_N=dn, BLOCK_K=cfg.block_n,
        act_s=act_s, w2_s=w2_s, shared2_s=shared_w2_s, stride_se=w2_s.stride(0), FP8=True, G=GROUP,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    out = torch.empty_like(x)
    FM._combine_kernel[(T, triton.cdiv(H, 1024))](y, x if residual is None else residual, out, T, H,
                                                   NP=r.pairs_per_token, HAS_RES=residual is not None, BLOCK_H=1024)
    return out


def fused_moe_fp8_ref(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w13_s: torch.Tensor,
                      w2: torch.Tensor, w2_s: torch.Tensor, top_k: int,
                      shared_w13: torch.Tensor | None, shared_w13_s: torch.Tensor | None,
                      shared_w2: torch.Tensor | None, shared_w2_s: torch.Tensor | None,
                      shared_gate_w: torch.Tensor | None, config: FM.MoEConfig | None = None,
                      residual: torch.Tensor | None = None) -> torch.Tensor:
    """float64 of the dequantised weights, the tokens quantised as the kernel does (groups of 128)
    and the intermediate quantised per row and `block_n` columns of the config the kernel would use."""
    T, H = x.shape
    cfg = config or default_config(T)
    xq, xs = group_quant_ref(x)
    x64 = xq.to(torch.float64) * xs.to(torch.float64).repeat_interleave(GROUP, 1)

    def expert(rows: torch.Tensor, w13e, w13e_s, w2e, w2e_s) -> torch.Tensor:
        gate, up = (rows @ dequantize_weight_blocks(w13e, w13e_s).T).chunk(2, -1)
        h = torch.nn.functional.silu(gate) * up
        hq, hs = group_quant_ref(h, cfg.block_n)
        h = hq.to(torch.float64) * hs.to(torch.float64).repeat_interleave(cfg.block_n, 1)
        return h @ dequantize_weight_blocks(w2e, w2e_s).T

    topw, topi = route_ref(x, router_w, top_k)
    out = torch.zeros(T, H, dtype=torch.float64, device=x.device)
    for e in topi.unique().tolist():
        tok, slot = (topi == e).nonzero(as_tuple=True)
        out.index_add_(0, tok, topw[tok, slot, None] * expert(x64[tok], w13[e], w13_s[e], w2[e], w2_s[e]))
    if shared_gate_w is not None:
        gate = torch.sigmoid(x.to(torch.float64) @ shared_gate_w.to(torch.float64).T)
        out += gate * expert(x64, shared_w13, shared_w13_s, shared_w2, shared_w2_s)
    if residual is not None:
        out += residual.to(torch.float64)
    return out.to(x.dtype)
