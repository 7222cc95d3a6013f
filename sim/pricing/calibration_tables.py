"""Reading a model's calibration tables (`results/calibration/<gpu>/<model>/*.csv`) into curves.

Each layer table of core.tables.TABLES becomes one interpolator per mode (graph, eager);
the decode-core conv table one curve per policy; step_check.csv the host overhead per step.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from core.calibration_files import model_file
from core.config import HardwareConfig
from core.interp import Curve1D, GridInterpolator, from_rows
from core.tables import (DECODE_CONV, DECODE_CONV_COLUMNS, GDN_MIXED_COLUMNS, STEP_COLUMNS, TABLES, TableError,
                         read_rows)

MODES = ("graph", "eager")
MIXED_FLOOR_US = 0.01


def _file(mdir: Path, name: str) -> Path:
    """A file of the model's calibration folder, through the one list the code version hashes."""
    return model_file(mdir.parent, mdir.name, name)


def load_tables(mdir: Path, *, extrapolate: bool = True,
                modes: tuple[str, ...] = MODES) -> dict[tuple[str, str], GridInterpolator]:
    """Every layer table in TABLES in the modes its pricing reads (the pipeline reads only graph
    rows: a model measured with `--modes graph` has no eager rows); a missing required or
    partial table is an error."""
    out = {}
    for name, spec in TABLES.items():
        path = _file(mdir, f"{name}.csv")
        if not spec.required and not path.exists():
            continue
        rows = read_rows(path)
        for mode in modes:
            sel = [r for r in rows if r["mode"] == mode]
            if not sel and not spec.required:  # e.g. a kernel that could not be graph-captured
                sel = [r for r in rows if r["mode"] != mode]
            if not sel:
                raise TableError(f"{mdir / name}.csv: no rows with mode={mode!r}")
            try:
                out[(name, mode)] = from_rows(f"{mdir.name}/{name}[{mode}]", sel, spec.axes, spec.scales,
                                              fill_low=spec.fill_low, extrapolate=extrapolate)
            except ValueError as e:
                raise TableError(f"{mdir / name}.csv: {e}") from None
    return out


def load_decode_conv(mdir: Path, policy: str, *, extrapolate: bool = True) -> Curve1D | None:
    """The GPU time of one GDN layer's decode core outside the policy's kernels (gdn_decode_conv.csv,
    the policy's graph rows) over decode tokens; None where it was not measured."""
    path = _file(mdir, f"{DECODE_CONV}.csv")
    if not path.exists():
        return None
    rows = [r for r in read_rows(path, DECODE_CONV_COLUMNS) if r["policy"] == policy and r["mode"] == "graph"]
    if not rows:
        return None
    try:
        return from_rows(f"{mdir.name}/{DECODE_CONV}[{policy}]", rows, ("tokens",), ("log",),
                         extrapolate=extrapolate).partial()
    except ValueError as e:
        raise TableError(f"{path}: {e}") from None


def load_gdn_mixed(mdir: Path, *, extrapolate: bool = True) -> GridInterpolator | None:
    """What B one-token decodes cost one GDN layer in a step with an n-token prefill, where vLLM runs
    them through its chunked prefill path (gdn_mixed.csv's extra over the prefill alone, over B >= 1
    and n); None where it was not measured. Below about 64 decodes the eager timings are bound by
    the host's launches and their difference is noise, at times negative: it counts as zero (as
    MIXED_FLOOR_US, the interpolation being in log space)."""
    path = _file(mdir, "gdn_mixed.csv")
    if not path.exists():
        return None
    rows = [{"B": r["B"], "tokens": r["tokens"], "us": max(MIXED_FLOOR_US, r["extra_us"])}
            for r in read_rows(path, GDN_MIXED_COLUMNS) if r["B"] >= 1]
    try:
        return from_rows(f"{mdir.name}/gdn_mixed", rows, ("B", "tokens"), ("log", "log"), extrapolate=extrapolate)
    except ValueError as e:
        raise TableError(f"{path}: {e}") from None


def derived_scale(hw: HardwareConfig, kind: str) -> float:
    return float(hw.scaling[kind]) if hw.derived else 1.0


def load_overhead(mdir: Path) -> float | None:
    """Median host overhead per step (host loop time minus GPU time), from step_check.csv.

    Graph-mode rows only: there the GPU time is exact, and what remains is the upload,
    launch, download and sync that every step pays. Eager rows already carry the
    launch cost in the eager tables, and their host/GPU difference is launch jitter.
    """
    path = _file(mdir, "step_check.csv")
    if not path.exists():
        return None
    rows = [r for r in read_rows(path, STEP_COLUMNS) if r["mode"] == "graph"]
    return statistics.median(max(0.0, r["host_step_us"] - r["step_us"]) for r in rows) if rows else None

