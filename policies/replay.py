from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policies.base import TREEWY_MAX_POSITIONS, CommitPolicy


def cache_slots(flush_interval: int, max_path: int) -> int:
    """Tokens a replay cache holds per sequence: the accepted paths (at most `max_path`
    tokens each) of the flush_interval - 1 commits between flushes; the flushing commit
    folds its own path in at once and caches nothing. The one definition: the kernels
    allocate this many slots (policies.kernels.replay, .conv), the memory model charges
    them and the latency model runs the verify over them."""
    return (flush_interval - 1) * max_path


class Replay(CommitPolicy):
    """ReplaySSM: one older state + cached inputs of accepted tokens, flushed every m steps."""

    name = "replay"
    max_kernel_positions = TREEWY_MAX_POSITIONS

    @property
    def flush_interval(self) -> int:
        return self.cfg.flush_interval

    def cached_input_bytes_per_token_per_layer(self) -> int:
        """What one cached token keeps, as the kernels allocate it: k (bf16, per q/k head) and
        v (bf16, per v head) for the state, g and beta (float32, per v head), and the conv's
        input row (every conv channel, in the model's dtype) to rebuild the conv window."""
        g = self.model.gdn
        conv_channels = 2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim
        return (2 * (g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim) + 2 * 4 * g.num_v_heads
                + conv_channels * self.model.conv_dtype_bytes)

    def cache_slots(self) -> int:
        """Cache slots per sequence; the verify kernel runs over all of them every step, however
        many hold tokens (its shapes are fixed for CUDA graphs)."""
        return cache_slots(self.flush_interval, self.tree.depth + 1)

    def kernel_positions(self) -> int:
        return self.cache_slots() + self.verify_positions

    def cache_bytes_per_seq_per_gpu(self) -> int:
        per_layer = self.cached_input_bytes_per_token_per_layer() // self.model.tensor_parallel
        return self.model.gdn_layers * self.cache_slots() * per_layer

    def request_state(self) -> "ReplayCache":
        return ReplayCache(self.flush_interval)

    def request_states(self) -> "ReplayCaches":
        return ReplayCaches(self.flush_interval)


class ReplayCache:
    """One request's input cache: the verify replays the tokens accepted since the last flush,
    and every `flush_interval`-th verify's commit writes the state back and empties it."""

    __slots__ = ("flush_interval", "steps", "tokens")

    def __init__(self, flush_interval: int) -> None:
        self.flush_interval = flush_interval
        self.steps = 0  # verify steps since the last flush
        self.tokens = 0  # accepted tokens cached since then

    def verify_work(self) -> tuple[int, bool]:
        return self.tokens, self.steps + 1 >= self.flush_interval

    def committed(self, accepted_tokens: int) -> None:
        if self.steps + 1 >= self.flush_interval:
            self.steps = self.tokens = 0
        else:
            self.steps += 1
            self.tokens += accepted_tokens

    def reset(self) -> None:
        self.steps = self.tokens = 0


class ReplayCaches:
    """Many requests' input caches as arrays, one entry per request (the engine's decode group
    keeps its members' so): `ReplayCache`'s rules, over the arrays."""

    def __init__(self, flush_interval: int) -> None:
        self.flush_interval = flush_interval
        self.steps = np.zeros(0, np.int64)
        self.tokens = np.zeros(0, np.int64)

    def add(self, caches: Sequence[ReplayCache]) -> None:
        """Append these requests' caches."""
        self.steps = np.concatenate((self.steps, np.fromiter((c.steps for c in caches), np.int64, len(caches))))
        self.tokens = np.concatenate((self.tokens, np.fromiter((c.tokens for c in caches), np.int64, len(caches))))

    def remove(self, keep: np.ndarray, leaving: Sequence[tuple[int, ReplayCache]]) -> None:
        """Hand the entries `leaving` lists back to their caches; keep those `keep` marks."""
        for i, cache in leaving:
            cache.steps, cache.tokens = int(self.steps[i]), int(self.tokens[i])
        self.steps, self.tokens = self.steps[keep], self.tokens[keep]

    def verify_work(self) -> tuple[np.ndarray, np.ndarray]:
        """Each entry's `ReplayCache.verify_work`: (tokens replayed, flushes)."""
        return self.tokens, self.steps + 1 >= self.flush_interval

    def committed(self, accepted_tokens: np.ndarray) -> None:
        """A verify of every entry completed (`ReplayCache.committed`)."""
        flush = self.steps + 1 >= self.flush_interval
        self.tokens = np.where(flush, 0, self.tokens + accepted_tokens)
        self.steps = np.where(flush, 0, self.steps + 1)

    def work_ahead(self, committed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`verify_work` of every entry's next verifies, when the k-th commits `committed[:, k]`
        tokens (one row per entry, K columns): (replayed tokens, flushes), each with K + 1 columns,
        the last one the verify after those K (the entry's `verify_work` then)."""
        rows, k = committed.shape
        interval = self.flush_interval
        flush = (self.steps[:, None] + np.arange(k + 1)) % interval == interval - 1
        done = np.zeros((rows, k + 1), np.int64)  # tokens committed before each verify
        np.cumsum(committed, axis=1, out=done[:, 1:])
        # The cache holds what was committed since the last flush before the verify (the flushing
        # commit caches nothing), or since the start plus what it held then.
        since = np.zeros((rows, k + 1), np.int64)  # 1 + the last flush before each verify (0: none)
        np.maximum.accumulate(np.where(flush[:, :k], np.arange(1, k + 1), 0), axis=1, out=since[:, 1:])
        base = np.where(since > 0, np.take_along_axis(done, since, axis=1), -self.tokens[:, None])
        return done - base, flush

    def fast_forward(self, verifies: int, tokens: np.ndarray) -> None:
        """Every entry `verifies` commits later, holding `tokens` (`work_ahead`'s column for it)."""
        self.steps = (self.steps + verifies) % self.flush_interval
        self.tokens = tokens

