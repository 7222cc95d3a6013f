"""The KV/state memory pool: vLLM's paged hybrid allocator, or an idealised byte-granular one.

Both count abstract units (blocks, or bytes) so the scheduler does not care which:
`attn_units(tokens)` is what a request's KV cache of that many tokens holds,
`state_units` what its GDN state (1 + the policy's speculative blocks per GDN group, one
more in mamba cache mode "align", plus replay's input cache) takes once at admission.
`usage` is vLLM's `kv_cache_usage`: 1 - free / usable, where vLLM's block pool keeps
block 0 as the null block that no request holds.
"""
from __future__ import annotations

from core.config import ConfigError, ModelConfig
from policies import CommitPolicy
from sim.engine.budget import BlockLayout

NULL_BLOCKS = 1  # vLLM's BlockPool reserves block 0 (the null block); usage is over the rest


class Pool:
    """Free-unit counter shared by every request; `take` refuses to go below zero."""

    kind: str = ""

    def __init__(self, capacity: int, state_units: int, unit_bytes: int) -> None:
        if capacity <= 0:
            raise ValueError(f"pool capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.free = capacity
        self.state_units = state_units
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
        super().__init__(layout.num_blocks - NULL_BLOCKS, layout.state_blocks, layout.block_bytes)
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
        super().__init__(pool_bytes, state, 1)
        self.token_bytes = model.pool_attn_layers * model.attn_page_bytes_per_token_per_gpu

    def attn_units(self, tokens: int) -> int:
        return tokens * self.token_bytes

    def tokens_held(self, units: int) -> int:
        return (units - self.state_units) // self.token_bytes


def check_one_request_fits(pool: Pool, max_model_len: int, tree: str) -> None:
    """vLLM refuses to start when its KV cache cannot hold one request of max_model_len
    tokens (`check_enough_kv_cache_memory`, docs/vllm.md#startup-checks): no request of that length
    could ever run, so the simulation would only reject them."""
    need = pool.units_for(max_model_len)
    if need <= pool.capacity:
        return
    lo, hi = 0, max_model_len  # the longest length whose footprint fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if pool.units_for(mid) <= pool.capacity else (lo, mid - 1)
    unit = "blocks" if pool.kind == "paged" else "bytes"
    longest = (f"the longest request that fits is {lo:,} tokens" if pool.units_for(lo) <= pool.capacity
               else f"its GDN state alone ({pool.state_units:,} {unit}) does not fit")
    raise ConfigError(f"one request of max_model_len {max_model_len:,} tokens needs {need:,} {unit} of the KV and "
                      f"state pool (state {pool.state_units:,} with tree {tree}) but the pool holds {pool.capacity:,}; "
                      f"{longest}. vLLM refuses to start here: raise engine.gmu, lower engine.max_model_len, "
                      "or draft a smaller tree")


def make_pool(kind: str, model: ModelConfig, policy: CommitPolicy, layout: BlockLayout, pool_bytes: int) -> Pool:
    if kind == "paged":
        return PagedPool(layout)
    if kind == "ideal":
        cache = policy.cache_bytes_per_seq_per_gpu() if layout.cache_blocks else 0
        return IdealPool(model, layout, cache, pool_bytes)
    raise ValueError(f"engine.allocator must be 'paged' or 'ideal', got {kind!r}")
