"""The KV/state memory pool: vLLM's paged hybrid allocator, or an idealised byte-granular one.

Both count abstract units (blocks, or bytes) so the scheduler does not care which:
`attn_units(tokens)` is what a request's KV cache of that many tokens holds,
`state_units` what its GDN state (1 + the policy's speculative blocks per GDN group, plus
replay's input cache) takes once at admission. In mamba cache mode "align" a request holds one
more state block per GDN group after it crosses a block boundary, until a later schedule frees
the old state (`BoundaryRule`); vLLM's startup check counts it as always held (`boundary_units`).
`usage` is vLLM's `kv_cache_usage`: 1 - free / usable, where vLLM's block pool keeps
block 0 as the null block that no request holds.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.config import ConfigError, ModelConfig
from policies import CommitPolicy
from sim.engine.budget import BlockLayout

NULL_BLOCKS = 1  # vLLM's BlockPool reserves block 0 (the null block); usage is over the rest


@dataclass(frozen=True)
class BoundaryRule:
    """Mamba cache mode "align": the state block a request holds besides once it crosses a block
    boundary (vLLM 0.17.1 `MambaManager`, vllm/v1/core/single_type_kv_cache_manager.py).

    A request's state lives in the block of its last computed token. When a schedule takes its
    tokens (`num_computed_tokens` + the scheduled ones, no lookahead) past the end of that block,
    `allocate_new_blocks` adds one block per GDN group for the new state and keeps the old one
    (`last_state_block_idx`); a later schedule of the request frees it (`remove_skipped_blocks`,
    at the start of its `allocate_slots`) once `num_computed_tokens` less `num_speculative_blocks`
    is past the old block's end. The scheduler applies it (sim.engine.scheduler, decode_group,
    decode_run); vLLM's startup check counts the block as always held."""

    units: int  # what one crossing takes: a block (or a state's bytes) per GDN group
    block: int  # tokens per state block: the attention block
    spec: int  # vLLM's num_speculative_blocks, which its release test takes off num_computed_tokens

    def end(self, tokens: int) -> int:
        """The end of the block holding the state after `tokens` tokens."""
        return -(-tokens // self.block) * self.block

    def releases(self, computed: int, old_end: int) -> bool:
        """Whether a schedule at `computed` tokens (vLLM's num_computed_tokens) frees the old state."""
        return computed - self.spec > old_end


class Pool:
    """Free-unit counter shared by every request; `take` refuses to go below zero."""

    kind: str = ""

    def __init__(self, capacity: int, state_units: int, unit_bytes: int, boundary: BoundaryRule | None = None) -> None:
        if capacity <= 0:
            raise ValueError(f"pool capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.free = capacity
        self.state_units = state_units
        self.boundary = boundary  # align mode's state block for a crossed boundary (None: other modes)
        self.boundary_units = boundary.units if boundary is not None else 0
        self.unit_bytes = unit_bytes  # bytes per unit, for reporting

    def attn_units(self, tokens: int) -> int:
        raise NotImplementedError

    def units_for(self, tokens: int) -> int:
        """Units one request holds with `tokens` in its KV cache, state included."""
        return self.attn_units(tokens) + self.state_units

    def tokens_held(self, units: int) -> int:
        """The most tokens `units` (a `units_for` result) hold: the scheduler asks for more
        units only when a request grows past it."""
        raise NotImplementedError

    def take(self, n: int) -> None:
        if n > self.free:
            raise RuntimeError(f"pool over-allocated: asked {n}, {self.free} free of {self.capacity}")
        self.free -= n

    def give(self, n: int) -> None:
        self.free += n
        if self.free > self.capacity:
            raise RuntimeError(f"pool freed more than it holds: {self.free} free of {self.capacity}")

    @property
    def used(self) -> int:
        return self.capacity - self.free

    @property
    def usage(self) -> float:
        return 1.0 - self.free / self.capacity


class PagedPool(Pool):
    """vLLM's hybrid allocator: attention pages enlarged to the GDN page, whole blocks only."""

    kind = "paged"

    def __init__(self, layout: BlockLayout) -> None:
        super().__init__(layout.num_blocks - NULL_BLOCKS, layout.state_blocks, layout.block_bytes,
                         _rule(layout, layout.boundary_blocks))
        self.layout = layout

    def attn_units(self, tokens: int) -> int:
        return self.layout.attn_blocks(tokens)

    def tokens_held(self, units: int) -> int:
        layout = self.layout
        return (units - self.state_units) // layout.attn_groups * layout.attn_block_tokens


class IdealPool(Pool):
    """Byte-granular: a request holds exactly its KV bytes and state bytes (what alignment costs)."""

    kind = "ideal"

    def __init__(self, model: ModelConfig, layout: BlockLayout, cache_bytes: int, pool_bytes: int) -> None:
        state = model.gdn_layers * layout.gdn_page_bytes * layout.state_blocks_per_group + cache_bytes
        super().__init__(pool_bytes, state, 1, _rule(layout, model.gdn_layers * layout.gdn_page_bytes))
        self.token_bytes = model.pool_attn_layers * model.attn_page_bytes_per_token_per_gpu

    def attn_units(self, tokens: int) -> int:
        return tokens * self.token_bytes

    def tokens_held(self, units: int) -> int:
        return (units - self.state_units) // self.token_bytes


def _rule(layout: BlockLayout, units: int) -> BoundaryRule | None:
    """The layout's boundary rule, a crossing taking `units` (None outside align mode)."""
    if not layout.boundary_blocks_per_group:
        return None
    return BoundaryRule(units, layout.attn_block_tokens, layout.state_blocks_per_group - 1)


def check_one_request_fits(pool: Pool, max_model_len: int, tree: str) -> None:
    """vLLM refuses to start when its KV cache cannot hold one request of max_model_len
    tokens (`check_enough_kv_cache_memory`, docs/vllm.md#startup-checks): no request of that length
    could ever run, so the simulation would only reject them. Its footprint counts align mode's
    boundary block as held, as vLLM's `max_memory_usage_bytes` does."""
    def peak(tokens: int) -> int:
        return pool.units_for(tokens) + pool.boundary_units

    need = peak(max_model_len)
    if need <= pool.capacity:
        return
    lo, hi = 0, max_model_len  # the longest length whose footprint fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if peak(mid) <= pool.capacity else (lo, mid - 1)
    unit = "blocks" if pool.kind == "paged" else "bytes"
    longest = (f"the longest request that fits is {lo:,} tokens" if peak(lo) <= pool.capacity
               else f"its GDN state alone ({pool.state_units + pool.boundary_units:,} {unit}) does not fit")
    raise ConfigError(f"one request of max_model_len {max_model_len:,} tokens needs {need:,} {unit} of the KV and "
                      f"state pool (state {pool.state_units + pool.boundary_units:,} with tree {tree}) but the pool holds {pool.capacity:,}; "
                      f"{longest}. vLLM refuses to start here: raise engine.gmu, lower engine.max_model_len, "
                      "or draft a smaller tree")


def make_pool(kind: str, model: ModelConfig, policy: CommitPolicy, layout: BlockLayout, pool_bytes: int) -> Pool:
    if kind == "paged":
        return PagedPool(layout)
    if kind == "ideal":
        cache = policy.cache_bytes_per_seq_per_gpu() if layout.cache_blocks else 0
        return IdealPool(model, layout, cache, pool_bytes)
    raise ValueError(f"engine.allocator must be 'paged' or 'ideal', got {kind!r}")
