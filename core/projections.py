"""The linear projections of one layer of each kind, from a model's shapes (pure Python).

One list for every count that needs one: the block-FP8 checkpoint's tensor list
(core/weight_bytes.py), the per-GPU layer weights (calibrate/model/shapes.py, which passes the head
counts and widths of one GPU) and the parameter count of an imported config
(sim/runs/model_import.py). Names are the checkpoint's module names (Qwen3.5's Hugging Face layout),
so that a caller can pick by name what a checkpoint keeps unquantised.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Projection:
    name: str
    out: int
    inp: int
    count: int = 1  # identical matrices: the routed experts' gate, up and down

    @property
    def elements(self) -> int:
        return self.out * self.inp * self.count


def gdn_projections(hidden: int, k_heads: int, v_heads: int, head_k: int, head_v: int) -> list[Projection]:
    """Gated DeltaNet: q, k, v (the conv channels) and the output gate z from the hidden state, one
    beta and one alpha per value head, the output projection back to the hidden size."""
    qk, v = k_heads * head_k, v_heads * head_v
    return [Projection("in_proj_qkv", 2 * qk + v, hidden), Projection("in_proj_z", v, hidden),
            Projection("in_proj_b", v_heads, hidden), Projection("in_proj_a", v_heads, hidden),
            Projection("out_proj", hidden, v)]


def attention_projections(hidden: int, q_heads: int, kv_heads: int, head_dim: int,
                          gated: bool) -> list[Projection]:
    """q_proj emits the query and, when gated, a same-sized output gate; then k, v and o."""
    q, kv = q_heads * head_dim, kv_heads * head_dim
    return [Projection("q_proj", q * (2 if gated else 1), hidden), Projection("k_proj", kv, hidden),
            Projection("v_proj", kv, hidden), Projection("o_proj", hidden, q)]


def mlp_projections(hidden: int, width: int, count: int = 1, prefix: str = "") -> list[Projection]:
    """A SiLU-gated MLP: gate and up to `width`, down back to the hidden size."""
    return [Projection(f"{prefix}gate_proj", width, hidden, count),
            Projection(f"{prefix}up_proj", width, hidden, count),
            Projection(f"{prefix}down_proj", hidden, width, count)]


def moe_projections(hidden: int, num_experts: int, expert_width: int, shared_width: int) -> list[Projection]:
    """The routed experts, the shared expert and its sigmoid gate when it has one, and the router
    (`mlp.gate`, one logit per expert)."""
    out = mlp_projections(hidden, expert_width, num_experts, "experts.")
    if shared_width:
        out += mlp_projections(hidden, shared_width, prefix="shared_expert.") + [
            Projection("shared_expert_gate", 1, hidden)]
    return out + [Projection("gate", num_experts, hidden)]


def elements(projections: list[Projection]) -> int:
    return sum(p.elements for p in projections)
