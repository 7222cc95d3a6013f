"""Random inputs for the fused kernels, as keyword dicts both a kernel and its reference take."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

BF16 = torch.bfloat16


def _randn(g: torch.Generator, *shape: int, scale: float, device: torch.device) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, device=device) * scale).to(BF16)


def moe_inputs(tokens: int, hidden: int, experts: int, width: int, top_k: int, shared: bool,
               device: torch.device | str = "cpu", seed: int = 0) -> dict:
    """x and weights scaled so every stage stays O(1) (router logits of unit spread)."""
    dev = torch.device(device)
    g = torch.Generator(dev).manual_seed(seed)
    s_h, s_i = hidden ** -0.5, width ** -0.5
    return {
        "x": _randn(g, tokens, hidden, scale=1.0, device=dev),
        "router_w": _randn(g, experts, hidden, scale=s_h, device=dev),
        "w13": _randn(g, experts, 2 * width, hidden, scale=s_h, device=dev),
        "w2": _randn(g, experts, hidden, width, scale=s_i, device=dev),
        "top_k": top_k,
        "shared_w13": _randn(g, 2 * width, hidden, scale=s_h, device=dev) if shared else None,
        "shared_w2": _randn(g, hidden, width, scale=s_i, device=dev) if shared else None,
        "shared_gate_w": _randn(g, 1, hidden, scale=s_h, device=dev) if shared else None,
    }


def paged_inputs(q_lens: list[int], contexts: list[int], block_size: int, kv_heads: int, group: int,
                 head_dim: int, device: torch.device | str = "cpu", seed: int = 0, spare_blocks: int = 3) -> dict:
    """A batch of requests over a shuffled paged pool: request b has contexts[b] cached tokens
    plus q_lens[b] new ones (their K/V cached too), so seq_lens = contexts + q_lens.

    Unused block-table entries hold -1, as a real table's tail would be garbage."""
    dev = torch.device(device)
    g = torch.Generator(dev).manual_seed(seed)
    B = len(q_lens)
    seq = [c + q for c, q in zip(contexts, q_lens)]
    need = [-(-s // block_size) for s in seq]
    width = max(need) + 1
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g, device=dev).int().cpu()
    table = torch.full((B, width), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[used:used + n]
        used += n
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return {
        "q": _randn(g, int(cu[-1]), kv_heads * group, head_dim, scale=1.0, device=dev),
        "k_cache": _randn(g, *shape, scale=1.0, device=dev),
        "v_cache": _randn(g, *shape, scale=1.0, device=dev),
        "block_tables": table.to(dev),
        "seq_lens": torch.tensor(seq, dtype=torch.int32, device=dev),
        "cu_seqlens_q": cu.to(dev),
        "max_seqlen_q": max(q_lens),
        "scale": head_dim ** -0.5,
    }


@contextmanager
def nan_poison() -> Iterator[None]:
    """Inside, torch.empty / empty_like come back filled with NaN (floats) or -77 (ints), so an
    output element a kernel forgot to write fails a check instead of reading as stale memory."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(-77)
        return t

    torch.empty = lambda *a, **kw: poison(empty(*a, **kw))
    torch.empty_like = lambda *a, **kw: poison(empty_like(*a, **kw))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like
