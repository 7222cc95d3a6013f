"""How a replay times one step, synchronously and in vLLM's async-scheduling steady state, under a hard time budget.

Synchronous (`time_step`): wall time from the start of host prep to the sampled tokens on the
host, each of `reps` runs after `warmup` runs (which capture any graph the step needs). Async
scheduling (`time_step_async`): the period between consecutive steps' tokens on the host, step
N+1 prepared and launched while the GPU runs step N. The budget is checked before every timed run
(`check_deadline`, `BudgetSpent`), and SIGALRM shortly past it interrupts whatever runs
(`arm_alarm`). Collections are kept out of the timed runs (`freeze_heap`, gc disabled inside).
"""
from __future__ import annotations

import gc
import time
from typing import Callable, Sequence

ALARM_GRACE_S = 15.0  # past the budget by this much, SIGALRM interrupts whatever runs (graph capture included)
ASYNC_STEPS = 4  # pipelined steps per async timing of a short step: the period over 3 intervals
ASYNC_WORK_S = 0.15  # a longer step gets fewer pipelined steps (at least 2: one interval of >= 75 ms)


def async_steps(sync_us: float) -> int:
    """Pipelined steps for the async timing of a step whose synchronous time is sync_us: about
    ASYNC_WORK_S of steps, between 2 and ASYNC_STEPS (long mixed steps cost the budget most)."""
    return max(2, min(ASYNC_STEPS, round(ASYNC_WORK_S * 1e6 / max(sync_us, 1.0))))


class BudgetSpent(Exception):
    """The replay's time budget ran out inside a step (the step is dropped, outputs are kept)."""


def check_deadline(end: float | None) -> None:
    if end is not None and time.perf_counter() > end:
        raise BudgetSpent("time budget spent inside a step")


def time_step(ex: object, reqs: Sequence, flush: bool, reps: int, warmup: int,
              end: float | None = None) -> tuple[list[float], object]:
    """Wall times (us) of `reps` runs of one step, each from host prep to tokens on the host.
    Checks the deadline `end` before every run (BudgetSpent)."""
    for _ in range(warmup):
        check_deadline(end)
        out = ex.run(reqs, flush)
    ts = []
    gc_was = gc.isenabled()
    gc.disable()  # a collection inside a timed step is noise vLLM does not have (it freezes its heap)
    try:
        for _ in range(reps):
            check_deadline(end)
            t0 = time.perf_counter()
            out = ex.run(reqs, flush)
            ts.append((time.perf_counter() - t0) * 1e6)
    finally:
        if gc_was:
            gc.enable()
    return ts, out


def time_step_async(ex: object, reqs: Sequence, flush: bool, steps: int, end: float | None = None) -> float:
    """Wall time (us) per step in vLLM's async scheduling steady state: the host prepares and
    launches step N+1 while the GPU runs step N, then waits for step N's tokens.

    The period between consecutive steps' tokens reaching the host (`finish` returning), over
    max(steps, 2) pipelined steps: max(host prep + launch, GPU time) in steady
    state; every launched step is waited for. (The
    version before this one timed one prepare/launch/finish after a gc.collect() during which the
    previous step's GPU work had already finished, and never waited for the step it launched:
    it measured the host launch alone, ~3 ms for every full-graph step.)"""
    k = max(steps, 2)  # at least one interval
    gc_was = gc.isenabled()
    gc.disable()
    try:
        check_deadline(end)
        st = ex.prepare(reqs, flush)
        ex.launch(st)
        done: list[float] = []
        for _ in range(k):
            check_deadline(end)
            nxt = ex.prepare(reqs, flush)
            ex.launch(nxt)
            ex.finish(st)
            done.append(time.perf_counter())
            st = nxt
        ex.finish(st)  # waited for, untimed: no next step is prepared behind it
    finally:
        if gc_was:
            gc.enable()
    # Intervals between tokens on the host, each with the next step's prep and launch inside
    # it; the first finish opens the first interval (its step started from an idle GPU).
    return (done[-1] - done[0]) * 1e6 / (len(done) - 1)


def freeze_heap() -> None:
    """One full collection, then gc.freeze(): the traced steps of every run, the weights' and
    graphs' Python objects (~400k objects for 18 runs) move to the permanent generation. Without
    it each step's gc.collect() walked them all (0.2-0.3 s a call, two calls a step: most of the
    ~0.7 s of host time per 3-5 ms step in an early replay). vLLM freezes its heap the same way."""
    gc.collect()
    gc.freeze()


def arm_alarm(budget_s: float | None) -> Callable[[], None]:
    """SIGALRM at budget_s + ALARM_GRACE_S raising KeyboardInterrupt (the outputs are then written);
    returns the disarm. A no-op off the main thread, without SIGALRM or without a budget."""
    import signal
    import threading

    if budget_s is None or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        return lambda: None

    def fire(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"time budget {budget_s} s + {ALARM_GRACE_S} s grace spent")
    prev = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(1e-3, budget_s + ALARM_GRACE_S))

    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, prev)
    return disarm
