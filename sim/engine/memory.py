"""Per-sequence memory facts of a model under a commit policy, and the pool vLLM builds (`specsim memory`)."""
from __future__ import annotations

from typing import Any

from core.config import EngineConfig, GiB, HardwareConfig, ModelConfig
from policies import CommitPolicy
from sim.engine.budget import BlockLayout, MemoryBudget, block_layout, memory_budget, vllm_log_lines
from sim.engine.vllm_version import CURRENT, kv_cache_size_tokens

CONTEXT_32K = 32768  # tokens: the context docs/design.md's KV fact is stated at


def memory_facts(model: ModelConfig, policy: CommitPolicy) -> dict[str, Any]:
    """Model-wide byte counts (all TP ranks together), as docs/design.md#the-commit-policies states them."""
    return {
        "model": model.name,
        "policy": policy.name,
        "tree": str(policy.tree),
        "mamba_ssm_dtype": model.mamba_ssm_dtype,
        "gdn_layers": model.gdn_layers,
        "attn_layers": model.attn_layers,
        "gdn_state_bytes_per_seq": model.gdn_layers * model.gdn_state_bytes_per_layer,
        "conv_state_bytes_per_seq": model.gdn_layers * model.conv_state_bytes_per_layer(),
        "spec_state_bytes_per_seq": policy.spec_state_bytes_per_seq(),
        "kv_bytes_per_token": model.kv_bytes_per_token,
        "kv_bytes_per_seq_32k": model.kv_bytes_per_token * CONTEXT_32K,
        "state_blocks_per_group": policy.state_blocks_per_group(),
        "transient_bytes_per_step_per_seq": policy.transient_bytes_per_step_per_seq(),
        "cache_bytes_per_seq_per_gpu": policy.cache_bytes_per_seq_per_gpu(),
    }


def layout_facts(model: ModelConfig, layout: BlockLayout, pool_bytes: int, vllm_version: str = CURRENT) -> dict[str, Any]:
    """The per-GPU block geometry, under the names vLLM's log lines give them (as `vllm_version` prints them)."""
    concurrency = layout.max_concurrency(model.max_model_len)
    return {
        "attention_block_size": layout.attn_block_tokens,
        "mamba_page_padding_pct": round(layout.mamba_page_padding_pct, 4),
        "num_blocks": layout.num_blocks,
        "gpu_kv_cache_tokens": kv_cache_size_tokens(layout.num_blocks, layout.num_groups, layout.attn_block_tokens,
                                                    concurrency, model.max_model_len, vllm_version),
        "max_model_len": model.max_model_len,
        "max_concurrency": round(layout.max_concurrency(model.max_model_len), 4),
        "available_kv_cache_gib": round(pool_bytes / GiB, 4),
        "kv_cache_groups": layout.num_groups,
        "layers_per_group": layout.group_layers,
        "pool_attn_layers": model.pool_attn_layers,
        "padding_layers": layout.attn_padding_layers + layout.gdn_padding_layers,
        "gdn_page_bytes": layout.gdn_page_bytes,
        "page_bytes": layout.page_bytes,
        "block_bytes": layout.block_bytes,
        "state_blocks_per_group": layout.state_blocks_per_group,
        "cache_blocks_per_request": layout.cache_blocks,
    }


def pool_facts(model: ModelConfig, hw: HardwareConfig | None, engine: EngineConfig, policy: CommitPolicy,
               kv_cache_memory_bytes: int | None = None, vllm_version: str = CURRENT) -> tuple[dict[str, Any], list[str]]:
    """The per-GPU pool and block geometry, and vLLM's log lines for it.

    `model` is the served model (`sim.engine.budget.served_model`). With no hardware the
    available KV memory must be given (`kv_cache_memory_bytes`).
    """
    budget: MemoryBudget | None = None
    if hw is not None:
        budget = memory_budget(model, hw, engine, kv_cache_memory_bytes)
        pool = budget.pool_bytes
    elif kv_cache_memory_bytes is not None:
        pool = kv_cache_memory_bytes
    else:
        raise ValueError("pool_facts needs the hardware or the available KV cache memory")
    layout = block_layout(model, policy, pool, engine)
    facts = {"mamba_cache_mode": engine.resolved_mamba_cache_mode, "kv_cache_dtype": engine.kv_cache_dtype,
             "tensor_parallel": model.tensor_parallel, "num_speculative_tokens": model.mtp_depth,
             "vllm_version": vllm_version, **layout_facts(model, layout, pool, vllm_version)}
    if budget is not None:
        facts.update({f"budget_{k}": v for k, v in budget.as_dict().items()})
    return facts, vllm_log_lines(layout, model, pool, vllm_version)
