"""Per-sequence memory facts of a model under a commit policy (`specsim memory`)."""
from __future__ import annotations

from typing import Any

from core.config import EngineConfig, HardwareConfig, ModelConfig
from policies import CommitPolicy
from sim.budget import block_layout, memory_budget

CONTEXT_32K = 32768  # tokens: the context DESIGN.md's KV fact is stated at


def memory_facts(model: ModelConfig, policy: CommitPolicy) -> dict[str, Any]:
    """Model-wide byte counts (all TP ranks together), as DESIGN.md section 3 states them."""
    return {
        "model": model.name,
        "policy": policy.name,
        "tree": str(policy.tree),
        "gdn_layers": model.gdn_layers,
        "attn_layers": model.attn_layers,
        "gdn_state_bytes_per_seq": model.gdn_layers * model.gdn_state_bytes_per_layer,
        "conv_state_bytes_per_seq": model.gdn_layers * model.conv_state_bytes_per_layer(),
        "spec_state_bytes_per_seq": policy.spec_state_bytes_per_seq(),
        "kv_bytes_per_token": model.kv_bytes_per_token,
        "kv_bytes_per_seq_32k": model.kv_bytes_per_token * CONTEXT_32K,
        "state_blocks_per_layer": policy.state_blocks_per_layer(),
        "transient_bytes_per_step_per_seq": policy.transient_bytes_per_step_per_seq(),
        "cache_bytes_per_seq_per_gpu": policy.cache_bytes_per_seq_per_gpu(),
    }


def pool_facts(model: ModelConfig, hw: HardwareConfig, engine: EngineConfig, policy: CommitPolicy) -> dict[str, Any]:
    """The per-GPU pool and block geometry at this gmu."""
    budget = memory_budget(model, hw, engine)
    layout = block_layout(model, policy, budget.pool_bytes)
    return {
        **{f"budget_{k}": v for k, v in budget.as_dict().items()},
        "block_bytes": layout.block_bytes,
        "page_bytes": layout.page_bytes,
        "attn_block_tokens": layout.attn_block_tokens,
        "num_blocks": layout.num_blocks,
        "state_blocks_per_request": layout.state_blocks,
    }
