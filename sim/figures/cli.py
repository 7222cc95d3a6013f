"""`specsim figures --sweep DIR`: the four figures of a sweep (PNG + PDF) and report.md.

1. breakdown: each policy's ratio to `store_all` per metric, memory-bound vs slack,
   geometric means and point counts; 2. peak KV + state pool usage against load; 3. p99
   TTFT and throughput against load; 4. draft-tree shapes (only for a grid that sweeps
   `policy_overrides.draft_tree_widths`, e.g. configs/grids/trees.yaml).
Every figure is drawn from the table that report.md prints beside it. Figures 2 and 3
have one panel per model, gmu (and any other swept field); policies whose values
coincide are drawn side by side, and a panel whose points did not run says why.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from sim.figures.style import NOT_RUN_MARKER, color, footnote, header, ratio_ticks, save_figure, short_model
import matplotlib.pyplot as plt  # noqa: E402  (after figure_style, which picks the file backend)
from matplotlib.patches import Patch  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from core.config import GiB, ConfigError  # noqa: E402
from core.files import StagedOutput, read_text  # noqa: E402
from sim.figures.load import LOAD_LABELS, TREE_AXIS, fig_kv_usage, fig_latency_throughput  # noqa: E402
from sim.runs.report import (  # noqa: E402
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
from sim.figures import speculation as spec  # noqa: E402

CLASS_COLORS = {"memory-bound": "#c44e52", "slack": "#8c8c8c"}
CLASS_LABELS = {"memory-bound": f"memory-bound ({BASELINE} exhausted the pool)", "slack": "slack (pool not exhausted)"}


# ------------------------------------------------------------------- 1. breakdown
def fig_breakdown(df: pd.DataFrame, manifest: dict[str, Any], fig_dir: Path) -> Section:
    table = breakdown_table(df)
    title = f"Policy / {BASELINE} ratios, memory-bound vs slack points"
    note = (
        f"A point is memory-bound when `{BASELINE}` at the same model, gmu, load (and tree) exhausted the pool: "
        "peak KV + state pool usage >= 99.9%, requests waited for memory, or preemptions; all other points are "
        "slack. Each panel is one metric: bars are the geometric mean of the policy's ratio to "
        f"`{BASELINE}` over the points of a class (number under the bar, n = points), dots are the points. "
        "A bar above 1x means a larger value than the baseline: better for throughput, worse for latencies "
        "(each panel's title says which way is better). Where throughput rises, TPOT rises too: a policy that "
        "frees state blocks runs more requests at once, so every step carries a bigger batch and takes longer."
    )
    if table.empty:
        return Section(title, None, note + " Not drawn: no policy has an ok baseline point.", [])
    ok = df[(df["status"] == "ok") & (df["policy"] != BASELINE) & df["memory_bound"].notna()]
    models = list(dict.fromkeys(ok["model"]))
    metrics = [m for m in RATIO_METRICS if ratio_column(m) in ok]
    fig, axes = plt.subplots(len(models), len(metrics), figsize=(3.6 * len(metrics), 3.4 * len(models) + 0.8),
                             squeeze=False, layout="constrained")
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
                        ax.bar(x, gm - 1.0, bottom=1.0, width=0.36, color=color, alpha=0.55)
                        ax.scatter(x + rng.uniform(-0.1, 0.1, len(vals)), vals, s=9, color=color, edgecolor="black", linewidth=0.3, zorder=3)
                    text = f"{gm:.2f}x\nn={len(vals)}" if len(vals) else "n=0"
                    ax.text(x, 0.02, text, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_yscale("log")
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo / (hi / lo) ** 0.3, hi * (hi / lo) ** 0.05)  # room for the labels under the bars
            ratio_ticks(ax)
            # reconstruct_deferred is wider than its slot: wrap long names at their first underscore
            ax.set_xticks(range(len(policies)), [p.replace("_", "\n", 1) if len(p) > 12 else p for p in policies])
            ax.set_ylabel(f"{label} / {BASELINE}")
            ax.set_title(f"{short_model(model)}: {label}\n({better} is better)", fontsize=9)
    handles = [Patch(color=CLASS_COLORS[c], alpha=0.55, label=CLASS_LABELS[c]) for c in CLASS_COLORS]
    header(fig, f"{manifest.get('workload', '')}: {title}", handles)
    caption = footnote(fig, df)
    save_figure(fig, fig_dir, "fig1_breakdown")
    return Section(title, "fig1_breakdown", note + (" " + caption if caption else ""), [("ratios by class", table)])


# ------------------------------------------------------------------------ 4. trees
# (column, label, same at every gmu and load: drawn once at the top)
TREE_METRICS = [
    ("mean_accepted_len", "accepted length (tokens/step)", True),
    ("state_blocks_per_group", "state blocks per request\nin each GDN group", True),
    ("peak_kv_gib", "peak KV + state pool use (GiB)", False),
    ("output_throughput_tok_s", "output tok/s (higher is better)", False),
]


def _tree_bars(ax: plt.Axes, rows: pd.DataFrame, col: str, trees: list[str], policies: list[str],
               values_on_bars: bool) -> None:
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        per_tree = rows[rows["policy"] == policy].groupby("tree")[col].mean().reindex(trees)
        x = np.arange(len(trees)) + (k - (len(policies) - 1) / 2) * width
        bars = ax.bar(x, per_tree.fillna(0), width=width, color=color(policy))
        if values_on_bars:
            ax.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.3g}" for v in per_tree], fontsize=6, padding=1)
        for xi, v in zip(x, per_tree):
            if math.isnan(v):  # the point did not run: say so where its bar would be
                ax.text(xi, 0, NOT_RUN_MARKER, ha="center", va="bottom", color=color(policy), fontsize=9)
    ax.set_xticks(range(len(trees)), [f"({t})" for t in trees], fontsize=8)
    ax.margins(y=0.12)


def fig_trees(df: pd.DataFrame, manifest: dict[str, Any], fig_dir: Path) -> Section:
    title = "Draft-tree shapes per policy"
    ok = df[df["status"] == "ok"]
    if TREE_AXIS not in manifest.get("grid_axes", {}) or ok.empty:
        return Section(title, None, "Not drawn: this grid does not sweep `policy_overrides.draft_tree_widths` "
                       "(run `--grid configs/grids/trees.yaml`).", [])
    metrics = [(c, label, once) for c, label, once in TREE_METRICS if c in ok]
    top = [m for m in metrics if m[2]]
    per_cell = [m for m in metrics if not m[2]]
    load = manifest.get("load_axis")
    groups = ["model", "engine.gmu"] + ([load] if load else [])
    cells = list(ok.groupby(groups, sort=False))
    trees = list(dict.fromkeys(df["tree"]))
    policies = policies_in(df)
    ncols = max(len(top), len(per_cell), 1)
    nrows = (1 if top else 0) + len(cells)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.0 * ncols, 2.7 * nrows + 0.8), squeeze=False,
                             layout="constrained")
    for j, (col, ylabel, _) in enumerate(top):
        ax = axes[0][j]
        _tree_bars(ax, ok, col, trees, policies, values_on_bars=True)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(f"{ylabel.replace(chr(10), ' ')}: every gmu and load", fontsize=9)
    for j in range(len(top), ncols):
        if top:
            axes[0][j].set_visible(False)
    for i, (values, rows) in enumerate(cells, start=1 if top else 0):
        label = ", ".join(short_model(v) if k == "model" else f"{k.split('.')[-1]} {v:g}" for k, v in zip(groups, values))
        for j, (col, ylabel, _) in enumerate(per_cell):
            ax = axes[i][j]
            _tree_bars(ax, rows, col, trees, policies, values_on_bars=False)
            if col == "peak_kv_gib" and "pool_bytes" in rows:
                pool = rows["pool_bytes"].max() / GiB
                ax.axhline(pool, color="black", linewidth=0.8, linestyle="--")
                ax.text(0.01, pool, f"pool {pool:.1f} GiB", transform=ax.get_yaxis_transform(), fontsize=7, va="bottom")
                ax.set_ylim(top=pool * 1.15)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.set_title(label, fontsize=9)
        for j in range(len(per_cell), ncols):
            axes[i][j].set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("draft tree (widths per depth)", fontsize=8)
    handles = [Patch(color=color(p), label=p) for p in policies]
    header(fig, f"{manifest.get('workload', '')}: {title}", handles)
    caption = footnote(fig, df, width=120)
    save_figure(fig, fig_dir, "fig4_trees")
    table = ok[groups + ["tree", "policy"] + [c for c, _, _ in metrics]].sort_values(groups, kind="stable")
    note = ("Top row: accepted length and state blocks per tree, which do not depend on gmu or load. Below, one "
            "row per model, gmu and load: peak KV + state pool use against the pool's size (dashed) and "
            "output throughput, one bar per policy.")
    return Section(title, "fig4_trees", note + (" " + caption if caption else ""), [("per tree and policy", table)])


def fig_speculation(df: pd.DataFrame, manifest: dict[str, Any], fig_dir: Path) -> Section:
    load_axis = manifest.get("load_axis")
    table = spec.speculation_table(df, load_axis)
    if table.empty:
        return Section(spec.TITLE, None, spec.NOT_DRAWN, [])
    fig, axes = spec.draw_speculation(table, LOAD_LABELS.get(load_axis, load_axis))
    for ax in axes:
        ratio_ticks(ax)
    caption = footnote(fig, df, width=120)
    save_figure(fig, fig_dir, spec.STEM)
    return Section(spec.TITLE, spec.STEM, spec.note(table) + (" " + caption if caption else ""),
                   [("per model and gmu", spec.verdict_table(table)), ("per point", table)])


FIGURES = (fig_breakdown, fig_kv_usage, fig_latency_throughput, fig_trees, fig_speculation)


def _missing_sweep(sweep_dir: Path) -> str:
    """What to run when a folder has no finished sweep: the workload comes from a point
    file when an interrupted sweep left some (the grid must be given again)."""
    for point in sorted((sweep_dir / "points").glob("*.json"))[:20]:
        try:
            workload = json.loads(point.read_text())["config"]["workload"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return (f"--sweep {sweep_dir}: no points.csv and sweep.json there: the sweep was interrupted; rerun it "
                f"to finish (finished points are kept): `specsim sweep --workload {workload} --grid GRID "
                f"--out {sweep_dir}` with the grid it ran with, then `specsim figures --sweep {sweep_dir}`")
    return (f"--sweep {sweep_dir}: no points.csv and sweep.json there; run a sweep first: "
            f"`specsim sweep --workload NAME --out {sweep_dir}` (or `make sweep WORKLOAD=NAME`)")


def make_figures(sweep_dir: Path) -> list[Section]:
    points = sweep_dir / "points.csv"
    manifest_path = sweep_dir / "sweep.json"
    if not points.exists() or not manifest_path.exists():
        raise ConfigError(_missing_sweep(sweep_dir))
    df = read_points_csv(points)
    try:
        manifest = json.loads(read_text(manifest_path, "the sweep's sweep.json"))
    except ValueError as e:
        raise ConfigError(f"{manifest_path}: not valid JSON ({e}); rerun the sweep to rewrite it") from None
    if not isinstance(manifest, dict):
        raise ConfigError(f"{manifest_path}: expected a JSON object; rerun the sweep to rewrite it")
    # Figures and report.md appear together or not at all: a failure keeps the previous ones.
    with StagedOutput(sweep_dir, ["report.md"], ["figures"], option="--sweep") as staged:
        fig_dir = staged.path / "figures"
        fig_dir.mkdir()
        sections = [draw(df, manifest, fig_dir) for draw in FIGURES]
        write_report(staged.path / "report.md", df, manifest, sections)
        staged.publish()
    return sections


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sweep", required=True, help="a sweep folder (holds points.csv and sweep.json)")


def main(args: argparse.Namespace) -> int:
    sweep_dir = Path(args.sweep)
    for s in make_figures(sweep_dir):
        print(f"{s.title}: " + (f"{sweep_dir / 'figures' / s.figure}.png/.pdf" if s.figure else s.note))
    print(f"wrote {sweep_dir / 'report.md'}")
    return 0
