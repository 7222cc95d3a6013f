"""`specsim figures --sweep DIR`: the four figures of a sweep (PNG + PDF) and report.md.

1. breakdown: each policy's ratio to `store_all` per metric, memory-bound vs slack,
   geometric means and point counts; 2. peak KV usage against load; 3. p99 TTFT and
   throughput against load; 4. draft-tree shapes (only for a grid that sweeps
   `policy_overrides.draft_tree_widths`, e.g. configs/grids/trees.yaml).
Every figure is drawn from the table that report.md prints beside it.
"""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from core.config import ConfigError  # noqa: E402
from sim.report import (  # noqa: E402
    BASELINE,
    RATIO_METRICS,
    Section,
    breakdown_table,
    geomean,
    policies_in,
    ratio_column,
    read_points_csv,
    write_report,
)

TREE_AXIS = "policy_overrides.draft_tree_widths"
LOAD_LABELS = {
    "client.max_concurrency": "maximum concurrency (requests)",
    "client.request_rate": "request rate (requests/s)",
}
COLORS = {"store_all": "#4c72b0", "reconstruct": "#dd8452", "replay": "#55a868"}
MARKERS = {"store_all": "o", "reconstruct": "s", "replay": "^"}  # distinct even where lines overlap
CLASS_COLORS = {"memory-bound": "#c44e52", "slack": "#8c8c8c"}
GMU_STYLES = ("-", "--", ":", "-.")
# Ratio axes are logarithmic; label them at round ratios, the roundest first, whatever the span.
NICE_RATIOS = (1.0, 2, 0.5, 10, 0.1, 5, 0.2, 1.5, 0.7, 3, 0.3, 1.2, 0.8, 1.1, 0.9, 1.05, 0.95, 20, 0.05, 50, 0.02, 100, 0.01)


def _color(policy: str) -> str:
    return COLORS.get(policy, "#937860")


def _save(fig: plt.Figure, fig_dir: Path, stem: str) -> None:
    for ext in ("png", "pdf"):
        # Fixed metadata so the same table gives the same bytes; temp file + rename so an
        # interrupted run never leaves half a figure.
        meta = {"Software": None} if ext == "png" else {"CreationDate": None, "Producer": None}
        tmp = fig_dir / f".{stem}.tmp.{ext}"
        fig.savefig(tmp, dpi=130, bbox_inches="tight", metadata=meta)
        os.replace(tmp, fig_dir / f"{stem}.{ext}")
    plt.close(fig)


def _ratio_ticks(ax: plt.Axes) -> None:
    lo, hi = ax.get_ylim()
    gap = np.log(hi / lo) / 7  # at most about 7 labels, evenly spread on the log axis
    ticks: list[float] = []
    for t in NICE_RATIOS:
        if lo <= t <= hi and all(abs(np.log(t / k)) >= gap for k in ticks):
            ticks.append(t)
    ax.yaxis.set_major_locator(FixedLocator(sorted(ticks)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_locator(NullLocator())


def _legend(fig: plt.Figure, axes: np.ndarray) -> None:
    """One legend for all panels (a panel may lack a line, e.g. an infeasible gmu)."""
    entries: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    fig.tight_layout()
    fig.legend(entries.values(), entries.keys(), loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8, frameon=False)


def _facets(df: pd.DataFrame, manifest: dict[str, Any]) -> list[str]:
    """Swept columns other than model, policy, gmu and load: each value gets its own panel."""
    skip = {"model", "policy", "engine.gmu", manifest.get("load_axis")}
    cols = ["tree" if a == TREE_AXIS else a for a in manifest.get("grid_axes", {}) if a not in skip]
    return [c for c in cols if c in df and df[c].nunique() > 1]


def _panels(df: pd.DataFrame, facets: list[str]) -> list[tuple[str, pd.DataFrame]]:
    keys = ["model", *facets]
    out = []
    for values, sub in df.groupby(keys, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        label = ", ".join([str(values[0])] + [f"{k}={v}" for k, v in zip(facets, values[1:])])
        out.append((label, sub))
    return out


# ------------------------------------------------------------------- 1. breakdown
def fig_breakdown(df: pd.DataFrame, manifest: dict[str, Any], fig_dir: Path) -> Section:
    table = breakdown_table(df)
    title = f"Policy / {BASELINE} ratios, memory-bound vs slack points"
    note = (
        f"A point is memory-bound when `{BASELINE}` at the same model, gmu, load (and tree) exhausted the pool: "
        "peak KV usage >= 99.9%, requests waited for memory, or preemptions. Bars: geometric mean; dots: points."
    )
    if table.empty:
        return Section(title, None, note + " Not drawn: no policy has an ok baseline point.", [])
    ok = df[(df["status"] == "ok") & (df["policy"] != BASELINE) & df["memory_bound"].notna()]
    models = list(dict.fromkeys(ok["model"]))
    metrics = [m for m in RATIO_METRICS if ratio_column(m) in ok]
    fig, axes = plt.subplots(len(models), len(metrics), figsize=(4.2 * len(metrics), 3.9 * len(models)), squeeze=False)
    rng = np.random.default_rng(0)  # dot jitter only
    for i, model in enumerate(models):
        sub = ok[ok["model"] == model]
        policies = policies_in(sub)
        for j, metric in enumerate(metrics):
            ax = axes[i][j]
            label, better = RATIO_METRICS[metric]
            col = ratio_column(metric)
            for k, policy in enumerate(policies):
                for c, (cls, color) in enumerate(CLASS_COLORS.items()):
                    mask = sub["policy"].eq(policy) & (sub["memory_bound"] if cls == "memory-bound" else ~sub["memory_bound"]).astype(bool)
                    vals = sub.loc[mask, col].dropna()
                    x = k + (c - 0.5) * 0.38
                    gm = geomean(vals)
                    if len(vals):
                        # Bars grow from 1 (parity with the baseline), up or down on the log axis.
                        ax.bar(x, gm - 1.0, bottom=1.0, width=0.36, color=color, alpha=0.55, label=cls if k == 0 else None)
                        ax.scatter(x + rng.uniform(-0.1, 0.1, len(vals)), vals, s=9, color=color, edgecolor="black", linewidth=0.3, zorder=3)
                    text = f"{gm:.2f}x\nn={len(vals)}" if len(vals) else "n=0"
                    ax.text(x, 0.02, text, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_yscale("log")
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo / (hi / lo) ** 0.25, hi * (hi / lo) ** 0.05)  # room for the labels under the bars
            _ratio_ticks(ax)
            ax.set_xticks(range(len(policies)), policies)
            ax.set_ylabel(f"{label} / {BASELINE} (x)")
            ax.set_title(f"{model}\n{label} ({better} is better)", fontsize=9)
            if i == 0 and j == 0:
                ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"{manifest.get('workload', '')}: {title}")
    fig.tight_layout()
    _save(fig, fig_dir, "fig1_breakdown")
    return Section(title, "fig1_breakdown", note, [("ratios by class", table)])


# ---------------------------------------------------------- 2./3. against the load
def _against_load(
    df: pd.DataFrame,
    manifest: dict[str, Any],
    fig_dir: Path,
    stem: str,
    title: str,
    metrics: list[tuple[str, str, bool, Callable[[pd.Series], pd.Series]]],  # column, y label, log y, transform
) -> Section:
    load = manifest.get("load_axis")
    ok = df[df["status"] == "ok"]
    needed = [m[0] for m in metrics]
    if not load or ok.empty or any(c not in ok for c in needed):
        why = "the grid sweeps no load axis" if not load else "no ok points with those metrics"
        return Section(title, None, f"Not drawn: {why}.", [])
    facets = _facets(ok, manifest)
    panels = _panels(ok, facets)
    gmus = sorted(ok["engine.gmu"].unique())
    loads = sorted(ok[load].unique())
    fig, axes = plt.subplots(len(metrics), len(panels), figsize=(4.6 * len(panels), 3.4 * len(metrics)), squeeze=False)
    for j, (panel, sub) in enumerate(panels):
        for i, (col, ylabel, logy, transform) in enumerate(metrics):
            ax = axes[i][j]
            for policy in policies_in(sub):
                for g, gmu in enumerate(gmus):
                    line = sub[(sub["policy"] == policy) & (sub["engine.gmu"] == gmu)].sort_values(load)
                    if not line.empty:
                        ax.plot(line[load], transform(line[col]), GMU_STYLES[g % len(GMU_STYLES)], marker=MARKERS.get(policy, "o"), markersize=3.5, fillstyle="none",
                                color=_color(policy), label=f"{policy}, gmu {gmu:g}")
            ax.set_xscale("log", base=2)
            ax.set_xticks(loads, [f"{v:g}" for v in loads])
            ax.xaxis.set_minor_locator(NullLocator())
            if logy:
                ax.set_yscale("log")
            ax.set_xlabel(LOAD_LABELS.get(load, load))
            ax.set_ylabel(ylabel)
            ax.set_title(panel, fontsize=9)
            ax.grid(alpha=0.3)
    fig.suptitle(f"{manifest.get('workload', '')}: {title}")
    _legend(fig, axes)
    _save(fig, fig_dir, stem)
    index = ["model", *facets, "engine.gmu", load]
    tables = []
    for col, ylabel, _, transform in metrics:
        wide = ok.pivot_table(index=index, columns="policy", values=col, sort=False, dropna=False)
        tables.append((ylabel, transform(wide[policies_in(ok)]).reset_index()))
    return Section(title, stem, "One line per policy (colour) and gmu (line style).", tables)


def _same(s: pd.Series) -> pd.Series:
    return s


def fig_kv_usage(df: pd.DataFrame, manifest: dict[str, Any], fig_dir: Path) -> Section:
    return _against_load(df, manifest, fig_dir, "fig2_peak_kv_usage", "Peak KV-cache usage against load",
                         [("peak_kv_usage", "peak KV-cache usage (%)", False, lambda s: 100 * s)])


def fig_latency_throughput(df: pd.DataFrame, manifest: dict[str, Any], fig_dir: Path) -> Section:
    return _against_load(df, manifest, fig_dir, "fig3_ttft_throughput", "p99 TTFT and output throughput against load",
                         [("ttft_p99_s", "p99 TTFT (s)", True, _same),
                          ("output_throughput_tok_s", "output throughput (tok/s)", False, _same)])


# ------------------------------------------------------------------------ 4. trees
TREE_METRICS = [
    ("mean_accepted_len", "accepted length (tokens/step)"),
    ("state_blocks_per_layer", "state blocks per request per GDN layer"),
    ("peak_kv_gib", "peak KV + state pool use (GiB)"),
    ("output_throughput_tok_s", "output throughput (tok/s)"),
]


def fig_trees(df: pd.DataFrame, manifest: dict[str, Any], fig_dir: Path) -> Section:
    title = "Draft-tree shapes per policy"
    ok = df[df["status"] == "ok"]
    if TREE_AXIS not in manifest.get("grid_axes", {}) or ok.empty:
        return Section(title, None, "Not drawn: this grid does not sweep `policy_overrides.draft_tree_widths` "
                       "(run `--grid configs/grids/trees.yaml`).", [])
    metrics = [(c, label) for c, label in TREE_METRICS if c in ok]
    load = manifest.get("load_axis")
    groups = ["model", "engine.gmu"] + ([load] if load else [])
    panels = list(ok.groupby(groups, sort=False))
    trees = list(dict.fromkeys(ok["tree"]))
    fig, axes = plt.subplots(len(panels), len(metrics), figsize=(4.4 * len(metrics), 3.2 * len(panels)), squeeze=False)
    for i, (values, sub) in enumerate(panels):
        label = ", ".join(f"{k.split('.')[-1]} {v}" for k, v in zip(groups, values))
        policies = policies_in(sub)
        width = 0.8 / len(policies)
        for j, (col, ylabel) in enumerate(metrics):
            ax = axes[i][j]
            for k, policy in enumerate(policies):
                vals = sub[sub["policy"] == policy].set_index("tree").reindex(trees)[col]
                ax.bar(np.arange(len(trees)) + (k - (len(policies) - 1) / 2) * width, vals, width=width,
                       color=_color(policy), label=policy)
            ax.set_xticks(range(len(trees)), [f"({t})" for t in trees], fontsize=7)
            ax.set_xlabel("draft tree (widths per depth)")
            ax.set_ylabel(ylabel, fontsize=8)
            ax.set_title(label, fontsize=8)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"{manifest.get('workload', '')}: {title}")
    fig.tight_layout()
    _save(fig, fig_dir, "fig4_trees")
    table = ok[groups + ["tree", "policy"] + [c for c, _ in metrics]].sort_values(groups, kind="stable")
    return Section(title, "fig4_trees", "Bars per tree shape and policy; one row of panels per model, gmu and load.",
                   [("per tree and policy", table)])


FIGURES = (fig_breakdown, fig_kv_usage, fig_latency_throughput, fig_trees)


def make_figures(sweep_dir: Path) -> list[Section]:
    points = sweep_dir / "points.csv"
    manifest_path = sweep_dir / "sweep.json"
    if not points.exists() or not manifest_path.exists():
        raise ConfigError(f"--sweep {sweep_dir}: no points.csv and sweep.json there; run `specsim sweep --out {sweep_dir}` first")
    df = read_points_csv(points)
    manifest = json.loads(manifest_path.read_text())
    fig_dir = sweep_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    sections = [draw(df, manifest, fig_dir) for draw in FIGURES]
    write_report(sweep_dir / "report.md", df, manifest, sections)
    return sections


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sweep", required=True, help="a sweep folder (holds points.csv and sweep.json)")


def main(args: argparse.Namespace) -> int:
    sweep_dir = Path(args.sweep)
    for s in make_figures(sweep_dir):
        print(f"{s.title}: " + (f"{sweep_dir / 'figures' / s.figure}.png/.pdf" if s.figure else s.note))
    print(f"wrote {sweep_dir / 'report.md'}")
    return 0
