"""One engine step's schedule: what the scheduler plans, the engine prices and runs, and the
scheduler's output processing reads back (vLLM's `SchedulerOutput`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from sim.engine.request import Request


@dataclass
class StepPlan:
    """One step's schedule, as vLLM's `SchedulerOutput`: the target tokens scheduled per request
    (its `num_scheduled_tokens`), in scheduling order; the requests that verify a draft (its
    `scheduled_spec_decode_tokens`: tokens - 1 drafts each); the prompt chunks that stop short
    of the request's last known token, whose sampled token is discarded (vLLM tells them by
    `num_computed_tokens < num_tokens` when it processes the outputs); who was preempted and
    who admitted."""

    tokens: dict[Request, int] = field(default_factory=dict)
    spec: set[Request] = field(default_factory=set)
    partial: set[Request] = field(default_factory=set)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    group: bool = False  # every member of the scheduler's decode group is in it too (n tokens each)

    @property
    def empty(self) -> bool:
        return not self.tokens and not self.group
