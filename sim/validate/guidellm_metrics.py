"""guidellm's benchmark metrics, computed from a run's request log the way guidellm 0.5.3 computes them.

Each rule's source is in docs/guidellm.md#metrics. Per request, `start` is the send (after any
wait for a concurrency slot and for its due time: requests.csv's send_s), `first` and `last` the
first and last streamed chunks the client's response handler counted, `end` the close of the
stream, just after the last token (finish_s), and `n` the output tokens the server reports:
- time to first token = first - start; request latency = end - start;
- inter-token latency = (last - first) / (n - 1); time per output token = (last - start) / n.
Distributions over successful requests: TTFT and latency one value per request; inter-token
latency weighted by n - 1 and time per output token by n. The mean is the weighted mean; a
percentile p is the smallest value whose cumulative weight reaches p, the median p = 0.5.

The benchmark's duration runs from the first send of any request to the end of the last one
(no warm-up or cool-down unless asked for). A throughput is the mean of a rate distribution,
which comes to its events' total over the span from its first event to its last:
- requests: one event at each successful request's end, the span pinned to the duration;
- output tokens: events from each request's first counted chunk to its last counted one (all of
  them at its only chunk if it counted one), so the span runs from the earliest first chunk of
  the benchmark to the latest last chunk, not over the duration;
- total tokens: the prompt's tokens one more event at the request's first chunk: the same span.
These need only each request's first and last chunk: guidellm itself does not keep a stream's
chunk times but spreads its events evenly between the two, and a total over a span depends on
the span's ends alone. With every token counted the last chunk is the last token
(`*_throughput_tok_s`); `*_throughput_first_chunk_tok_s` is the same rule where each request
counted only its first chunk, as GPUStack's handler does for a request that thought for its
whole output: the two bound the rates of a client that counted only the answers.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

PERCENTILES = {"median": 0.5, "p95": 0.95, "p99": 0.99}
# Events closer than this are merged into one before the rates are taken
# (`rate_distribution_from_timings`, threshold 1e-4 s): a span that short has no rate.
MERGE_S = 1e-4


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


def span_rate(total: float, first_event_s: float, last_event_s: float) -> float:
    """The mean of guidellm's rate distribution: the events' total over their span, 0 without one."""
    span = last_event_s - first_event_s
    return total / span if span > MERGE_S else 0.0


def _times(rows: Iterable[Mapping[str, Any]], column: str) -> np.ndarray:
    return np.array([float(r[column]) for r in rows], dtype=float)


def benchmark_window(rows: Iterable[Mapping[str, Any]]) -> tuple[float, float]:
    """(first send, last end) over every request sent: a rejected one ends where it was sent."""
    sent = [r for r in rows if r["send_s"] not in ("", None)]
    if not sent:
        return 0.0, 0.0
    ends = [float(r["finish_s"]) if r["finish_s"] not in ("", None) else float(r["send_s"]) for r in sent]
    return float(_times(sent, "send_s").min()), max(ends)


def guidellm_metrics(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The metrics GPUStack's tables print, from request rows (requests.csv's columns:
    status, send_s, first_token_s, finish_s, prompt_tokens, generated_tokens)."""
    rows = list(rows)
    done = [r for r in rows if r["status"] == "finished"]
    start = _times(done, "send_s")
    first = _times(done, "first_token_s")
    last = _times(done, "finish_s")
    n = np.array([int(r["generated_tokens"]) for r in done])
    prompt = sum(int(r["prompt_tokens"]) for r in done)
    out_tokens = float(n.sum())
    begin, end = benchmark_window(rows)
    duration = end - begin
    out: dict[str, float] = {"successful_requests": float(len(done)), "duration_s": duration,
                             "total_input_tokens": float(prompt), "total_output_tokens": out_tokens,
                             "request_throughput": len(done) / duration if duration > 0 else 0.0}
    if done:
        for suffix, last_chunk in (("tok_s", last), ("first_chunk_tok_s", first)):
            out[f"output_throughput_{suffix}"] = span_rate(out_tokens, first.min(), last_chunk.max())
            out[f"total_throughput_{suffix}"] = span_rate(prompt + out_tokens, first.min(), last_chunk.max())
    multi = n > 1
    itl = (last[multi] - first[multi]) / (n[multi] - 1)
    tpot = (last - start) / np.maximum(n, 1)
    for prefix, scale, values, weights in (("ttft", 1e3, first - start, None), ("latency", 1.0, last - start, None),
                                           ("itl", 1e3, itl, n[multi] - 1), ("tpot_incl_first", 1e3, tpot, n)):
        unit = "ms" if scale == 1e3 else "s"
        for stat, value in weighted_summary(values * scale, weights).items():
            out[f"{prefix}_{stat}_{unit}"] = value
    return out
