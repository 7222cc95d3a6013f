"""guidellm's benchmark metrics, computed from a run's request log the way guidellm computes them.

guidellm 0.5.3 (docs/guidellm.md): per request (`schemas/request_stats.py`), with `start` the
moment the request was sent (after any wait for a concurrency slot), `first`/`last` the first
and last streamed token and `n` the output tokens:
- time to first token = first - start; request latency = end - start (end = the last token);
- inter-token latency = (last - first) / (n - 1): the "time per output token, excluding the
  first token" of GPUStack's tables;
- time per output token = (last - start) / n (the first token's wait included).
Distributions (`GenerativeMetrics.compile`, `DistributionSummary.from_values`) over successful
requests: TTFT and latency one value per request; inter-token latency weighted by n - 1 and time
per output token by n (per token, not per request). The mean is the weighted mean; a percentile
p is the smallest value whose cumulative weight reaches p (`Percentiles.from_pdf`:
`searchsorted(cdf, p, side="left")`), the median p = 0.5. Throughputs are totals over the
benchmark's duration, from its start (the first send is 1 / rate after it) to the last response.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

PERCENTILES = {"median": 0.5, "p95": 0.95, "p99": 0.99}


def weighted_summary(values: Iterable[float], weights: Iterable[float] | None = None) -> dict[str, float]:
    """guidellm's DistributionSummary: weighted mean and 'first value reaching p' percentiles."""
    v = np.asarray(list(values), dtype=float)
    w = np.ones_like(v) if weights is None else np.asarray(list(weights), dtype=float)
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        return {"mean": 0.0, **dict.fromkeys(PERCENTILES, 0.0)}
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    uniq, inv = np.unique(v, return_inverse=True)
    wsum = np.zeros_like(uniq)
    np.add.at(wsum, inv, w)
    prob = wsum / wsum.sum()
    cdf = np.cumsum(prob)
    out = {"mean": float(np.sum(uniq * prob))}
    for name, p in PERCENTILES.items():
        out[name] = float(uniq[min(int(np.searchsorted(cdf, p, side="left")), uniq.size - 1)])
    return out


def guidellm_metrics(rows: Iterable[Mapping[str, Any]], duration_s: float) -> dict[str, float]:
    """The metrics GPUStack's tables print, from request rows (requests.csv's columns:
    status, send_s, first_token_s, finish_s, prompt_tokens, generated_tokens)."""
    done = [r for r in rows if r["status"] == "finished"]
    start = np.array([float(r["send_s"]) for r in done])
    first = np.array([float(r["first_token_s"]) for r in done])
    last = np.array([float(r["finish_s"]) for r in done])
    n = np.array([int(r["generated_tokens"]) for r in done])
    prompt = sum(int(r["prompt_tokens"]) for r in done)
    out: dict[str, float] = {"successful_requests": float(len(done)), "duration_s": duration_s,
                             "total_input_tokens": float(prompt), "total_output_tokens": float(n.sum())}
    if duration_s > 0:
        out.update(request_throughput=len(done) / duration_s, output_throughput_tok_s=n.sum() / duration_s,
                   total_throughput_tok_s=(prompt + n.sum()) / duration_s)
    multi = n > 1
    itl = (last[multi] - first[multi]) / (n[multi] - 1)
    tpot = (last - start) / np.maximum(n, 1)
    for prefix, scale, values, weights in (("ttft", 1e3, first - start, None), ("latency", 1.0, last - start, None),
                                           ("itl", 1e3, itl, n[multi] - 1), ("tpot_incl_first", 1e3, tpot, n)):
        unit = "ms" if scale == 1e3 else "s"
        for stat, value in weighted_summary(values * scale, weights).items():
            out[f"{prefix}_{stat}_{unit}"] = value
    return out
