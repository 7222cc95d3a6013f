"""The fused MoE of calibrate/kernels/fused_moe.py with block-FP8 experts, as vLLM's
`fused_moe_kernel` runs a `use_fp8_w8a8` checkpoint with `block_shape` [128, 128]
(`vllm/model_executor/layers/fused_moe/fused_moe.py`): the tokens quantised per group of 128
channels before the gate+up GEMM, each K-block's partial product times the token's group scale
and the weight block's scale, accumulated in fp32.

Routing (bf16 router and shared-expert gate, as the checkpoint keeps them), the pair grouping
and the final combine are fused_moe.py's kernels. Two differences from vLLM, both saving a pass
over the intermediate: the intermediate SiLU(gate) * up is quantised in the gate+up GEMM's
epilogue, one scale per row and `block_n` columns (vLLM runs `per_token_group_quant_fp8` on it
with groups of 128: ours are as fine or finer), and the shared expert rides along as expert E.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from calibrate.kernels import fused_moe as FM
from calibrate.kernels.fused_moe import _block_rows, _swizzle
from calibrate.kernels.common import INTERPRET, mma
from calibrate.kernels.fp8_gemm import EPS, FP8, FP8_MAX, GROUP, dequantize_weight_blocks, group_quant, group_quant_ref
from calibrate.kernels.naive import route_ref


@triton.jit(do_not_specialize=["num_pairs", "num_m"])
def _gate_up_fp8_kernel(xq, xs, w13, w13_s, shared13, shared13_s, act, act_s, sorted_pair, block_expert, ids,
                        num_pairs, num_m, H, I, stride_we, stride_se,
                        E: tl.constexpr, NP: tl.constexpr, SORTED: tl.constexpr, GROUP_M: tl.constexpr, G: tl.constexpr,
                        FMAX: tl.constexpr, EPS_: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = _swizzle(tl.program_id(0), num_m, tl.cdiv(I, BLOCK_N), GROUP_M)
    e, pair, m_row, row = _block_rows(pid_m, sorted_pair, block_expert, ids, num_pairs, SORTED, BLOCK_M)
    if e < 0:
        return
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_n = o_n < I
    kg = tl.cdiv(H, G)
    tok = pair // NP
    p_a = xq + tok[:, None].to(tl.int64) * H + o_k[None, :]
    if e == E:
        p_g = shared13 + o_n[None, :] * H + o_k[:, None]
        p_sg = shared13_s + (o_n // G) * kg
    else:
        p_g = w13 + e.to(tl.int64) * stride_we + o_n[None, :] * H + o_k[:, None]
        p_sg = w13_s + e.to(tl.int64) * stride_se + (o_n // G) * kg
    p_u = p_g + I * H
    p_su = p_sg + tl.cdiv(I, G) * kg  # the up rows' scale rows follow the gate rows'
    b_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    b_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        m_k = o_k < H - k0
        b_a = tl.load(p_a, mask=m_row[:, None] & m_k[None, :], other=0.0)
        s_a = tl.load(xs + tok * kg + k0 // G, mask=m_row, other=0.0)[:, None]
        zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        b_g += mma(b_a, tl.load(p_g, mask=m_k[:, None] & m_n[None, :], other=0.0), zero, INTERPRET) \
            * s_a * tl.load(p_sg + k0 // G, mask=m_n, other=0.0)[None, :]
        b_u += mma(b_a, tl.load(p_u, mask=m_k[:, None] & m_n[None, :], other=0.0), zero, INTERPRET) \
            * s_a * tl.load(p_su + k0 // G, mask=m_n, other=0.0)[None, :]
        p_a += BLOCK_K
        p_g += BLOCK_K
        p_u += BLOCK_K
    b_h = b_g * tl.sigmoid(b_g) * b_u
    # One scale per row and BLOCK_N columns: the down GEMM's K-blocks are this tile's columns.
    b_s = tl.maximum(tl.max(tl.abs(b_h), 1), EPS_) / FMAX
    b_q = tl.clamp(b_h / b_s[:, None], -FMAX, FMAX)
    tl.store(act + row[:, None].to(tl.int64) * I + o_n[None, :], b_q.to(act.dtype.element_ty),
             mask=m_row[:, None] & m_n[None, :])
    tl.store(act_s + row * tl.cdiv(I, BLOCK_N) + pid_n, b_s, mask=m_row)


@triton.jit(do_not_specialize=["num_pairs", "num_m"])
def _down_fp8_kernel(act, act_s, w2, w2_s, shared2, shared2_s, y, weights, sorted_pair, block_expert, ids,
                     num_pairs, num_m, H, I, stride_we, stride_se, stride_y,
                     E: tl.constexpr, SORTED: tl.constexpr, GROUP_M: tl.constexpr, G: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = _swizzle(tl.program_id(0), num_m, tl.cdiv(H, BLOCK_N), GROUP_M)
    e, pair, m_row, row = _block_rows(pid_m, sorted_pair, block_expert, ids, num_pairs, SORTED, BLOCK_M)
    if e < 0:
        return
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_n = o_n < H
    kg = tl.cdiv(I, G)
    p_a = act + row[:, None].to(tl.int64) * I + o_k[None, :]
    if e == E:
        p_b = shared2 + o_n[None, :] * I + o_k[:, None]
        p_sb = shared2_s + (o_n // G) * kg
    else:
        p_b = w2 + e.to(tl.int64) * stride_we + o_n[None, :] * I + o_k[:, None]
        p_sb = w2_s + e.to(tl.int64) * stride_se + (o_n // G) * kg
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        m_k = o_k < I - k0
        b_a = tl.load(p_a, mask=m_row[:, None] & m_k[None, :], other=0.0)
        s_a = tl.load(act_s + row * tl.cdiv(I, BLOCK_K) + k0 // BLOCK_K, mask=m_row, other=0.0)
        s_b = tl.load(p_sb + k0 // G, mask=m_n, other=0.0)
        acc += mma(b_a, tl.load(p_b, mask=m_k[:, None] & m_n[None, :], other=0.0),
                   tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), INTERPRET) * s_a[:, None] * s_b[None, :]
        p_a += BLOCK_K
        p_b += BLOCK_K
    acc *= tl.load(weights + pair, mask=m_row, other=0.0)[:, None]
    tl.store(y + pair[:, None] * stride_y + o_n[None, :], acc.to(y.dtype.element_ty),
             mask=m_row[:, None] & m_n[None, :])


def default_config(tokens: int) -> FM.MoEConfig:
    """fused_moe's block sizes, with K-blocks of at most one scale group (128)."""
    cfg = FM.default_config(tokens)
    return FM.MoEConfig(**{**cfg.__dict__, "block_k": min(cfg.block_k, GROUP), "block_n": min(cfg.block_n, GROUP),
                           "down_block_n": min(cfg.down_block_n or cfg.block_n, GROUP)})


def fused_moe_fp8(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w13_s: torch.Tensor,
                  w2: torch.Tensor, w2_s: torch.Tensor, top_k: int,
                  shared_w13: torch.Tensor, shared_w13_s: torch.Tensor, shared_w2: torch.Tensor,
                  shared_w2_s: torch.Tensor, shared_gate_w: torch.Tensor,
                  config: FM.MoEConfig | None = None) -> torch.Tensor:
    """x [T, hidden] bf16; router_w [E, hidden] and shared_gate_w [1, hidden] bf16; w13 [E, 2I, hidden]
    and w2 [E, hidden, I] fp8 with float32 block scales w13_s [E, 2I/128, hidden/128], w2_s
    [E, hidden/128, I/128]; the shared expert's likewise, width I. Returns [T, hidden] bf16."""
    T, H = x.shape
    E, I = w13.shape[0], w13.shape[1] // 2
    cfg = config or default_config(T)
    if GROUP % cfg.block_k or GROUP % cfg.block_n or I % cfg.block_n or H % GROUP or I % GROUP:
        raise ValueError(f"fused_moe_fp8: block_k {cfg.block_k} and block_n {cfg.block_n} must divide {GROUP}, "
                         f"and hidden {H}, width {I} be multiples of {GROUP} and block_n")
    if w13.dtype != FP8 or w2.dtype != FP8 or w13_s.shape != (E, 2 * I // GROUP, H // GROUP) \
            or w2_s.shape != (E, H // GROUP, I // GROUP):
        raise ValueError("fused_moe_fp8: w13, w2 must be float8_e4m3fn with [E, N/128, K/128] float32 scales")
    if T == 0:
        return torch.empty_like(x)
    NP, NE = top_k + 1, E + 1
    num_pairs = T * NP
    dev = x.device
    logits = torch.empty(T, NE, dtype=torch.float32, device=dev)
    block_te = 16 if T <= 64 else 64
    FM._logits_kernel[(triton.cdiv(T, block_te), triton.cdiv(NE, block_te))](
        x, router_w, shared_gate_w, logits, T, H, x.stride(0), logits.stride(0),
        E=E, HAS_GATE=True, BLOCK_T=block_te, BLOCK_E=block_te, BLOCK_H=128)
    ids = torch.empty(T, NP, dtype=torch.int32, device=dev)
    weights = torch.empty(T, NP, dtype=torch.float32, device=dev)
    bins = triton.next_power_of_2(NE + 1)
    counts = torch.zeros(bins, dtype=torch.int32, device=dev) if cfg.sorted else ids
    FM._topk_kernel[(T,)](
        logits, ids, weights, counts, T, logits.stride(0), E=E, TOP_K=top_k, HAS_SHARED=True,
        COUNT=cfg.sorted, BLOCK_T=1, BLOCK_E=triton.next_power_of_2(E),
        BLOCK_P=triton.next_power_of_2(NP), num_warps=1)
    if cfg.sorted:
        num_m = triton.cdiv(num_pairs, cfg.block_m) + NE
        sorted_pair = torch.full((num_m * cfg.block_m,), num_pairs, dtype=torch.int32, device=dev)
        block_expert = torch.empty(num_m, dtype=torch.int32, device=dev)
        cursor = torch.empty(NE, dtype=torch.int32, device=dev)
        FM._align_kernel[(1,)](counts, cursor, block_expert, num_m, NE=NE, BLOCK_M=cfg.block_m, BINS=bins,
                               BLOCK_J=max(16, min(64, 16384 // bins)))
        FM._scatter_kernel[(triton.cdiv(num_pairs, 1024),)](ids, cursor, sorted_pair, num_pairs, BLOCK=1024)
        act_rows = num_m * cfg.block_m
    else:
        num_m = num_pairs
        sorted_pair = block_expert = ids
        act_rows = num_pairs
    xq, xs = group_quant(x)
    act = torch.empty(act_rows, I, dtype=FP8, device=dev)
    act_s = torch.empty(act_rows, I // cfg.block_n, dtype=torch.float32, device=dev)
    _gate_up_fp8_kernel[(num_m * triton.cdiv(I, cfg.block_n),)](
        xq, xs, w13, w13_s, shared_w13, shared_w13_s, act, act_s, sorted_pair, block_expert, ids,
        num_pairs, num_m, H, I, w13.stride(0), w13_s.stride(0),
        E=E, NP=NP, SORTED=cfg.sorted, GROUP_M=cfg.group_m, G=GROUP, FMAX=FP8_MAX, EPS_=EPS,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    y = torch.empty(num_pairs, H, dtype=x.dtype, device=dev)
    dn = cfg.down_block_n or cfg.block_n
    # The down GEMM's K-blocks are the intermediate's scale groups: block_k = the gate+up block_n.
    _down_fp8_kernel[(num_m * triton.cdiv(H, dn),)](
        act, act_s, w2, w2_s, shared_w2, shared_w2_s, y, weights, sorted_pair, block_expert, ids,
        num_pairs, num_m, H, I, w2.stride(0), w2_s.stride(0), y.stride(0),
        E=E, SORTED=cfg.sorted, GROUP_M=cfg.group_m, G=GROUP,
        BLOCK_M=cfg.block_m, BLOCK_N=dn, BLOCK_K=cfg.block_n,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    out = torch.empty_like(x)
    FM._combine_kernel[(T, triton.cdiv(H, 1024))](y, x, out, T, H, NP=NP, HAS_RES=False, BLOCK_H=1024)
    return out


def fused_moe_fp8_ref(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w13_s: torch.Tensor,
                      w2: torch.Tensor, w2_s: torch.Tensor, top_k: int,
                      shared_w13: torch.Tensor, shared_w13_s: torch.Tensor, shared_w2: torch.Tensor,
                      shared_w2_s: torch.Tensor, shared_gate_w: torch.Tensor,
                      config: FM.MoEConfig | None = None) -> torch.Tensor:
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
    gate = torch.sigmoid(x.to(torch.float64) @ shared_gate_w.to(torch.float64).T)
    out += gate * expert(x64, shared_w13, shared_w13_s, shared_w2, shared_w2_s)
    return out.to(x.dtype)
