"""Packaged attention kernels for the attention core, beside our paged Triton kernel.

vLLM's FLASH_ATTN backend runs FlashAttention 3 on Hopper over its paged KV cache. FA3 has no
wheel for the device's torch; flash-attn-4 (FlashAttention's CuTe DSL kernels, with an SM90
path, compiled at run time through nvidia-cutlass-dsl) takes the same paged layout, so it is
the stand-in that reads the cache as vLLM's kernel does. torch's cuDNN SDPA needs K and V
contiguous per sequence: it prices the math of a prefill chunk, not the paged reads.
Each builder returns a zero-argument call (the shape fixed), as the timers take.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def load_fa4() -> Callable[..., object] | None:
    """flash-attn-4's varlen forward, or None where it does not import (no package, or its DSL fails to load)."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception:
        return None
    return flash_attn_varlen_func


def fa4_num_splits(requested: int, capability: tuple[int, int] | None) -> int:
    """The split count to pass flash-attn-4. Below 1 asks its heuristic to split the keys of small
    batches (flash-decoding), but in flash-attn-4 4.0.0b36 the SM90 forward asserts "SplitKV not
    supported on SM 9.0" (flash_attn/cute/interface.py, `_flash_attn_fwd`) whenever the heuristic
    picks more than one: on compute capability 9.x it runs unsplit."""
    if requested < 1 and capability is not None and capability[0] == 9:
        return 1
    return requested


def fa4_paged(fa: Callable[..., object], q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              block_tables: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, max_seqlen_q: int,
              scale: float, num_splits: int = 0) -> Callable[[], object]:
    """Every request's queries (q [tokens, Hq, D], packed by cu_seqlens_q) over its pages of the
    [blocks, block, Hkv, D] cache, causal with the queries at the end of each sequence (as vLLM).
    num_splits as `fa4_num_splits` resolves it; with 1 split a one-request decode ran on one SM's
    worth of programs (97 us against our 22)."""
    capability = torch.cuda.get_device_capability(q.device) if q.is_cuda else None
    splits = fa4_num_splits(num_splits, capability)
    return lambda: fa(q, k_cache, v_cache, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                      seqused_k=seq_lens, page_table=block_tables, softmax_scale=scale, causal=True,
                      num_splits=splits)


def fa4_dense(fa: Callable[..., object], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              cu_seqlens: torch.Tensor, max_seqlen: int, scale: float) -> Callable[[], object]:
    """Causal attention of packed sequences over their own contiguous K/V ([tokens, H, D])."""
    return lambda: fa(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                      max_seqlen_k=max_seqlen, softmax_scale=scale, causal=True)


SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def sdpa_prefill(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 k_prefix: torch.Tensor | None = None, v_prefix: torch.Tensor | None = None) -> Callable[[], object]:
    """One chunk: q [1, Hq, C, D] causal over its own k, v [1, Hkv, C, D], plus (a cached prefix) a
    non-causal call over k_prefix / v_prefix: the work of a bottom-right causal mask over both. GQA
    by expanded K/V views where the backend refuses enable_gqa."""
    group = q.shape[1] // k.shape[1]
    which = SDPA_BACKENDS[backend]

    def expand(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.repeat_interleave(group, dim=1)

    def run(kc, vc, kp, vp, gqa: bool) -> torch.Tensor:
        with sdpa_kernel(which):
            o = F.scaled_dot_product_attention(q, kc, vc, is_causal=True, enable_gqa=gqa)
            if kp is not None:
                o = o + F.scaled_dot_product_attention(q, kp, vp, enable_gqa=gqa)
        return o
    try:
        run(k, v, k_prefix, v_prefix, True)
        return lambda: run(k, v, k_prefix, v_prefix, True)
    except RuntimeError:  # this backend has no GQA path for the shape
        ke, ve, kpe, vpe = expand(k), expand(v), expand(k_prefix), expand(v_prefix)
        run(ke, ve, kpe, vpe, False)
        return lambda: run(ke, ve, kpe, vpe, False)


def sdpa_decode(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], object]:
    """B sequences x P queries (q [B, Hq, P, D]) over their contiguous keys (k, v [B, Hkv, L, D]), no mask."""
    group = q.shape[1] // k.shape[1]
    which = SDPA_BACKENDS[backend]

    def run(kc, vc, gqa: bool) -> torch.Tensor:
        with sdpa_kernel(which):
            return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=gqa)
    try:
        run(k, v, True)
        return lambda: run(k, v, True)
    except RuntimeError:
        ke, ve = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        run(ke, ve, False)
        return lambda: run(ke, ve, False)
