"""The replay's files: replay_steps.csv (one row per timed step), replay_summary.json and the side tables.

replay_steps.csv holds each step's measurements, the simulator's prediction and its terms (a
`pred_<term>` column each) and the old eager-sum pricing; replay_summary.json is
calibrate.replay.summary's view of those rows; host.csv, host_policies.csv and
gdn_prefill_varlen.csv are the tables measured on the replay's executor.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Sequence

from calibrate.replay.summary import summarize
from core.files import atomic_write_text

BASE_COLUMNS = ("run", "step", "kind", "mode", "tokens", "padded_tokens", "requests", "decodes", "prefills",
                "context_tokens", "measured_us", "measured_sync_us", "measured_async_us", "measured_sync_min_us",
                "measured_sync_max_us", "reps", "pass", "host_probe_us", "predicted_us",
                "old_predicted_us")


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: (round(v, 3) if isinstance(v, float) else v) for c, v in r.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())


def read_replay_rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            if k not in ("run", "kind", "mode"):
                r[k] = (int(v) if v.lstrip("-").isdigit() else float(v)) if v not in ("", None) else math.nan
    return rows


def write_outputs(mdir: Path, rows: list[dict], tables_probe_us: float | None = None) -> None:
    """replay_steps.csv (a pred_<term> column per predicted term) and replay_summary.json (with the
    host-bound steps at their own host speed when the host tables' probe is given)."""
    terms = sorted({k for r in rows for k in r if k.startswith("pred_")})
    write_csv(mdir / "replay_steps.csv", rows, (*BASE_COLUMNS, *terms))
    (mdir / "replay_summary.json").write_text(json.dumps(summarize(rows, tables_probe_us=tables_probe_us), indent=2) + "\n")


def write_side_tables(mdir: Path, host_rows: list[dict], varlen_rows: list[dict],
                      policy_rows: Sequence[dict] = ()) -> None:
    """host.csv, host_policies.csv and gdn_prefill_varlen.csv, where measured."""
    from calibrate.tables.host import COLUMNS as HOST
    from core.tables import HOST_POLICY_COLUMNS, SEQS_COLUMNS

    if host_rows:
        write_csv(mdir / "host.csv", host_rows, HOST)
    if policy_rows:
        write_csv(mdir / "host_policies.csv", list(policy_rows), HOST_POLICY_COLUMNS)
    if varlen_rows:
        write_csv(mdir / "gdn_prefill_varlen.csv", varlen_rows, SEQS_COLUMNS)
