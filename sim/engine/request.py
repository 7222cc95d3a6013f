"""A request's life inside the simulated engine: waiting -> running -> finished, or rejected.

Token accounting follows vLLM v1: `num_tokens` = prompt + generated tokens; a
decoding request has computed every token but the last sampled one
(`computed == num_tokens - 1`), so it schedules 1 token, or 1 + N verify positions
when it holds a draft. Preemption by recompute resets `computed` to 0 and keeps the
generated tokens, so the next prefill covers prompt + generated tokens. Under async
scheduling the next step is planned while one runs: its tokens count as computed for
planning (`computed + inflight`, vLLM's optimistic `num_computed_tokens`) and become
`computed` when its outputs are processed.
"""
from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from workloads.base import RequestSpec

if TYPE_CHECKING:
    from policies.base import RequestCommitState
    from sim.engine.acceptance import AcceptanceStream


class Status(Enum):
    PENDING = "pending"  # not yet sent by the client
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"


class Request:
    """Mutable per-request state; plain attributes (slots) because the step loop touches them often."""

    __slots__ = (
        "spec", "rid", "prompt", "output", "category",
        "arrival_s", "send_s", "engine_s", "status", "reject_reason",
        "computed", "generated", "units", "units_tokens", "state_end", "bound_end", "has_draft", "inflight",
        "preemptions", "enqueued_s", "waiting_s", "waited_for_memory", "memory_epoch",
        "first_scheduled_s", "first_token_s", "finish_s", "token_times",
        "spec_steps", "spec_tokens", "acceptance", "commit_state", "group",
    )

    def __init__(self, spec: RequestSpec, arrival_s: float) -> None:
        self.spec = spec
        self.rid = spec.request_id
        self.prompt = spec.prompt_tokens
        self.output = spec.output_tokens
        self.category = spec.category
        self.arrival_s = arrival_s  # when the client had it ready (before its concurrency limit)
        self.send_s: float | None = None  # when the client sent it: the request clock starts here
        self.engine_s: float | None = None  # when it reached the engine's waiting queue (after the API server)
        self.status = Status.PENDING
        self.reject_reason = ""
        self.computed = 0  # tokens in the KV cache / folded into the GDN state
        self.generated = 0  # output tokens emitted
        self.units = 0  # pool units held (blocks, or bytes for the ideal allocator)
        self.units_tokens = -1  # the most tokens those units hold (Pool.tokens_held); -1: none held
        # Align mode (sim.engine.pool.BoundaryRule): the end of the block its state is in, and of the
        # old state's block it still holds besides (-1: none; not in `units`)
        self.state_end = 0
        self.bound_end = -1
        self.has_draft = False  # the drafter ran after this request's last sample
        self.inflight = 0  # tokens scheduled in steps whose outputs are not processed yet (async scheduling)
        self.preemptions = 0
        self.enqueued_s = 0.0  # last time it entered the waiting queue
        self.waiting_s = 0.0  # total time in the engine's waiting queue
        self.waited_for_memory = False
        self.memory_epoch = 0  # engine's memory-blocked step counter when it was enqueued
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.token_times: list[float] = []  # one entry per emission (a verify step emitting 3 tokens is one)
        self.spec_steps = 0  # verify steps
        self.spec_tokens = 0  # tokens those steps accepted, bonus included (before output truncation)
        self.acceptance: "AcceptanceStream | None" = None  # its draws while in the engine (a speculating run)
        self.commit_state: "RequestCommitState | None" = None  # the policy's bookkeeping between verifies
        self.group = False  # in the scheduler's decode group: its counters live there (sim.engine.decode_group)

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated

    def __repr__(self) -> str:
        return (f"Request({self.rid}, {self.status.value}, computed={self.computed}, "
                f"generated={self.generated}/{self.output})")

