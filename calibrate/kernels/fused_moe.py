"""Fused MoE in Triton: routing, expert grouping and two grouped GEMMs, no host sync.

The shared expert rides along as expert number E (its sigmoid gate as its routing
weight), so every token has NP = top_k + 1 (token, expert) pairs and both grouped
GEMMs serve routed and shared experts in one launch each. Launches:

  1. router logits (plus the shared gate as column E), fp32       `_logits_kernel`
  2. top-k, renormalised softmax weights, sigmoid shared weight     `_topk_kernel`
     (large batches: + per-expert pair counts, by atomics)
  3. large batches only: per-expert offsets padded to BLOCK_M and the block -> expert
     map (`_align_kernel`, one program), then each pair's slot in the expert-sorted
     order (`_scatter_kernel`, atomics: the order inside an expert is arbitrary, the
     result is not, since each pair writes its own output row)
  4. gate+up grouped GEMM, SiLU(gate) * up fused in the epilogue   `_gate_up_kernel`
  5. down grouped GEMM, the pair's routing weight fused             `_down_kernel`
  6. sum of each token's NP rows, plus the residual when given    `_combine_kernel`

Small batches skip step 3: each pair is its own M-block (one valid row of BLOCK_M),
since with few tokens an expert rarely has two pairs and sorting costs more launches
than it saves. Every buffer is sized from shapes alone, so the call is CUDA-graph
capturable. Block sizes come from the tuned table for the shapes and GPU where one is
committed (`moe_configs.py`, vLLM's per-(E, N, device) JSON tables and nearest-token rule),
else `default_config`.

Structure after vLLM's (vllm/model_executor/layers/fused_moe/fused_moe.py: `fused_experts`,
`fused_moe_kernel`, `moe_align_block_size`, `moe_sum`): pairs sorted by expert and padded
to BLOCK_M, one grouped-GEMM launch per projection with the routing weight in the down
GEMM's epilogue, a top-k sum. Ours also fuses SiLU(gate) * up into the gate+up epilogue
(vLLM: a separate `silu_and_mul`) and the shared expert into the same GEMMs. The two GEMM
kernels also run block-FP8 experts (their FP8 switch; calibrate/kernels/fused_moe_fp8.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from calibrate.kernels.common import INTERPRET, mma
from calibrate.kernels.moe_configs import MoEConfig, config_for, default_config  # noqa: F401 (re-exported)


@functools.lru_cache(maxsize=None)
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


# Token and pair counts vary call to call: one compiled variant for all of them.
@triton.jit(do_not_specialize=["T"])
def _logits_kernel(x, router, gate, logits, T, H, stride_x, stride_l,
                   E: tl.constexpr, HAS_GATE: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    pid_t, pid_e = tl.program_id(0), tl.program_id(1)
    o_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    m_t = o_t < T
    m_r = o_e < E
    m_g = (o_e == E) & (o_e < E + HAS_GATE)  # column E exists only with a shared expert
    b_acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_H):
        o_h = k0 + tl.arange(0, BLOCK_H)
        m_h = o_h < H
        b_x = tl.load(x + o_t[:, None] * stride_x + o_h[None, :], mask=m_t[:, None] & m_h[None, :], other=0.0)
        # Column E is the shared expert's gate row: two masked loads, only one fetches.
        b_w = tl.load(router + o_e[:, None] * H + o_h[None, :], mask=m_r[:, None] & m_h[None, :], other=0.0)
        b_w += tl.load(gate + o_e[:, None] * 0 + o_h[None, :], mask=m_g[:, None] & m_h[None, :], other=0.0)
        b_acc = mma(b_x, tl.trans(b_w), b_acc, INTERPRET)
    tl.store(logits + o_t[:, None] * stride_l + o_e[None, :], b_acc,
             mask=m_t[:, None] & (m_r | m_g)[None, :])


@triton.jit(do_not_specialize=["T"])
def _topk_kernel(logits, ids, weights, counts, T, stride_l,
                 E: tl.constexpr, TOP_K: tl.constexpr, HAS_SHARED: tl.constexpr, COUNT: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr):
    NP: tl.constexpr = TOP_K + HAS_SHARED
    pid = tl.program_id(0)
    o_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    o_e = tl.arange(0, BLOCK_E)
    m_t = o_t < T
    b_l = tl.load(logits + o_t[:, None] * stride_l + o_e[None, :], mask=m_t[:, None] & (o_e < E)[None, :],
                  other=float("-inf"))
    b_top = tl.max(b_l, 1)
    b_sum = tl.zeros([BLOCK_T], dtype=tl.float32)
    # Renormalised top-k of the softmax = softmax over the k largest logits. Each pick is one
    # reduction (value and index together) and is stored at once: carrying [BLOCK_T, NP] tiles
    # through the picks cost a layout conversion each, 48 us for one token on the H200.
    for j in tl.static_range(TOP_K):
        b_m, b_i = tl.max(b_l, 1, return_indices=True)
        b_p = tl.exp(b_m - b_top)
        b_sum += b_p
        tl.store(ids + o_t * NP + j, b_i, mask=m_t)
        tl.store(weights + o_t * NP + j, b_p, mask=m_t)
        b_l = tl.where(o_e[None, :] == b_i[:, None], float("-inf"), b_l)
    if HAS_SHARED:
        b_g = tl.load(logits + o_t * stride_l + E, mask=m_t, other=0.0)
        tl.store(ids + o_t * NP + TOP_K, o_t * 0 + E, mask=m_t)
        tl.store(weights + o_t * NP + TOP_K, tl.sigmoid(b_g), mask=m_t)
    tl.debug_barrier()  # the picks' stores are read back by other threads below
    o_p = tl.arange(0, BLOCK_P)
    m_k = m_t[:, None] & (o_p < TOP_K)[None, :]
    p_w = weights + o_t[:, None] * NP + o_p[None, :]
    tl.store(p_w, tl.load(p_w, mask=m_k, other=0.0) / b_sum[:, None], mask=m_k)
    if COUNT:
        # One atomic per pair: a tile holds few tokens, so a histogram would add mostly zeros.
        m_out = m_t[:, None] & (o_p < NP)[None, :]
        b_ids = tl.load(ids + o_t[:, None] * NP + o_p[None, :], mask=m_out, other=0)
        tl.atomic_add(counts + b_ids, tl.full([BLOCK_T, BLOCK_P], 1, tl.int32), mask=m_out)


@triton.jit(do_not_specialize=["max_blocks"])
def _align_kernel(counts, cursor, block_expert, max_blocks,
                  NE: tl.constexpr, BLOCK_M: tl.constexpr, BINS: tl.constexpr, BLOCK_J: tl.constexpr):
    o_b = tl.arange(0, BINS)
    m_b = o_b < NE
    b_c = tl.load(counts + o_b, mask=m_b, other=0)
    b_pad = tl.cdiv(b_c, BLOCK_M) * BLOCK_M
    b_end = tl.cumsum(b_pad, 0)
    tl.store(cursor + o_b, b_end - b_pad, mask=m_b)
    b_total = tl.sum(b_pad, 0)
    b_end = tl.where(m_b, b_end, 2147483647)
    for j0 in range(0, max_blocks, BLOCK_J):
        o_j = j0 + tl.arange(0, BLOCK_J)
        b_row = o_j * BLOCK_M
        # The expert of an M-block: how many experts' padded ranges end at or before it.
        b_e = tl.sum((b_end[None, :] <= b_row[:, None]).to(tl.int32), 1)
        b_e = tl.where(b_row < b_total, b_e, -1)
        tl.store(block_expert + o_j, b_e, mask=o_j < max_blocks)


@triton.jit(do_not_specialize=["num_pairs"])
def _scatter_kernel(ids, cursor, sorted_pair, num_pairs, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < num_pairs
    b_e = tl.load(ids + o, mask=m, other=0)
    b_pos = tl.atomic_add(cursor + b_e, 1, mask=m)
    tl.store(sorted_pair + b_pos, o, mask=m)


@triton.jit
def _block_rows(pid_m, sorted_pair, block_expert, ids, num_pairs, SORTED: tl.constexpr, BLOCK_M: tl.constexpr):
    """The M-block's expert, its pairs and which rows are real."""
    o_m = tl.arange(0, BLOCK_M)
    if SORTED:
        e = tl.load(block_expert + pid_m)
        pair = tl.load(sorted_pair + pid_m * BLOCK_M + o_m)
        m_row = pair < num_pairs
        row = pid_m * BLOCK_M + o_m  # rows of the intermediate: sorted order
    else:
        e = tl.load(ids + pid_m)
        pair = pid_m + o_m * 0
        m_row = o_m == 0
        row = pair  # one pair per block: the intermediate is in pair order
    return e, pair, m_row, row


@triton.jit
def _swizzle(pid, num_m, num_n, GROUP_M: tl.constexpr):
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


# FP8 (a constexpr, off for bf16: its branches are not compiled, so the bf16 kernels are the same
# code as without them) runs block-FP8 experts as vLLM's `fused_moe_kernel` does with
# `use_fp8_w8a8` and `block_shape` [128, 128]: each K-block's product times the token group's
# scale and the weight block's. The scale pointers are None for bf16.
@triton.jit(do_not_specialize=["num_pairs", "num_m"])
def _gate_up_kernel(x, w13, shared13, act, sorted_pair, block_expert, ids, num_pairs, num_m, H, I,
                    stride_x, stride_we, stride_act,
                    E: tl.constexpr, NP: tl.constexpr, SORTED: tl.constexpr, GROUP_M: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    x_s=None, w13_s=None, shared13_s=None, act_s=None, stride_se=None,
                    FP8: tl.constexpr = False, G: tl.constexpr = 128, FMAX: tl.constexpr = 448.0,
                    EPS_: tl.constexpr = 1e-10):
    pid_m, pid_n = _swizzle(tl.program_id(0), num_m, tl.cdiv(I, BLOCK_N), GROUP_M)
    e, pair, m_row, row = _block_rows(pid_m, sorted_pair, block_expert, ids, num_pairs, SORTED, BLOCK_M)
    if e < 0:
        return
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_n = o_n < I
    p_a = x + (pair // NP)[:, None] * stride_x + o_k[None, :]
    # w13 rows: gate 0..I-1, up I..2I-1, hidden contiguous: B tiles are [BLOCK_K, BLOCK_N] views.
    if e == E:
        p_g = shared13 + o_n[None, :] * H + o_k[:, None]
    else:
        p_g = w13 + e.to(tl.int64) * stride_we + o_n[None, :] * H + o_k[:, None]
    p_u = p_g + I * H
    if FP8:
        kg = tl.cdiv(H, G)
        p_xs = x_s + (pair // NP) * kg
        if e == E:
            p_sg = shared13_s + (o_n // G) * kg
        else:
            p_sg = w13_s + e.to(tl.int64) * stride_se + (o_n // G) * kg
        p_su = p_sg + tl.cdiv(I, G) * kg  # the up rows' scale rows follow the gate rows'
    b_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    b_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        m_k = o_k < H - k0
        b_a = tl.load(p_a, mask=m_row[:, None] & m_k[None, :], other=0.0)
        if FP8:
            s_a = tl.load(p_xs + k0 // G, mask=m_row, other=0.0)[:, None]
            zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            b_g += mma(b_a, tl.load(p_g, mask=m_k[:, None] & m_n[None, :], other=0.0), zero, INTERPRET) \
                * s_a * tl.load(p_sg + k0 // G, mask=m_n, other=0.0)[None, :]
            b_u += mma(b_a, tl.load(p_u, mask=m_k[:, None] & m_n[None, :], other=0.0), zero, INTERPRET) \
                * s_a * tl.load(p_su + k0 // G, mask=m_n, other=0.0)[None, :]
        else:
            b_g = mma(b_a, tl.load(p_g, mask=m_k[:, None] & m_n[None, :], other=0.0), b_g, INTERPRET)
            b_u = mma(b_a, tl.load(p_u, mask=m_k[:, None] & m_n[None, :], other=0.0), b_u, INTERPRET)
        p_a += BLOCK_K
        p_g += BLOCK_K
        p_u += BLOCK_K
    b_h = b_g * tl.sigmoid(b_g) * b_u
    if FP8:
        # One scale per row and BLOCK_N columns: the down GEMM's K-blocks are this tile's columns.
        b_s = tl.maximum(tl.max(tl.abs(b_h), 1), EPS_) / FMAX
        b_h = tl.clamp(b_h / b_s[:, None], -FMAX, FMAX)
        tl.store(act_s + row * tl.cdiv(I, BLOCK_N) + pid_n, b_s, mask=m_row)
    tl.store(act + row[:, None] * stride_act + o_n[None, :], b_h.to(act.dtype.element_ty),
             mask=m_row[:, None] & m_n[None, :])


@triton.jit(do_not_specialize=["num_pairs", "num_m"])
def _down_kernel(act, w2, shared2, y, weights, sorted_pair, block_expert, ids, num_pairs, num_m, H, I,
                 stride_act, stride_we, stride_y,
                 E: tl.constexpr, SORTED: tl.constexpr, GROUP_M: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 act_s=None, w2_s=None, shared2_s=None, stride_se=None,
                 FP8: tl.constexpr = False, G: tl.constexpr = 128):
    pid_m, pid_n = _swizzle(tl.program_id(0), num_m, tl.cdiv(H, BLOCK_N), GROUP_M)
    e, pair, m_row, row = _block_rows(pid_m, sorted_pair, block_expert, ids, num_pairs, SORTED, BLOCK_M)
    if e < 0:
        return
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_n = o_n < H
    p_a = act + row[:, None] * stride_act + o_k[None, :]
    if e == E:
        p_b = shared2 + o_n[None, :] * I + o_k[:, None]
    else:
        p_b = w2 + e.to(tl.int64) * stride_we + o_n[None, :] * I + o_k[:, None]
    if FP8:
        kg = tl.cdiv(I, G)
        p_as = act_s + row * tl.cdiv(I, BLOCK_K)  # the intermediate's scales: one per BLOCK_K columns
        if e == E:
            p_sb = shared2_s + (o_n // G) * kg
        else:
            p_sb = w2_s + e.to(tl.int64) * stride_se + (o_n // G) * kg
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        m_k = o_k < I - k0
        b_a = tl.load(p_a, mask=m_row[:, None] & m_k[None, :], other=0.0)
        if FP8:
            s_a = tl.load(p_as + k0 // BLOCK_K, mask=m_row, other=0.0)
            s_b = tl.load(p_sb + k0 // G, mask=m_n, other=0.0)
            b_acc += mma(b_a, tl.load(p_b, mask=m_k[:, None] & m_n[None, :], other=0.0),
                         tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), INTERPRET) * s_a[:, None] * s_b[None, :]
        else:
            b_acc = mma(b_a, tl.load(p_b, mask=m_k[:, None] & m_n[None, :], other=0.0), b_acc, INTERPRET)
        p_a += BLOCK_K
        p_b += BLOCK_K
    b_acc *= tl.load(weights + pair, mask=m_row, other=0.0)[:, None]
    tl.store(y + pair[:, None] * stride_y + o_n[None, :], b_acc.to(y.dtype.element_ty),
             mask=m_row[:, None] & m_n[None, :])


@triton.jit(do_not_specialize=["T"])
def _combine_kernel(y, residual, out, T, H, NP: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = sum of token t's NP pair rows (+ residual[t]), accumulated in fp32."""
    t = tl.program_id(0)
    o_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    b_acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    if HAS_RES:
        b_acc += tl.load(residual + t.to(tl.int64) * H + o_h, mask=m_h, other=0.0).to(tl.float32)
    for j in tl.static_range(NP):
        b_acc += tl.load(y + (t.to(tl.int64) * NP + j) * H + o_h, mask=m_h, other=0.0).to(tl.float32)
    tl.store(out + t.to(tl.int64) * H + o_h, b_acc.to(out.dtype.element_ty), mask=m_h)


@dataclass(frozen=True)
class Routing:
    """Each token's (token, expert) pairs and, for large batches, their expert-sorted order."""
    pairs_per_token: int  # top_k, + 1 with a shared expert
    num_pairs: int
    num_m: int  # M-blocks the grouped GEMMs launch over
    act_rows: int  # rows of the intermediate
    ids: torch.Tensor  # [T, NP] expert of each pair (the shared expert is E)
    weights: torch.Tensor  # [T, NP] float32 routing weight of each pair
    sorted_pair: torch.Tensor  # [num_m * BLOCK_M] pair of each sorted row (sorted) or ids
    block_expert: torch.Tensor  # [num_m] expert of each M-block (sorted) or ids


def route(x: torch.Tensor, router_w: torch.Tensor, shared_gate_w: torch.Tensor | None, top_k: int, E: int,
          cfg: MoEConfig) -> Routing:
    """Launches 1-3 of the module docstring: router logits, top-k and, when `cfg.sorted`, the
    pairs grouped by expert and padded to BLOCK_M."""
    T, H = x.shape
    has_shared = shared_gate_w is not None
    NP = top_k + int(has_shared)
    NE = E + int(has_shared)
    num_pairs = T * NP
    dev = x.device
    logits = torch.empty(T, NE, dtype=torch.float32, device=dev)
    # Few tokens: narrow expert tiles spread the router's bytes over many SMs; many tokens: wide
    # tiles so x and the router are re-read from L2 fewer times.
    block_te = 16 if T <= 64 else 64
    _logits_kernel[(triton.cdiv(T, block_te), triton.cdiv(NE, block_te))](
        x, router_w, shared_gate_w if has_shared else router_w, logits, T, H, x.stride(0), logits.stride(0),
        E=E, HAS_GATE=has_shared, BLOCK_T=block_te, BLOCK_E=block_te, BLOCK_H=128)

    ids = torch.empty(T, NP, dtype=torch.int32, device=dev)
    weights = torch.empty(T, NP, dtype=torch.float32, device=dev)
    bins = triton.next_power_of_2(NE + 1)
    counts = torch.zeros(bins, dtype=torch.int32, device=dev) if cfg.sorted else ids
    # One token per single-warp program: every pick's reduction stays inside the warp (shuffles,
    # no shared memory); with more warps or rows Triton splits the experts across warps.
    _topk_kernel[(T,)](
        logits, ids, weights, counts, T, logits.stride(0), E=E, TOP_K=top_k, HAS_SHARED=has_shared,
        COUNT=cfg.sorted, BLOCK_T=1, BLOCK_E=triton.next_power_of_2(E),
        BLOCK_P=triton.next_power_of_2(NP), num_warps=1)

    if not cfg.sorted:
        # each pair is its own block: the intermediate is in pair order
        return Routing(NP, num_pairs, num_pairs, num_pairs, ids, weights, ids, ids)
    # Worst case of padded M-blocks: every expert's last block may be partial.
    num_m = triton.cdiv(num_pairs, cfg.block_m) + NE
    sorted_pair = torch.full((num_m * cfg.block_m,), num_pairs, dtype=torch.int32, device=dev)
    block_expert = torch.empty(num_m, dtype=torch.int32, device=dev)
    cursor = torch.empty(NE, dtype=torch.int32, device=dev)
    _align_kernel[(1,)](counts, cursor, block_expert, num_m, NE=NE, BLOCK_M=cfg.block_m, BINS=bins,
                        BLOCK_J=max(16, min(64, 16384 // bins)))
    _scatter_kernel[(triton.cdiv(num_pairs, 1024),)](ids, cursor, sorted_pair, num_pairs, BLOCK=1024)
    return Routing(NP, num_pairs, num_m, num_m * cfg.block_m, ids, weights, sorted_pair, block_expert)


def _check(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
           shared: tuple[torch.Tensor | None, ...]) -> None:
    T, H = x.shape
    E, I2, H13 = w13.shape
    if router_w.shape != (E, H) or H13 != H or w2.shape != (E, H, I2 // 2):
        raise ValueError(f"fused_moe: shapes x {tuple(x.shape)}, router_w {tuple(router_w.shape)}, "
                         f"w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)} do not agree")
    if not 1 <= top_k <= E:
        raise ValueError(f"fused_moe: top_k must be in 1..{E}, got {top_k}")
    if any(t is None for t in shared) and any(t is not None for t in shared):
        raise ValueError("fused_moe: shared_w13, shared_w2, shared_gate_w must be all given or all None")
    if shared[0] is not None:
        s13, s2, sg = shared
        if s13.shape != (I2, H) or s2.shape != (H, I2 // 2) or sg.shape != (1, H):
            raise ValueError(f"fused_moe: the shared expert must have the routed experts' width {I2 // 2}: "
                             f"shared_w13 {tuple(s13.shape)}, shared_w2 {tuple(s2.shape)}, "
                             f"shared_gate_w {tuple(sg.shape)}")
    for name, t in (("x", x), ("router_w", router_w), ("w13", w13), ("w2", w2)) + tuple(
            zip(("shared_w13", "shared_w2", "shared_gate_w"), shared)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"fused_moe: {name} must be contiguous")


def fused_moe(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
              shared_w13: torch.Tensor | None, shared_w2: torch.Tensor | None, shared_gate_w: torch.Tensor | None,
              config: MoEConfig | None = None, residual: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, hidden] bf16; router_w [E, hidden]; w13 [E, 2I, hidden] (gate rows, then up); w2 [E, hidden, I];
    shared_* (width I, gate [1, hidden]) or all None. Softmax top-k routing renormalised over the k
    (Qwen3.5's norm_topk_prob), SiLU(gate) * up, shared expert times sigmoid(x . shared_gate_w).
    Returns [T, hidden] in x's dtype; plus `residual` [T, hidden] when given (added in the final
    reduction, saving the layer a pass), into `out` when given: it may be `residual` itself (each
    element is read before the same program writes it), so the residual stream is updated in place."""
    _check(x, router_w, w13, w2, top_k, (shared_w13, shared_w2, shared_gate_w))
    T, H = x.shape
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"fused_moe: residual {tuple(residual.shape)} must be contiguous and match x {tuple(x.shape)}")
    if T == 0:
        return (torch.empty_like(x) if residual is None else residual.clone()) if out is None else out
    E, I = w13.shape[0], w13.shape[1] // 2
    has_shared = shared_w13 is not None
    dev = x.device
    cfg = config or config_for(T, E, I, _device_name(dev.index or 0) if dev.type == "cuda" and not INTERPRET else None)
    r = route(x, router_w, shared_gate_w, top_k, E, cfg)

    act = torch.empty(r.act_rows, I, dtype=x.dtype, device=dev)
    s13 = shared_w13 if has_shared else w13
    s2 = shared_w2 if has_shared else w2
    _gate_up_kernel[(r.num_m * triton.cdiv(I, cfg.block_n),)](
        x, w13, s13, act, r.sorted_pair, r.block_expert, r.ids, r.num_pairs, r.num_m, H, I,
        x.stride(0), w13.stride(0), act.stride(0),
        E=E, NP=r.pairs_per_token, SORTED=cfg.sorted, GROUP_M=cfg.group_m,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    y = torch.empty(r.num_pairs, H, dtype=x.dtype, device=dev)
    dn = cfg.down_block_n or cfg.block_n
    _down_kernel[(r.num_m * triton.cdiv(H, dn),)](
        act, w2, s2, y, r.weights, r.sorted_pair, r.block_expert, r.ids, r.num_pairs, r.num_m, H, I,
        act.stride(0), w2.stride(0), y.stride(0),
        E=E, SORTED=cfg.sorted, GROUP_M=cfg.group_m,
        BLOCK_M=cfg.block_m, BLOCK_N=dn, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or not out.is_contiguous():
        raise ValueError(f"fused_moe: out {tuple(out.shape)} must be contiguous and match x {tuple(x.shape)}")
    _combine_kernel[(T, triton.cdiv(H, 1024))](y, residual if residual is not None else x, out, T, H,
                                              NP=r.pairs_per_token, HAS_RES=residual is not None, BLOCK_H=1024)
    return out
