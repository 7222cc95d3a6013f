"""The decode group: the running requests in steady decode, kept as arrays and planned and
updated as one block.

Most of a loaded engine's running requests do the same thing every step: each verifies its
draft of n = 1 + N positions (decodes one token without speculation), accepts some of it and
grows. The scheduler keeps such requests in the group. While a request is a member, its
counters (computed and generated tokens, blocks held, verify counts) live in arrays here and
its Request's copies are stale; its acceptance stream is read ahead into an array, its policy
state (replay's cache) kept by the policy's array form (`CommitPolicy.request_states`), and its
token times are the group's step times from its joining on. A step plans every member at once
(n tokens each; the few that grow past their blocks ask the pool one by one) and processes
every member's outputs at once; decode runs (sim.engine.decode_run) advance the whole group several
steps at a time. A request joins when it decodes in the step planned and its output is far
from its length; it leaves, its Request brought up to date, before a step could end it
(`margin` tokens left) or when the scheduler plans a step one request at a time. The rules are
those of `Scheduler.schedule` and `Scheduler.update_from_output` for a decoding request:
tests/test_decode_group.py holds runs with the group to runs without it, output for output.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from policies.base import RequestStates
from sim.engine.pool import Pool
from sim.engine.request import Request, Status
from sim.engine.step_trace import BatchTotals

DRAWS = 64  # acceptance counts read ahead per member at a time
# Members a group needs to be kept from step to step: the arrays' fixed cost a step (joining,
# leaving, reading acceptance counts ahead) is that of planning about this many requests one by
# one; below, each is planned on its own (a decode run still takes every request into the group).
KEEP = 96
COUNTERS = ("computed", "generated", "output", "units", "held", "state_end", "bound_end", "spec_steps", "spec_tokens",
            "joined", "ptr", "avail")


class Growth(NamedTuple):
    """What the members ask of the pool at a planning: `need` units at most (the old states they
    free left out), which members grow to how many units, and in align mode which free a crossed
    boundary's old state (`release`) and which cross into a new state block (`cross`)."""
    need: int
    grow: list[tuple[int, int]]
    release: np.ndarray | None
    cross: np.ndarray | None


class DecodeGroup:
    def __init__(self, *, verify_positions: int, lookahead: int, sync: bool, states: RequestStates | None) -> None:
        self.n = verify_positions  # tokens a member schedules each step (1: no speculation)
        self.spec = verify_positions > 1
        self.sync = sync
        # A member's planned total is its computed tokens plus these (the step in flight's n
        # count as computed under async scheduling). Each step's outputs come after a planning,
        # which lets a member go once its tokens left reach `margin`: the next outputs, n tokens
        # at most, cannot end a member then.
        self.extra = (verify_positions if sync else 2 * verify_positions) + lookahead
        self.lookahead = lookahead
        self.margin = verify_positions
        self.states = states
        self.reqs: list[Request] = []
        self.size = 0  # members: len(reqs), asked several times a step
        # A row per member: its counters (COUNTERS' order; each column is also the attribute of
        # its name), then the acceptance counts read ahead (`draws`, where the run speculates):
        # joining and leaving move one array. `joined`: a member's first step in `times`; `ptr`,
        # `avail`: its next count in its row of `draws`, and how many the row holds.
        self.table = np.zeros((0, len(COUNTERS) + (DRAWS if self.spec else 0)), np.int64)
        self._bind()
        self.times: list[float] = []  # the end of every step the group ran since it was last empty

    def _bind(self) -> None:
        (self.computed, self.generated, self.output, self.units, self.held, self.state_end, self.bound_end,
         self.spec_steps, self.spec_tokens, self.joined, self.ptr, self.avail) = self.table[:, :len(COUNTERS)].T
        self.draws = self.table[:, len(COUNTERS):]

    # ------------------------------------------------------------------ membership
    def join(self, reqs: Sequence[Request]) -> None:
        """Take these requests' counters into the arrays (their Requests go stale)."""
        if not reqs:
            return
        step = len(self.times)
        new = np.zeros((len(reqs), self.table.shape[1]), np.int64)
        new[:, :len(COUNTERS)] = [(r.computed, r.generated, r.output, r.units, r.units_tokens, r.state_end, r.bound_end,
                                   r.spec_steps, r.spec_tokens, step, 0, 0) for r in reqs]
        self.table = np.concatenate((self.table, new))
        self._bind()
        if self.states is not None:
            self.states.add([r.commit_state for r in reqs])
        for r in reqs:
            r.group = True
        self.reqs.extend(reqs)
        self.size = len(self.reqs)

    def leave(self, which: np.ndarray, inflight: int) -> list[Request]:
        """Bring the members at indices `which` up to date and out of the group; `inflight`: the
        tokens each has in a step planned and not yet processed (n under async scheduling)."""
        if not len(which):
            return []
        keep = np.ones(self.size, bool)
        keep[which] = False
        out = []
        for i, (computed, generated, _, units, held, state_end, bound_end, spec_steps, spec_tokens, joined, ptr, _) in zip(
                which.tolist(), self.table[which, :len(COUNTERS)].tolist()):
            r = self.reqs[i]
            r.computed, r.generated, r.units, r.units_tokens = computed, generated, units, held
            r.state_end, r.bound_end = state_end, bound_end
            r.spec_steps, r.spec_tokens = spec_steps, spec_tokens
            r.token_times.extend(self.times[joined:])
            if self.spec:
                r.acceptance.skip(ptr)
            r.inflight = inflight
            r.group = False
            out.append(r)
        if self.states is not None:
            self.states.remove(keep, [(i, self.reqs[i].commit_state) for i in which.tolist()])
        self.table = self.table[keep]
        self._bind()
        for i in sorted(which.tolist(), reverse=True):
            del self.reqs[i]
        self.size = len(self.reqs)
        if not self.reqs:
            self.times = []
        return out

    def joiners(self, planned: Iterable[tuple[Request, int]], spec: set[Request] | None, inflight: int) -> list[Request]:
        """The requests of `planned` (request, tokens) that decode steadily: n tokens, verifying a
        draft where the run speculates (`spec`: the plan's verifying requests; None under sync
        scheduling, where a request verifies when it holds a draft), `inflight` tokens in steps not
        processed, and more than twice `margin` tokens from their output length."""
        n, far, running = self.n, 2 * self.margin, Status.RUNNING
        return [r for r, tokens in planned
                if tokens == n and r.inflight == inflight and r.status is running and r.generated
                and r.computed + 1 == r.prompt + r.generated and r.output - r.generated > far
                and ((r in spec) is self.spec if spec is not None else r.has_draft or not self.spec)]

    def fits(self, running: Sequence[Request], need: int, max_tokens: int, pool: Pool, lookahead: int) -> bool:
        """Whether a step can plan every member in place, as planning the running requests one by
        one in their order would: the tokens up to the last member (each other request's at most
        all it has left, or n) fit the budget, and the members' growth (`need`) with what every
        other request might grow into fits the pool, so nobody is cut short or preempted."""
        n, used, upto, worst = self.n, 0, 0, need
        for r in running:
            if r.group:
                used += n
                upto = used
                continue
            inflight = r.inflight
            computed = r.computed + inflight
            num_tokens = r.prompt + r.generated
            most = n if inflight and computed >= num_tokens else max(num_tokens - computed, n)
            used += most
            total = computed + most + lookahead
            if total > r.units_tokens:
                worst += pool.units_for(total) - r.units
            if pool.boundary is not None and computed + most > r.state_end:
                worst += pool.boundary_units
        return upto <= max_tokens and worst <= pool.free

    def near_their_end(self) -> np.ndarray:
        """The members a step of the group could end: `margin` tokens or fewer left."""
        return (self.output - self.generated <= self.margin).nonzero()[0]

    # ------------------------------------------------------------------ one step
    def growth(self, pool: Pool) -> Growth:
        """What the members ask of the pool at this planning: their planned totals past what their
        blocks hold, and in align mode (sim.engine.pool.BoundaryRule) their states' block crossings,
        with vLLM's num_computed_tokens at the planning (the lookahead and this step's n short of
        the planned total)."""
        planned = self.computed + self.extra
        grow = [(i, pool.units_for(int(planned[i]))) for i in (planned > self.held).nonzero()[0].tolist()]
        need = sum(units - int(self.units[i]) for i, units in grow)
        rule = pool.boundary
        if rule is None:
            return Growth(need, grow, None, None)
        computed = planned - self.lookahead - self.n
        holding = self.bound_end >= 0
        release = holding & (computed - rule.spec > self.bound_end)
        cross = computed + self.n > self.state_end
        return Growth(need + rule.units * int((cross & ~(holding & ~release)).sum()), grow, release, cross)

    def grow(self, pool: Pool, growth: Growth) -> None:
        """Apply a planning's growth: old states freed first, then the blocks taken."""
        rule = pool.boundary
        if rule is not None:
            pool.give(rule.units * int(growth.release.sum()))
            self.bound_end[growth.release] = -1
            cross = growth.cross
            pool.take(rule.units * int((cross & (self.bound_end < 0)).sum()))
            self.bound_end[cross] = self.state_end[cross]
            main = self.computed[cross] + self.extra - self.lookahead
            self.state_end[cross] = -(-main // rule.block) * rule.block
        for i, units in growth.grow:
            pool.take(units - int(self.units[i]))
            self.units[i] = units
            self.held[i] = pool.tokens_held(units)

    def totals(self) -> BatchTotals:
        """The members as one step's BatchTotals (a step's decodes of the uniform query length)."""
        m = self.size
        if self.states is not None:
            replayed, flush = self.states.verify_work()
            replay_tokens, flush_seqs = int(replayed.sum()), int(flush.sum())
        else:
            replay_tokens, flush_seqs = 0, m if self.spec else 0
        return BatchTotals(m, m * self.n, m, True, m if self.spec else 0, 0, replay_tokens, flush_seqs,
                           int(np.add.reduce(self.computed)), int(np.maximum.reduce(self.computed)), ())

    def complete(self, now: float) -> None:
        """Every member's outputs of the step that ended at `now`: the drafts it accepted (the next
        count of its stream) and the bonus token; one token without speculation."""
        if self.spec:
            self._refill(1)
            emitted = self.draws[np.arange(self.size), self.ptr] + 1
            self.ptr += 1
            self.spec_steps += 1
            self.spec_tokens += emitted
        else:
            emitted = 1
        self.computed += emitted
        self.generated += emitted
        if self.states is not None:
            self.states.committed(emitted)
        self.times.append(now)

    # ------------------------------------------------------------------ runs
    def draws_ahead(self, steps: int) -> np.ndarray:
        """Every member's next `steps` acceptance counts, left unused (a row per member)."""
        self._refill(steps)
        return self.draws[np.arange(self.size)[:, None], self.ptr[:, None] + np.arange(steps)]

    def _refill(self, steps: int) -> None:
        """Rows holding fewer than `steps` unused counts read their streams again (the array
        widened first when `steps` is more than a row holds)."""
        width = self.draws.shape[1]
        if steps > width:
            width = max(steps, 2 * width)
            self.table = np.concatenate((self.table[:, :len(COUNTERS)], np.zeros((self.size, width), np.int64)),
                                        axis=1)
            self._bind()
            short = np.arange(self.size)
        else:
            short = (self.ptr + steps > self.avail).nonzero()[0]
            if not short.size:
                return
        draws, reqs, counts = self.draws, self.reqs, []
        for i, ptr, left in zip(short.tolist(), self.ptr[short].tolist(),
                                (self.output[short] - self.generated[short]).tolist()):
            # As many counts as the member can use, up to `width` (a verify emits a token at least,
            # so it needs no more than its tokens left), of those its stream has drawn once it holds
            # `steps`: a member draws no sooner than on its own.
            stream = reqs[i].acceptance
            stream.skip(ptr)
            stream.ahead(steps)  # draws only where it holds fewer
            count = min(width, left, stream.drawn)
            draws[i, :count] = stream.ahead(count)
            counts.append(count)
        self.ptr[short] = 0
        self.avail[short] = counts
