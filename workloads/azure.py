"""Azure LLM inference traces 2023 (conversation and code services), replayed in order.

Accepted schemas: the processed form used by microsoft/vidur and Splitwise
(`arrived_at` in seconds, `num_prefill_tokens`, `num_decode_tokens`) and the raw
release of Azure/AzurePublicDataset (`TIMESTAMP` date-time, `ContextTokens`,
`GeneratedTokens`). The workload is the first `num_requests` requests in arrival order
with their arrival times relative to the first; the seed plays no part. Rows with 0
prompt or 0 output tokens are dropped (counted in the source). Asking for more
requests than the trace holds is an error: repeating a trace would repeat timestamps.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workloads.base import RequestSpec, Sample, WorkloadError
from workloads.files import memo_by_file, numeric_column, read_csv

if TYPE_CHECKING:
    import pandas as pd

PROCESSED = ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]
RAW = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
DATA_HINT = ("the Azure LLM inference trace 2023, https://github.com/Azure/AzurePublicDataset "
             "(AzureLLMInferenceTrace_conv.csv / _code.csv, CC-BY-4.0), or its processed form "
             "microsoft/vidur data/processed_traces/splitwise_conv.csv / splitwise_code.csv (MIT)")


def _header(path: Path) -> list[str]:
    with path.open(encoding="utf-8", errors="replace") as f:
        return [c.strip() for c in f.readline().strip().split(",")]


@memo_by_file
def read_trace(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival seconds from the first row, prompt tokens, output tokens) in file order."""
    import pandas as pd  # here, not at module level: a run that reads no trace file skips its import
    header = _header(path)
    if all(c in header for c in RAW) and not all(c in header for c in PROCESSED):
        df = read_csv(path, RAW, "raw Azure LLM trace")
        t = pd.to_datetime(df["TIMESTAMP"], errors="coerce", format="mixed")
        if t.isna().any():
            i = int(np.argmax(t.isna().to_numpy()))
            raise WorkloadError(f"{path}: line {i + 2}: column 'TIMESTAMP' value {df['TIMESTAMP'].iloc[i]!r} "
                                "is not a date-time")
        arrival = (t - t.iloc[0]).dt.total_seconds().to_numpy()
        return (arrival, numeric_column(df, "ContextTokens", path, integer=True),
                numeric_column(df, "GeneratedTokens", path, integer=True))
    df = read_csv(path, PROCESSED, f"Azure LLM trace (or the raw schema {','.join(RAW)})")
    return (numeric_column(df, "arrived_at", path, integer=False),
            numeric_column(df, "num_prefill_tokens", path, integer=True),
            numeric_column(df, "num_decode_tokens", path, integer=True))


def load(path: Path, num_requests: int) -> Sample:
    arrival, prompt, output = read_trace(path)
    order = np.argsort(arrival, kind="stable")  # both releases are in arrival order; be sure
    arrival, prompt, output = arrival[order], prompt[order], output[order]
    usable = (prompt > 0) & (output > 0)
    dropped = int((~usable).sum())
    arrival, prompt, output = arrival[usable], prompt[usable], output[usable]
    if len(prompt) == 0:
        raise WorkloadError(f"{path}: no request with positive prompt and output tokens")
    if num_requests > len(prompt):
        raise WorkloadError(f"{path}: the trace holds {len(prompt)} usable requests, {num_requests} asked for; "
                            f"ask for at most {len(prompt)}")
    t = arrival[:num_requests] - arrival[0]
    span = t[-1]
    requests = [RequestSpec(request_id=i, prompt_tokens=int(p), output_tokens=int(o), arrival_s=float(a))
                for i, (p, o, a) in enumerate(zip(prompt[:num_requests], output[:num_requests], t))]
    source = (f"Azure LLM trace {path}: first {num_requests} of {len(prompt)} requests"
              + (f" ({dropped} rows with 0 tokens dropped)" if dropped else "")
              + f", {span:.1f} s of trace")
    return Sample(requests, source)
