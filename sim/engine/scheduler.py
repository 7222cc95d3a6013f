"""vLLM-v1-style scheduling of one engine step (docs/vllm.md#scheduling, docs/engine.md).

Running requests first, in list order, then waiting ones FCFS, all under one token
budget (`max_num_batched_tokens`): chunked prefill. A decoding request that holds a
draft schedules its 1 + N verify positions. When the budget left is shorter, a chain
draft is truncated to the budget (vLLM's `spec_token_ids[:num_scheduled_spec_tokens]`)
or, with `truncate_drafts` off or a tree (which cannot be cut), the request schedules
1 token. Every request also gets K lookahead KV slots for the drafter once it has
computed tokens. When a running request cannot get its blocks, the newest running
request is preempted (recompute: blocks freed, computed tokens reset, put at the
front of the waiting queue) until the allocation fits or the request itself was
preempted. No waiting request is admitted in a step that preempted. Admission needs
blocks for the whole sequence, `min(num_tokens, max_model_len)` without lookahead
(vLLM's `full_sequence_must_fit`; option: the first chunk only), and fewer than
`max_num_seqs` running requests. The whole-prompt rule is a check, not a
reservation: only the scheduled chunk's blocks are allocated, as in vLLM.

Mamba cache mode "align" (prefix caching on a hybrid model): a prefill chunk ends on
a block boundary (vLLM's `_mamba_block_aligned_split`), so a budget left over that is
smaller than one block starts no chunk: a running request is skipped, the waiting
queue stops.

Async scheduling: the step after the one in flight is planned before the in-flight
step's outputs are known. The in-flight tokens count as computed (vLLM advances
`num_computed_tokens` at schedule time, `Request.inflight` here); a request whose
in-flight step samples is scheduled another verify on placeholder drafts unless that
step surely ends it (one more token reaches its output length); a request not
scheduled in the previous plan has no draft (vLLM drops unused placeholders).

Decode group (sim.engine.decode_group): requests in steady decode are kept as arrays, and a step
plans them in place, in their running order, as the loop below plans one: n tokens each, the
members that outgrow their blocks given more. Where the budget or the pool could not serve
every member in that order, the group empties first and the step is planned one by one.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from sim.engine.decode_group import KEEP, DecodeGroup, Growth
from sim.engine.pool import Pool
from sim.engine.request import Request, Status
from sim.engine.step_plan import StepPlan

REJECT_CONTEXT = "exceeds_context"  # prompt + output longer than the model's max_model_len
REJECT_POOL = "exceeds_pool"  # the request alone, at full length, needs more than the whole pool


class Scheduler:
    def __init__(self, pool: Pool, *, max_num_batched_tokens: int, max_num_seqs: int, verify_positions: int,
                 lookahead: int, admission: str, max_model_len: int, async_scheduling: bool,
                 truncate_drafts: bool, align_tokens: int, group: DecodeGroup | None = None) -> None:
        """`truncate_drafts` only for a chain draft; `align_tokens`: the block size of mamba cache
        mode "align" (0: chunks are not aligned); `group`: where steady decodes are kept as
        arrays (sim.engine.decode_group; None: every request planned on its own)."""
        if admission not in ("full_prompt", "first_chunk"):
            raise ValueError(f"engine.admission must be 'full_prompt' or 'first_chunk', got {admission!r}")
        if align_tokens < 0:
            raise ValueError(f"align_tokens must be >= 0, got {align_tokens}")
        self.pool = pool
        self.max_tokens = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.verify_positions = verify_positions  # 1 + N draft nodes; 1 disables speculation
        self.lookahead = lookahead
        self.full_prompt = admission == "full_prompt"
        self.max_model_len = max_model_len
        self.async_scheduling = async_scheduling
        self.truncate_drafts = truncate_drafts
        self.align_tokens = align_tokens
        # MTP is an EAGLE-style drafter (vLLM `use_eagle()`): align mode keeps the last
        # cached block one block further back (`_mamba_block_aligned_split`'s eagle prune).
        self.eagle_prune = lookahead > 0
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.memory_blocked_steps = 0  # steps that preempted, or whose queue head could not get its blocks
        self.preemptions = 0
        self.group = group

    # ------------------------------------------------------------------ arrivals
    def reject_reason(self, req: Request) -> str:
        """Why a request can never run here ('' if it can)."""
        total = req.prompt + req.output
        if total > self.max_model_len:
            return REJECT_CONTEXT
        # Its largest footprint: every token plus one verify tree and the lookahead slots.
        if self.pool.units_for(total + self.verify_positions + self.lookahead) > self.pool.capacity:
            return REJECT_POOL
        return ""

    def add(self, req: Request, now: float) -> None:
        req.status = Status.WAITING
        req.engine_s = req.enqueued_s = now
        req.memory_epoch = self.memory_blocked_steps
        self.waiting.append(req)

    # ------------------------------------------------------------------ one step
    def schedule(self, now: float, in_flight: StepPlan | None = None) -> StepPlan:
        """The next step. `in_flight`: the step planned before whose outputs are not processed yet
        (async scheduling); decode-group members that leave the group now go into it on their own."""
        plan = StepPlan()
        growth = self._plan_group(plan, in_flight) if self.group is not None and self.group.size else None
        budget = self.max_tokens
        vp = self.verify_positions
        la = self.lookahead
        running = self.running
        scheduled, spec_reqs, partial = plan.tokens, plan.spec, plan.partial
        sync = not self.async_scheduling
        truncate = self.truncate_drafts
        align = self.align_tokens
        speculate = vp > 1
        pool = self.pool
        rule = pool.boundary
        # A preemption pops from the end of `running`: iterating it then stops before the popped ones.
        for req in running:
            if budget <= 0:
                break
            if req.group:
                budget -= vp  # a member: the group plans its n tokens
                continue
            inflight = req.inflight
            computed = req.computed + inflight  # vLLM's num_computed_tokens
            generated = req.generated
            num_tokens = req.prompt + generated
            if inflight and computed >= num_tokens:
                # Its in-flight step samples and its output is not known yet.
                if generated + 1 >= req.output:
                    continue  # that step surely finishes it: no extra step
                remaining, draft = 1, True  # the in-flight step's drafter fills the placeholders
            else:
                remaining, draft = num_tokens - computed, sync and req.has_draft
            if remaining == 1 and draft and speculate:
                if vp <= budget:
                    n, spec = vp, True
                elif truncate:
                    n = budget
                    spec = n > 1
                else:
                    n, spec = 1, False
            else:
                spec = False
                n = remaining if remaining < budget else budget
                # Only a prefill chunk is aligned (_chunk's own test, asked here to spare decodes the call).
                if align and (computed < req.prompt or computed < num_tokens - 1):
                    n = self._chunk(req, computed, n)
                    if n == 0:
                        continue  # align mode: no aligned chunk fits the budget left; later requests may
            total = computed + n + la
            cross = False
            if rule is not None:  # align mode: vLLM's allocate_slots first frees a crossed boundary's old state
                if req.bound_end >= 0 and rule.releases(computed, req.bound_end):
                    pool.give(rule.units)
                    req.bound_end = -1
                cross = computed + n > req.state_end
            if (total > req.units_tokens or cross) and not self._grow(req, total, plan, now, cross, computed + n):
                break  # preempted itself: nobody after it runs either
            scheduled[req] = n
            if spec:
                spec_reqs.add(req)
            elif computed + n < num_tokens:
                partial.add(req)
            req.inflight = inflight + n
            budget -= n

        if plan.preempted:
            self.memory_blocked_steps += 1  # nobody is admitted this step: memory was short
            return plan
        waiting = self.waiting
        if growth is not None:
            self.group.grow(pool, growth)
        while waiting and budget > 0 and len(running) < self.max_seqs:
            req = waiting[0]
            total = req.num_tokens  # a preempted request recomputes its outputs too
            n = self._chunk(req, 0, min(total, budget))
            if n == 0:
                break
            # Lookahead slots only once the request has computed tokens (vLLM's effective_lookahead_tokens).
            need = pool.units_for(n)
            check = pool.units_for(min(total, self.max_model_len)) if self.full_prompt else need
            if check > pool.free:
                self.memory_blocked_steps += 1
                break
            pool.take(need)
            req.units = need
            req.units_tokens = pool.tokens_held(need)
            if rule is not None:
                req.state_end = rule.end(n)
            waiting.popleft()
            req.status = Status.RUNNING
            req.waiting_s += now - req.enqueued_s
            if self.memory_blocked_steps > req.memory_epoch:
                req.waited_for_memory = True
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now
            running.append(req)
            plan.admitted.append(req)
            scheduled[req] = n
            if n < total:
                partial.add(req)
            req.inflight += n
            budget -= n
        return plan

    def _plan_group(self, plan: StepPlan, in_flight: StepPlan | None) -> Growth | None:
        """The decode group's part of the step: members near their output length leave it first;
        then either every member is planned in place (n tokens each) and what they ask of the pool
        is returned (sim.engine.decode_group.Growth), or, where the budget or the pool could not
        serve them all in running order, every member leaves and the step is planned one by one."""
        group = self.group
        self._leave(group.near_their_end(), in_flight)
        if group.size < KEEP:  # too few to be worth the arrays: planned one by one (a decode run's group)
            self._leave(np.arange(group.size), in_flight)
            return None
        growth = group.growth(self.pool)
        if not group.fits(self.running, growth.need, self.max_tokens, self.pool, self.lookahead):
            self._leave(np.arange(group.size), in_flight)
            return None
        plan.group = True
        return growth

    def _leave(self, which: np.ndarray, in_flight: StepPlan | None) -> None:
        """Members out of the group; in the step in flight (async) they are planned on their own."""
        n = self.verify_positions
        left = self.group.leave(which, 0 if in_flight is None else n)
        if in_flight is not None:
            for req in left:
                in_flight.tokens[req] = n
                if n > 1:
                    in_flight.spec.add(req)

    def _grow(self, req: Request, total: int, plan: StepPlan, now: float, cross: bool, main: int) -> bool:
        """Give a running request the units for `total` tokens, and where its state crosses a block
        (`cross`, align mode; `main`: its tokens without lookahead) the new state's, preempting the
        newest running requests while the pool is short; False if it preempted `req` itself."""
        pool = self.pool
        need = max(pool.units_for(total) - req.units, 0)
        # A second crossing before the first's release (they are a block apart, the release within
        # num_speculative_blocks tokens) would keep one old state: none is taken for it.
        extra = pool.boundary_units if cross and req.bound_end < 0 else 0
        while need + extra > pool.free:
            victim = self.running.pop()
            self._preempt(victim, now)
            plan.preempted.append(victim)
            if victim is req:
                return False
        if need:
            pool.take(need)
            req.units += need
            req.units_tokens = pool.tokens_held(req.units)
        if cross:
            pool.take(extra)
            req.bound_end = req.state_end
            req.state_end = pool.boundary.end(main)
        return True

    def _chunk(self, req: Request, computed: int, n: int) -> int:
        """The prefill chunk of at most `n` tokens that align mode allows (vLLM `_mamba_block_aligned_split`)."""
        block = self.align_tokens
        if not block or computed >= max(req.prompt, req.num_tokens - 1):  # not a prefill
            return n
        last = req.num_tokens - req.num_tokens % block  # the last block boundary, whose state is cached
        if self.eagle_prune:
            last = max(last - block, 0)
        after = computed + n
        if after < last:
            return n // block * block
        if computed < last < after:
            return last - computed  # stop on the last boundary so its state is cached
        return n  # the tail after the last boundary

    def _free(self, req: Request) -> None:
        """All a request holds back to the pool: its blocks and a crossed boundary's old state."""
        self.pool.give(req.units + (self.pool.boundary_units if req.bound_end >= 0 else 0))
        req.units, req.units_tokens, req.state_end, req.bound_end = 0, -1, 0, -1

    def _preempt(self, req: Request, now: float) -> None:
        self._free(req)
        req.computed = 0
        req.inflight = 0  # an in-flight step still delivers its sampled tokens; its KV is recomputed
        req.has_draft = False
        req.preemptions += 1
        req.waited_for_memory = True
        if req.commit_state is not None:
            req.commit_state.reset()
        req.status = Status.WAITING
        req.enqueued_s = now
        req.memory_epoch = self.memory_blocked_steps
        self.waiting.appendleft(req)
        self.preemptions += 1

    # ------------------------------------------------------------------ outputs
    def update_from_output(self, plan: StepPlan, now: float, accepted: Callable[[Request, int], int] | None = None,
                           following: StepPlan | None = None) -> list[Request]:
        """Process a step's outputs (vLLM's `Scheduler.update_from_output`): progress, the drafts
        each verifying request whose outputs count accepted, emitted tokens; returns the requests it
        finished, whose blocks are freed and who leave `running`. The step's sampled result for a
        request verifying n positions is the next count of its acceptance stream (at most its n - 1
        drafts), or `accepted(req, n)` where given (the engine's, when it records the trace). Then
        requests that decode steadily join the decode group: under async scheduling from `following`,
        the step planned while this one ran."""
        finished: list[Request] = []
        spec_enabled = self.verify_positions > 1
        spec_reqs, partial = plan.spec, plan.partial
        done, waiting = Status.FINISHED, Status.WAITING  # looked up once: this loop runs per request
        for req, n in plan.tokens.items():
            status = req.status
            if status is done:
                continue  # async: an earlier step's outputs ended it; this step's tokens are discarded
            # Async: preempted while this step ran. Its sampled tokens still count (vLLM appends
            # them); its KV and state are recomputed from scratch, so progress is not kept.
            preempted = status is waiting
            if req in spec_reqs:
                # the accepted drafts and the bonus token
                emit = (req.acceptance.accepted_drafts(n - 1) if accepted is None else accepted(req, n)) + 1
                req.spec_steps += 1
                req.spec_tokens += emit
                if not preempted:
                    req.inflight -= n
                    req.computed += emit  # the root token and the accepted drafts; the bonus is sampled
                    if req.commit_state is not None:
                        req.commit_state.committed(emit)
            else:
                if not preempted:
                    req.inflight -= n
                    req.computed += n
                if req in partial:
                    continue  # a prompt chunk samples a token only when it is the last
                emit = 1
            generated = req.generated
            if not generated:
                req.first_token_s = now
            req.token_times.append(now)
            if not preempted:
                req.has_draft = spec_enabled  # the drafter ran over this request's new tokens
            generated += emit
            if generated < req.output:
                req.generated = generated
            else:  # it stops at its output length; extra accepted tokens are dropped
                req.generated = req.output
                self._finish(req)
                req.status = done
                req.finish_s = now
                finished.append(req)
        if plan.group and self.group.size:
            self.group.complete(now)
        if finished:
            running = self.running
            for req in finished:  # a few a step: remove each (one preempted while its last step ran is not there)
                try:
                    running.remove(req)
                except ValueError:
                    pass
        if self.group is not None:
            self._join(following)
        return finished

    def _join(self, following: StepPlan | None) -> None:
        """Requests that decode steadily into the group (where it would hold KEEP at least): under
        async scheduling those `following` plans, the step planned while the last one ran."""
        group = self.group
        if self.async_scheduling:
            if following is None or group.size + len(following.tokens) < KEEP:
                return
            joining = group.joiners(following.tokens.items(), following.spec, inflight=self.verify_positions)
        else:
            if len(self.running) < KEEP:
                return
            joining = group.joiners(((r, self.verify_positions) for r in self.running if not r.group), None,
                                    inflight=0)
        if group.size + len(joining) < KEEP:
            return
        if self.async_scheduling:
            self._take_from(following, joining)
        group.join(joining)

    def join_planned(self, plan: StepPlan) -> bool:
        """Every request `plan` holds on its own into the group, if every one decodes steadily
        (a decode run's group, however small: the step after the run plans a small one one by one)."""
        joining = self.group.joiners(plan.tokens.items(), plan.spec, inflight=self.verify_positions)
        if len(joining) != len(plan.tokens):
            return False
        self._take_from(plan, joining)
        self.group.join(joining)
        return True

    @staticmethod
    def _take_from(plan: StepPlan, joining: list[Request]) -> None:
        for req in joining:
            del plan.tokens[req]
            plan.spec.discard(req)
        plan.group |= bool(joining)

    def _finish(self, req: Request) -> None:
        """Free a finished request's blocks.

        Under async scheduling a request preempted while its last step ran finishes from
        the waiting queue (vLLM's `stopped_preempted_reqs`)."""
        if req.status is Status.WAITING:
            self.waiting.remove(req)
        self._free(req)
