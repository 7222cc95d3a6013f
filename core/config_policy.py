"""The commit policy's schema: which state-commit rule, the draft tree, replay's flush interval."""
from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from core.config_base import Strict

# "none": no speculative decoding (the baseline), vLLM without --speculative-config.
PolicyName = Literal["store_all", "reconstruct", "replay", "reconstruct_deferred", "none"]


class PolicyConfig(Strict):
    name: str
    mamba_state_commit: PolicyName
    draft_tree_widths: list[int] = Field(default_factory=lambda: [1, 1, 1])
    flush_interval: int = Field(4, gt=0)  # replay: steps between flushes
    # Our reconstruct kernels replay inside a CUDA graph with a fixed maximum tree;
    # false reproduces the reference implementation, where any tree ran piecewise.
    graph_capturable_tree: bool = False

    @field_validator("draft_tree_widths")
    @classmethod
    def _widths(cls, v: list[int]) -> list[int]:
        if not v or any(w < 1 for w in v):
            raise ValueError("draft_tree_widths must be a non-empty list of positive ints, e.g. [1, 1, 1]")
        return v

    @model_validator(mode="after")
    def _no_tree_without_drafts(self) -> "PolicyConfig":
        if self.mamba_state_commit == "none" and "draft_tree_widths" in self.model_fields_set:
            raise ValueError(f"policy {self.name} (mamba_state_commit none) drafts nothing, so draft_tree_widths "
                             f"{self.draft_tree_widths} cannot apply; allowed: no draft_tree_widths (no --tree), or a "
                             f"speculating policy: {', '.join(p for p in get_args(PolicyName) if p != 'none')}")
        return self
