"""A run's step prices: each distinct batch built and priced once.

A latency model's price is a function of the StepBatch alone (no model keeps state that
changes a price), and the StepBatch one of the step's BatchTotals (sim.engine.step_trace) and
the run's constants. So the engine asks for a step's price by its totals, and a step
whose totals were priced before is neither assembled nor priced again: at concurrency 1
a decode step's only variable is its context length, and 96-99% of the steps of a
closed-loop run at concurrency 1 repeat an earlier one. Under load the context sums
almost never repeat (0-1% of steps at concurrency 8 and above), so the memo stops taking
new entries once it holds PROBE_ENTRIES without having been hit as often as a quarter of
them: a loaded run then keeps no memo, whatever its length.

Prices go into the StepLog's table of distinct prices, one row each; a step is logged as
its row (sim.engine.metrics.StepLog).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from sim.engine.metrics import StepLog
from sim.engine.step_trace import BatchTotals, TracedRequest, batch_of_totals
from sim.pricing.latency import STEP_MEMO, LatencyModel, StepBatch, StepTimes

PROBE_ENTRIES = 4096  # the memo's size at which its hits are counted: below a quarter of it, it is dropped
VECTOR_STEPS = 12  # a run's stretch priced at once from this many steps on (fewer: one by one is cheaper)


class PricedStep(NamedTuple):
    duration_s: float
    row: int  # its price's row in the StepLog's table


class StepPrices:
    def __init__(self, latency: LatencyModel, log: StepLog, *, verify_positions: int, draft_depth: int,
                 sizes: Sequence[int], full_graph_ok: bool) -> None:
        self.latency = latency
        self.log = log
        self.verify_positions = verify_positions
        self.draft_depth = draft_depth
        self.sizes = sizes
        self.full_graph_ok = full_graph_ok
        self.memo: dict[BatchTotals, PricedStep] = {}
        self.hits = 0  # steps priced from the memo
        self._memoise = True
        self.vector = getattr(latency, "step_times", None)  # LatencyModel.step_times, where the model has it
        # A lone request's decode steps by their context, per shape: (price rows, durations), -1 unknown.
        self.by_context: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def batch(self, totals: BatchTotals, requests: tuple[TracedRequest, ...] = ()) -> StepBatch:
        return batch_of_totals(totals, verify_positions=self.verify_positions, draft_depth=self.draft_depth,
                               sizes=self.sizes, full_graph_ok=self.full_graph_ok, requests=requests)

    def price(self, totals: BatchTotals, batch: StepBatch | None = None) -> PricedStep:
        """The price of a step's totals (`batch`: its StepBatch where the caller built it)."""
        p = self.memo.get(totals)
        if p is not None:
            self.hits += 1
            return p
        if batch is None:
            batch = self.batch(totals)
        st = self.latency.step_time(batch)
        p = PricedStep(st.total_s, self.log.add_price(st, batch.eager))
        if self._memoise:
            memo = self.memo
            memo[totals] = p
            n = len(memo)
            if n == PROBE_ENTRIES and 4 * self.hits < n:
                memo.clear()  # the steps do not repeat: keep no memo
                self._memoise = False
            elif n >= STEP_MEMO:
                self._memoise = False
        return p


class RunPrices:
    """The prices of a decode run's steps (sim.engine.decode_run). They differ only in the replay cache's
    work and in their context sums, so a stretch of steps with the same flushing requests is priced
    at once where the latency model can (`LatencyModel.step_times`) and the stretch is long enough
    to pay for it, else one by one (the same floats either way). Durations come a stretch at a time
    (`durations`); `rows` then logs the prices of the steps the run took, and only those. A lone
    request's prices are kept by context (`StepPrices.by_context`): at concurrency 1 the decode
    steps of one request repeat the contexts of those before it."""

    def __init__(self, prices: StepPrices, *, rows: int, tokens: int, spec_seqs: int, uniform: bool) -> None:
        self.prices = prices
        self.head = (rows, tokens, rows, uniform, spec_seqs, 0)  # BatchTotals' fields before the replay work
        self.flush = spec_seqs  # requests whose commit writes the state back, where no policy state says otherwise
        self.steps = 0  # priced so far
        self._known: list[tuple[np.ndarray, np.ndarray]] = []  # (steps, their rows in the price table)
        self._new: list[tuple[np.ndarray, StepTimes, bool, tuple | None, np.ndarray]] = []  # not in the table yet

    def durations(self, contexts: np.ndarray, max_contexts: np.ndarray, replayed: np.ndarray | None = None,
                  flushed: np.ndarray | None = None) -> np.ndarray:
        """Seconds of the run's next len(contexts) steps, given each one's context sum and longest
        context, and where a policy keeps state, its replayed tokens and flushing requests."""
        count = len(contexts)
        steps = np.arange(self.steps, self.steps + count)
        self.steps += count
        out = np.empty(count)
        # A replay run's flushing requests take a few values (each flushes every flush_interval
        # steps), its replayed tokens many: the steps are priced together by the former.
        if flushed is None:
            groups = [(self.flush, steps - steps[0])]
        else:
            values, which = np.unique(flushed, return_inverse=True)
            groups = [(int(f), np.flatnonzero(which == g)) for g, f in enumerate(values.tolist())]
        for flush, idx in groups:
            key = self.head + (flush,) if self.head[0] == 1 and replayed is None else None
            if key is not None:
                idx = self._cached(key, idx, contexts, steps, out)
            if len(idx):
                self._price(flush, idx, contexts, max_contexts, replayed, steps, out, key)
        return out

    def _price(self, flush: int, idx: np.ndarray, contexts: np.ndarray, max_contexts: np.ndarray,
               replayed: np.ndarray | None, steps: np.ndarray, out: np.ndarray, key: tuple | None) -> None:
        prices = self.prices
        replays = replayed[idx].tolist() if replayed is not None else [0] * len(idx)
        if prices.vector is not None and len(idx) >= VECTOR_STEPS:
            first = int(idx[0])
            batch = prices.batch(BatchTotals(*self.head, replays[0], flush, int(contexts[first]),
                                             int(max_contexts[first]), ()))
            times = prices.vector(batch, contexts[idx], replayed[idx] if replayed is not None else None)
            if times is not None:
                out[idx] = times.total_s
                self._new.append((steps[idx], times, batch.eager, key, contexts[idx]))
                return
        priced = [prices.price(BatchTotals(*self.head, r, flush, c, m, ()))
                  for r, c, m in zip(replays, contexts[idx].tolist(), max_contexts[idx].tolist())]
        out[idx] = [p.duration_s for p in priced]
        self._known.append((steps[idx], np.array([p.row for p in priced], np.int64)))

    def _cached(self, key: tuple, idx: np.ndarray, contexts: np.ndarray, steps: np.ndarray,
                out: np.ndarray) -> np.ndarray:
        """Fill in the steps whose context was priced before; the others' indices."""
        table = self.prices.by_context.get(key)
        if table is None:
            return idx
        rows, seconds = table
        ctx = contexts[idx]
        known = ctx < len(rows)
        known[known] = rows[ctx[known]] >= 0
        hit = idx[known]
        out[hit] = seconds[ctx[known]]
        self._known.append((steps[hit], rows[ctx[known]]))
        return idx[~known]

    def rows(self, taken: int) -> np.ndarray:
        """Log the prices of the run's first `taken` steps; their rows in the price table, in step order."""
        out = np.empty(taken, np.int64)
        for steps, rows in self._known:
            keep = steps < taken
            out[steps[keep]] = rows[keep]
        log, by_context = self.prices.log, self.prices.by_context
        for steps, times, eager, key, contexts in self._new:
            keep = steps < taken
            if not keep.any():
                continue
            rows = log.add_prices(StepTimes(times.terms_s[keep], times.total_s[keep], times.mode), eager)
            out[steps[keep]] = rows
            if key is not None:
                ctx = contexts[keep]
                table = by_context.get(key)
                size = int(ctx.max()) + 1
                if table is None or len(table[0]) < size:
                    size = max(size, 2 * len(table[0]) if table else 0)
                    grown = (np.full(size, -1, np.int64), np.zeros(size))
                    if table is not None:
                        grown[0][:len(table[0])], grown[1][:len(table[1])] = table
                    table = by_context[key] = grown
                table[0][ctx], table[1][ctx] = rows, times.total_s[keep]
        return out
