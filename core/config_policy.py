"""The commit policy's schema: which state-commit rule, the draft tree, replay's flush interval."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

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
