"""The step-latency interface shared by the engine and the calibrator.

A step is: the MTP drafter (one pass over all scheduled target tokens, then K - 1
one-token passes per speculating request), one target forward over all scheduled
tokens, then the state commit. A `LatencyModel` prices a `StepBatch` term by term so
the summary can say where each term came from (`calibrated`, `analytic`, `derived`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

# Term names, in the order they are summed. Every LatencyModel returns all of them.
TERMS: tuple[str, ...] = (
    "drafter",      # MTP layer passes + its LM head
    "gdn",          # GDN layers: projections, short conv, norm, output projection
    "gdn_verify",   # the policy's verify kernel (incl. replay of cached inputs)
    "gdn_commit",   # the policy's commit kernel (store_all: slot select; replay: flush)
    "attention",    # attention layers: QKV, RoPE, attention over the KV cache, out proj
    "moe",          # router, routed experts, shared expert (every layer)
    "lm_head",      # final norm, LM head, sampling / acceptance
    "allreduce",    # tensor-parallel all-reduces (2 per layer)
    "overhead",     # fixed per-step CPU/launch overhead
)
US = 1e-6  # seconds per microsecond: the tables are in microseconds
STEP_MEMO = 200_000  # distinct small entries (a step's price, a drafter pass's) a memo keeps
SHAPE_MEMO = 8_192  # distinct batch shapes whose context-free pricing a model keeps (a few KB each: their op lists)


class StepBatch(NamedTuple):
    """What the scheduler put into one engine step (per GPU view of the whole batch); immutable,
    a named tuple because one is built for every step priced (a frozen dataclass costs 5x to build)."""

    num_seqs: int  # requests scheduled this step
    prefill_tokens: int  # prompt tokens scheduled (chunked prefill), all requests
    prefill_seqs: int
    decode_seqs: int  # requests in decode (verifying a draft or plain decoding)
    spec_seqs: int  # of decode_seqs, those that verify a draft tree this step
    verify_positions: int  # positions per speculating request (1 + N draft nodes)
    context_tokens: int  # sum over scheduled requests of tokens already in the KV cache
    max_context: int
    eager: bool  # piecewise (eager) mode: mixed/prefill batch, or a tree that breaks graphs
    replay_tokens: int = 0  # replay: cached accepted tokens replayed before the tree, all seqs
    flush_seqs: int = 0  # replay: requests whose commit writes the state back this step
    draft_depth: int = 0  # K drafter passes (0: no speculation this step)
    truncated: int = 0  # verify positions cut from speculating requests' chains when the token budget was short
    # How vLLM dispatches the step (sim.pricing.dispatch); "" when a batch is built by hand.
    kind: str = ""  # sim.pricing.dispatch.STEP_KINDS
    mode: str = ""  # "full", "piecewise" or "eager"; "" = piecewise if `eager` else full
    padded_tokens: int = 0  # tokens the graphs run at (the capture size); 0 = num_tokens
    prefill_chunks: tuple[tuple[int, int], ...] = ()  # (chunk tokens, context) per prefilling request
    # Per-request detail (sim.engine.step_trace.TracedRequest, untyped here: that module builds on this
    # one) where it is kept: traced runs and replayed steps. Latency models do not read it.
    requests: tuple[Any, ...] = ()

    @property
    def graph_mode(self) -> str:
        return self.mode or ("piecewise" if self.eager else "full")

    @property
    def run_tokens(self) -> int:
        """Tokens the dense parts run at: padded up to the capture size in graph modes."""
        return self.padded_tokens or self.num_tokens

    @property
    def chunks(self) -> tuple[tuple[int, int], ...]:
        """Prefill chunks with their contexts; a hand-built batch's are its mean chunk at the mean context."""
        if self.prefill_chunks or not self.prefill_seqs:
            return self.prefill_chunks
        ctx = self.context_tokens // self.num_seqs
        return ((self.prefill_tokens // self.prefill_seqs, ctx),) * self.prefill_seqs

    @property
    def decode_tokens(self) -> int:
        return self.spec_seqs * self.verify_positions + (self.decode_seqs - self.spec_seqs) - self.truncated

    @property
    def num_tokens(self) -> int:
        """All target tokens of the forward."""
        return self.prefill_tokens + self.decode_tokens


@dataclass
class StepTime:
    terms: dict[str, float]  # seconds per term (TERMS)
    mode: str  # "graph" or "eager"

    @property
    def total_s(self) -> float:
        return sum(self.terms.values())


class StepTimes(NamedTuple):
    """The prices of several steps at once (a decode run's, sim.engine.decode_run)."""

    terms_s: np.ndarray  # seconds, one row per step, one column per term in TERMS order
    total_s: np.ndarray  # seconds per step: its terms summed in TERMS order, as StepTime.total_s
    mode: str

    @classmethod
    def of(cls, terms: Mapping[str, float | np.ndarray], steps: int, mode: str) -> "StepTimes":
        """From seconds per term, each one value for every step or one per step."""
        table = np.empty((steps, len(TERMS)))
        total: float | np.ndarray = 0
        for j, t in enumerate(TERMS):
            table[:, j] = terms[t]
            total = total + terms[t]
        return cls(table, np.broadcast_to(np.asarray(total, dtype=float), (steps,)).copy(), mode)


@dataclass
class LatencySources:
    """Which source priced each term: 'calibrated', 'analytic', 'derived' or 'config'."""

    by_term: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # a term not wholly measured: what prices the rest

    def summary(self) -> str:
        kinds = set(self.by_term.values())
        return kinds.pop() if len(kinds) == 1 else "mixed"


class LatencyModel(Protocol):
    """`step_time` prices one step. A model may also have `step_times(batch, contexts, replay_tokens)
    -> StepTimes | None`: the steps that are the decode batch `batch` but for their context sums (and
    the tokens replay replays, one array each), priced at once to the same floats (None, or no such
    method: the engine prices them one by one)."""

    sources: LatencySources

    def step_time(self, batch: StepBatch) -> StepTime: ...
