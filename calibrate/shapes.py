"""Per-GPU layer shapes of a model under tensor parallelism (pure Python, no torch).

vLLM's sharding: attention and GDN heads split across ranks (KV heads replicated when
TP exceeds them), every expert on every rank with its intermediate width split by TP
(no expert parallelism by default), a dense MLP's intermediate width split by TP, the
LM head split over the vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.config import ModelConfig
from core.projections import (Projection, attention_projections, elements, gdn_projections, mlp_projections,
                              moe_projections)


@dataclass(frozen=True)
class LayerShapes:
    model: str
    tp: int
    hidden: int
    # GDN, per GPU
    gdn_k_heads: int
    gdn_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    # attention, per GPU
    q_heads: int
    kv_heads: int
    head_dim: int
    # MoE, per GPU (all 0 for a dense model)
    num_experts: int
    top_k: int
    expert_width: int  # each expert's intermediate width on this GPU
    shared_width: int  # shared expert(s) intermediate width on this GPU
    vocab: int  # LM-head rows on this GPU
    # layer counts of the whole model
    gdn_layers: int
    attn_layers: int
    mtp_depth: int
    mlp_width: int = 0  # a dense model's MLP intermediate width on this GPU (0: the MoE above)
    rotary_fraction: float = 0.25  # partial RoPE: the fraction of each head's channels it turns
    gated: bool = True  # attention's q_proj also emits an output gate

    @classmethod
    def from_model(cls, m: ModelConfig) -> "LayerShapes":
        tp = m.tensor_parallel
        g, a, e = m.gdn, m.attention, m.moe
        widths = (("moe.expert_width", e.expert_width), ("moe.shared_width", e.shared_width)) if e else \
            (("mlp.intermediate_size", m.mlp.intermediate_size),)
        for what, n in (("gdn.num_k_heads", g.num_k_heads), ("gdn.num_v_heads", g.num_v_heads),
                        ("attention.num_q_heads", a.num_q_heads), *widths):
            if n % tp:
                raise ValueError(f"{m.name}: {what} ({n}) is not divisible by tensor_parallel ({tp})")
        return cls(
            model=m.name, tp=tp, hidden=m.hidden_size,
            gdn_k_heads=g.num_k_heads // tp, gdn_v_heads=g.num_v_heads // tp,
            head_k_dim=g.head_k_dim, head_v_dim=g.head_v_dim, conv_kernel=g.conv_kernel,
            q_heads=a.num_q_heads // tp, kv_heads=m.kv_heads_per_gpu, head_dim=a.head_dim,
            num_experts=e.num_experts if e else 0, top_k=e.top_k if e else 0,
            expert_width=e.expert_width // tp if e else 0, shared_width=e.shared_width // tp if e else 0,
            vocab=-(-m.vocab_size // tp),
            gdn_layers=m.gdn_layers, attn_layers=m.attn_layers, mtp_depth=m.mtp_depth,
            mlp_width=m.mlp.intermediate_size // tp if m.mlp else 0, rotary_fraction=a.partial_rotary_factor,
            gated=a.gated,
        )

    # -- one layer's projections on this GPU (core/projections.py)
    @property
    def gdn_projections(self) -> list[Projection]:
        return gdn_projections(self.hidden, self.gdn_k_heads, self.gdn_v_heads, self.head_k_dim, self.head_v_dim)

    @property
    def attn_projections(self) -> list[Projection]:
        return attention_projections(self.hidden, self.q_heads, self.kv_heads, self.head_dim, self.gated)

    # -- GDN
    @property
    def gdn_qk_channels(self) -> int:
        return self.gdn_k_heads * self.head_k_dim

    @property
    def gdn_v_channels(self) -> int:
        return self.gdn_v_heads * self.head_v_dim

    @property
    def gdn_conv_channels(self) -> int:
        return 2 * self.gdn_qk_channels + self.gdn_v_channels

    @property
    def gdn_in_features(self) -> int:
        """in_proj outputs: q, k, v (conv channels), the output gate z, then b and a per v-head."""
        return sum(p.out for p in self.gdn_projections if p.name.startswith("in_proj"))

    # -- attention
    @property
    def qkv_features(self) -> int:
        """q_proj's query (and, gated, a same-sized gate), then k and v."""
        return sum(p.out for p in self.attn_projections if p.name != "o_proj")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rotary_fraction)

    @property
    def dense(self) -> bool:
        """A dense MLP after every layer in place of the MoE."""
        return self.mlp_width > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """One attention layer's K and V for one token on this GPU (bf16)."""
        return 2 * self.kv_heads * self.head_dim * 2

    @property
    def gdn_state_bytes(self) -> int:
        """One GDN layer's recurrent state for one sequence on this GPU (bf16)."""
        return self.gdn_v_heads * self.head_v_dim * self.head_k_dim * 2

    # -- weight bytes per layer on this GPU (bf16), for L2 rotation and roofline counts
    @property
    def gdn_weight_bytes(self) -> int:
        return 2 * (elements(self.gdn_projections) + self.gdn_conv_channels * self.conv_kernel)

    @property
    def attn_weight_bytes(self) -> int:
        return 2 * elements(self.attn_projections)

    @property
    def moe_weight_bytes(self) -> int:
        """Routed and shared experts, the shared expert's gate and the router."""
        return 2 * elements(moe_projections(self.hidden, self.num_experts, self.expert_width, self.shared_width))

    @property
    def mlp_weight_bytes(self) -> int:
        return 2 * elements(mlp_projections(self.hidden, self.mlp_width))

    @property
    def ffn_weight_bytes(self) -> int:
        """The feed-forward block's weights: the dense MLP's or the MoE's."""
        return self.mlp_weight_bytes if self.dense else self.moe_weight_bytes

    @property
    def lm_head_weight_bytes(self) -> int:
        return 2 * self.vocab * self.hidden

    @property
    def mtp_fc_weight_bytes(self) -> int:
        return 2 * 2 * self.hidden * self.hidden // self.tp
