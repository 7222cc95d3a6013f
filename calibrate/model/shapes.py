"""Per-GPU layer shapes of a model under tensor parallelism (pure Python, no torch).

vLLM's sharding: attention and GDN heads split across ranks (KV heads replicated when
TP exceeds them), every expert on every rank with its intermediate width split by TP
(no expert parallelism by default), a dense MLP's intermediate width split by TP, the
LM head split over the vocabulary. A block-FP8 checkpoint (`weights: fp8`) names the projections it
stores in FP8 (core/weight_bytes.py's rule, applied to the whole model's shapes); each GPU's shard of
one must still be whole 128 x 128 blocks, as vLLM's loader requires.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.config import ModelConfig
from core.projections import (Projection, attention_projections, elements, gdn_projections, mlp_projections,
                              moe_projections)
from core.weight_bytes import (FP8_BLOCK, FP8_BYTES, SCALE_BYTES, attn_quantised, block_scales, ffn_quantised,
                               gdn_quantised)


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
    fp8_projections: frozenset[str] = frozenset()  # the block-FP8 projections' names (none: a bf16 checkpoint)

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
        fp8 = frozenset(p.name for p in gdn_quantised(m) + attn_quantised(m) + ffn_quantised(m)) \
            if m.weights == "fp8" else frozenset()
        s = cls(
            model=m.name, tp=tp, hidden=m.hidden_size,
            gdn_k_heads=g.num_k_heads // tp, gdn_v_heads=g.num_v_heads // tp,
            head_k_dim=g.head_k_dim, head_v_dim=g.head_v_dim, conv_kernel=g.conv_kernel,
            q_heads=a.num_q_heads // tp, kv_heads=m.kv_heads_per_gpu, head_dim=a.head_dim,
            num_experts=e.num_experts if e else 0, top_k=e.top_k if e else 0,
            expert_width=e.expert_width // tp if e else 0, shared_width=e.shared_width // tp if e else 0,
            vocab=-(-m.vocab_size // tp),
            gdn_layers=m.gdn_layers, attn_layers=m.attn_layers, mtp_depth=m.mtp_depth,
            mlp_width=m.mlp.intermediate_size // tp if m.mlp else 0, rotary_fraction=a.partial_rotary_factor,
            gated=a.gated, fp8_projections=fp8,
        )
        projections = s.gdn_projections + s.attn_projections + s.ffn_projections
        uneven = [p.name for p in projections if p.name in fp8 and (p.out % FP8_BLOCK or p.inp % FP8_BLOCK)]
        if uneven:
            raise ValueError(f"{m.name}: block-FP8 projections {uneven} are not whole {FP8_BLOCK} x {FP8_BLOCK} "
                             f"blocks on each of {tp} GPUs")
        return s

    # -- one layer's projections on this GPU (core/projections.py)
    @property
    def gdn_projections(self) -> list[Projection]:
        return gdn_projections(self.hidden, self.gdn_k_heads, self.gdn_v_heads, self.head_k_dim, self.head_v_dim)

    @property
    def attn_projections(self) -> list[Projection]:
        return attention_projections(self.hidden, self.q_heads, self.kv_heads, self.head_dim, self.gated)

    @property
    def ffn_projections(self) -> list[Projection]:
        if self.dense:
            return mlp_projections(self.hidden, self.mlp_width)
        return moe_projections(self.hidden, self.num_experts, self.expert_width, self.shared_width)

    @property
    def fp8(self) -> bool:
        return bool(self.fp8_projections)

    def weight_bytes(self, projections: list[Projection]) -> int:
        """bf16: two bytes an element; block-FP8: one, plus a float32 scale per 128 x 128 block."""
        fp8 = [p for p in projections if p.name in self.fp8_projections]
        return 2 * (elements(projections) - elements(fp8)) + FP8_BYTES * elements(fp8) + SCALE_BYTES * block_scales(fp8)

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

    # -- weight bytes per layer on this GPU (bf16, or the checkpoint's block-FP8 with its scales), for L2
    # rotation and roofline counts
    @property
    def gdn_weight_bytes(self) -> int:
        return self.weight_bytes(self.gdn_projections) + 2 * self.gdn_conv_channels * self.conv_kernel

    @property
    def attn_weight_bytes(self) -> int:
        return self.weight_bytes(self.attn_projections)

    @property
    def moe_weight_bytes(self) -> int:
        """Routed and shared experts, the shared expert's gate and the router."""
        return self.weight_bytes(moe_projections(self.hidden, self.num_experts, self.expert_width, self.shared_width))

    @property
    def expert_weight_bytes(self) -> int:
        """One routed expert's gate, up and down."""
        return self.weight_bytes(mlp_projections(self.hidden, self.expert_width, prefix="experts."))

    @property
    def mlp_weight_bytes(self) -> int:
        return self.weight_bytes(mlp_projections(self.hidden, self.mlp_width))

    @property
    def ffn_weight_bytes(self) -> int:
        """The feed-forward block's weights: the dense MLP's or the MoE's."""
        return self.mlp_weight_bytes if self.dense else self.moe_weight_bytes

    @property
    def lm_head_weight_bytes(self) -> int:
        return 2 * self.vocab * self.hidden  # bf16 in the FP8 checkpoints too

    @property
    def mtp_fc_weight_bytes(self) -> int:
        return 2 * 2 * self.hidden * self.hidden // self.tp  # core/weight_bytes.py counts mtp.fc as bf16
