"""Weight bytes of a block-FP8 checkpoint, from its tensor list (docs/fp8.md).

The FP8 checkpoints (`quant_method: fp8`, `fmt: e4m3`, `weight_block_size: [128, 128]`)
store every linear projection whose two sides are multiples of 128 as float8_e4m3 with one
inverse scale per 128 x 128 block, and keep the rest in the unquantised dtype: embeddings,
LM head, norms, the router, the shared-expert gate, GDN's a/b projections, conv1d, A_log and
dt_bias. vLLM allocates the block scales as float32 (`weight_scale_inv`). So a checkpoint's
bytes are the unquantised bytes of all parameters less one byte for every quantised element,
plus the scales. The projections themselves are core/projections.py's.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from core.projections import (Projection, attention_projections, elements, gdn_projections, mlp_projections,
                              moe_projections)

ModelConfig = Any  # core.config_model.ModelConfig, which imports this module

FP8_BLOCK = 128  # weight_block_size: [128, 128]
SCALE_BYTES = 4  # vLLM's weight_scale_inv parameter: float32
FP8_BYTES = 1
# The checkpoints' modules_to_not_convert among the projections: GDN's beta and alpha, the router,
# the shared-expert gate (the router's 256 x 2,048 would otherwise pass the block rule).
KEPT_BF16 = frozenset({"in_proj_a", "in_proj_b", "gate", "shared_expert_gate"})


def _quantised(projections: list[Projection]) -> list[Projection]:
    return [p for p in projections
            if p.name not in KEPT_BF16 and p.out % FP8_BLOCK == 0 and p.inp % FP8_BLOCK == 0]


def gdn_quantised(m: ModelConfig) -> list[Projection]:
    """One GDN layer's block-FP8 projections: in_proj_qkv, in_proj_z, out_proj."""
    g = m.gdn
    return _quantised(gdn_projections(m.hidden_size, g.num_k_heads, g.num_v_heads, g.head_k_dim, g.head_v_dim))


def attn_quantised(m: ModelConfig) -> list[Projection]:
    """q_proj (query and its output gate when gated), k_proj, v_proj, o_proj."""
    a = m.attention
    return _quantised(attention_projections(m.hidden_size, a.num_q_heads, a.num_kv_heads, a.head_dim, a.gated))


def ffn_quantised(m: ModelConfig) -> list[Projection]:
    """Every expert's gate, up and down (routed and shared), or the dense MLP's."""
    if m.moe is None:
        return _quantised(mlp_projections(m.hidden_size, m.mlp.intermediate_size))
    e = m.moe
    return _quantised(moe_projections(m.hidden_size, e.num_experts, e.expert_width, e.shared_width))


def quantised_projections(m: ModelConfig) -> list[Projection]:
    """Every block-FP8 projection of the model, each `count` the copies of it in the model, the MTP
    layer's included (one attention layer and one feed-forward block per MTP hidden layer)."""
    attn_layers = m.attn_layers + m.mtp_num_hidden_layers
    per_kind = ((gdn_quantised(m), m.gdn_layers), (attn_quantised(m), attn_layers),
                (ffn_quantised(m), m.gdn_layers + attn_layers))
    return [replace(p, count=p.count * layers) for kind, layers in per_kind for p in kind]


def block_scales(projections: list[Projection]) -> int:
    return sum(math.ceil(p.out / FP8_BLOCK) * math.ceil(p.inp / FP8_BLOCK) * p.count for p in projections)


def fp8_weight_bytes(m: ModelConfig) -> int:
    """All weights of a block-FP8 checkpoint, model-wide: total_params at the unquantised
    dtype, one byte less per quantised element, plus the float32 block scales."""
    q = quantised_projections(m)
    return math.ceil(m.total_params * m.weight_dtype_bytes - elements(q) * (m.weight_dtype_bytes - FP8_BYTES)
                     + block_scales(q) * SCALE_BYTES)
