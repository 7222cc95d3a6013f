"""Real-shape Qwen3.5 layers with random bf16 weights, as PyTorch ops (GPU path only).

Each builder returns a weights object; each forward takes the residual stream
`x [tokens, hidden]` and returns the new one. GEMMs are cuBLAS (`F.linear`), routed
experts one grouped GEMM per projection (`torch._grouped_mm`), the attention core
flash SDPA; elementwise work is unfused PyTorch, so these times bound vLLM's fused
kernels from above on the elementwise parts. The GDN recurrence is not here: it is
the policy's verify kernel (policies/kernels), passed in as `recurrence` when a whole
step runs it, and timed by the kernels bench for the tables.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from calibrate.shapes import LayerShapes

EPS = 1e-6
BF16 = torch.bfloat16
Recurrence = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _w(*shape: int, device: torch.device, fan_in: int | None = None) -> torch.Tensor:
    # Random, never zeros: zeros run faster than real data on the matrix units.
    t = torch.empty(*shape, dtype=BF16, device=device)
    return t.normal_(0.0, 1.0 / math.sqrt(fan_in or shape[-1]))


def _norm_w(n: int, device: torch.device) -> torch.Tensor:
    return torch.empty(n, dtype=BF16, device=device).uniform_(0.5, 1.5)


# ----------------------------------------------------------------------------- GDN
@dataclass
class GDNWeights:
    norm: torch.Tensor
    in_proj: torch.Tensor  # [in_features, hidden]
    conv: torch.Tensor  # [kernel, conv_channels]
    neg_a: torch.Tensor  # -exp(A_log) per v-head, float32 (a constant of the checkpoint)
    dt_bias: torch.Tensor
    qk_scale: torch.Tensor  # 1 / sqrt(head_k_dim): rms_norm with this weight is the L2 norm
    o_norm: torch.Tensor
    out_proj: torch.Tensor  # [hidden, v_channels]


def gdn_weights(s: LayerShapes, device: torch.device) -> GDNWeights:
    return GDNWeights(
        norm=_norm_w(s.hidden, device),
        in_proj=_w(s.gdn_in_features, s.hidden, device=device),
        conv=_w(s.conv_kernel, s.gdn_conv_channels, device=device, fan_in=s.conv_kernel),
        neg_a=-torch.rand(s.gdn_v_heads, device=device).exp(),
        dt_bias=torch.rand(s.gdn_v_heads, device=device),
        qk_scale=torch.full((s.head_k_dim,), s.head_k_dim ** -0.5, dtype=BF16, device=device),
        o_norm=_norm_w(s.head_v_dim, device),
        out_proj=_w(s.hidden, s.gdn_v_channels, device=device),
    )


def gdn_forward(x: torch.Tensor, w: GDNWeights, s: LayerShapes, conv_state: torch.Tensor,
                recurrence: Recurrence | None = None) -> torch.Tensor:
    """conv_state: [kernel - 1, conv_channels], the rolling window, updated in place."""
    n = x.shape[0]
    h = F.rms_norm(x, (s.hidden,), w.norm, EPS)
    proj = F.linear(h, w.in_proj)
    qkv, z, b, a = proj.split([s.gdn_conv_channels, s.gdn_v_channels, s.gdn_v_heads, s.gdn_v_heads], -1)
    # Depthwise causal conv (kernel K) over the token stream, continuing the rolling window.
    xs = torch.cat([conv_state, qkv], 0)
    y = xs[0:n] * w.conv[0]
    for j in range(1, s.conv_kernel):
        y.addcmul_(xs[j:j + n], w.conv[j])
    conv_state.copy_(xs[n:])
    y = F.silu(y)
    qk, v = y.split([2 * s.gdn_qk_channels, s.gdn_v_channels], -1)
    # L2-normalise q and k (all their heads) in one pass: rms_norm x sqrt(d)^-1 is x / |x|.
    q, k = F.rms_norm(qk.reshape(n, 2 * s.gdn_k_heads, s.head_k_dim), (s.head_k_dim,), w.qk_scale, EPS).chunk(2, 1)
    v = v.reshape(n, s.gdn_v_heads, s.head_v_dim)
    beta = b.float().sigmoid()
    g = F.softplus(a.float() + w.dt_bias) * w.neg_a
    o = v if recurrence is None else recurrence(q, k, v, g, beta)
    o = F.rms_norm(o.to(BF16), (s.head_v_dim,), w.o_norm, EPS) * F.silu(z.view(n, s.gdn_v_heads, s.head_v_dim))
    return x + F.linear(o.reshape(n, s.gdn_v_channels), w.out_proj)


# ----------------------------------------------------------------------- attention
@dataclass
class AttnWeights:
    norm: torch.Tensor
    qkv: torch.Tensor  # [q + gate + k + v features, hidden]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o_proj: torch.Tensor  # [hidden, q_heads * head_dim]


def attn_weights(s: LayerShapes, device: torch.device) -> AttnWeights:
    return AttnWeights(
        norm=_norm_w(s.hidden, device),
        qkv=_w(s.qkv_features, s.hidden, device=device),
        q_norm=_norm_w(s.head_dim, device),
        k_norm=_norm_w(s.head_dim, device),
        o_proj=_w(s.hidden, s.q_heads * s.head_dim, device=device),
    )


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Partial rotary embedding on the first rotary_dim channels of each head (neox halves)."""
    r, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    x1, x2 = r.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1)


def rope_tables(positions: torch.Tensor, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10_000_000.0 ** (torch.arange(0, rotary_dim, 2, device=positions.device).float() / rotary_dim))
    ang = positions.float()[:, None] * inv[None, :]
    return ang.cos().to(BF16)[:, None, :], ang.sin().to(BF16)[:, None, :]


AttnCore = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attn_forward(x: torch.Tensor, w: AttnWeights, s: LayerShapes, cos: torch.Tensor, sin: torch.Tensor,
                 kv_slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 core: AttnCore | None = None) -> torch.Tensor:
    """k_cache/v_cache: [slots, kv_heads, head_dim]; the new tokens' K/V go to kv_slots.

    core(q [n, q_heads, D], k, v [n, kv_heads, D]) -> [n, q_heads, D]; None times the
    layer without its core (the core is tabled separately by sequence shape).
    """
    n = x.shape[0]
    h = F.rms_norm(x, (s.hidden,), w.norm, EPS)
    qd, kd = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
    q, gate, k, v = F.linear(h, w.qkv).split([qd, qd, kd, kd], -1)
    q = F.rms_norm(q.reshape(n, s.q_heads, s.head_dim), (s.head_dim,), w.q_norm, EPS)
    k = F.rms_norm(k.reshape(n, s.kv_heads, s.head_dim), (s.head_dim,), w.k_norm, EPS)
    q, k = rope(torch.cat([q, k], 1), cos, sin, s.rotary_dim).split([s.q_heads, s.kv_heads], 1)
    v = v.reshape(n, s.kv_heads, s.head_dim)
    k_cache.index_copy_(0, kv_slots, k)
    v_cache.index_copy_(0, kv_slots, v)
    o = q if core is None else core(q, k, v)
    o = o * torch.sigmoid(gate.view(n, s.q_heads, s.head_dim))
    return x + F.linear(o.reshape(n, qd), w.o_proj)


def decode_core(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor) -> torch.Tensor:
    """B sequences x P verify queries over their cached keys: q [B, Hq, P, D], kv [B, Hkv, L, D].

    No mask: the verify positions' own causal/tree mask changes P x P of P x L scores.
    """
    return F.scaled_dot_product_attention(q, k_ctx, v_ctx, enable_gqa=True)


def prefill_core(q: torch.Tensor, k_prefix: torch.Tensor | None, v_prefix: torch.Tensor | None,
                 k_chunk: torch.Tensor, v_chunk: torch.Tensor) -> torch.Tensor:
    """One chunk of C queries after a cached prefix: q [1, Hq, C, D].

    A bottom-right causal mask over prefix + chunk is the work of a non-causal call over
    the prefix plus a causal call over the chunk; the two partial outputs are merged
    with one elementwise pass (the log-sum-exp rescale, costed, not computed exactly).
    """
    o = F.scaled_dot_product_attention(q, k_chunk, v_chunk, is_causal=True, enable_gqa=True)
    if k_prefix is None:
        return o
    return o + F.scaled_dot_product_attention(q, k_prefix, v_prefix, enable_gqa=True)


# ----------------------------------------------------------------------------- MoE
@dataclass
class MoEWeights:
    norm: torch.Tensor
    router: torch.Tensor  # [experts, hidden]
    w13: torch.Tensor  # [experts, 2 * width, hidden]: gate and up
    w2: torch.Tensor  # [experts, hidden, width]
    shared13: torch.Tensor  # [2 * shared_width + 1, hidden]: gate, up, and the shared expert's gate
    shared2: torch.Tensor  # [hidden, shared_width]


def moe_weights(s: LayerShapes, device: torch.device) -> MoEWeights:
    return MoEWeights(
        norm=_norm_w(s.hidden, device),
        router=_w(s.num_experts, s.hidden, device=device),
        w13=_w(s.num_experts, 2 * s.expert_width, s.hidden, device=device),
        w2=_w(s.num_experts, s.hidden, s.expert_width, device=device),
        shared13=_w(2 * s.shared_width + 1, s.hidden, device=device),
        shared2=_w(s.hidden, s.shared_width, device=device),
    )


def moe_forward(x: torch.Tensor, w: MoEWeights, s: LayerShapes) -> torch.Tensor:
    n = x.shape[0]
    h = F.rms_norm(x, (s.hidden,), w.norm, EPS)
    # Top-k of the router logits, then softmax over those k: the renormalised top-k
    # softmax (norm_topk_prob) in fewer passes.
    topv, topi = F.linear(h, w.router).topk(s.top_k, -1)
    topw = topv.float().softmax(-1).to(BF16)
    # Sort the n * top_k (token, expert) pairs by expert: one grouped GEMM per projection.
    flat = topi.flatten()
    order = flat.argsort(stable=True)
    counts = torch.zeros(s.num_experts, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, _ONE.get(x.device).expand(flat.shape[0]))
    offs = counts.cumsum(0, dtype=torch.int32)
    token = order // s.top_k
    gu = torch._grouped_mm(h.index_select(0, token), w.w13.transpose(-2, -1), offs=offs)
    gate, up = gu.chunk(2, -1)
    act = F.silu(gate) * up * topw.flatten().index_select(0, order)[:, None]
    ys = torch._grouped_mm(act, w.w2.transpose(-2, -1), offs=offs)
    # Shared expert and its sigmoid gate from one GEMM.
    sg, su, sgate = F.linear(h, w.shared13).split([s.shared_width, s.shared_width, 1], -1)
    out = x + F.linear(F.silu(sg) * su, w.shared2) * torch.sigmoid(sgate)
    return out.index_add_(0, token, ys)


class _Ones:
    """One int32 1 per device, expanded (not materialised) as scatter_add's source."""

    def __init__(self) -> None:
        self.by_device: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device) -> torch.Tensor:
        if device not in self.by_device:
            self.by_device[device] = torch.ones(1, dtype=torch.int32, device=device)
        return self.by_device[device]


_ONE = _Ones()


# ------------------------------------------------------------------ LM head, MTP fc
@dataclass
class HeadWeights:
    norm: torch.Tensor
    lm_head: torch.Tensor  # [vocab on this GPU, hidden]


def head_weights(s: LayerShapes, device: torch.device) -> HeadWeights:
    return HeadWeights(norm=_norm_w(s.hidden, device), lm_head=_w(s.vocab, s.hidden, device=device))


def lm_head_forward(x: torch.Tensor, w: HeadWeights, s: LayerShapes) -> torch.Tensor:
    """Final norm, logits in float32 (as vLLM's sampler takes them), greedy token ids."""
    logits = F.linear(F.rms_norm(x, (s.hidden,), w.norm, EPS), w.lm_head).float()
    return logits.argmax(-1)


@dataclass
class MTPWeights:
    norm_e: torch.Tensor
    norm_h: torch.Tensor
    fc: torch.Tensor  # [hidden / tp, 2 * hidden]: column-parallel


def mtp_weights(s: LayerShapes, device: torch.device) -> MTPWeights:
    return MTPWeights(_norm_w(s.hidden, device), _norm_w(s.hidden, device),
                      _w(s.hidden // s.tp, 2 * s.hidden, device=device))


def mtp_fc_forward(emb: torch.Tensor, hidden: torch.Tensor, w: MTPWeights, s: LayerShapes) -> torch.Tensor:
    """The MTP layer's input: fc(concat(norm(embedding), norm(target hidden))).

    The column-parallel output is gathered back to the full hidden size; on one GPU
    `repeat` writes the bytes that all-gather would (its link time is not counted).
    """
    e = F.rms_norm(emb, (s.hidden,), w.norm_e, EPS)
    h = F.rms_norm(hidden, (s.hidden,), w.norm_h, EPS)
    y = F.linear(torch.cat([e, h], -1), w.fc)
    return y if s.tp == 1 else y.repeat(1, s.tp)
