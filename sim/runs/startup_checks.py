"""What vLLM 0.17.1 refuses at start-up, and what cannot mean what the user typed: the one
check `run`, `sweep`, `plan` and `memory` all pass a configuration through before anything
runs or is written. Each rule says where vLLM has it (docs/vllm.md#startup-checks lists them).

Not here, because they depend on the memory budget and a grid sweeps it on purpose: the
weights fitting at a gmu (sim.engine.budget.memory_budget) and the pool holding one request of
max_model_len (sim.engine.pool.check_one_request_fits). `specsim run` refuses those too; a sweep
records such a point as infeasible and goes on.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from core.batch_limits import batch_limits
from core.config import (ConfigError, EngineConfig, HardwareConfig, ModelConfig, RunConfig, load_hardware, load_model,
                         load_policy)
from policies import CommitPolicy, DraftTree, make_policy
from sim.engine.acceptance import REFERENCE_ACCEPTED_LEN, REFERENCE_DEPTH, AcceptanceModel
from sim.engine.budget import block_layout, served_model
from sim.runs.speculation import resolve_speculation, speculating_model
from workloads import Workload

TP_SHOWN = 64  # tensor-parallel sizes an error lists the allowed ones up to


@dataclass(frozen=True)
class Served:
    """A run's configuration as the engine serves it, checked."""
    cfg: RunConfig  # num_speculative_tokens turned into the policy, model and tree it stands for
    model: ModelConfig  # as served: KV dtype, max_model_len, MTP layer or none
    hw: HardwareConfig | None
    policy: CommitPolicy


def serve(cfg: RunConfig, with_hardware: bool = True) -> Served:
    """`cfg` resolved and checked; `with_hardware=False` (`specsim memory` without a GPU) skips
    the rules that need the GPU's engine defaults."""
    cfg = resolve_speculation(cfg)
    policy_cfg = load_policy(cfg.policy, cfg.policy_overrides)
    model = served_model(speculating_model(load_model(cfg.model, cfg.model_overrides), policy_cfg), cfg.engine)
    hw = load_hardware(cfg.hardware) if with_hardware else None
    policy = make_policy(model, policy_cfg)
    check_serving(model, policy, cfg.engine, hw)
    return Served(cfg, model, hw, policy)


def check_serving(model: ModelConfig, policy: CommitPolicy, engine: EngineConfig, hw: HardwareConfig | None) -> None:
    check_tensor_parallel(model)
    _check_drafts(model, policy)
    _check_kernels(policy)
    if hw is not None or engine.max_num_batched_tokens is not None:
        _check_token_budget(model, policy, engine, hw)


# ------------------------------------------------------------------ tensor parallelism
def tp_problem(model: ModelConfig, tp: int) -> str:
    """Why vLLM cannot shard `model` over `tp` GPUs ('' if it can)."""
    a, g = model.attention, model.gdn
    # config/model.py ModelConfig.verify_with_parallel_config; models/qwen3_next.py Qwen3NextAttention
    if a.num_q_heads % tp:
        return f"its {a.num_q_heads} attention heads do not divide over {tp} GPUs"
    # models/qwen3_next.py Qwen3NextAttention: KV heads split, or replicated a whole number of times
    if (a.num_kv_heads % tp) if a.num_kv_heads >= tp else (tp % a.num_kv_heads):
        return f"its {a.num_kv_heads} KV heads neither divide over {tp} GPUs nor replicate evenly on them"
    # models/qwen3_next.py Qwen3NextGatedDeltaNet: divide(num_v_heads, tp) and num_k_heads // tp per GPU
    if g.num_v_heads % tp or g.num_k_heads % tp:
        return f"its GDN heads ({g.num_k_heads} key, {g.num_v_heads} value) do not divide over {tp} GPUs"
    # models/qwen3_next.py Qwen3NextSparseMoeBlock: "Tensor parallel size ... is greater than the number of experts"
    if model.moe is not None and tp > model.moe.num_experts:
        return f"it has {model.moe.num_experts} experts, fewer than {tp} GPUs"
    return ""


def check_tensor_parallel(model: ModelConfig) -> None:
    tp = model.tensor_parallel
    if problem := tp_problem(model, tp):
        allowed = [t for t in range(1, TP_SHOWN + 1) if not tp_problem(model, t)]
        raise ConfigError(f"tensor_parallel {tp}: vLLM cannot serve {model.name} on {tp} GPUs: {problem}; "
                          f"allowed: {', '.join(map(str, allowed))}")


# ---------------------------------------------------------------------------- drafts
def tree_name(tree: DraftTree) -> str:
    """A tree as the user wrote it; a long chain by its length."""
    return f"[1 x {tree.depth}] (a chain)" if tree.is_chain and tree.depth > 8 else str(tree)


def _check_drafts(model: ModelConfig, policy: CommitPolicy) -> None:
    tree, k = policy.tree, model.mtp_depth
    if tree.depth > k:
        raise ConfigError(f"policy {policy.name}: draft_tree_widths {list(tree.widths)} has depth {tree.depth}, "
                          f"but {model.name} drafts only mtp_depth = {k} tokens; allowed: depth 1 to {k} "
                          "(or num_speculative_tokens = the depth)")
    n = model.mtp_num_hidden_layers
    # config/speculative.py SpeculativeConfig.__post_init__: MTP layers are reused whole
    if k > n > 0 and k % n:
        raise ConfigError(f"num_speculative_tokens {k}: {model.name}'s {n} MTP layers run whole, so vLLM needs a "
                          f"multiple of {n} above {n}; allowed: 1 to {n} or a multiple of {n}")


def _check_kernels(policy: CommitPolicy) -> None:
    cap = policy.max_kernel_positions
    if cap is not None and policy.kernel_positions() > cap:
        replayed = policy.kernel_positions() - policy.verify_positions
        extra = f" and {replayed:,} replayed tokens" if replayed else ""
        raise ConfigError(f"draft_tree_widths {tree_name(policy.tree)}: a verify of policy {policy.name} runs over "
                          f"{policy.verify_positions:,} tree positions{extra} per request, but its kernels "
                          f"(TreeWY, policies/kernels/treewy.py) take at most {cap}; allowed: trees of at most "
                          f"{cap - 1 - replayed:,} draft nodes")


def _check_token_budget(model: ModelConfig, policy: CommitPolicy, engine: EngineConfig,
                        hw: HardwareConfig | None) -> None:
    if hw is None:  # `specsim memory` without a GPU: the limits as given
        tokens, seqs = engine.max_num_batched_tokens, engine.max_num_seqs
    else:
        tokens, seqs = batch_limits(engine, hw, model.max_model_len)
    where = "engine.max_num_batched_tokens" + ("" if engine.max_num_batched_tokens else f" ({hw.name}'s default)")
    # config/scheduler.py SchedulerConfig.verify_max_model_len (a defaulted max_num_seqs is capped first)
    if seqs is not None and seqs > tokens:
        seqs_where = "engine.max_num_seqs" + ("" if engine.max_num_seqs else f" ({hw.name}'s default)")
        raise ConfigError(f"{seqs_where} {seqs:,} is above {where} {tokens:,}: vLLM refuses a batch of more "
                          f"sequences than tokens; allowed: max_num_seqs 1 to {tokens:,}")
    # config/vllm.py VllmConfig.__post_init__: in mamba cache mode "align" a chunk is cut at whole blocks
    if engine.resolved_mamba_cache_mode == "align":
        block = block_layout(model, policy, 0, engine).attn_block_tokens
        if block > tokens:
            raise ConfigError(f"{where} {tokens:,} is below {model.name}'s attention block of {block:,} tokens: "
                              f"with prefix caching (mamba cache mode align) vLLM needs block_size <= "
                              f"max_num_batched_tokens; allowed: at least {block:,}, or "
                              "engine.enable_prefix_caching=false")
    # v1/core/sched/scheduler.py schedules a verify's drafts within the budget: a tree that never
    # fits is never verified as drafted (a chain is cut, a tree falls back to one token a step).
    if policy.verify_positions > tokens:
        raise ConfigError(f"draft_tree_widths {tree_name(policy.tree)}: one verify needs {policy.verify_positions:,} "
                          "positions of "
                          f"one request (1 + {policy.num_draft_nodes:,} draft nodes), more than {where} {tokens:,}; "
                          f"allowed: trees of at most {tokens - 1:,} draft nodes, or a larger token budget")


# ------------------------------------------------------------------------ the workload
def check_workload(served: Served, workload: Workload) -> AcceptanceModel:
    """The workload against the served engine; returns the acceptance model of the run's tree."""
    cfg, model = served.cfg, served.model
    shortest = min(r.prompt_tokens + r.output_tokens for r in workload.requests)
    if shortest > model.max_model_len:  # sim.engine.scheduler rejects prompt + output > max_model_len
        raise ConfigError(f"engine.max_model_len {model.max_model_len:,}: every request of workload {workload.name} "
                          f"is longer (prompt + output; the shortest is {shortest:,} tokens), so every one would be "
                          f"rejected; allowed: at least {shortest:,}")
    tree = served.policy.tree
    if "" not in workload.acceptance and tree.depth > REFERENCE_DEPTH:
        raise ConfigError(f"draft tree {tree_name(tree)} (num_speculative_tokens, draft_tree_widths) is {tree.depth} "
                          "deep, but "
                          f"the built-in acceptance is fitted at depth {REFERENCE_DEPTH} (accepted lengths "
                          + " and ".join(f"{n} for ({','.join(map(str, w))})" for w, n in REFERENCE_ACCEPTED_LEN.items())
                          + f", docs/design.md#draft-trees) and workload {workload.name} gives no "
                          f"rows of its own; allowed: depth 1 to {REFERENCE_DEPTH}, or a workload whose acceptance: "
                          "has a row per depth")
    return AcceptanceModel(tree.widths, cfg.seed, workload.acceptance, f"workload {workload.name} acceptance")


def label(cfg: RunConfig, others: Sequence[RunConfig]) -> str:
    """`cfg` named by the fields in which `others` differ (a grid point by its axis values)."""
    def flat(node: object, prefix: str = "") -> dict[str, object]:
        if isinstance(node, dict):
            return {k: v for key, sub in node.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): node}

    mine = flat(cfg.model_dump(mode="json"))
    dumps = [flat(o.model_dump(mode="json")) for o in others]
    varied = [k for k in mine if any(d.get(k) != mine[k] for d in dumps)]
    return " ".join(f"{k}={mine[k]}" for k in varied) or cfg.policy


def check_points(configs: Sequence[RunConfig], names: Sequence[str] | None = None) -> None:
    """Every point of a sweep or plan round through `serve` and `check_workload`, before any runs:
    the first point refused is named by `names`, or by the fields in which the points differ."""
    from workloads import load_workload

    checked: set[str] = set()
    samples: dict[str, Workload] = {}
    for i, cfg in enumerate(configs):
        sample = json.dumps([cfg.workload, cfg.num_requests, cfg.seed, cfg.workload_overrides], sort_keys=True)
        key = json.dumps([cfg.model_dump(mode="json", exclude={"client", "measure", "trace_steps"}), sample],
                         sort_keys=True)
        if key in checked:
            continue
        try:
            served = serve(cfg)
            if sample not in samples:
                samples[sample] = load_workload(cfg.workload, cfg.num_requests, cfg.seed, cfg.workload_overrides)
            check_workload(served, samples[sample])
        except ConfigError as e:
            raise ConfigError(f"{names[i] if names else 'point ' + label(cfg, configs)}: {e}") from None
        checked.add(key)
