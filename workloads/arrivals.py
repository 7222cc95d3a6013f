"""Open-loop send times, as vLLM's serving benchmark draws them or guidellm's constant profile
spaces them, and trace replay.

Closed loop (a maximum concurrency) is the engine client's semaphore, not a schedule.

vLLM's `get_request` (benchmarks/serve.py) draws one gap per request, the first one
included, from Gamma(shape = burstiness, scale = 1 / (rate x burstiness)): mean gap
1/rate whatever the burstiness, coefficient of variation 1/sqrt(burstiness);
burstiness 1 is a Poisson process, below 1 burstier, above 1 more regular. The send
times are the cumulative gaps, then all rescaled so the last send falls at n / rate
("to close the gap for stabilizing the throughput data from different random seeds").
So the first request waits one gap too, and the mean rate is exactly `rate`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from workloads.base import RequestSpec, WorkloadError


def gamma_arrival_times(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Send times in seconds of n requests at `rate` requests/s (inf: all at t = 0)."""
    if n < 0:
        raise WorkloadError(f"number of requests must be >= 0, got {n}")
    if not rate > 0:
        raise WorkloadError(f"request_rate must be > 0 requests/s (or inf), got {rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise WorkloadError(f"burstiness must be a finite number > 0 (1 = Poisson), got {burstiness}")
    if n == 0:
        return np.zeros(0)
    if math.isinf(rate):
        return np.zeros(n)
    t = np.cumsum(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n))
    return t * (n / rate / t[-1])


def constant_arrival_times(n: int, rate: float) -> np.ndarray:
    """guidellm's constant profile (`AsyncConstantStrategy.next_request_time`, no ramp-up): the
    i-th request (i from 1, a counter shared by its worker processes) is due at i / rate after
    the benchmark starts, whether or not earlier ones have finished."""
    if n < 0:
        raise WorkloadError(f"number of requests must be >= 0, got {n}")
    if not (rate > 0 and math.isfinite(rate)):
        raise WorkloadError(f"request_rate must be a finite number > 0 requests/s for a constant rate, got {rate}")
    return np.arange(1, n + 1, dtype=float) / rate


def trace_arrival_times(requests: Sequence[RequestSpec], time_scale: float) -> np.ndarray:
    """The requests' own timestamps relative to the first, times `time_scale`
    (0.5 replays the trace twice as fast)."""
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise WorkloadError(f"time_scale must be a finite number > 0, got {time_scale}")
    if not requests:
        return np.zeros(0)
    missing = [r.request_id for r in requests if r.arrival_s is None]
    if missing:
        raise WorkloadError(f"trace replay needs arrival times, but {len(missing)} request(s) have none "
                            f"(first: request {missing[0]}); this workload is not a trace: use a request "
                            "rate or a maximum concurrency instead")
    t = np.array([r.arrival_s for r in requests], dtype=float)
    if np.any(np.diff(t) < 0):
        i = int(np.argmax(np.diff(t) < 0)) + 1
        raise WorkloadError(f"trace arrival times must not decrease: request {requests[i].request_id} "
                            f"at {t[i]} s comes after {t[i - 1]} s")
    return (t - t[0]) * time_scale
