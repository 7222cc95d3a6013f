"""Weight bytes of a block-FP8 checkpoint, from its tensor list (docs/fp8.md).

The FP8 checkpoints (`quant_method: fp8`, `fmt: e4m3`, `weight_block_size: [128, 128]`)
store every linear projection whose two sides are multiples of 128 as float8_e4m3 with one
inverse scale per 128 x 128 block, and keep the rest in the unquantised dtype: embeddings,
LM head, norms, the router, the shared-expert gate, GDN's a/b projections, conv1d, A_log and
dt_bias. vLLM allocates the block scales as float32 (`weight_scale_inv`). So a checkpoint's
bytes are the unquantised bytes of all parameters less one byte for every quantised element,
plus the scales; this module lists the quantised projections of one layer of each kind.
"""
from __future__ import annotations

import math
from typing import Any

ModelConfig = Any  # core.config_model.ModelConfig, which imports this module

FP8_BLOCK = 128  # weight_block_size: [128, 128]
SCALE_BYTES = 4  # vLLM's weight_scale_inv parameter: float32
FP8_BYTES = 1


def _gdn_projections(m: ModelConfig) -> list[tuple[int, int]]:
    """(out, in) of one GDN layer's quantised projections: in_proj_qkv, in_proj_z, out_proj."""
    g, h = m.gdn, m.hidden_size
    qkv = 2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim
    value = g.num_v_heads * g.head_v_dim
    return [(qkv, h), (value, h), (h, value)]


def _attn_projections(m: ModelConfig) -> list[tuple[int, int]]:
    """q_proj (query and its output gate when gated), k_proj, v_proj, o_proj."""
    a, h = m.attention, m.hidden_size
    q = a.num_q_heads * a.head_dim
    kv = a.num_kv_heads * a.head_dim
    return [(q * (2 if a.gated else 1), h), (kv, h), (kv, h), (h, q)]


def _ffn_projections(m: ModelConfig) -> list[tuple[int, int]]:
    """Every expert's gate, up and down (routed and shared), or the dense MLP's."""
    h = m.hidden_size
    if m.moe is None:
        i = m.mlp.intermediate_size
        return [(i, h), (i, h), (h, i)]
    e = m.moe
    routed = [(e.expert_width, h), (e.expert_width, h), (h, e.expert_width)] * e.num_experts
    sw = e.shared_width
    shared = [(sw, h), (sw, h), (h, sw)] if sw else []
    return routed + shared


def quantised_projections(m: ModelConfig) -> list[tuple[int, int]]:
    """(out, in) of every block-FP8 projection of the model, the MTP layer's included
    (one attention layer and one feed-forward block per MTP hidden layer)."""
    per_attn = _attn_projections(m) + _ffn_projections(m)
    per_gdn = _gdn_projections(m) + _ffn_projections(m)
    out = per_gdn * m.gdn_layers + per_attn * (m.attn_layers + m.mtp_num_hidden_layers)
    return [(o, i) for o, i in out if o % FP8_BLOCK == 0 and i % FP8_BLOCK == 0]


def fp8_weight_bytes(m: ModelConfig) -> int:
    """All weights of a block-FP8 checkpoint, model-wide: total_params at the unquantised
    dtype, one byte less per quantised element, plus the float32 block scales."""
    projections = quantised_projections(m)
    elements = sum(o * i for o, i in projections)
    scales = sum(math.ceil(o / FP8_BLOCK) * math.ceil(i / FP8_BLOCK) for o, i in projections)
    return math.ceil(m.total_params * m.weight_dtype_bytes - elements * (m.weight_dtype_bytes - FP8_BYTES)
                     + scales * SCALE_BYTES)
