from __future__ import annotations

from typing import TYPE_CHECKING

from policies.base import CommitPolicy
from policies.tree import DraftTree

if TYPE_CHECKING:
    from core.config import ModelConfig, PolicyConfig


class NoSpeculation(CommitPolicy):
    """No speculative decoding: vLLM served without a speculative config.

    Each decode step runs one position per request and the GDN recurrence updates the
    request's single state in place, so there is nothing to commit and no draft state
    block. Its config has no draft tree (core.config_policy refuses one; a grid gives its tree
    to the speculating policies only); the served model has no MTP layer (`sim.runs.speculation`).
    """

    name = "none"

    def __init__(self, model: "ModelConfig", cfg: "PolicyConfig") -> None:
        super().__init__(model, cfg)
        self.tree = DraftTree(())

    def commit_is_index_update(self) -> bool:
        return True  # the state was written in place by the decode kernel itself
