"""Host-bound replayed steps priced at the host speed they were measured at.

The host tables (host.csv) were measured at one host speed: the host probe
(`calibrate.tables.host.HostProbe`, us per small eager launch) taken around their passes, of
which each point keeps its lowest, so the tables' speed is the fastest of those probes.
The device's host drifts between regimes within a call (calibrate/replay/README.md), and a
replayed step carries the probe taken just before it. For the host-bound kinds the host
time a step exposes beyond its GPU work is the prediction's `overhead` term (the pipeline
pricing: host issue time not hidden under the GPU's); scaled by the step's probe over the
tables' probe it prices the step at the host speed it ran at, so a slower host regime
reads as a slower host, not as a model error. GPU terms are not scaled.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

HOST_BOUND_KINDS = ("mixed_graph", "mixed_eager", "prefill_only")
HOST_TERM = "pred_overhead"  # replay_steps.csv's column of the exposed host time
COLUMN = "predicted_at_host_speed_us"


def tables_probe_us(host_probes: dict | None) -> float | None:
    """The host tables' speed from the probes around their passes ({"host": [us, ...], ...}): the fastest."""
    probes = [p for p in (host_probes or {}).get("host", []) if isinstance(p, (int, float)) and p > 0]
    return min(probes) if probes else None


def tables_probe_from(model_dir: Path) -> float | None:
    """The probe of the host tables committed beside a replay: the newest provenance part that has one."""
    path = model_dir / "provenance.json"
    if not path.is_file():
        return None
    parts = json.loads(path.read_text()).get("parts", [])
    for part in reversed(parts):
        ref = tables_probe_us(part.get("host_probe_us") if isinstance(part.get("host_probe_us"), dict) else None)
        if ref is not None:
            return ref
    return None


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not math.isnan(v)


def at_host_speed(row: dict, ref_us: float) -> float:
    """The row's prediction with its exposed host time scaled to its own probe (host-bound kinds
    with a probe and an overhead term); otherwise the prediction unchanged."""
    pred = row.get("predicted_us")
    probe, host = row.get("host_probe_us"), row.get(HOST_TERM)
    if row.get("kind") not in HOST_BOUND_KINDS or not (_num(pred) and _num(probe) and _num(host)) or probe <= 0:
        return pred
    return pred + host * (probe / ref_us - 1.0)


def with_host_speed(rows: Sequence[dict], ref_us: float) -> list[dict]:
    """Copies of the rows with COLUMN added."""
    if not (_num(ref_us) and ref_us > 0):
        raise ValueError(f"host tables' probe must be a positive number of us, got {ref_us!r}")
    return [{**r, COLUMN: at_host_speed(r, ref_us)} for r in rows]
