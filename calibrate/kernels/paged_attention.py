"""Attention over a paged KV cache in Triton: decode, verify and prefill chunks in one launch.

The cache is vLLM's: [num_blocks, block_size, kv_heads, head_dim] per K and V, any
block size (the hybrid pool enlarges attention blocks to the GDN page, e.g. 560 or
1072 tokens). Keys are walked in tiles of BLOCK_N positions; each position maps
through the request's block table, so a tile may straddle two blocks.

One program takes BLOCK_Q query tokens of one request times the GROUP query heads
that share one KV head (GQA), i.e. BLOCK_M = BLOCK_Q * GROUP rows, so each K/V tile
read serves every query head of its group. Programs are numbered over the batch's
query blocks: request b's blocks start at cu_seqlens_q[b] // BLOCK_Q + b, an upper
bound the host knows without reading the lengths (found back by binary search).
When the batch has too few programs to fill the GPU (small B x kv_heads, decode),
keys are split over `num_splits` programs that write partial softmax state, merged
by `_merge_kernel` (flash-decoding).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

from calibrate.kernels.common import INTERPRET, mma

LOG2E = 1.4426950408889634  # the kernel's softmax runs in exp2
MAX_SPLITS = 32


@dataclass(frozen=True)
class AttnConfig:
    block_m: int  # query rows per program: BLOCK_Q tokens x GROUP heads
    block_n: int  # keys per tile
    num_warps: int = 4
    num_stages: int = 2
    num_splits: int | None = None  # None: as many as fill the GPU twice (decode-only batches)


def default_config(max_seqlen_q: int, group: int) -> AttnConfig:
    """Block sizes by the longest query run in the batch (bench-tuned on the H200, see NOTES.md)."""
    rows = max_seqlen_q * group
    if rows <= 64:
        return AttnConfig(block_m=max(16, triton.next_power_of_2(rows)), block_n=64, num_warps=4, num_stages=2)
    return AttnConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, num_splits=1)


@triton.jit
def _cache_kernel(k, v, k_cache, v_cache, slot_mapping, stride_kt, stride_kh, stride_vt, stride_vh,
                  HEADS: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t).to(tl.int64)
    if slot < 0:  # padding tokens
        return
    o = tl.arange(0, BLOCK)
    m = o < HEADS * D
    h, d = o // D, o % D
    tl.store(k_cache + slot * HEADS * D + o, tl.load(k + t * stride_kt + h * stride_kh + d, mask=m), mask=m)
    tl.store(v_cache + slot * HEADS * D + o, tl.load(v + t * stride_vt + h * stride_vh + d, mask=m), mask=m)


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """k, v: [num_tokens, kv_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim];
    token t goes to slot slot_mapping[t] = block_id * block_size + offset (negative: skipped)."""
    n, heads, d = k.shape
    if k_cache.shape[2:] != (heads, d) or v_cache.shape != k_cache.shape or v.shape != k.shape:
        raise ValueError(f"reshape_and_cache: k {tuple(k.shape)}, v {tuple(v.shape)}, k_cache "
                         f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)} do not agree")
    if k.stride(2) != 1 or v.stride(2) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("reshape_and_cache: head_dim must be contiguous in k, v and the caches")
    if n:
        _cache_kernel[(n,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0),
                            v.stride(1), HEADS=heads, D=d, BLOCK=triton.next_power_of_2(heads * d))


@triton.jit
def _find_request(cu_q, pid, B, BLOCK_Q: tl.constexpr):
    """The request b whose query blocks hold program pid: last b with cu_q[b] // BLOCK_Q + b <= pid."""
    lo: tl.int32 = 0
    hi: tl.int32 = B
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_q + mid) // BLOCK_Q + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# Batch sizes and split counts vary call to call: one compiled variant for all of them.
@triton.jit(do_not_specialize=["B", "num_splits"])
def _attn_kernel(q, k_cache, v_cache, out, part_o, part_ml, block_tables, seq_lens, cu_q, qk_scale_log2, v_scale, B,
                 block_size, num_splits, stride_qt, stride_qh, stride_ot, stride_oh, stride_ct, stride_ch, stride_bt,
                 GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP
    pid, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b = _find_request(cu_q, pid, B, BLOCK_Q)
    q0 = tl.load(cu_q + b)
    q_len = tl.load(cu_q + b + 1) - q0
    local = pid - (q0 // BLOCK_Q + b)
    if local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens + b)
    ctx = seq_len - q_len

    o_m = tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    tok = local * BLOCK_Q + o_m // GROUP
    head = kvh * GROUP + o_m % GROUP
    m_m = (o_m < BLOCK_Q * GROUP) & (tok < q_len)
    q_pos = ctx + tok
    b_q = tl.load(q + (q0 + tok)[:, None] * stride_qt + head[:, None] * stride_qh + o_d[None, :],
                  mask=m_m[:, None] & m_d[None, :], other=0.0)

    # Keys up to the last query of this block (causal); with splits, this program's share of tiles.
    kv_end = tl.minimum(seq_len, ctx + tl.minimum(q_len, (local + 1) * BLOCK_Q))
    tiles = tl.cdiv(kv_end, BLOCK_N)
    per = tl.cdiv(tiles, num_splits)
    t_lo = split * per
    t_hi = tl.minimum(tiles, t_lo + per)

    b_m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    p_table = block_tables + b.to(tl.int64) * stride_bt
    for j in range(t_lo, t_hi):
        o_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
        m_n = o_n < kv_end
        blk = tl.load(p_table + o_n // block_size, mask=m_n, other=0).to(tl.int64)
        row = (blk * block_size + o_n % block_size) * stride_ct + kvh * stride_ch
        # An fp8 cache (--kv-cache-dtype fp8) is widened to the queries' dtype; its scales are applied outside.
        b_k = tl.load(k_cache + row[:, None] + o_d[None, :], mask=m_n[:, None] & m_d[None, :], other=0.0).to(b_q.dtype)
        b_v = tl.load(v_cache + row[:, None] + o_d[None, :], mask=m_n[:, None] & m_d[None, :], other=0.0).to(b_q.dtype)
        b_s = mma(b_q, tl.trans(b_k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), INTERPRET) * qk_scale_log2
        b_s = tl.where(m_n[None, :] & (o_n[None, :] <= q_pos[:, None]), b_s, float("-inf"))
        m_new = tl.maximum(b_m, tl.max(b_s, 1))
        # Rows with no key yet keep m = -inf: subtract 0 there instead of -inf - -inf.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        b_p = tl.exp2(b_s - m_sub[:, None])
        alpha = tl.exp2(b_m - m_sub)
        b_l = b_l * alpha + tl.sum(b_p, 1)
        b_acc = mma(b_p.to(b_v.dtype), b_v, b_acc * alpha[:, None], INTERPRET)
        b_m = m_new

    o_row = q0 + tok
    m_out = m_m[:, None] & m_d[None, :]
    b_acc *= v_scale  # linear in V: the split partials may carry it into the merge
    if not SPLIT:
        b_o = b_acc / b_l[:, None]
        tl.store(out + o_row[:, None] * stride_ot + head[:, None] * stride_oh + o_d[None, :],
                 b_o.to(out.dtype.element_ty), mask=m_out)
    else:
        # Partials [splits, total_q, q_heads, D] unnormalised; m (log2 domain) and l beside.
        n_rows = tl.load(cu_q + B)
        base = (split.to(tl.int64) * n_rows + o_row) * (tl.num_programs(1) * GROUP) + head
        tl.store(part_o + base[:, None] * D + o_d[None, :], b_acc, mask=m_out)
        tl.store(part_ml + base * 2, b_m, mask=m_m)
        tl.store(part_ml + base * 2 + 1, b_l, mask=m_m)


@triton.jit(do_not_specialize=["rows_heads", "num_splits"])
def _merge_kernel(part_o, part_ml, out, stride_ot, stride_oh, rows_heads, num_splits, HQ: tl.constexpr,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    r = tl.program_id(0)  # one (query token, head) row
    t, h = r // HQ, r % HQ
    o_s = tl.arange(0, BLOCK_S)
    o_d = tl.arange(0, BLOCK_D)
    m_s = o_s < num_splits
    base = o_s.to(tl.int64) * rows_heads + r
    b_m = tl.load(part_ml + base * 2, mask=m_s, other=float("-inf"))
    b_l = tl.load(part_ml + base * 2 + 1, mask=m_s, other=0.0)
    m_all = tl.max(b_m, 0)
    b_w = tl.where(b_m == float("-inf"), 0.0, tl.exp2(b_m - m_all))
    b_o = tl.load(part_o + base[:, None] * D + o_d[None, :], mask=m_s[:, None] & (o_d < D)[None, :], other=0.0)
    b_o = tl.sum(b_o * b_w[:, None], 0) / tl.sum(b_l * b_w, 0)
    tl.store(out + t * stride_ot + h * stride_oh + o_d, b_o.to(out.dtype.element_ty), mask=o_d < D)


@lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _splits(cfg: AttnConfig, programs: int, max_context: int, device: torch.device) -> int:
    if cfg.num_splits is not None:
        return cfg.num_splits
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 4
    # Enough programs for two waves, never a split shorter than 256 keys of capacity.
    return max(1, min(MAX_SPLITS, -(-2 * sms // programs), max_context // 256))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, max_seqlen_q: int, scale: float,
                    out: torch.Tensor | None = None, config: AttnConfig | None = None,
                    k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """q [total_q, q_heads, D] (GQA: q_heads % kv_heads == 0); caches [num_blocks, block_size, kv_heads, D];
    block_tables int32 [B, max_blocks]; seq_lens int32 [B] keys per request, this step's included
    (already cached); cu_seqlens_q int32 [B + 1]. Query i of request b sits at position
    seq_lens[b] - q_len_b + i and sees keys 0..that position. Returns [total_q, q_heads, D].
    The caches may be float8_e4m3fn (vLLM's --kv-cache-dtype fp8): keys and values are then the
    cached values times k_scale, v_scale (vLLM's per-layer scales, 1.0 unless calibrated)."""
    total_q, hq, d = q.shape
    _, block_size, hkv, dk = k_cache.shape
    B = seq_lens.shape[0]
    if dk != d or v_cache.shape != k_cache.shape or hq % hkv or cu_seqlens_q.shape != (B + 1,) \
            or block_tables.shape[0] != B:
        raise ValueError(f"paged_attention: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache "
                         f"{tuple(v_cache.shape)}, block_tables {tuple(block_tables.shape)}, seq_lens "
                         f"{tuple(seq_lens.shape)}, cu_seqlens_q {tuple(cu_seqlens_q.shape)} do not agree")
    if q.stride(2) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("paged_attention: head_dim must be contiguous in q, and the caches contiguous")
    group = hq // hkv
    cfg = config or default_config(max_seqlen_q, group)
    if cfg.block_m < group:
        raise ValueError(f"paged_attention: block_m {cfg.block_m} < {group} query heads per KV head")
    if cfg.num_splits is not None and not 1 <= cfg.num_splits <= MAX_SPLITS:
        raise ValueError(f"paged_attention: num_splits must be in 1..{MAX_SPLITS}, got {cfg.num_splits}")
    if out is None:
        out = torch.empty_like(q)
    if total_q == 0 or B == 0:
        return out
    block_q = cfg.block_m // group
    programs = triton.cdiv(total_q, block_q) + B
    splits = _splits(cfg, programs * hkv, block_tables.shape[1] * block_size, q.device)
    block_d = triton.next_power_of_2(d)
    if splits > 1:
        part_o = torch.empty(splits, total_q, hq, d, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(splits, total_q, hq, 2, dtype=torch.float32, device=q.device)
    else:
        part_o = part_ml = out  # unused
    _attn_kernel[(programs, hkv, splits)](
        q, k_cache, v_cache, out, part_o, part_ml, block_tables, seq_lens, cu_seqlens_q, scale * LOG2E * k_scale, v_scale, B, block_size,
        splits, q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, D=d, BLOCK_D=block_d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT=splits > 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if splits > 1:
        _merge_kernel[(total_q * hq,)](part_o, part_ml, out, out.stride(0), out.stride(1), total_q * hq, splits,
                                       HQ=hq, D=d, BLOCK_D=block_d, BLOCK_S=MAX_SPLITS)
    return out
