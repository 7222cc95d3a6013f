"""The validation figure: simulated against published value per metric, log-log, identity line."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

# The panels: one metric each (the others are in validation.csv).
PANELS = (("duration_s", "benchmark duration (s)"), ("ttft_mean_ms", "mean TTFT (ms)"),
          ("ttft_p99_ms", "p99 TTFT (ms)"), ("latency_mean_s", "mean request latency (s)"),
          ("tpot_mean_ms", "mean TPOT excl. 1st token (ms)"), ("request_throughput", "requests/s"))
STEM = "validation"


def _short(case: str) -> str:
    """The case name without the prefix every case shares."""
    return case.removeprefix("gpustack-h200-qwen3.5-35b-a3b-")


def _plain_log(axis) -> None:
    """Round numbers (20, 50, 100) on a log axis instead of "2 x 10^1"."""
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
    axis.set_minor_formatter(NullFormatter())


def draw(rows: list[dict[str, Any]], fig_dir: Path) -> None:
    from sim.figures.style import save_figure  # fixed metadata, written atomically
    fig_dir.mkdir(parents=True, exist_ok=True)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    colors = {c: f"C{i % 10}" for i, c in enumerate(cases)}
    markers = {c: "osD^vP*X"[i % 8] for i, c in enumerate(cases)}
    fig, axes = plt.subplots(2, 3, figsize=(12, 8.4), layout="constrained")
    for ax, (metric, label) in zip(axes.flat, PANELS):
        sel = [r for r in rows if r["metric"] == metric and r["real"] > 0 and r["simulated"] > 0]
        if not sel:
            ax.set_title(f"{label}: no case reports it", fontsize=9)
            ax.set_axis_off()
            continue
        xs, ys = [r["real"] for r in sel], [r["simulated"] for r in sel]
        lo, hi = min(xs + ys) / 1.6, max(xs + ys) * 1.6
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--")
        for r in sel:
            ax.scatter(r["real"], r["simulated"], s=36, zorder=3, color=colors[r["case"]], marker=markers[r["case"]])
            ax.annotate(f"{r['simulated'] / r['real']:.2f}x", (r["real"], r["simulated"]),
                        textcoords="offset points", xytext=(5, -3), fontsize=7, color=colors[r["case"]])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal", adjustable="box")
        _plain_log(ax.xaxis)
        _plain_log(ax.yaxis)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("published", fontsize=8)
        ax.set_ylabel("simulated", fontsize=8)
        ax.set_title(label, fontsize=9)
    handles = [Line2D([], [], ls="", marker=markers[c], color=colors[c], label=_short(c)) for c in cases]
    handles.append(Line2D([], [], color="black", lw=0.8, ls="--", label="simulated = published"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    fig.suptitle("Simulated against published vLLM runs (GPUStack, Qwen3.5-35B-A3B, one H200); "
                 "each point's simulated / published ratio beside it", fontsize=10)
    save_figure(fig, fig_dir, STEM)
