"""vLLM-v1-style scheduling of one engine step (DESIGN.md section 5).

Running requests first, in list order, then waiting ones FCFS, all under one token
budget (`max_num_batched_tokens`): chunked prefill. A decoding request that holds a
draft schedules its 1 + N verify positions, or 1 token when the whole tree does not
fit the remaining budget (a tree cannot be truncated). Every request also gets K
lookahead KV slots for the drafter. When a running request cannot get its blocks,
the newest running request is preempted (recompute: blocks freed, computed tokens
reset, put at the front of the waiting queue) until the allocation fits or the
request itself was preempted. No waiting request is admitted in a step that
preempted. Admission needs blocks for the whole prompt (vLLM 0.33; option: the first
chunk only) plus lookahead slots and the GDN state blocks, and fewer than
`max_num_seqs` running requests. The whole-prompt rule is a check, not a
reservation: only the scheduled chunk's blocks are allocated, as in vLLM.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sim.pool import Pool
from sim.request import Request, Status

REJECT_CONTEXT = "exceeds_context"  # prompt + output longer than the model's max_model_len
REJECT_POOL = "exceeds_pool"  # the request alone, at full length, needs more than the whole pool


@dataclass
class StepPlan:
    """One step's schedule: parallel lists (cheap to build and walk)."""

    reqs: list[Request] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # target tokens scheduled per request
    spec: list[bool] = field(default_factory=list)  # verifies a draft tree this step
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    context_tokens: int = 0  # sum of computed tokens of the scheduled requests
    max_context: int = 0


class Scheduler:
    def __init__(self, pool: Pool, *, max_num_batched_tokens: int, max_num_seqs: int, verify_positions: int,
                 lookahead: int, admission: str, max_model_len: int) -> None:
        if admission not in ("full_prompt", "first_chunk"):
            raise ValueError(f"engine.admission must be 'full_prompt' or 'first_chunk', got {admission!r}")
        self.pool = pool
        self.max_tokens = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.verify_positions = verify_positions  # 1 + N draft nodes; 1 disables speculation
        self.lookahead = lookahead
        self.full_prompt = admission == "full_prompt"
        self.max_model_len = max_model_len
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.memory_blocked_steps = 0  # steps that preempted, or whose queue head could not get its blocks
        self.preemptions = 0

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
        req.enqueued_s = now
        req.memory_epoch = self.memory_blocked_steps
        self.waiting.append(req)

    # ------------------------------------------------------------------ one step
    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        pool = self.pool
        budget = self.max_tokens
        vp = self.verify_positions
        la = self.lookahead
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            remaining = req.prompt + req.generated - req.computed
            spec = remaining == 1 and req.has_draft and vp > 1 and vp <= budget
            n = vp if spec else min(remaining, budget)
            need = pool.units_for(req.computed + n + la) - req.units
            scheduled = True
            while need > pool.free:
                victim = running.pop()
                self._preempt(victim, now)
                plan.preempted.append(victim)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            if need > 0:
                pool.take(need)
                req.units += need
            self._add(plan, req, n, spec)
            budget -= n
            i += 1

        if plan.preempted:
            self.memory_blocked_steps += 1  # nobody is admitted this step: memory was short
            return plan
        waiting = self.waiting
        while waiting and budget > 0 and len(running) < self.max_seqs:
            req = waiting[0]
            total = req.prompt + req.generated  # a preempted request recomputes its outputs too
            n = min(total, budget)
            check = pool.units_for((total if self.full_prompt else n) + la)
            if check > pool.free:
                self.memory_blocked_steps += 1
                break
            need = pool.units_for(n + la)
            pool.take(need)
            req.units = need
            waiting.popleft()
            req.status = Status.RUNNING
            req.waiting_s += now - req.enqueued_s
            if self.memory_blocked_steps > req.memory_epoch:
                req.waited_for_memory = True
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now
            running.append(req)
            plan.admitted.append(req)
            self._add(plan, req, n, False)
            budget -= n
        return plan

    @staticmethod
    def _add(plan: StepPlan, req: Request, n: int, spec: bool) -> None:
        plan.reqs.append(req)
        plan.tokens.append(n)
        plan.spec.append(spec)
        plan.context_tokens += req.computed
        if req.computed > plan.max_context:
            plan.max_context = req.computed

    def _preempt(self, req: Request, now: float) -> None:
        self.pool.give(req.units)
        req.units = 0
        req.computed = 0
        req.has_draft = False
        req.preemptions += 1
        req.waited_for_memory = True
        req.steps_since_flush = 0
        req.tokens_since_flush = 0
        req.status = Status.WAITING
        req.enqueued_s = now
        req.memory_epoch = self.memory_blocked_steps
        self.waiting.appendleft(req)
        self.preemptions += 1

    def finish(self, req: Request) -> None:
        """Free a finished request's blocks (the caller removes it from `running`)."""
        self.pool.give(req.units)
        req.units = 0
