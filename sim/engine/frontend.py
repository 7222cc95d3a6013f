"""vLLM's API-server event loop as a capacity-limited server (docs/frontend.md).

vLLM 0.17.1 runs its OpenAI server in one process with one asyncio event loop; the engine core
runs in its own process and does not wait for it. That loop takes in every request (HTTP,
validation, the chat template; after the tokeniser thread, the engine request and its send to
the engine core) and, for every engine step, reads the step's outputs, detokenises them
(`OutputProcessor.process_outputs`, in slices of `output_chunk` with a yield between slices)
and wakes each stream's task, which builds, serialises and writes its server-sent events. So
the client sees a token when the loop has written it, and the engine sees a request when the
loop has sent it.

The loop here is one FIFO server: a job (a request's intake or admission, a step's outputs)
starts when it has arrived and the loop is free, and holds the loop for its cost. Within a step,
vLLM's order: the outputs in the engine's order (the running requests, then those the step
admitted), slice j's processing, then slice j's streams one after another, then slice j + 1. The
k-th output of a step is written at
    start + step_s + processing of slices 0..j + the events of outputs 0..k,
the processing of a slice being `output_s` per output plus a first output's detokeniser prefill,
an output's events `stream_s` (plus `stream_s_per_token` per token its stream generated before,
at the step's mean; plus `first_stream_s` on a first output and `finish_s` on a last). The
loop's asyncio interleaving of whole jobs is taken as FIFO, and outputs a stream's task has not
consumed are not merged (they are not at these costs: each slice's streams run before the next).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.config_frontend import FrontendCosts


@dataclass
class StepEvent:
    """An output of a step that the client times: a request's first, its last, or both."""

    position: int  # its index among the step's outputs, in the engine's order
    first: bool
    last: bool
    prompt: int  # prompt tokens (the detokeniser's prefill on a first output)


class FrontendLoop:
    def __init__(self, costs: FrontendCosts) -> None:
        self.c = costs
        self.free_at = 0.0  # when the loop has done every job it took so far
        self.busy_s = 0.0  # the loop's work, summed
        self.takes_requests = (costs.intake_s or costs.intake_s_per_prompt_token or costs.admit_s
                               or costs.admit_s_per_prompt_token) > 0

    def _start(self, arrival: float, work: float) -> float:
        start = arrival if arrival > self.free_at else self.free_at
        self.free_at = start + work
        self.busy_s += work
        return start

    def intake(self, now: float, prompt: int) -> float:
        """A new request's work before its tokenisation; returns when it is done."""
        self._start(now, self.c.intake_s + self.c.intake_s_per_prompt_token * prompt)
        return self.free_at

    def admit(self, now: float, prompt: int) -> float:
        """A tokenised request's work up to its send to the engine core; returns when the engine has it."""
        self._start(now, self.c.admit_s + self.c.admit_s_per_prompt_token * prompt)
        return self.free_at

    def step(self, end: float, outputs: int, generated: int, events: Sequence[StepEvent]) -> list[float]:
        """A step ending at `end` with `outputs` outputs whose streams had generated `generated`
        tokens in all; returns when each of `events` (by position) is written."""
        c = self.c
        if not outputs:
            return [end] * len(events)
        per_event = c.stream_s + c.stream_s_per_token * generated / outputs
        prefill = [c.first_output_s + c.first_output_s_per_prompt_token * e.prompt if e.first else 0.0 for e in events]
        work = (c.step_s + outputs * (c.output_s + per_event) + sum(prefill)
                + sum(c.first_stream_s for e in events if e.first) + sum(c.finish_s for e in events if e.last))
        start = self._start(end, work) + c.step_s
        out = []
        chunk = c.output_chunk
        for e in events:
            upto = min(outputs, (e.position // chunk + 1) * chunk)  # outputs processed before its stream runs
            before = [i for i, o in enumerate(events) if o.position <= e.position]
            out.append(start + c.output_s * upto + sum(prefill[i] for i, o in enumerate(events) if o.position < upto)
                       + per_event * (e.position + 1) + sum(c.first_stream_s for i in before if events[i].first)
                       + sum(c.finish_s for i in before if events[i].last))
        return out

    def run(self, ends: Sequence[float], outputs: int, generated: tuple[int, int]) -> None:
        """A decode run's steps (sim.engine.decode_run: no first or last outputs), ending at `ends`, with
        `outputs` outputs each; `generated`: the streams' tokens before the first and after the last."""
        c = self.c
        g0, g1 = generated
        m = len(ends)
        fixed = c.step_s + outputs * (c.output_s + c.stream_s)
        free, busy = self.free_at, 0.0
        for k, e in enumerate(ends):
            w = fixed + c.stream_s_per_token * (g0 + (g1 - g0) * k / m)
            free = (e if e > free else free) + w
            busy += w
        self.free_at = free
        self.busy_s += busy
