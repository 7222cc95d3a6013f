from __future__ import annotations

from policies.base import CommitPolicy


class StoreAll(CommitPolicy):
    """vLLM/SGLang default: one full state per verify position, persistent for the request."""

    name = "store_all"

    def spec_blocks_per_group(self) -> int:
        # vLLM sizes num_speculative_blocks by the number of draft tokens (K for a chain).
        return self.num_draft_nodes

    def commit_is_index_update(self) -> bool:
        # vLLM passes num_accepted_tokens to the next verify, which reads the accepted
        # slot's state directly; no copy is made.
        return True
