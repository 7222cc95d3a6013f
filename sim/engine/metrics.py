"""Serving metrics as vLLM's benchmark defines them, and the per-step log they draw on.

TTFT = first output - send time; TPOT = (E2E - TTFT) / (output tokens - 1) for outputs
longer than one token; ITL = gaps between consecutive emissions of a request (a
verify step that emits several tokens is one gap); E2E = last output - send time;
throughput = completed requests (output tokens) / duration of the run; percentiles
with linear interpolation (numpy's default, as the benchmark uses). Every request
generates its workload's output length, as the benchmark's requests do with
`--ignore-eos` (without it a model may stop earlier; a workload's `output_cap` or
`output_resample` models that: docs/engine.md).
"""
from __future__ import annotations

from array import array
from collections import Counter, deque
from itertools import chain
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from sim.engine.request import Request, Status
from sim.engine.step_trace import TracedStep
from sim.pricing.latency import TERMS, StepBatch, StepTime, StepTimes

PERCENTILES = {"median": 50, "p90": 90, "p99": 99}
STEP_COLUMNS = ("time_s", "duration_s", "num_seqs", "num_tokens", "prefill_tokens", "spec_seqs", "running",
                "waiting", "preempted", "used_units", "kv_usage", "mode")
EVENT_COLUMNS = ("time_s", "event", "request_id")
US = 1e-6
GAP_CHUNK = 4096  # requests whose inter-token gaps are gathered at a time


class StepLog:
    """Per-step records: always the few the summary needs, the full trace on request.

    A step is logged as the row of its price in a table of the run's distinct prices
    (sim.engine.step_prices prices each distinct batch once) and the pool's free units; durations,
    pool usage and the per-term sums are worked out from those when asked, in step order,
    so each is the float that adding step by step gives."""

    def __init__(self, trace: bool, capacity: int) -> None:
        """`capacity`: the pool's units (usage = 1 - free / capacity, as Pool.usage)."""
        self.trace = trace
        self.capacity = capacity
        self.request_steps = 0  # requests scheduled, summed over steps
        self.price_rows = array("q")  # per step: its row of the price table
        self.free = array("q")  # per step: the pool's free units after its allocations
        self._terms = array("d")  # per price: seconds per term, TERMS order
        self._totals = array("d")  # per price: the step time
        self._eager = array("b")  # per price: a piecewise or eager step
        self._modes: list[str] = []  # per price: StepTime.mode
        self.rows: list[tuple] = []  # STEP_COLUMNS, with trace only
        self.events: list[tuple[float, str, int]] = []  # (time, admit|preempt|finish|reject, request id), trace only
        self._traced: list[tuple[float, StepBatch, StepTime]] = []  # trace only
        self._accepted: list[list[int]] = []  # per traced step, per request
        self._verifying: dict[int, deque[tuple[int, int]]] = {}  # rid -> (step, slot) awaiting an accepted count

    def add_price(self, st: StepTime, eager: bool) -> int:
        """A new distinct price; its row in the table."""
        self._terms.extend(map(st.terms.__getitem__, TERMS))
        self._totals.append(st.total_s)
        self._eager.append(eager)
        self._modes.append(st.mode)
        return len(self._totals) - 1

    def add_prices(self, times: StepTimes, eager: bool) -> np.ndarray:
        """New distinct prices, one per step of `times`; their rows in the table."""
        first = len(self._totals)
        n = len(times.total_s)
        self._terms.frombytes(np.ascontiguousarray(times.terms_s, dtype=float).tobytes())
        self._totals.frombytes(np.ascontiguousarray(times.total_s, dtype=float).tobytes())
        self._eager.extend([eager] * n)
        self._modes.extend([times.mode] * n)
        return np.arange(first, first + n, dtype=np.int64)

    def price(self, row: int) -> StepTime:
        """The StepTime of a row of the price table."""
        k = len(TERMS)
        return StepTime(dict(zip(TERMS, self._terms[row * k:(row + 1) * k])), self._modes[row])

    def _rows(self) -> np.ndarray:
        return np.frombuffer(self.price_rows, dtype=np.int64) if self.price_rows else np.zeros(0, dtype=np.int64)

    @property
    def durations(self) -> np.ndarray:
        """Step times in seconds, per step."""
        return np.asarray(self._totals, dtype=float)[self._rows()]

    @property
    def usage(self) -> np.ndarray:
        """vLLM's kv_cache_usage after each step's allocations."""
        return 1.0 - np.asarray(self.free, dtype=np.int64) / self.capacity

    @property
    def eager_steps(self) -> int:
        return int(np.asarray(self._eager, dtype=bool)[self._rows()].sum())

    @property
    def term_sums(self) -> dict[str, float]:
        """Seconds per term over all steps; a cumulative sum adds in step order, as a running total would."""
        if not self.price_rows:
            return dict.fromkeys(TERMS, 0.0)
        table = np.asarray(self._terms, dtype=float).reshape(-1, len(TERMS))
        rows = self._rows()
        # One term at a time: a million steps' terms side by side would be 70 MB per copy.
        return {t: float(np.cumsum(table[rows, k])[-1]) for k, t in enumerate(TERMS)}

    def record(self, now: float, batch: StepBatch, st: StepTime) -> None:
        """Keep a step for the trace (`batch.requests` filled by the engine when tracing)."""
        step = len(self._traced)
        self._traced.append((now, batch, st))
        self._accepted.append([r.accepted for r in batch.requests])
        for slot, r in enumerate(batch.requests):
            if r.tree:
                self._verifying.setdefault(r.rid, deque()).append((step, slot))

    def accepted(self, rid: int, positions: int) -> None:
        """A verify of request `rid` completed with `positions` accepted (bonus included).

        Verifies complete in the order they were scheduled, also when the engine
        schedules a step before the previous one completes (async scheduling).
        """
        step, slot = self._verifying[rid].popleft()
        self._accepted[step][slot] = positions

    def traced_steps(self) -> list[TracedStep]:
        out = []
        for i, ((now, batch, st), acc) in enumerate(zip(self._traced, self._accepted)):
            reqs = tuple(replace(r, accepted=a) if r.accepted != a else r for r, a in zip(batch.requests, acc))
            out.append(TracedStep(i, now, batch.kind, reqs, st.total_s / US,
                                  {t: v / US for t, v in st.terms.items()}))
        return out

    def __len__(self) -> int:
        return len(self.price_rows)


def _stats(prefix: str, values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """Mean and percentiles; an array passed in is the function's to reorder (its percentiles are
    taken in place: the inter-token gaps of a long run are hundreds of MB)."""
    if len(values) == 0:
        return {f"{prefix}_mean_s": None, **{f"{prefix}_{k}_s": None for k in PERCENTILES}}
    arr = values if isinstance(values, np.ndarray) else np.asarray(values, dtype=float)
    out = {f"{prefix}_mean_s": float(arr.mean())}
    qs = np.percentile(arr, list(PERCENTILES.values()), overwrite_input=True)
    out.update({f"{prefix}_{name}_s": float(v) for name, v in zip(PERCENTILES, qs)})
    return out


def _gaps(requests: Sequence[Request]) -> np.ndarray:
    """Every request's gaps between emissions, request after request, as one array, worked out
    GAP_CHUNK requests at a time (an array of every emission time beside it would double a long
    run's peak memory)."""
    counts = np.fromiter((len(r.token_times) for r in requests), np.int64, len(requests))
    out = np.empty(int(np.maximum(counts - 1, 0).sum()))
    at = 0
    for lo in range(0, len(requests), GAP_CHUNK):
        part = counts[lo:lo + GAP_CHUNK]
        times = np.fromiter(chain.from_iterable(r.token_times for r in requests[lo:lo + GAP_CHUNK]), float,
                            int(part.sum()))
        gaps = np.diff(times)
        across = np.cumsum(part)[:-1] - 1  # the gap from one request's last emission to the next one's first
        gaps = np.delete(gaps, across[(across >= 0) & (across < len(gaps))])
        out[at:at + len(gaps)] = gaps
        at += len(gaps)
    return out


def request_rows(requests: Sequence[Request]) -> list[dict[str, Any]]:
    """One row per request for requests.csv (times in seconds from the start of the run)."""
    rows = []
    for r in sorted(requests, key=lambda r: r.rid):
        done = r.status is Status.FINISHED
        ttft = r.first_token_s - r.send_s if done else None
        e2e = r.finish_s - r.send_s if done else None
        rows.append({
            "request_id": r.rid, "category": r.category, "prompt_tokens": r.prompt, "output_tokens": r.output,
            "status": r.status.value, "reject_reason": r.reject_reason,
            "arrival_s": r.arrival_s, "send_s": r.send_s, "engine_s": r.engine_s, "first_scheduled_s": r.first_scheduled_s,
            "first_token_s": r.first_token_s, "finish_s": r.finish_s,
            "client_queue_s": (r.send_s - r.arrival_s) if r.send_s is not None else None,
            "waiting_s": r.waiting_s, "waited_for_memory": r.waited_for_memory, "preemptions": r.preemptions,
            "ttft_s": ttft, "e2e_s": e2e,
            "tpot_s": (e2e - ttft) / (r.output - 1) if done and r.output > 1 else None,
            "generated_tokens": r.generated, "emissions": len(r.token_times),
            "spec_steps": r.spec_steps, "spec_tokens": r.spec_tokens,
        })
    return rows


def measured(requests: Sequence[Request], warmup_fraction: float = 0.0,
             cooldown_fraction: float = 0.0) -> list[Request]:
    """The requests a steady-state measurement covers: all but the first `warmup_fraction`
    and the last `cooldown_fraction` of them by arrival time (ties by request id)."""
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.rid))
    n = len(ordered)
    return ordered[int(warmup_fraction * n): n - int(cooldown_fraction * n)]


def run_warnings(requests: Sequence[Request], warmup_fraction: float = 0.0,
                 cooldown_fraction: float = 0.0) -> list[str]:
    """What a run that ran still reports a user may not have meant (stderr and the summary)."""
    rejected = Counter(r.reject_reason for r in requests if r.status is Status.REJECTED)
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(rejected.items()))
    if rejected and sum(rejected.values()) == len(requests):
        return [f"every request was rejected ({reasons}): the run measured nothing"]
    out = [f"{sum(rejected.values())} of {len(requests)} requests were rejected ({reasons}): the statistics cover "
           "the others"] if rejected else []
    window = [r for r in measured(requests, warmup_fraction, cooldown_fraction) if r.status is Status.FINISHED]
    if len(window) == 1:
        out.append("the latency statistics cover one completed request (num_requests and the measure window "
                   "leave one): each mean and percentile is that request's value")
    return out


def summarize(requests: Sequence[Request], steps: StepLog, duration_s: float,
              warmup_fraction: float = 0.0, cooldown_fraction: float = 0.0) -> dict[str, Any]:
    """Counts, throughput and pool use over the whole run; the latency statistics
    (TTFT, TPOT, ITL, E2E) over the `measured` requests only."""
    done = [r for r in requests if r.status is Status.FINISHED]
    rejected = [r for r in requests if r.status is Status.REJECTED]
    window = [r for r in measured(requests, warmup_fraction, cooldown_fraction) if r.status is Status.FINISHED]
    ttft = [r.first_token_s - r.send_s for r in window]
    e2e = [r.finish_s - r.send_s for r in window]
    tpot = [(r.finish_s - r.first_token_s) / (r.output - 1) for r in window if r.output > 1]
    itl = _gaps(window)
    out_tokens = sum(r.generated for r in done)
    spec_steps = sum(r.spec_steps for r in requests)
    n_steps = len(steps)
    dur = np.asarray(steps.durations)
    usage = np.asarray(steps.usage)
    busy = float(dur.sum())
    summary: dict[str, Any] = {
        "completed": len(done),
        "rejected": len(rejected),
        "rejected_reasons": dict(sorted(Counter(r.reject_reason for r in rejected).items())),
        "duration_s": duration_s,
        "request_throughput": len(done) / duration_s if duration_s > 0 else 0.0,
        "output_throughput_tok_s": out_tokens / duration_s if duration_s > 0 else 0.0,
        "total_output_tokens": out_tokens,
        **_stats("ttft", ttft), **_stats("tpot", tpot), **_stats("itl", itl), **_stats("e2e", e2e),
        "peak_kv_usage": float(usage.max()) if n_steps else 0.0,
        # Time-weighted over engine steps: each step's usage after its allocations.
        "mean_kv_usage": float((usage * dur).sum() / busy) if busy > 0 else 0.0,
        "preemptions": sum(r.preemptions for r in requests),
        "preempted_requests": sum(1 for r in requests if r.preemptions),
        "waited_for_memory": sum(1 for r in requests if r.waited_for_memory),
        "mean_waiting_s": float(np.mean([r.waiting_s for r in done])) if done else None,
        "client_queue_mean_s": float(np.mean([r.send_s - r.arrival_s for r in done])) if done else None,
        "mean_accepted_len": sum(r.spec_tokens for r in requests) / spec_steps if spec_steps else None,
        "num_steps": n_steps,
        "eager_step_fraction": steps.eager_steps / n_steps if n_steps else 0.0,
        "mean_step_time_s": busy / n_steps if n_steps else 0.0,
        "mean_step_time_by_term_s": {t: v / n_steps if n_steps else 0.0 for t, v in steps.term_sums.items()},
    }
    return summary
