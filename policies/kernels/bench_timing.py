"""Timing primitives of the kernel benchmark: copy bandwidth, CUDA-graph and eager timings (wall clock in a rehearsal)."""
from __future__ import annotations

import gc
import statistics
import time
from typing import Callable

import torch

from policies.kernels.bench_cases import DEVICE, REHEARSAL


def sync() -> None:
    if not REHEARSAL:
        torch.cuda.synchronize()


def allocated() -> int:
    return 0 if REHEARSAL else torch.cuda.memory_allocated()


def wall_us(calls: list[Callable[[], object]]) -> float:
    """Rehearsal timing: wall clock of one pass over the calls, per call."""
    t0 = time.perf_counter()
    for f in calls:
        f()
    return (time.perf_counter() - t0) * 1e6 / len(calls)


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second (eager torch copy_: a captured copy_ is slower, docs/notes/2026-11-29-h200-reference-points.md)."""
    if REHEARSAL:
        src = torch.randn(1 << 20)
        return 2 * src.numel() * 4 / (wall_us([lambda: src.clone()]) * 1e-6)
    src = torch.randn(nbytes // 4, device=DEVICE)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def time_graph(calls: list[Callable[[], object]], reset: Callable[[], None] | None = None, reps: int = 8) -> float:
    """Median microseconds per call of a captured graph of `calls`, back to back."""
    if REHEARSAL:
        if reset:
            reset()
        return wall_us(calls)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in calls:
            f()
        if reset:
            reset()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in calls:
            f()
    times = []
    for _ in range(reps + 2):
        if reset:
            reset()       # outside the timed region
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / len(calls))
    del graph
    return statistics.median(times[2:])


def time_eager(call: Callable[[int], object], copies: int, reset: Callable[[], None] | None = None,
               reps: int = 3) -> float:
    times = []
    for r in range(reps + 1):
        if reset:
            reset()
        sync()
        t0 = time.perf_counter()
        call(r % copies)
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times[1:])


def recover() -> None:
    """After a failed case: free what it left so the next one starts clean."""
    gc.collect()
    if not REHEARSAL:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
