"""BurstGPT (Azure OpenAI GPT service traces, HPMLL/BurstGPT) from a user-given CSV.

Schema: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.
As vLLM's `BurstGPTDataset`: drop failed requests (`Response tokens` == 0), keep one
model (vLLM keeps "GPT-4"; `model_filter: null` keeps all), input length = `Request
tokens`, output length = `Response tokens`, and draw `num_requests` rows with
`DataFrame.sample(n, random_state=seed)` (with replacement when more are asked for
than remain). We also drop rows with `Request tokens` == 0 (an empty prompt cannot be
prefilled); when a file has none, the sample is row for row vLLM's.

With `arrival: trace` the rows are instead the first `num_requests` in timestamp order
and carry their `Timestamp` (seconds, relative to the first), for trace replay.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workloads.base import RequestSpec, Sample, WorkloadError
from workloads.files import memo_by_file, numeric_column, read_csv

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ["Timestamp", "Model", "Request tokens", "Response tokens"]
DATA_HINT = ("the BurstGPT trace, published at https://github.com/HPMLL/BurstGPT (release files "
             "BurstGPT_1.csv or BurstGPT_without_fails_2.csv, columns Timestamp,Model,Request tokens,"
             "Response tokens,Total tokens,Log Type)")


@memo_by_file
def read_trace(path: Path) -> pd.DataFrame:
    import pandas as pd  # here, not at module level: a run that reads no trace file skips its import
    raw = read_csv(path, COLUMNS, "BurstGPT trace")
    return pd.DataFrame({
        "timestamp": numeric_column(raw, "Timestamp", path, integer=False),
        "model": raw["Model"].astype(str).str.strip().to_numpy(),
        "prompt": numeric_column(raw, "Request tokens", path, integer=True),
        "output": numeric_column(raw, "Response tokens", path, integer=True),
    })


def load(path: Path, num_requests: int, seed: int, model_filter: str | None, trace: bool) -> Sample:
    df = read_trace(path)
    total = len(df)
    df = df[df["output"] > 0]  # failed requests
    failed = total - len(df)
    if model_filter is not None:
        models = sorted(df["model"].unique())
        df = df[df["model"] == model_filter]
        if df.empty:
            raise WorkloadError(f"{path}: no successful request of model {model_filter!r}; models in the file: "
                                f"{', '.join(models) or 'none'} (set model_filter, or null for all)")
    empty_prompts = int((df["prompt"] == 0).sum())
    df = df[df["prompt"] > 0]
    if df.empty:
        raise WorkloadError(f"{path}: no request left after dropping failed rows and empty prompts")
    note = (f"BurstGPT from {path}: {total} rows, {failed} failed dropped"
            + (f", {empty_prompts} with 0 request tokens dropped" if empty_prompts else "")
            + (f", model {model_filter}" if model_filter else ", all models") + f", {len(df)} usable")
    if trace:
        if num_requests > len(df):
            raise WorkloadError(f"{path}: trace replay of {num_requests} requests, but only {len(df)} usable rows; "
                                f"ask for at most {len(df)}")
        picked = df.sort_values("timestamp", kind="stable").iloc[:num_requests]
        arrivals = picked["timestamp"].to_numpy() - picked["timestamp"].iloc[0]
        note += f"; first {num_requests} in timestamp order"
    else:
        # vLLM: self.data.sample(n=num_requests, random_state=seed, replace=num_requests > len)
        picked = df.sample(n=num_requests, random_state=seed, replace=num_requests > len(df))
        arrivals = np.full(num_requests, np.nan)
        note += f"; {num_requests} drawn with seed {seed}" + (" with replacement" if num_requests > len(df) else "")
    requests = [RequestSpec(request_id=i, prompt_tokens=int(p), output_tokens=int(o),
                            arrival_s=None if np.isnan(a) else float(a))
                for i, (p, o, a) in enumerate(zip(picked["prompt"], picked["output"], arrivals))]
    return Sample(requests, note)
