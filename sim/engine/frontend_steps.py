"""The engine's side of the API server's loop (sim.engine.frontend): which outputs of a step the client
times, where they stand in the step's outputs, and when the loop writes them.

vLLM's engine core lists a step's outputs in its scheduling order (vllm/v1/core/sched/scheduler.py,
`update_from_output` walks `num_scheduled_tokens`: the running requests in their order, then the
ones the step admitted, which the scheduler appends to `running` here too). A request's first
output and its last are the ones the client times; only requests that sample in the step and have
no token yet, or are within a step's tokens of their length, can have one, so only those are
placed, by one walk over the running requests. Decode-group members emit every step of the group
and are never first or last (they leave the group before a step could end them).
"""
from __future__ import annotations

from typing import NamedTuple

from sim.engine.decode_group import DecodeGroup
from sim.engine.frontend import FrontendLoop, StepEvent
from sim.engine.request import Request, Status
from sim.engine.scheduler import Scheduler
from sim.engine.step_plan import StepPlan


class PlacedOutputs(NamedTuple):
    """A step's outputs as the API server's loop will stream them, taken before the scheduler
    processes them (`candidates`) and handed to `serve` after."""

    positions: dict[Request, int]  # where each request that may get its first or last output stands
    outputs: int  # the step's outputs: requests that sample in it
    generated: int  # the tokens their streams had generated before the step


def candidates(sched: Scheduler, plan: StepPlan) -> PlacedOutputs:
    """Before the step's outputs are processed: the positions of the plan's requests that may get
    their first or last output, the step's outputs and the tokens their streams had generated."""
    most = sched.verify_positions  # tokens a step emits for a request at most
    done, partial, tokens = Status.FINISHED, plan.partial, plan.tokens
    maybe = {r for r in tokens if r.status is not done and r not in partial
             and (not r.generated or r.output - r.generated <= most)}
    group = sched.group if plan.group else None
    members = group.size if group is not None else 0
    own = [r for r in tokens if r.status is not done and r not in partial]
    generated = (int(group.generated.sum()) if members else 0) + sum(r.generated for r in own)
    if not maybe:
        return PlacedOutputs({}, members + len(own), generated)
    pos, k = {}, 0
    for r in sched.running:
        if r.group:
            k += members > 0
        elif r in tokens and r.status is not done and r not in partial:
            if r in maybe:
                pos[r] = k
            k += 1
    # preempted while the step ran: its tokens still count, after the others (in request order: a set
    # of requests iterates in the order of their addresses, which differs from run to run)
    for r in sorted(maybe - pos.keys(), key=lambda r: r.rid):
        pos[r] = k
        k += 1
    return PlacedOutputs(pos, members + len(own), generated)


def serve(front: FrontendLoop, placed: PlacedOutputs, now: float,
          finished: list[Request]) -> dict[Request, float]:
    """After the step's outputs are processed: when the loop writes each first and last output;
    sets the requests' first-token and finish times to those. Returns the finished ones' times."""
    pos, outputs, generated = placed
    ended = set(finished)
    timed = [(r, p) for r, p in pos.items() if r in ended or (r.first_token_s == now and len(r.token_times) == 1)]
    if not timed and not outputs:
        return {}
    timed.sort(key=lambda rp: rp[1])
    events = [StepEvent(p, r.first_token_s == now and len(r.token_times) == 1, r in ended, r.prompt) for r, p in timed]
    written = front.step(now, outputs, generated, events)
    out = {}
    for (r, _), e, t in zip(timed, events, written):
        if e.first:
            r.first_token_s = t
            r.token_times[0] = t
        if e.last:
            r.finish_s = t
            r.token_times[-1] = t
            out[r] = t
    return out


def serve_run(front: FrontendLoop, group: DecodeGroup, first_step: int, generated_before: int) -> None:
    """A decode run's steps: the group's step ends from `first_step` on."""
    ends = group.times[first_step:]
    if ends:
        front.run(ends, group.size, (generated_before, int(group.generated.sum())))
