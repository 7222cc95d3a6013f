"""Whether and how a run speculates: the no-speculation baseline and `num_speculative_tokens`.

The baseline is the policy `none`; `num_speculative_tokens: 0` (`--num-speculative-tokens 0`)
is another spelling of it. K > 0 serves the model with K MTP drafts per step (vLLM's
num_speculative_tokens) on a chain of K unless a tree is given. Without speculation
vLLM builds no drafter, so the served model has no MTP layer (mtp_depth 0): no drafter
passes, no MTP attention layer in the KV pool, no lookahead slots in the conv state.
"""
from __future__ import annotations

from core.config import ConfigError, ModelConfig, PolicyConfig, RunConfig, load_policy

NO_SPECULATION = "none"


def resolve_speculation(cfg: RunConfig) -> RunConfig:
    """`cfg` with `num_speculative_tokens` turned into the policy, model and tree it stands for."""
    k = cfg.num_speculative_tokens
    if k is None:
        return cfg
    if k == 0:
        if "policy" in cfg.model_fields_set and cfg.policy != NO_SPECULATION:
            raise ConfigError(f"num_speculative_tokens 0 is the no-speculation baseline (policy {NO_SPECULATION}); "
                              f"it cannot run with policy {cfg.policy}")
        return cfg.model_copy(update={"policy": NO_SPECULATION, "num_speculative_tokens": None})
    if cfg.policy == NO_SPECULATION:
        raise ConfigError(f"policy {NO_SPECULATION} drafts nothing; num_speculative_tokens must be 0 or unset, got {k}")
    policy_overrides = dict(cfg.policy_overrides)
    policy_overrides.setdefault("draft_tree_widths", [1] * k)
    return cfg.model_copy(update={"model_overrides": {**cfg.model_overrides, "mtp_depth": k},
                                  "policy_overrides": policy_overrides, "num_speculative_tokens": None})


def speculating_model(model: ModelConfig, policy: PolicyConfig) -> ModelConfig:
    """The model as vLLM serves it under this policy: without an MTP drafter for `none`."""
    if policy.mamba_state_commit == NO_SPECULATION and model.mtp_depth:
        return model.model_copy(update={"mtp_depth": 0})
    return model


def speculates(policy: str) -> bool:
    """Whether the policy of this name (or YAML path) drafts at all."""
    return load_policy(policy).mamba_state_commit != NO_SPECULATION
