"""Acceptance of a draft tree: per-depth rank distributions and per-request random streams.

At tree depth d the target model's token has a rank among the drafter's candidates,
drawn from a per-depth categorical distribution (row d: P(rank 0), P(rank 1), ...;
the rest of the row's mass is "not among the candidates"). A tree of widths
(w_1, ..., w_D) keeps its draft at depth d while that rank is below w_d; the first
miss ends the accepted path. Inverse-CDF sampling makes this one uniform per depth:
accept at depth d iff u_d < P(rank < w_d).

Common random numbers: every request owns a stream seeded by (seed, request_id) and
each verify step consumes exactly D uniforms, whatever is accepted, so the k-th verify
step of a request sees the same uniforms under every policy, tree and load.

The built-in default (`default_rank_rows`) reproduces docs/design.md#draft-trees' reference accepted
lengths (bonus token included): 3.24 for (1,1,1) and 3.58 for (3,3,3). Two numbers
pin two parameters, so we assume depth-independent conditional probabilities:
  - rank 0 with probability a at every depth: 1 + a + a^2 + a^3 = 3.24 gives
    a = 0.86088 (solved by bisection below);
  - P(rank < 3) = b at every depth: 1 + b + b^2 + b^3 = 3.58 gives b = 0.92646;
  - ranks 1, 2, ... share 1 - a geometrically: P(rank = r) = (1 - a) q (1 - q)^(r-1),
    with q fixed by a + (1 - a)(1 - (1 - q)^2) = b, so q = 0.27295.
Rows list ranks 0..RANK_COLUMNS-1; wider trees than that gain nothing more.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from core.config import ConfigError
from sim.engine.stream_seeds import Seeded, seed_words

REFERENCE_ACCEPTED_LEN = {(1, 1, 1): 3.24, (3, 3, 3): 3.58}  # docs/design.md#draft-trees, bonus token included
REFERENCE_DEPTH = 3  # the depth of both: the built-in rows have no evidence past it
RANK_COLUMNS = 16  # candidate ranks listed per row of the default distribution
# Verify steps of uniforms drawn per refill (amortises numpy's call overhead: a draw costs about
# as much as 150 more steps in it). The first block covers the steps a request of known output
# length is expected to verify, with a margin (FIRST_BLOCK_MARGIN), or UNIFORM_BLOCK steps where
# the length is not known; each later one twice the one before up to the largest, so a long
# request refills a few times only.
UNIFORM_BLOCK = 64
UNIFORM_BLOCK_MAX = 1024
FIRST_BLOCK_MARGIN = 1.25
SEED_BLOCK = 1024  # request ids whose streams' seeds are worked out together (sim.engine.stream_seeds)
SEED_BLOCKS_KEPT = 4
ALL_DRAFTS = 1 << 30  # accepted_drafts' cap when every draft was verified


def _solve_geometric_sum(target: float, depth: int) -> float:
    """p in (0, 1) with p + p^2 + ... + p^depth = target (monotone in p: bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(mid ** k for k in range(1, depth + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def default_rank_rows(depth: int = 3) -> list[list[float]]:
    """Depth-independent rank distribution fitted to docs/design.md#draft-trees' 3.24 / 3.58 (see module doc)."""
    a = _solve_geometric_sum(REFERENCE_ACCEPTED_LEN[(1, 1, 1)] - 1, REFERENCE_DEPTH)
    b = _solve_geometric_sum(REFERENCE_ACCEPTED_LEN[(3, 3, 3)] - 1, REFERENCE_DEPTH)
    q = 1 - np.sqrt(1 - (b - a) / (1 - a))
    row = [a] + [(1 - a) * q * (1 - q) ** (r - 1) for r in range(1, RANK_COLUMNS)]
    return [list(map(float, row)) for _ in range(depth)]


def validate_rows(rows: Sequence[Sequence[float]], depth: int, source: str) -> list[list[float]]:
    if len(rows) < depth:
        raise ConfigError(f"{source}: acceptance needs one row per tree depth ({depth}), got {len(rows)}")
    out = []
    for d, row in enumerate(rows[:depth]):
        row = [float(p) for p in row]
        if not row or any(p < 0 for p in row) or sum(row) > 1 + 1e-9:
            raise ConfigError(f"{source}: acceptance row {d} must be non-negative probabilities "
                              f"summing to <= 1, got {row}")
        out.append(row)
    return out


def accept_thresholds(rows: Sequence[Sequence[float]], widths: Sequence[int]) -> tuple[float, ...]:
    """P(rank < w_d) per depth: the conditional probability of accepting depth d."""
    return tuple(float(sum(row[:w])) for row, w in zip(rows, widths))


def expected_accepted_len(thresholds: Sequence[float]) -> float:
    """Mean tokens per verify step, bonus included: 1 + sum_d prod_{j<=d} p_j."""
    total, run = 1.0, 1.0
    for p in thresholds:
        run *= p
        total += run
    return total


class AcceptanceStream:
    """One request's seeded uniforms, consumed D per verify step; the accepted counts of
    a block of verify steps are worked out at once from each block of uniforms (a block's size
    changes only how the stream is read, never its values). `ahead` shows the counts to come
    without using them (the decode group and sim.engine.decode_run read them as arrays), `skip` uses them."""

    __slots__ = ("_rng", "_counts", "_listed", "_next", "_block_steps", "_accept", "thresholds", "depth")

    def __init__(self, seed: int, request_id: int, thresholds: tuple[float, ...], *,
                 words: np.ndarray | None = None, first_steps: int = UNIFORM_BLOCK) -> None:
        """`words`: the seed words of (seed, request_id) where worked out already (sim.engine.stream_seeds);
        `first_steps`: the verify steps the first block draws."""
        seq = np.random.SeedSequence([seed, request_id]) if words is None else Seeded(words)
        self._rng = np.random.Generator(np.random.PCG64(seq))
        self.thresholds = thresholds
        self.depth = len(thresholds)
        self._accept = np.array(thresholds)
        # The counts drawn, the next one at `_next`: as an array (read ahead a block at a time)
        # and as a list (read one at a time).
        self._counts = np.zeros(0, np.int64)
        self._listed: list[int] = []
        self._next = 0
        self._block_steps = first_steps

    def accepted_drafts(self, drafts: int = ALL_DRAFTS) -> int:
        """Drafts accepted along the tree's best path this verify step (0..D), of the first
        `drafts` verified (a chain cut to the token budget verifies fewer)."""
        i = self._next
        if i == len(self._listed):
            self._draw()
            i = 0
        self._next = i + 1
        a = self._listed[i]
        return a if a < drafts else drafts

    def ahead(self, steps: int) -> np.ndarray:
        """The accepted counts of the next `steps` verify steps, left unused."""
        while len(self._listed) - self._next < steps:
            self._draw()
        return self._counts[self._next:self._next + steps]

    @property
    def drawn(self) -> int:
        """Counts drawn and not used yet (more are drawn, a block at a time, when asked for)."""
        return len(self._listed) - self._next

    def skip(self, steps: int) -> None:
        """Use the next `steps` counts (those `ahead` showed)."""
        if self.drawn < steps:
            raise ValueError(f"skip({steps}): only {self.drawn} counts drawn ahead")
        self._next += steps

    def _draw(self) -> None:
        """One more block of counts, after those drawn and not used."""
        steps = self._block_steps
        self._block_steps = min(2 * steps, UNIFORM_BLOCK_MAX)
        depth = self.depth
        # A row accepts through the depth before its first miss; a miss after the last depth
        # (the column left False) ends every row, so a row that accepts every depth counts D.
        accept = np.zeros((steps, depth + 1), bool)
        np.less(self._rng.random((steps, depth)), self._accept, out=accept[:, :depth])
        counts = accept.argmin(axis=1)
        if self._next < len(self._listed):  # counts drawn and not used yet come first
            counts = np.concatenate((self._counts[self._next:], counts))
        self._counts, self._listed, self._next = counts, counts.tolist(), 0


class AcceptanceModel:
    """Per-category thresholds for one draft tree; hands each request its stream."""

    def __init__(self, widths: Sequence[int], seed: int,
                 by_category: Mapping[str, Sequence[Sequence[float]]] | None = None,
                 source: str = "workload acceptance") -> None:
        self.widths = tuple(widths)
        self.seed = seed
        depth = len(self.widths)
        rows = {cat: validate_rows(r, depth, f"{source}[{cat!r}]") for cat, r in (by_category or {}).items()}
        default = rows.get("", default_rank_rows(depth))
        self._default = accept_thresholds(default, self.widths)
        self._by_category = {cat: accept_thresholds(r, self.widths) for cat, r in rows.items()}
        self.source = "workload" if rows else "built-in default"
        self._seed_blocks: dict[int, np.ndarray] = {}  # by request id // SEED_BLOCK, oldest first

    def thresholds(self, category: str) -> tuple[float, ...]:
        return self._by_category.get(category, self._default)

    def stream(self, request_id: int, category: str = "", output_tokens: int | None = None) -> AcceptanceStream:
        """The request's stream; `output_tokens`, where known, sizes its first block of draws."""
        thresholds = self.thresholds(category)
        first = UNIFORM_BLOCK
        if output_tokens is not None:
            expected = output_tokens / expected_accepted_len(thresholds) * FIRST_BLOCK_MARGIN
            first = max(1, min(math.ceil(expected), UNIFORM_BLOCK_MAX))
        return AcceptanceStream(self.seed, request_id, thresholds, words=self._seed_words(request_id),
                                first_steps=first)

    def _seed_words(self, request_id: int) -> np.ndarray | None:
        """The seed words of the request's stream, worked out for its SEED_BLOCK of ids at once
        (None outside what sim.engine.stream_seeds covers: numpy's SeedSequence then seeds it, or says why not)."""
        block = request_id // SEED_BLOCK
        words = self._seed_blocks.get(block)
        if words is None:
            if not 0 <= request_id < 1 << 64:
                return None
            words = self._seed_blocks[block] = seed_words(self.seed, block * SEED_BLOCK, SEED_BLOCK)
            if len(self._seed_blocks) > SEED_BLOCKS_KEPT:
                del self._seed_blocks[next(iter(self._seed_blocks))]
        return words[request_id - block * SEED_BLOCK]

    def expected_len(self, category: str = "") -> float:
        return expected_accepted_len(self.thresholds(category))
