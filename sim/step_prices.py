"""A run's step prices: each distinct batch built and priced once.

A latency model's price is a function of the StepBatch alone (no model keeps state that
changes a price), and the StepBatch one of the step's BatchTotals (sim.step_trace) and
the run's constants. So the engine asks for a step's price by its totals, and a step
whose totals were priced before is neither assembled nor priced again: at concurrency 1
a decode step's only variable is its context length, and 96-99% of the steps of a
closed-loop run at concurrency 1 repeat an earlier one. Under load the context sums
almost never repeat (0-1% of steps at concurrency 8 and above), so the memo stops taking
new entries once it holds PROBE_ENTRIES without having been hit as often as a quarter of
them: a loaded run then keeps no memo, whatever its length.

Prices go into the StepLog's table of distinct prices, one row each; a step is logged as
its row (sim.metrics.StepLog).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sim.latency import STEP_MEMO, LatencyModel, StepBatch
from sim.metrics import StepLog
from sim.step_trace import BatchTotals, TracedRequest, batch_of_totals

PROBE_ENTRIES = 4096  # the memo's size at which its hits are counted: below a quarter of it, it is dropped


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
