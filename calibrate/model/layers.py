"""Real-shape Qwen3.5 layers with random bf16 weights, as PyTorch ops (GPU path only).

Each builder returns a weights object; each forward takes the residual stream
`x [tokens, hidden]` and returns the new one. GEMMs are cuBLAS (`F.linear`); the MoE
is our fused Triton kernel (`calibrate/kernels/fused_moe.py`), the attention core our
paged Triton kernel over vLLM's block-table KV pool (`paged_attn_forward`), with the
dense-cache SDPA cores kept for the whole-step check; other elementwise work is
unfused PyTorch, so these times bound vLLM's fused kernels from above there. The GDN recurrence is not here: it is
the policy's verify kernel (policies/kernels), passed in as `recurrence` when a whole
step runs it, and timed by the kernels bench for the tables. A dense model has a SwiGLU
MLP (cuBLAS GEMMs) where the MoE is: `ffn_weights` / `ffn_forward` pick the block. A block-FP8
checkpoint's weights (calibrate/model/layers_fp8.py) fill the same dataclasses with callable projections,
which `linear` calls where a bf16 weight goes to cuBLAS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from calibrate.kernels.fused_moe import fused_moe
from calibrate.kernels.paged_attention import paged_attention, reshape_and_cache
from calibrate.model.shapes import LayerShapes

EPS = 1e-6
BF16 = torch.bfloat16
Recurrence = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _w(*shape: int, device: torch.device, fan_in: int | None = None) -> torch.Tensor:
    # Random, never zeros: zeros run faster than real data on the matrix units.
    t = torch.empty(*shape, dtype=BF16, device=device)
    return t.normal_(0.0, 1.0 / math.sqrt(fan_in or shape[-1]))


def linear(x: torch.Tensor, w: torch.Tensor | Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """F.linear for a bf16 weight; a block-FP8 projection (calibrate.model.fp8_linear.Fp8Linear) is called."""
    return F.linear(x, w) if isinstance(w, torch.Tensor) else w(x)


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


def gdn_in(x: torch.Tensor, w: GDNWeights, s: LayerShapes, out: torch.Tensor | None = None) -> torch.Tensor:
    """The GDN layer's dense half before its core: RMSNorm and in_proj ([n, gdn_in_features]: conv
    input, z, b, a). A block-FP8 in_proj returns vLLM's two projections, (conv input and z, b and a)."""
    h = F.rms_norm(x, (s.hidden,), w.norm, EPS)
    return torch.mm(h, w.in_proj.t(), out=out) if isinstance(w.in_proj, torch.Tensor) else w.in_proj(h)


def gdn_out(o: torch.Tensor, z: torch.Tensor, w: GDNWeights, s: LayerShapes) -> torch.Tensor:
    """The dense half after the core: the gated RMSNorm of the core's output o ([n, v channels])
    with z, and out_proj: the residual's increment."""
    n = o.shape[0]
    o = F.rms_norm(o.reshape(n, s.gdn_v_heads, s.head_v_dim), (s.head_v_dim,), w.o_norm, EPS)
    o = o * F.silu(z.reshape(n, s.gdn_v_heads, s.head_v_dim))
    return linear(o.reshape(n, s.gdn_v_channels), w.out_proj)


def gdn_forward(x: torch.Tensor, w: GDNWeights, s: LayerShapes, conv_state: torch.Tensor,
                recurrence: Recurrence | None = None) -> torch.Tensor:
    """The whole layer with a torch core (conv, gating, q/k norms, `recurrence`); conv_state:
    [kernel - 1, conv_channels], the rolling window, updated in place."""
    n = x.shape[0]
    proj = gdn_in(x, w, s)
    if isinstance(proj, tuple):  # a block-FP8 in_proj: (q, k, v and z; b and a)
        (qkv, z), (b, a) = proj[0].split([s.gdn_conv_channels, s.gdn_v_channels], -1), proj[1].chunk(2, -1)
    else:
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
    return x + gdn_out(o.to(BF16), z, w, s)


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


def _attn_in(x: torch.Tensor, w: AttnWeights, s: LayerShapes, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Norm, QKV projection, q/k norms and partial RoPE: q [n, q_heads, D], the output gate, k, v [n, kv_heads, D]."""
    n = x.shape[0]
    h = F.rms_norm(x, (s.hidden,), w.norm, EPS)
    qd, kd = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
    q, gate, k, v = linear(h, w.qkv).split([qd, qd, kd, kd], -1)
    q = F.rms_norm(q.reshape(n, s.q_heads, s.head_dim), (s.head_dim,), w.q_norm, EPS)
    k = F.rms_norm(k.reshape(n, s.kv_heads, s.head_dim), (s.head_dim,), w.k_norm, EPS)
    q, k = rope(torch.cat([q, k], 1), cos, sin, s.rotary_dim).split([s.q_heads, s.kv_heads], 1)
    return q, gate, k, v.reshape(n, s.kv_heads, s.head_dim)


def attn_out_proj(o: torch.Tensor, gate: torch.Tensor, w: AttnWeights, s: LayerShapes) -> torch.Tensor:
    """Qwen3.5's sigmoid output gate and o_proj (the residual is the caller's)."""
    n = o.shape[0]
    o = o * torch.sigmoid(gate.view(n, s.q_heads, s.head_dim))
    return linear(o.reshape(n, s.q_heads * s.head_dim), w.o_proj)


def _attn_out(x: torch.Tensor, o: torch.Tensor, gate: torch.Tensor, w: AttnWeights, s: LayerShapes) -> torch.Tensor:
    """attn_out_proj plus the residual."""
    return x + attn_out_proj(o, gate, w, s)


def attn_forward(x: torch.Tensor, w: AttnWeights, s: LayerShapes, cos: torch.Tensor, sin: torch.Tensor,
                 kv_slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 core: AttnCore | None = None) -> torch.Tensor:
    """k_cache/v_cache: [slots, kv_heads, head_dim]; the new tokens' K/V go to kv_slots.

    core(q [n, q_heads, D], k, v [n, kv_heads, D]) -> [n, q_heads, D]; None times the
    layer without its core (the core is tabled separately by sequence shape).
    """
    q, gate, k, v = _attn_in(x, w, s, cos, sin)
    k_cache.index_copy_(0, kv_slots, k)
    v_cache.index_copy_(0, kv_slots, v)
    return _attn_out(x, q if core is None else core(q, k, v), gate, w, s)


@dataclass
class PagedBatch:
    """One step's view of the paged KV pool for one attention layer (vLLM's attention metadata).

    Caches [num_blocks, block_size, kv_heads, head_dim]; the step's new tokens go to
    slot_mapping (block_id * block_size + offset); seq_lens count keys per request with
    this step's tokens included; cu_seqlens_q [B + 1] delimits each request's queries.
    """
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # int64 [tokens]
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    seq_lens: torch.Tensor  # int32 [B]
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    max_seqlen_q: int


def paged_attn_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: PagedBatch) -> torch.Tensor:
    """Cache this step's K/V, then causal GQA attention of every query over its request's pages:
    decode, verify and prefill chunks of one batch in one launch."""
    reshape_and_cache(k, v, kv.k_cache, kv.v_cache, kv.slot_mapping)
    return paged_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, kv.cu_seqlens_q,
                           kv.max_seqlen_q, q.shape[-1] ** -0.5)


def paged_attn_forward(x: torch.Tensor, w: AttnWeights, s: LayerShapes, cos: torch.Tensor, sin: torch.Tensor,
                       kv: PagedBatch) -> torch.Tensor:
    """The whole attention layer over the paged pool, as vLLM runs it."""
    q, gate, k, v = _attn_in(x, w, s, cos, sin)
    return _attn_out(x, paged_attn_core(q, k, v, kv), gate, w, s)


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
    shared13: torch.Tensor  # [2 * shared_width, hidden]: gate and up
    shared2: torch.Tensor  # [hidden, shared_width]
    shared_gate: torch.Tensor  # [1, hidden]: the shared expert's sigmoid gate


def moe_weights(s: LayerShapes, device: torch.device) -> MoEWeights:
    return MoEWeights(
        norm=_norm_w(s.hidden, device),
        router=_w(s.num_experts, s.hidden, device=device),
        w13=_w(s.num_experts, 2 * s.expert_width, s.hidden, device=device),
        w2=_w(s.num_experts, s.hidden, s.expert_width, device=device),
        shared13=_w(2 * s.shared_width, s.hidden, device=device),
        shared2=_w(s.hidden, s.shared_width, device=device),
        shared_gate=_w(1, s.hidden, device=device),
    )


def moe_forward(x: torch.Tensor, w: MoEWeights, s: LayerShapes, out: torch.Tensor | None = None) -> torch.Tensor:
    """Norm, then the fused MoE (routing, routed and shared experts; calibrate/kernels/fused_moe.py),
    the residual added in its final reduction; `out=x` updates the residual stream in place."""
    h = F.rms_norm(x, (s.hidden,), w.norm, EPS)
    if not isinstance(w, MoEWeights):  # block-FP8 experts: calibrate.model.layers_fp8.Fp8MoEWeights
        return w(h, s, residual=x, out=out)
    return fused_moe(h, w.router, w.w13, w.w2, s.top_k, w.shared13, w.shared2, w.shared_gate, residual=x, out=out)


# ------------------------------------------------------------------- dense MLP
@dataclass
class MLPWeights:
    norm: torch.Tensor
    w13: torch.Tensor  # [2 * width, hidden]: gate and up (vLLM's merged column-parallel gate_up_proj)
    w2: torch.Tensor  # [hidden, width]: down (row-parallel)


def mlp_weights(s: LayerShapes, device: torch.device) -> MLPWeights:
    return MLPWeights(norm=_norm_w(s.hidden, device), w13=_w(2 * s.mlp_width, s.hidden, device=device),
                      w2=_w(s.hidden, s.mlp_width, device=device))


def mlp_forward(x: torch.Tensor, w: MLPWeights, s: LayerShapes, out: torch.Tensor | None = None) -> torch.Tensor:
    """A dense model's feed-forward block: norm, gate_up GEMM, SiLU(gate) x up, down GEMM with the residual
    added in the GEMM's epilogue (vLLM fuses the activation in one kernel, SiluAndMul; torch makes it two)."""
    gate, up = linear(F.rms_norm(x, (s.hidden,), w.norm, EPS), w.w13).chunk(2, -1)
    if not isinstance(w.w2, torch.Tensor):  # block-FP8: the residual in its own pass (vLLM's is in the next norm)
        return torch.add(x, w.w2(F.silu(gate) * up), out=out)
    return torch.addmm(x, F.silu(gate) * up, w.w2.t(), out=out)


FFNWeights = MoEWeights | MLPWeights


def ffn_weights(s: LayerShapes, device: torch.device) -> FFNWeights:
    """The block after every layer: a dense MLP's weights for a dense model, else the MoE's."""
    return mlp_weights(s, device) if s.dense else moe_weights(s, device)


def ffn_forward(x: torch.Tensor, w: FFNWeights, s: LayerShapes, out: torch.Tensor | None = None) -> torch.Tensor:
    return mlp_forward(x, w, s, out) if isinstance(w, MLPWeights) else moe_forward(x, w, s, out)


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
    y = linear(torch.cat([e, h], -1), w.fc)
    return y if s.tp == 1 else y.repeat(1, s.tp)
