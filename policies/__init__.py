"""Commit policies, chosen by name from YAML (`mamba_state_commit`).

Layer: imports only `core`. `policies.kernels` (Triton) is never imported from here:
the simulator must run without torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from policies.base import CommitPolicy
from policies.none import NoSpeculation
from policies.reconstruct import Reconstruct
from policies.reconstruct_deferred import ReconstructDeferred
from policies.replay import Replay
from policies.store_all import StoreAll
from policies.tree import DraftTree

if TYPE_CHECKING:
    from core.config import ModelConfig, PolicyConfig

POLICIES: dict[str, type[CommitPolicy]] = {"store_all": StoreAll, "reconstruct": Reconstruct, "replay": Replay,
                                           "reconstruct_deferred": ReconstructDeferred, "none": NoSpeculation}


def make_policy(model: "ModelConfig", cfg: "PolicyConfig") -> CommitPolicy:
    try:
        cls = POLICIES[cfg.mamba_state_commit]
    except KeyError:
        raise ValueError(f"unknown mamba_state_commit {cfg.mamba_state_commit!r}; valid: {', '.join(POLICIES)}") from None
    return cls(model, cfg)


__all__ = ["POLICIES", "CommitPolicy", "DraftTree", "make_policy"]
