"""The interface every commit policy implements: memory and cost accounting, no torch."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

from policies.tree import DraftTree

if TYPE_CHECKING:
    import numpy as np

    from core.config import ModelConfig, PolicyConfig

# Verify positions of one request (replayed history included) the TreeWY kernels take: their
# ancestor mask is one [BT, BT] tile per tree (policies/kernels/treewy.py).
TREEWY_MAX_POSITIONS = 128


class RequestCommitState(Protocol):
    """A policy's per-request bookkeeping, kept by the engine beside the request."""

    def verify_work(self) -> tuple[int, bool]:
        """(cached tokens this verify replays before the tree, whether its commit writes the state back)."""
        ...

    def committed(self, accepted_tokens: int) -> None:
        """A verify completed, accepting this many tokens (bonus included)."""
        ...

    def reset(self) -> None:
        """The request was preempted: its state is recomputed from scratch."""
        ...


class RequestStates(Protocol):
    """A policy's per-request bookkeeping for many requests at once, as arrays with one entry per
    request (the engine's decode group): the rules of RequestCommitState, over the arrays."""

    def add(self, states: Sequence[RequestCommitState]) -> None:
        """Append these requests' states."""
        ...

    def remove(self, keep: "np.ndarray", leaving: Sequence[tuple[int, RequestCommitState]]) -> None:
        """Hand the entries `leaving` lists back to their requests' states; keep those `keep` marks."""
        ...

    def verify_work(self) -> tuple["np.ndarray", "np.ndarray"]:
        """Every entry's (cached tokens replayed, whether its commit writes the state back)."""
        ...

    def committed(self, accepted_tokens: "np.ndarray") -> None:
        """A verify of every entry completed, accepting these tokens (bonus included)."""
        ...

    def work_ahead(self, committed: "np.ndarray") -> tuple["np.ndarray", "np.ndarray"]:
        """`verify_work` of every entry's next K verifies when the k-th commits `committed[:, k]`:
        arrays of one row per entry and K + 1 columns."""
        ...

    def fast_forward(self, verifies: int, tokens: "np.ndarray") -> None:
        """Every entry `verifies` commits later, replaying `tokens` then (`work_ahead`'s last column)."""
        ...


class CommitPolicy:
    """How a GDN state-commit policy spends memory and which kernels it runs.

    Byte counts without a `_per_gpu` suffix are model-wide (all tensor-parallel
    ranks together), matching docs/design.md#the-commit-policies.
    """

    name: ClassVar[str]
    # The most `kernel_positions` its verify kernels take; None: no limit of their own.
    max_kernel_positions: ClassVar[int | None] = None

    def __init__(self, model: "ModelConfig", cfg: "PolicyConfig") -> None:
        self.model = model
        self.cfg = cfg
        self.tree = DraftTree(tuple(cfg.draft_tree_widths))

    # -- speculative shape
    @property
    def num_draft_nodes(self) -> int:
        return self.tree.num_nodes

    @property
    def verify_positions(self) -> int:
        return self.tree.verify_positions

    def kernel_positions(self) -> int:
        """Positions per request the verify kernels run over: the tree's, and what they replay."""
        return self.verify_positions

    # -- persistent GDN state
    def spec_blocks_per_group(self) -> int:
        """vLLM's num_speculative_blocks: extra state blocks per GDN group at admission."""
        return 0

    def state_blocks_per_group(self) -> int:
        """State blocks a request holds in each GDN group (each block holds one state page per layer
        of the group): 1 + the speculative ones. In vLLM's mamba cache mode "align" (prefix caching
        on) it holds one more from the step that takes it past a block boundary until its next
        schedule frees the old state (`MambaManager.allocate_new_blocks`, `remove_skipped_blocks`,
        vllm/v1/core/single_type_kv_cache_manager.py), which vLLM's memory check and concurrency
        report count as always held (`MambaSpec.max_memory_usage_bytes`): BlockLayout keeps both."""
        return 1 + self.spec_blocks_per_group()

    def spec_state_bytes_per_seq(self) -> int:
        """All full GDN states the policy keeps per running sequence (all GDN layers)."""
        return self.state_blocks_per_group() * self.model.gdn_layers * self.model.gdn_state_bytes_per_layer

    def cache_bytes_per_seq_per_gpu(self) -> int:
        """Persistent bytes outside state pages (replay's input cache); 0 by default."""
        return 0

    # -- per-step work
    def transient_bytes_per_step_per_seq(self) -> int:
        """Scratch a verify step needs per sequence beyond the persistent pages (all layers)."""
        return 0

    def request_state(self) -> "RequestCommitState | None":
        """What the policy tracks per request between verify steps (replay's input cache);
        None when a verify's work depends on nothing from earlier steps."""
        return None

    def request_states(self) -> "RequestStates | None":
        """`request_state` for many requests at once, as arrays (None where that is None)."""
        return None

    def commit_is_index_update(self) -> bool:
        """True when commit moves no state: the next verify reads the accepted slot in place."""
        return False

    def forces_eager(self) -> bool:
        """A real tree (any width > 1) broke CUDA-graph capture in the reference."""
        return not self.tree.is_chain

    @property
    def kernel(self) -> str:
        """Name of this policy's verify/commit entries in the calibration tables."""
        return self.name

