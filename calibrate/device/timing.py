"""Timing on the GPU: CUDA-graph replay (cold L2) and eager launches; the two ceilings.

Graph mode captures `calls` (the same layer on rotated weight copies, so the L2
holds none of the next call's weights) back to back in one CUDA graph and reports
the median over replays divided by len(calls). Eager mode launches the same calls
from Python in a loop and reports the steady-state time per call, which is the
larger of the GPU time and the host's launch time: the piecewise penalty.
On the CPU (tests), eager mode times with the host clock and graph mode is refused.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

ROTATE_BYTES = 512 << 20  # bytes: distinct data per graph, several times the 60 MB L2
MIN_COPIES = 3  # fewest rotated weight copies, so a replay never re-reads a hot copy
MAX_COPIES = 48


@dataclass(frozen=True)
class Timing:
    us: float  # median per call
    us_p10: float
    us_p90: float
    reps: int
    copies: int


def copies_for(bytes_per_call: int, rotate_bytes: int = ROTATE_BYTES, min_copies: int = MIN_COPIES) -> int:
    return max(min_copies, min(MAX_COPIES, -(-rotate_bytes // max(1, bytes_per_call))))


def spread(ts: Sequence[float]) -> tuple[float, float, float]:
    """Median, 10th and 90th percentile of the timings (one timing: itself three times)."""
    q = statistics.quantiles(ts, n=10) if len(ts) > 1 else list(ts) * 9
    return statistics.median(ts), q[0], q[-1]


def _summary(per_call_us: list[float], copies: int) -> Timing:
    return Timing(*spread(per_call_us), len(per_call_us), copies)


def time_calls(calls: list[Callable[[], object]], mode: str, device: torch.device,
               budget_s: float = 0.15, min_reps: int = 5, max_reps: int = 40) -> Timing:
    if mode not in ("graph", "eager"):
        raise ValueError(f"mode must be 'graph' or 'eager', got {mode!r}")
    if device.type != "cuda":
        if mode == "graph":
            raise ValueError("graph mode needs a CUDA device")
        return _time_host(calls, min_reps)
    return _time_graph(calls, budget_s, min_reps, max_reps) if mode == "graph" else \
        _time_eager(calls, budget_s, min_reps, max_reps)


def _run(calls: list[Callable[[], object]]) -> None:
    for c in calls:
        c()


def wall_times(fn: Callable[[], object], reps: int) -> list[float]:
    """Host-clock time (us) of each of `reps` calls of fn."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _time_host(calls: list[Callable[[], object]], reps: int) -> Timing:
    _run(calls)
    return _summary([t / len(calls) for t in wall_times(lambda: _run(calls), reps)], len(calls))


def _events_us(fn: Callable[[], None]) -> float:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3


def _reps(one_us: float, budget_s: float, min_reps: int, max_reps: int) -> int:
    return max(min_reps, min(max_reps, int(budget_s * 1e6 / max(one_us, 1.0))))


def capture(calls: list[Callable[[], object]]) -> torch.cuda.CUDAGraph:
    """Warm up on a side stream (as torch.cuda.graph requires), then capture."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _run(calls)
        _run(calls)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _run(calls)
    return g


def _time_graph(calls, budget_s, min_reps, max_reps) -> Timing:
    g = capture(calls)
    g.replay()
    one = _events_us(g.replay)
    out = [_events_us(g.replay) / len(calls) for _ in range(_reps(one, budget_s, min_reps, max_reps))]
    del g
    return _summary(out, len(calls))


def _time_eager(calls, budget_s, min_reps, max_reps) -> Timing:
    _run(calls)
    _run(calls)
    torch.cuda.synchronize()
    one = _events_us(lambda: _run(calls))
    # Several rounds per sample so launches queue ahead of the GPU as they do in a step.
    rounds = max(1, min(8, int(2000 / max(one, 1.0))))
    n = _reps(one * rounds, budget_s, min_reps, max_reps)
    out = []
    for _ in range(n):
        out.append(_events_us(lambda: [_run(calls) for _ in range(rounds)]) / (rounds * len(calls)))
    return _summary(out, len(calls))


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, read + write bytes over the median eager time."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    b = torch.empty_like(a)
    b.copy_(a)
    t = statistics.median(_events_us(lambda: b.copy_(a)) for _ in range(10))
    del a, b
    return 2 * nbytes / (t * 1e-6) / 1e9


def matmul_tflops(device: torch.device, n: int = 8192) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    a @ b
    t = statistics.median(_events_us(lambda: a @ b) for _ in range(10))
    del a, b
    return 2 * n ** 3 / (t * 1e-6) / 1e12
