"""`vllm bench serve`'s metrics of a simulated run, as its `calculate_metrics` computes them.

vLLM's serving benchmark (`vllm/benchmarks/serve.py`: `benchmark`, `calculate_metrics`;
`vllm/benchmarks/lib/endpoint_request_func.py`: the request functions; docs/vllm.md#serving-benchmark):
- a request's clock starts when it is sent, after the `--max-concurrency` semaphore (`st` in
  the request function); TTFT = the first streamed token chunk - send; E2EL (`latency`) = the
  last token chunk - send;
- TPOT per request = (E2EL - TTFT) / (output tokens - 1) for outputs longer than one token;
  its mean, median and percentiles are over requests, not weighted by their tokens;
- ITL: every gap between consecutive token chunks of every request, pooled (a verify step that
  emits several tokens is one chunk, one gap);
- mean `np.mean`, median `np.median`, percentiles `np.percentile` (linear interpolation);
  `--metric-percentiles` defaults to 99;
- duration: from just before the first request is issued (`benchmark_start_time`, so a finite
  rate's first gap is inside it) to the last response; throughputs are totals over it.

The run's summary (sim/engine/metrics.py `summarize`) holds TTFT, TPOT, ITL and E2E latency by exactly
these rules, over every request when the run measures them all (as a validation run does); this
module names them as vLLM prints them and adds the token totals from the request log.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# vLLM's printed name -> the summary's (sim.engine.metrics) name of the same per-request quantity
LATENCIES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
STATS = ("mean", "median", "p99")  # what `vllm bench serve` prints by default


def vllm_bench_metrics(rows: Iterable[Mapping[str, Any]], summary: Mapping[str, Any]) -> dict[str, float]:
    """The "Serving Benchmark Result" numbers of a simulated run: `rows` its requests.csv,
    `summary` its summary.json."""
    if summary["measured_requests"] != summary["num_requests"]:
        raise ValueError("vLLM's benchmark times every request: the run must measure them all "
                         f"(it measured {summary['measured_requests']} of {summary['num_requests']})")
    rows = list(rows)
    done = [r for r in rows if r["status"] == "finished"]
    duration = float(summary["duration_s"])
    prompt = sum(int(r["prompt_tokens"]) for r in done)
    output = sum(int(r["generated_tokens"]) for r in done)
    out: dict[str, float] = {"successful_requests": float(len(done)), "failed_requests": float(len(rows) - len(done)),
                             "duration_s": duration,
                             "total_input_tokens": float(prompt), "total_output_tokens": float(output)}
    if duration > 0:
        out.update(request_throughput=len(done) / duration, output_throughput_tok_s=output / duration,
                   total_throughput_tok_s=(prompt + output) / duration)
    for name, key in LATENCIES.items():
        for stat in STATS:
            value = summary.get(f"{key}_{stat}_s")
            if value is not None:
                out[f"{name}_{stat}_ms"] = 1e3 * float(value)
    return out
