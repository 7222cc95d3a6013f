"""The look shared by every figure: policy colours and markers, axis ticks, the header
legend, not-run notes, and writing a figure as PNG and PDF (fixed metadata, atomically)."""
from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

COLORS = {"store_all": "#4c72b0", "reconstruct": "#dd8452", "replay": "#55a868", "none": "#8172b3"}
MARKERS = {"store_all": "o", "reconstruct": "s", "replay": "^", "none": "v"}
# The no-speculation baseline is the line the speculating policies are read against: dashed.
LINESTYLES = {"none": "--"}
NOT_RUN_MARKER = "x"
# Ratio axes are logarithmic; label them at round ratios, the roundest first, whatever the span.
NICE_RATIOS = (1.0, 2, 0.5, 10, 0.1, 5, 0.2, 1.5, 0.7, 3, 0.3, 1.2, 0.8, 1.1, 0.9, 1.05, 0.95, 20, 0.05, 50, 0.02, 100, 0.01)


def color(policy: str) -> str:
    return COLORS.get(policy, "#937860")


def marker(policy: str) -> str:
    return MARKERS.get(policy, "D")


def linestyle(policy: str) -> str:
    return LINESTYLES.get(policy, "-")


def save_figure(fig: plt.Figure, fig_dir: Path, stem: str) -> None:
    for ext in ("png", "pdf"):
        # Fixed metadata so the same table gives the same bytes; temp file + rename so an
        # interrupted run never leaves half a figure.
        meta = {"Software": None} if ext == "png" else {"CreationDate": None, "Producer": None}
        tmp = fig_dir / f".{stem}.tmp.{ext}"
        fig.savefig(tmp, dpi=130, bbox_inches="tight", metadata=meta)
        os.replace(tmp, fig_dir / f"{stem}.{ext}")
    plt.close(fig)


def ratio_ticks(ax: plt.Axes) -> None:
    lo, hi = ax.get_ylim()
    gap = np.log(hi / lo) / 7  # at most about 7 labels, evenly spread on the log axis
    ticks: list[float] = []
    for t in NICE_RATIOS:
        if lo <= t <= hi and all(abs(np.log(t / k)) >= gap for k in ticks):
            ticks.append(t)
    ax.yaxis.set_major_locator(FixedLocator(sorted(ticks)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_locator(NullLocator())


def log_ticks(ax: plt.Axes) -> None:
    """Plain numbers (0.1, 0.2, 0.5, 1, 2, 5) on a log axis instead of "3 x 10^0"."""
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def header(fig: plt.Figure, title: str, handles: list[Any]) -> None:
    """The figure's title with its legend under it, above the panels (a separate title and
    an outside legend overlap in matplotlib's constrained layout)."""
    fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 4), fontsize=8, frameon=False,
               title=title, title_fontsize=11)


def short_model(model: str) -> str:
    return model.removeprefix("qwen3.5-")


def why_not_run(rows: pd.DataFrame) -> str:
    """One short reason for points that did not run, for a panel or a caption."""
    status = rows["status"].iloc[0]
    error = str(rows["error"].iloc[0])
    if m := re.search(r"([\d.]+ GiB) missing", error):
        return f"{status}: the weights and fixed memory do not fit ({m.group(1)} missing per GPU)"
    if m := re.search(r"one request of max_model_len ([\d,]+) tokens needs ([\d,]+) blocks .* the pool holds ([\d,]+)",
                      error):
        return (f"{status}: one request of max_model_len {m.group(1)} tokens needs {m.group(2)} blocks, the pool "
                f"holds {m.group(3)}")
    return f"{status}: {error.split('; ')[0]}"


PRICINGS = {"calibrated": "the calibration tables", "analytic": "the analytic roofline (no tables)",
            "mixed": "the calibration tables and, per term, other sources (report.md lists them)",
            "derived": "tables scaled from another GPU", "config": "the configured step time"}


def pricing_note(df: pd.DataFrame) -> str:
    """Which pricing made the points drawn (each run's latency_source), for every figure's footnote."""
    ok = df[df["status"] == "ok"]
    if "latency_source" not in ok or ok.empty:
        return ""
    counts = ok["latency_source"].value_counts()
    where = ", ".join(sorted(map(str, ok["hardware"].unique()))) if "hardware" in ok else ""
    parts = [f"{PRICINGS.get(src, src)} ({n} points)" for src, n in counts.items()]
    return f"Step prices{' on ' + where if where else ''}: " + "; ".join(parts) + "."


def footnote(fig: plt.Figure, df: pd.DataFrame, text: str = "", width: int = 160) -> str:
    """The figure's footnote: `text`, then the points that did not run and the pricing, which are
    returned for the caption in report.md."""
    added = " ".join(t for t in (not_run_note(df), pricing_note(df)) if t)
    if note := " ".join(t for t in (text, added) if t):
        fig.supxlabel("\n".join(textwrap.wrap(note, width)), fontsize=7)
    return added


def not_run_note(df: pd.DataFrame) -> str:
    """Which model/gmu combinations have points that did not run, and why (for captions)."""
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return ""
    parts = []
    for (model, gmu), rows in bad.groupby(["model", "engine.gmu"], sort=False):
        parts.append(f"{short_model(model)} at gmu {gmu:g}: {len(rows)} points {why_not_run(rows)}")
    return "Not drawn: " + "; ".join(parts) + "."
