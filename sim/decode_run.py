"""Decode runs: a stretch of engine steps advanced at once while the batch keeps its members.

When every running request decodes (verifies its draft of n = 1 + N positions, or decodes
one token without speculation) and nothing waits, a step changes a request only by the
tokens it accepts, and its acceptance stream already holds those. The engine then plans,
executes and updates a run of such steps as arrays over (requests x steps) instead of one
step and one request at a time: the tokens each step emits, the context sums the latency
model prices, the blocks the scheduler allocates as the requests grow, the policy's
per-request work (replay's cache). Each step is still priced and logged on its own, in
order. The run ends before the first step in which anything else would happen: a request
reaching its output length (under async scheduling it is also left out of the step planned
while its last one runs), a request needing blocks the pool does not have (a preemption),
another SimPy event (an arrival, a client's delivery) falling due. The step loop takes
that step, so a run changes how the simulator gets to each step, never what happens in it:
tests/test_decode_run.py runs configurations with and without runs and requires identical
outputs.

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

import numpy as np

from sim.metrics import StepLog
from sim.scheduler import Scheduler, StepPlan
from sim.step_prices import RunPrices, StepPrices

CELLS = 1 << 16  # requests x steps looked ahead at most (the arrays' size)
MIN_REQUEST_STEPS = 16  # a run is tried when its requests x sure steps reach this (gathering costs about as much)
LOOK_PAST = 8  # steps looked ahead beyond half the closest request's tokens left
FIRST_STRETCH = 16  # steps priced at once first while another event is due, then twice as many each time


class DecodeRuns:
    def __init__(self, scheduler: Scheduler, prices: StepPrices, log: StepLog, *, draft_depth: int,
                 commit_state_kept: bool) -> None:
        self.scheduler = scheduler
        self.prices = prices
        self.log = log
        self.n = scheduler.verify_positions  # tokens a decoding request schedules (1: no speculation)
        self.spec = self.n > 1
        # column_totals' rule: a decode of the uniform query length (always so here)
        self.uniform = self.n == (scheduler.verify_positions if draft_depth else 1)
        self.commit_state_kept = commit_state_kept
        self.sync = not scheduler.async_scheduling
        # planned total = computed + extra: the step in flight's n tokens count as computed under async
        self.extra = (self.n if self.sync else 2 * self.n) + scheduler.lookahead

    def advance(self, plan: StepPlan, now: float, horizon: float) -> float | None:
        """Run the steps from `plan` (every running request decoding, in running order) up to the
        first one the step loop must take, and return the delay to the last one's end (the engine's
        timeout); None when not one could run. `horizon`: the time of the next other SimPy event. Under async scheduling the step
        after them is planned as `plan` is; under sync scheduling it is not planned yet."""
        sched = self.scheduler
        running = sched.running
        rows = len(running)
        n = self.n
        if rows * n > sched.max_tokens:
            return None  # the token budget would cut a draft
        left = min([r.output - r.generated for r in running])
        # The run's steps are at least left // n - 1 (a step emits at most n tokens per request);
        # gathering the requests into arrays and back pays for so many request-steps and more.
        if left // n * rows < MIN_REQUEST_STEPS or left <= n:
            return None
        if len(plan.spec) != (rows if self.spec else 0):
            return None
        for req, (planned, tokens) in zip(running, plan.tokens.items()):
            # Decoding: it has sampled and computed every token but the last sampled one.
            if (planned is not req or tokens != n or req.inflight != n or not req.generated
                    or req.computed + 1 != req.prompt + req.generated):
                return None  # not every request decodes in this step
        # Steps looked ahead: past where the closest request is expected to finish (its emitted
        # tokens per step are seldom below 2), the run stops and the next one goes on.
        lookahead = min(left, max(2, CELLS // rows), left if not self.spec else left // 2 + LOOK_PAST)
        emitted = (np.array([r.acceptance.ahead(lookahead) for r in running], np.int64) + 1 if self.spec
                   else np.ones((rows, lookahead), np.int64))
        computed0 = np.fromiter((r.computed for r in running), np.int64, rows)
        generated0 = np.fromiter((r.generated for r in running), np.int64, rows)
        output = np.fromiter((r.output for r in running), np.int64, rows)
        done = np.cumsum(emitted, axis=1)  # tokens emitted by the end of each step
        # The first step that finishes a request (its outputs reach its length) is the loop's.
        finishing = np.flatnonzero((generated0[:, None] + done >= output[:, None]).any(axis=0))
        steps = int(finishing[0]) if finishing.size else lookahead
        if steps == 0:
            return None
        contexts = np.empty((rows, steps + 1), np.int64)  # computed before each step, and after the last
        contexts[:, 0] = computed0
        np.add(computed0[:, None], done[:, :steps], out=contexts[:, 1:])
        needs, grows = self._allocations(contexts, steps)
        short = np.flatnonzero(np.cumsum(needs) > sched.pool.free)
        if short.size:  # that planning would preempt: async, in step k, the loop's; sync, after step k
            steps = int(short[0]) + (1 if self.sync else 0)
            if steps == 0:
                return None
        return self._run(now, horizon, contexts, emitted, steps, needs, grows)

    def _allocations(self, contexts: np.ndarray, steps: int) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
        """The blocks each planning of the run asks for, and who grows when: (planning, request
        index, units after, tokens those hold), in order per request. Under async scheduling step k
        plans the next while it runs (plannings 0..steps-1); under sync scheduling after its outputs,
        but for the last step's (the loop plans it)."""
        pool = self.scheduler.pool
        running = self.scheduler.running
        planned = (contexts[:, 1:steps] if self.sync else contexts[:, :steps]) + self.extra
        plannings = planned.shape[1]
        needs = np.zeros(plannings, np.int64)
        grows: list[tuple[int, int, int, int]] = []
        if not plannings:
            return needs, grows
        held = np.fromiter((r.units_tokens for r in running), np.int64, len(running))
        for i in np.flatnonzero(planned[:, -1] > held).tolist():
            row = planned[i]
            units, tokens = running[i].units, running[i].units_tokens
            k = int(np.searchsorted(row, tokens, side="right"))  # the first planning past what it holds
            while k < plannings:
                more = pool.units_for(int(row[k]))
                needs[k] += more - units
                units, tokens = more, pool.tokens_held(more)
                grows.append((k, i, units, tokens))
                k = int(np.searchsorted(row, tokens, side="right"))
        return needs, grows

    def _run(self, now: float, horizon: float, contexts: np.ndarray, emitted: np.ndarray, steps: int,
             needs: np.ndarray, grows: list[tuple[int, int, int, int]]) -> float | None:
        """Price the steps, a stretch at a time, until one would end at or after `horizon`; log
        them and update the requests, the pool and the policy's states for the steps taken."""
        sched, log = self.scheduler, self.log
        running, pool = sched.running, sched.pool
        rows = len(running)
        states = [r.commit_state for r in running] if self.commit_state_kept else None
        replay_tokens = flush_seqs = None
        if states is not None:
            replayed, flush = type(states[0]).work_ahead(states, emitted[:, :steps])
            replay_tokens, flush_seqs = replayed[:, :steps].sum(axis=0), flush[:, :steps].sum(axis=0)
        sums, maxes = contexts[:, :steps].sum(axis=0), contexts[:, :steps].max(axis=0)
        prices = RunPrices(self.prices, rows=rows, tokens=rows * self.n, spec_seqs=rows if self.spec else 0,
                           uniform=self.uniform)
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
        log.free.frombytes((pool.free - np.concatenate(([0], np.cumsum(needs[:taken - 1])))).tobytes())
        log.request_steps += rows * taken
        plannings = taken if not self.sync else taken - 1
        pool.take(int(needs[:plannings].sum()))
        for k, i, units, held in grows:
            if k < plannings:
                running[i].units, running[i].units_tokens = units, held
        times = ends[1:taken + 1].tolist()
        grown = (contexts[:, taken] - contexts[:, 0]).tolist()
        for i, req in enumerate(running):
            g = grown[i]
            req.computed += g
            req.generated += g
            req.token_times.extend(times)
            if self.spec:
                req.spec_steps += taken
                req.spec_tokens += g
                req.acceptance.skip(taken)
            if states is not None:
                states[i].fast_forward(taken, int(replayed[i, taken]))
            if self.sync:
                req.inflight = 0  # the step after the run is not planned yet
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
