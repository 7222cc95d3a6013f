"""What each benchmark client prints, and the simulated run's value of the same quantity.

A case's `reported` names are its client's printed metrics; each compared one maps to the metric
of a simulated run with the same definition, computed the way that client computes it:

- guidellm, as GPUStack's tables print it (sim/validate/guidellm_metrics.py, docs/guidellm.md#metrics).
  GPUStack's "TPOT (excl. 1st token)" rows are guidellm's time_per_output_token, (last - start) / n,
  which includes the wait for the first token whatever the label says, and its "ITL" rows are
  guidellm's inter_token_latency, (last - first) / (n - 1): the Throughput baseline's mean TPOT,
  45.39 ms, is its mean TTFT over its 128 tokens (5,809.82 ms / 128), its ITL 0.00. Both time
  the chunks the client counted, and so do its token throughputs (totals over the span from the
  first counted chunk to the last), so all of them are compared only where it counted every
  token (`client.reasoning_timed`); the duration, request throughput, TTFT (the first chunk is
  counted either way) and latency (to the stream's close) are compared always.
- vllm-bench, `vllm bench serve`'s "Serving Benchmark Result" (sim/validate/vllm_bench_metrics.py): its TPOT
  is per request and excludes the first token, its ITL pools every gap.

Peaks and the configured concurrency are kept as published and not compared: `vllm bench serve`'s
peaks are per-second bucket counts whose definition changed between releases, guidellm's peak rate
the largest of its local rates (one event's tokens over half the gaps to its neighbours), and the
concurrency an input rather than a result.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sim.validate.guidellm_metrics import guidellm_metrics
from sim.validate.vllm_bench_metrics import vllm_bench_metrics

CLIENT_TOOLS = ("guidellm", "vllm-bench")

_COUNTS = ("successful_requests", "duration_s", "total_input_tokens", "total_output_tokens", "request_throughput")
_TOKEN_RATES = ("output_throughput_tok_s", "total_throughput_tok_s")
_TOTALS = (*_COUNTS, *_TOKEN_RATES)
_NOT_COMPARED = ("max_concurrency", "peak_output_throughput_tok_s", "peak_concurrent_requests")

GUIDELLM_STATS = ("mean", "median", "p95", "p99")
GUIDELLM: dict[str, str] = {
    **{k: k for k in _COUNTS},
    **{f"latency_{s}_s": f"latency_{s}_s" for s in GUIDELLM_STATS},
    **{f"ttft_{s}_ms": f"ttft_{s}_ms" for s in GUIDELLM_STATS},
}
# What guidellm times from the chunks its handler counted: GPUStack's per-token rows and the token
# throughputs -> guidellm_metrics' names of the same definitions
GUIDELLM_PER_TOKEN: dict[str, str] = {
    **{k: k for k in _TOKEN_RATES},
    **{f"tpot_{s}_ms": f"tpot_incl_first_{s}_ms" for s in GUIDELLM_STATS},
    **{f"itl_{s}_ms": f"itl_{s}_ms" for s in GUIDELLM_STATS},
}
UNTIMED_REASONING = ("the client timed only the chunks its response handler counts, and not the reasoning "
                     "the server streamed (client.reasoning_timed: false): a request that thought for its "
                     "whole output has last = first, ITL 0 and TPOT = TTFT / n (docs/guidellm.md#metrics)")
UNTIMED_TOKEN_RATE = ("a total over the span from the first counted chunk to the last, and the client counted "
                      "only the answers' chunks (client.reasoning_timed: false): a request's last counted chunk "
                      "is its first if it thought for its whole output, its last token if it answered, and which "
                      "requests answered is not modelled; sim.validate.guidellm_metrics gives the simulated run's rate "
                      "with no answer counted (*_first_chunk_tok_s) and with every token counted (*_tok_s), "
                      "the two ends of its range (docs/guidellm.md#metrics)")

VLLM_BENCH_STATS = ("mean", "median", "p99")
VLLM_BENCH: dict[str, str] = {
    **{k: k for k in _TOTALS}, "failed_requests": "failed_requests",
    **{f"{m}_{s}_ms": f"{m}_{s}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in VLLM_BENCH_STATS},
}


def compared(client: Any) -> dict[str, str]:
    """Published metric -> the simulated run's metric it is compared with, for this case's client."""
    if client.tool == "vllm-bench":
        return VLLM_BENCH
    return {**GUIDELLM, **GUIDELLM_PER_TOKEN} if client.reasoning_timed else GUIDELLM


def left_out(client: Any, reported: Iterable[str]) -> dict[str, str]:
    """The published metrics of `reported` that are kept but not compared, each with the reason."""
    comparable = compared(client)
    out = {}
    for metric in reported:
        if metric in comparable:
            continue
        out[metric] = (UNTIMED_TOKEN_RATE if metric in _TOKEN_RATES else
                       UNTIMED_REASONING if metric in GUIDELLM_PER_TOKEN else
                       "a configured input or a per-second peak, not compared")
    return out


def known_metrics(tool: str) -> tuple[str, ...]:
    """Every name a case of this client may report."""
    if tool == "vllm-bench":
        return (*VLLM_BENCH, *_NOT_COMPARED)
    return (*GUIDELLM, *GUIDELLM_PER_TOKEN, *_NOT_COMPARED)


def simulated_metrics(tool: str, rows: Iterable[Mapping[str, Any]], summary: Mapping[str, Any]) -> dict[str, float]:
    """The client's metrics of a simulated run (its requests.csv rows and summary.json)."""
    if tool == "vllm-bench":
        return vllm_bench_metrics(rows, summary)
    return guidellm_metrics(rows)
