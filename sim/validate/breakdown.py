"""Where a simulated request's time goes, case by case, beside what the published run allows.

From a run's `requests.csv` (finished requests): the mean time in the client's queue (due, not
yet sent: guidellm's slot wait), from the send to the engine (the HTTP round trip, the API
server's tokeniser thread and its event loop's intake), in the engine's waiting queue until the
first schedule, from the first schedule to the first token (the prefill, chunks and preemptions
included), and from the first token to the last (the decode). The published runs print none of
these; they print TTFT and latency, which bound them: TTFT is send to first token (API server +
engine queue + prefill), latency - TTFT the decode.
"""
from __future__ import annotations

import csv
from pathlib import Path

PARTS = ("client_queue_s", "frontend_s", "engine_queue_s", "prefill_s", "decode_s")


def time_breakdown(requests_csv: Path) -> dict[str, float]:
    """Mean seconds per finished request in each part (PARTS), and their count."""
    sums = dict.fromkeys(PARTS, 0.0)
    n = 0
    with requests_csv.open(newline="") as f:
        for r in csv.DictReader(f):
            if r["status"] != "finished":
                continue
            arrival, send, engine, first, token, finish = (
                float(r[k]) for k in ("arrival_s", "send_s", "engine_s", "first_scheduled_s", "first_token_s", "finish_s"))
            sums["client_queue_s"] += send - arrival
            sums["frontend_s"] += engine - send
            sums["engine_queue_s"] += first - engine
            sums["prefill_s"] += token - first
            sums["decode_s"] += finish - token
            n += 1
    return {**{k: v / n if n else 0.0 for k, v in sums.items()}, "requests": n}


def published_bounds(reported: dict[str, float]) -> dict[str, float]:
    """What the published means allow: TTFT (API server + engine queue + prefill) and latency - TTFT (decode)."""
    out = {}
    if "ttft_mean_ms" in reported:
        out["ttft_s"] = reported["ttft_mean_ms"] / 1000
        if "latency_mean_s" in reported:
            out["decode_s"] = reported["latency_mean_s"] - out["ttft_s"]
    return out
