"""One order of scheduler calls for vLLM's scheduler and the simulator's alike (no vLLM import here).

vLLM's engine core with async scheduling (`EngineCore.step_with_batch_queue`, a queue of two
batches; vllm/v1/engine/core.py) plans step k + 1 while step k runs and processes step k's
outputs when it ends, then plans step k + 2; without async scheduling it plans, runs and
processes one step at a time. Where a plan comes out empty while a step runs, the next one is
made after that step's outputs. The simulator's engine (sim/engine/core.py) keeps the same order.
`drive` makes these calls on a scheduler at given step start times, the requests reaching it
at their arrival times (those up to a call's time are added before it), and returns every plan
it made: the steps of a run are replayed on another scheduler, call for call.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Arrival:
    rid: int
    prompt: int
    output: int
    at_s: float  # when it reached the engine's waiting queue


@dataclass
class Planned:
    step: int
    at_s: float  # when it was planned
    tokens: dict[int, int]  # request id -> tokens scheduled
    preempted: set[int] = field(default_factory=set)


class Adapter(Protocol):
    def add(self, arrival: Arrival) -> None: ...

    def schedule(self, at_s: float, in_flight: Any | None) -> tuple[Any, Planned] | None:
        """The next plan (a handle for `update` and what it scheduled), None if it is empty."""

    def update(self, handle: Any, end_s: float, following: Any | None) -> None: ...


def drive(sched: Adapter, arrivals: Sequence[Arrival], step_starts: Sequence[float],
          async_scheduling: bool) -> list[Planned]:
    """The plans `sched` makes when its steps start at `step_starts` (one plan per step; planning
    stops where it plans nothing though steps remain, or runs out of steps)."""
    order = sorted(arrivals, key=lambda a: (a.at_s, a.rid))
    nxt = 0
    plans: list[Planned] = []

    def plan(k: int, at_s: float, in_flight: Any | None) -> Any | None:
        nonlocal nxt
        while nxt < len(order) and order[nxt].at_s <= at_s:
            sched.add(order[nxt])
            nxt += 1
        made = sched.schedule(at_s, in_flight)
        if made is None:
            return None
        handle, planned = made
        planned.step, planned.at_s = k, at_s
        plans.append(planned)
        return handle

    current = None
    for k, start in enumerate(step_starts):
        if current is None:
            current = plan(k, start, None)
            if current is None:
                break
        following = plan(k + 1, start, current) if async_scheduling else None
        end = step_starts[k + 1] if k + 1 < len(step_starts) else start
        sched.update(current, end, following)
        current = following
    return plans
