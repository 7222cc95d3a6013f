"""The API server's time outside the engine, as the validation cases charge it.

`validation/client_overhead_2026-12-02.json` holds what `python -m
sim.validate.client_measure` measured (tokenisation at four prompt sizes, one token's
detokenisation, a streamed chat completion on loopback; its provenance names the machine,
which is not the GPU host). A case's client gets the measured round trip and the tokeniser's
seconds per token at its prompt size, interpolated between the measured sizes (the rate per
token is not the same at every size). Nothing here is fitted to the published runs.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from core.config import ConfigError

OVERHEAD_FILE = Path(__file__).resolve().parents[2] / "validation" / "client_overhead_2026-12-02.json"


def load_overhead(path: Path = OVERHEAD_FILE) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        rows = data["tokenisation"]["rows"]
        round_trip = float(data["client"]["round_trip_s"])
        sizes = [int(r["tokens"]) for r in rows]
        seconds = [float(r["seconds"]) for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not a client overhead measurement ({e!r}); rewrite it with "
                          "`python -m sim.validate.client_measure --out FILE`") from None
    if sorted(sizes) != sizes or len(sizes) < 2:
        raise ConfigError(f"{path}: tokenisation rows must hold at least two sizes in increasing order")
    return {"path": path, "round_trip_s": round_trip, "sizes": sizes, "seconds": seconds,
            "provenance": data.get("provenance", {})}


def client_overhead(prompt_tokens: float, overhead: dict[str, Any]) -> dict[str, float]:
    """`client.round_trip_s` and `client.tokenize_s_per_token` for prompts of about `prompt_tokens`
    tokens: the measured seconds per token interpolated between the sizes (held at the ends)."""
    rate = np.interp(prompt_tokens, overhead["sizes"], np.divide(overhead["seconds"], overhead["sizes"]))
    return {"round_trip_s": overhead["round_trip_s"], "tokenize_s_per_token": float(rate)}
