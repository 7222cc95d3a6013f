"""Plain-PyTorch references for the calibrator's fused kernels (float64 inside).

Same signatures as the Triton versions (`paged_attention.py`, `fused_moe.py`) with a
`_ref` suffix, so tests and the GPU bench call both by keyword. Loops over requests
and tokens are plain Python: these are for correctness, never for timing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

F64 = torch.float64


def reshape_and_cache_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slot_mapping: torch.Tensor) -> None:
    """k, v: [num_tokens, kv_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim];
    token t goes to slot slot_mapping[t] = block_id * block_size + offset."""
    slots = slot_mapping.long()
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k.to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v.to(v_cache.dtype)


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, max_seqlen_q: int, scale: float,
                        out: torch.Tensor | None = None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Causal GQA attention of each request's queries over its paged context.

    q [total_q, q_heads, D]; request b owns q rows cu_seqlens_q[b]..cu_seqlens_q[b+1] and
    seq_lens[b] keys (its new tokens' K/V included), found through block_tables[b].
    Query i of a request of q_len queries sits at position seq_lens[b] - q_len + i.
    """
    block_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    res = torch.empty(q.shape, dtype=F64, device=q.device)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for b, n_keys in enumerate(lens):
        q0, q1 = cu[b], cu[b + 1]
        if q1 == q0:
            continue
        pos = torch.arange(n_keys, device=q.device)
        slots = block_tables[b].long()[pos // block_size] * block_size + pos % block_size
        k = k_cache.view(-1, *k_cache.shape[2:])[slots].to(F64).repeat_interleave(group, 1) * k_scale  # [L, Hq, D]
        v = v_cache.view(-1, *v_cache.shape[2:])[slots].to(F64).repeat_interleave(group, 1) * v_scale
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].to(F64), k) * scale
        q_pos = n_keys - (q1 - q0) + torch.arange(q1 - q0, device=q.device)
        s = s.masked_fill(pos[None, :] > q_pos[:, None], float("-inf"))
        res[q0:q1] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
    if out is None:
        return res.to(q.dtype)
    out.copy_(res)
    return out


def route_ref(x: torch.Tensor, router_w: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts, top-k, renormalised (Qwen3.5's norm_topk_prob): weights, ids [T, top_k]."""
    p = (x.to(F64) @ router_w.to(F64).T).softmax(-1)
    w, ids = p.topk(top_k, -1)
    return w / w.sum(-1, keepdim=True), ids


def _expert(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    gate, up = (x @ w13.to(F64).T).chunk(2, -1)
    return (F.silu(gate) * up) @ w2.to(F64).T


def fused_moe_ref(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
                  shared_w13: torch.Tensor | None, shared_w2: torch.Tensor | None,
                  shared_gate_w: torch.Tensor | None) -> torch.Tensor:
    """x [T, hidden]; router_w [E, hidden]; w13 [E, 2I, hidden] (gate rows, then up rows); w2 [E, hidden, I];
    shared_w13 [2Is, hidden], shared_w2 [hidden, Is], shared_gate_w [1, hidden] or all None.
    Returns sum_k w_k expert_k(x) + sigmoid(x . shared_gate_w) shared(x), [T, hidden] in x's dtype."""
    x64 = x.to(F64)
    topw, topi = route_ref(x, router_w, top_k)
    out = torch.zeros_like(x64)
    for e in topi.unique().tolist():
        tok, slot = (topi == e).nonzero(as_tuple=True)
        out.index_add_(0, tok, topw[tok, slot, None] * _expert(x64[tok], w13[e], w2[e]))
    if shared_w13 is not None:
        gate = torch.sigmoid(x64 @ shared_gate_w.to(F64).T)
        out += gate * _expert(x64, shared_w13, shared_w2)
    return out.to(x.dtype)
