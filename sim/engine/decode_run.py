"""Decode runs: a stretch of engine steps advanced at once while the batch keeps its members.

When every running request is in the scheduler's decode group (sim.engine.decode_group: each verifies
its draft of n = 1 + N positions, or decodes one token without speculation) and nothing waits,
a step changes a request only by the tokens it accepts, and its acceptance stream already holds
those. The engine then plans, executes and updates a run of such steps as arrays over
(requests x steps) instead of one step at a time: the tokens each step emits, the context sums
the latency model prices, the blocks the scheduler allocates as the requests grow, the policy's
per-request work (replay's cache). Each step is still priced and logged on its own, in order.
The run ends before the first step in which anything else would happen: a request reaching its
output length, a request needing blocks the pool does not have (a preemption), another SimPy
event (an arrival, a client's delivery) falling due. The step loop takes that step, so a run
changes how the simulator gets to each step, never what happens in it: tests/test_decode_run.py
runs configurations with and without runs and requires identical outputs.

The rules are those of `Scheduler.schedule` and `Scheduler.update_from_output` for a
decoding request, over arrays:
  - planning: n tokens per request; a request asks the pool for blocks when its planned
    total (computed + n + lookahead, with the n tokens of the step in flight counted as
    computed under async scheduling) passes what its blocks hold;
  - outputs: a verify emits its accepted drafts + 1 tokens (one token without speculation)
    and computed and generated grow by that.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from sim.engine.metrics import StepLog
from sim.engine.scheduler import Scheduler
from sim.engine.step_plan import StepPlan
from sim.engine.step_prices import RunPrices, StepPrices


class Allocations(NamedTuple):
    """A run's pool traffic per planning: units asked for (`needs`) and freed (`releases`, align
    mode's old states), then who grows when, (planning, member, units after, tokens those hold),
    and whose align-mode state moves when, (planning, member, state_end, bound_end), each in
    order per member."""
    needs: np.ndarray
    releases: np.ndarray
    grows: list[tuple[int, int, int, int]]
    bounds: list[tuple[int, int, int, int]]


CELLS = 1 << 16  # requests x steps looked ahead at most (the arrays' size)
MIN_REQUEST_STEPS = 16  # a run is tried when its requests x sure steps reach this (setting it up costs about as much)
LOOK_PAST = 8  # steps looked ahead beyond half the closest request's tokens left
FIRST_STRETCH = 16  # steps priced at once first while another event is due, then twice as many each time


class DecodeRuns:
    def __init__(self, scheduler: Scheduler, prices: StepPrices, log: StepLog) -> None:
        self.scheduler = scheduler
        self.group = scheduler.group
        self.prices = prices
        self.log = log

    def advance(self, plan: StepPlan, now: float, horizon: float) -> float | None:
        """Run the steps from `plan` (under async scheduling, the one in flight, which the last step
        of the run plans again) up to the first one the step loop must take, every running request
        in the decode group (those the plan holds on its own join it), and return the delay to the
        last one's end (the engine's timeout); None when not one could run. `horizon`: the time
        of the next other SimPy event."""
        sched, group = self.scheduler, self.group
        n, own = group.n, plan.tokens
        rows = len(own) + (group.size if plan.group else 0)
        if rows != len(sched.running):
            return None  # some running request is not in the step
        left = min([r.output - r.generated for r in own] + [int((group.output - group.generated).min())]
                   if plan.group and group.size else [r.output - r.generated for r in own])
        # The run's steps are at least left // n - 1 (a step emits at most n tokens per request);
        # setting the run up pays for so many request-steps and more.
        if left // n * rows < MIN_REQUEST_STEPS or left <= n:
            return None
        if own and not sched.join_planned(plan):
            return None  # some request does not decode steadily
        # Steps looked ahead: past where the closest request is expected to finish (its emitted
        # tokens per step are seldom below 2), the run stops and the next one goes on.
        lookahead = min(left, max(2, CELLS // rows), left if not group.spec else left // 2 + LOOK_PAST)
        emitted = group.draws_ahead(lookahead) + 1 if group.spec else np.ones((rows, lookahead), np.int64)
        done = np.cumsum(emitted, axis=1)  # tokens emitted by the end of each step
        # The first step that finishes a request (its outputs reach its length) is the loop's.
        finishing = np.flatnonzero((group.generated[:, None] + done >= group.output[:, None]).any(axis=0))
        steps = int(finishing[0]) if finishing.size else lookahead
        if steps == 0:
            return None
        contexts = np.empty((rows, steps + 1), np.int64)  # computed before each step, and after the last
        contexts[:, 0] = group.computed
        np.add(group.computed[:, None], done[:, :steps], out=contexts[:, 1:])
        alloc = self._allocations(contexts, steps)
        # A planning's old states are freed at each member's turn, so only the earlier plannings'
        # count for its own allocations (planned one by one, vLLM's order decides).
        freed_before = np.concatenate(([0], np.cumsum(alloc.releases)[:-1]))
        short = np.flatnonzero(np.cumsum(alloc.needs) - freed_before > sched.pool.free)
        if short.size:  # that planning would preempt: async, in step k, the loop's; sync, after step k
            steps = int(short[0]) + (1 if group.sync else 0)
            if steps == 0:
                return None
        return self._run(now, horizon, contexts, emitted, steps, alloc)

    def _allocations(self, contexts: np.ndarray, steps: int) -> Allocations:
        """The units each planning of the run asks for and frees, and who grows when. Under async
        scheduling step k plans the next while it runs (plannings 0..steps-1); under sync
        scheduling after its outputs, but for the last step's (the loop plans it)."""
        pool, group = self.scheduler.pool, self.group
        planned = (contexts[:, 1:steps] if group.sync else contexts[:, :steps]) + group.extra
        plannings = planned.shape[1]
        needs = np.zeros(plannings, np.int64)
        releases = np.zeros(plannings, np.int64)
        grows: list[tuple[int, int, int, int]] = []
        bounds: list[tuple[int, int, int, int]] = []
        if not plannings:
            return Allocations(needs, releases, grows, bounds)
        if pool.boundary is not None:
            self._boundaries(planned, needs, releases, bounds)
        for i in np.flatnonzero(planned[:, -1] > group.held).tolist():
            row = planned[i]
            units, tokens = int(group.units[i]), int(group.held[i])
            k = int(np.searchsorted(row, tokens, side="right"))  # the first planning past what it holds
            while k < plannings:
                more = pool.units_for(int(row[k]))
                needs[k] += more - units
                units, tokens = more, pool.tokens_held(more)
                grows.append((k, i, units, tokens))
                k = int(np.searchsorted(row, tokens, side="right"))
        return Allocations(needs, releases, grows, bounds)

    def _boundaries(self, planned: np.ndarray, needs: np.ndarray, releases: np.ndarray,
                    bounds: list[tuple[int, int, int, int]]) -> None:
        """Align mode (sim.engine.pool.BoundaryRule): at each planning a member's state may cross
        into a new block (its tokens without lookahead past `state_end`: the pool's units taken,
        `needs`) and an old state it holds may be freed (vLLM's num_computed_tokens, this step's n
        short of those, past `bound_end`: `releases`), the release first. `bounds` gets (planning,
        member, state_end, bound_end) after each such planning, in order per member."""
        group, rule = self.group, self.scheduler.pool.boundary
        plannings = planned.shape[1]
        main = planned - group.lookahead
        for i in np.flatnonzero((main[:, -1] > group.state_end) | (group.bound_end >= 0)).tolist():
            row, state, bound = main[i], int(group.state_end[i]), int(group.bound_end[i])
            freeable = row - group.n - rule.spec  # num_computed_tokens less num_speculative_blocks
            start = 0  # plannings before it are done with
            while True:
                at_release = start + int(np.searchsorted(freeable[start:], bound, side="right")) if bound >= 0 else plannings
                at_cross = start + int(np.searchsorted(row[start:], state, side="right"))
                k = min(at_release, at_cross)
                if k >= plannings:
                    break
                if k == at_release:
                    releases[k] += rule.units
                    bound = -1
                if k == at_cross:
                    if bound < 0:
                        needs[k] += rule.units
                    bound, state = state, rule.end(int(row[k]))
                bounds.append((k, i, state, bound))
                start = k + 1

    def _run(self, now: float, horizon: float, contexts: np.ndarray, emitted: np.ndarray, steps: int,
             alloc: Allocations) -> float | None:
        """Price the steps, a stretch at a time, until one would end at or after `horizon`; log
        them and update the group, the pool and the policy's states for the steps taken."""
        group, log, pool = self.group, self.log, self.scheduler.pool
        rows, states = group.size, group.states
        replay_tokens = flush_seqs = None
        if states is not None:
            replayed, flush = states.work_ahead(emitted[:, :steps])
            replay_tokens, flush_seqs = replayed[:, :steps].sum(axis=0), flush[:, :steps].sum(axis=0)
        sums, maxes = contexts[:, :steps].sum(axis=0), contexts[:, :steps].max(axis=0)
        prices = RunPrices(self.prices, rows=rows, tokens=rows * group.n, spec_seqs=rows if group.spec else 0,
                           uniform=True)
        ends = np.empty(steps + 1)  # ends[k + 1]: when step k ends, its duration added to the clock as SimPy does
        ends[0] = now
        taken, k, stretch = steps, 0, FIRST_STRETCH if horizon < math.inf else steps
        while k < steps:
            stop = min(steps, k + stretch)
            seconds = prices.durations(sums[k:stop], maxes[k:stop],
                                       None if states is None else replay_tokens[k:stop],
                                       None if states is None else flush_seqs[k:stop])
            ends[k:stop + 1] = np.cumsum(np.concatenate((ends[k:k + 1], seconds)))
            due = np.flatnonzero(ends[k + 1:stop + 1] >= horizon)
            if due.size:  # another event falls due first, or at the same time: the loop's step
                taken = k + int(due[0])
                break
            k, stretch = stop, 2 * stretch
        # The engine's clock jumps over the run with one timeout, whose delay must land on the last
        # step's end exactly; in the rare case none does, the run gives its last steps to the loop.
        delay = None
        while taken and (delay := landing_delay(now, float(ends[taken]))) is None:
            taken -= 1
        if not taken:
            return None
        log.price_rows.frombytes(prices.rows(taken).tobytes())
        # The pool's free units logged with each step: after the plannings before it.
        net = alloc.needs - alloc.releases
        log.free.frombytes((pool.free - np.concatenate(([0], np.cumsum(net[:taken - 1])))).tobytes())
        log.request_steps += rows * taken
        plannings = taken if not group.sync else taken - 1
        change = int(net[:plannings].sum())  # the run frees what it took itself: its net only
        if change >= 0:
            pool.take(change)
        else:
            pool.give(-change)
        for k, i, units, held in alloc.grows:
            if k < plannings:
                group.units[i], group.held[i] = units, held
        for k, i, state, bound in alloc.bounds:
            if k < plannings:
                group.state_end[i], group.bound_end[i] = state, bound
        grown = contexts[:, taken] - contexts[:, 0]
        group.computed += grown
        group.generated += grown
        if group.spec:
            group.spec_steps += taken
            group.spec_tokens += grown
            group.ptr += taken
        if states is not None:
            states.fast_forward(taken, replayed[:, taken])
        group.times.extend(ends[1:taken + 1].tolist())
        return delay


def landing_delay(now: float, end: float) -> float | None:
    """The delay d with now + d == end exactly, if there is one (SimPy adds a timeout's delay to
    its clock; a run of steps ends at their durations added one by one, which end - now alone may
    miss by a bit, and at a rounding tie no delay reaches)."""
    d = end - now
    while now + d < end:
        d = math.nextafter(d, math.inf)
    while now + d > end:
        d = math.nextafter(d, -math.inf)
    return d if now + d == end else None
