"""What sampling adds to a step beyond the LM head table's greedy argmax (docs/sampling.md).

`sampler.csv` (calibrate/benches/sampler.py) times vLLM 0.17.1's sampler, GPU time in a CUDA graph,
per sampling path, vocabulary and logits rows. The top-k/top-p path is read at the `peaked`
logits (a trained model's few likely tokens, where top-p binds before top-k), within 4% of the
`gaussian` ones at every size measured; the random path has no pivot search and one distribution.
A vocabulary the bench did not time takes the nearest measured one's times scaled by the
vocabulary ratio: every pass of the sampler reads each row's logits whole.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.config_base import SamplingPath
from core.interp import Curve1D, from_rows
from core.tables import SAMPLER_COLUMNS, TableError, read_rows

DIST = {"top_k_top_p": "peaked", "random": "gaussian"}  # the rows each path is read at


@dataclass(frozen=True)
class SamplerCost:
    """The GPU time (us) sampling adds over `rows` logits rows; `note` says what is not measured."""
    curve: Curve1D | None  # None: greedy, nothing added
    scale: float = 1.0
    note: str = ""

    def us(self, rows: float) -> float:
        return self.curve(rows) * self.scale if self.curve is not None and rows > 0 else 0.0


def load_sampler(path: Path, sampling: SamplingPath, vocab: int, *, extrapolate: bool = True) -> SamplerCost:
    if sampling == "greedy":
        return SamplerCost(None)
    if not path.exists():
        return SamplerCost(None, note=f"{sampling} sampling priced as greedy argmax: no {path.name} for this GPU")
    rows = [r for r in read_rows(path, SAMPLER_COLUMNS)
            if r["sampling"] == sampling and r["mode"] == "graph" and r["dist"] == DIST[sampling]]
    if not rows:
        raise TableError(f"{path}: no graph rows of {sampling} sampling at {DIST[sampling]} logits")
    measured = sorted({int(r["vocab"]) for r in rows})
    near = min(measured, key=lambda v: (abs(v - vocab), v))
    sel = [{"rows": r["rows"], "us": r["extra_us"]} for r in rows if r["vocab"] == near]
    try:
        # Not made monotone: at 8 rows vLLM leaves its torch sort for the Triton kernel, which is faster
        # at 8 rows than the sort at 4 (a measured step down, not noise).
        curve = from_rows(f"{path.stem}[{sampling},{near}]", sel, ("rows",), ("log",), extrapolate=extrapolate,
                          monotone=False).partial()
    except ValueError as e:
        raise TableError(f"{path}: {e}") from None
    if near == vocab:
        return SamplerCost(curve)
    return SamplerCost(curve, vocab / near, f"{sampling} sampling of a {vocab}-token vocabulary: the {near}-token "
                                            f"rows of {path.name} scaled by the vocabulary ratio")
