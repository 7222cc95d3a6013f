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
import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from core.config import GiB, ConfigError  # noqa: E402
from core.files import StagedOutput, read_text  # noqa: E402
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
from sim import figure_speculation as spec  # noqa: E402

TREE_AXIS = "policy_overrides.draft_tree_widths"
LOAD_LABELS = {
    "client.max_concurrency": "maximum concurrency (requests)",
    "client.request_rate": "request rate (requests/s)",
}
COLORS = {"store_all": "#4c72b0", "reconstruct": "#dd8452", "replay": "#55a868", "none": "#8172b3"}
MARKERS = {"store_all": "o", "reconstruct": "s", "replay": "^", "none": "v"}
CLASS_COLORS = {"memory-bound": "#c44e52", "slack": "#8c8c8c"}
CLASS_LABELS = {"memory-bound": f"memory-bound ({BASELINE} exhausted the pool)", "slack": "slack (pool not exhausted)"}
NOT_RUN_MARKER = "x"
# Policies at the same load are drawn this share of the load axis's width apart, so values
# that coincide show as markers side by side instead of one hiding the others.
DODGE = 0.022
MAX_COLUMNS = 4
# Ratio axes are logarithmic; label them at round ratios, the roundest first, whatever the span.
NICE_RATIOS = (1.0, 2, 0.5, 10, 0.1, 5, 0.2, 1.5, 0.7, 3, 0.3, 1.2, 0.8, 1.1, 0.9, 1.05, 0.95, 20, 0.05, 50, 0.02, 100, 0.01)


def _color(policy: str) -> str:
    return COLORS.get(policy, "#937860")


def _marker(policy: str) -> str:
    return MARKERS.get(policy, "D")


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


def _log_ticks(ax: plt.Axes) -> None:
    """Plain numbers (0.1, 0.2, 0.5, 1, 2, 5) on a log axis instead of "3 x 10^0"."""
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _header(fig: plt.Figure, title: str, handles: list[Any]) -> None:
    """The figure's title with its legend under it, above the panels (a separate title and
    an outside legend overlap in matplotlib's constrained layout)."""
    fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 4), fontsize=8, frameon=False,
               title=title, title_fontsize=11)


def _short_model(model: str) -> str:
    return model.removeprefix("qwen3.5-")


def why_not_run(rows: pd.DataFrame) -> str:
    """One short reason for points that did not run, for a panel or a caption."""
    status = rows["status"].iloc[0]
    error = str(rows["error"].iloc[0])
    if m := re.search(r"([\d.]+ GiB) missing", error):
        return f"{status}: the weights and fixed memory do not fit ({m.group(1)} missing per GPU)"
    return f"{status}: {textwrap.shorten(error, 90)}"


def _not_run_note(df: pd.DataFrame) -> str:
    """Which model/gmu combinations have points that did not run, and why (for captions)."""
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return ""
    parts = []
    for (model, gmu), rows in bad.groupby(["model", "engine.gmu"], sort=False):
        parts.append(f"{_short_model(model)} at gmu {gmu:g}: {len(rows)} points {why_not_run(rows)}")
    return "Not drawn: " + "; ".join(parts) + "."


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
            _ratio_ticks(ax)
            # reconstruct_deferred is wider than its slot: wrap long names at their first underscore
            ax.set_xticks(range(len(policies)), [p.replace("_", "\n", 1) if len(p) > 12 else p for p in policies])
            ax.set_ylabel(f"{label} / {BASELINE}")
            ax.set_title(f"{_short_model(model)}: {label}\n({better} is better)", fontsize=9)
    handles = [Patch(color=CLASS_COLORS[c], alpha=0.55, label=CLASS_LABELS[c]) for c in CLASS_COLORS]
    _header(fig, f"{manifest.get('workload', '')}: {title}", handles)
    if caption := _not_run_note(df):
        fig.supxlabel("\n".join(textwrap.wrap(caption, 160)), fontsize=7)
    _save(fig, fig_dir, "fig1_breakdown")
    return Section(title, "fig1_breakdown", note + (" " + caption if caption else ""), [("ratios by class", table)])


# ---------------------------------------------------------- 2./3. against the load
@dataclass
class Cell:
    """One panel of figures 2 and 3: every point of one model, gmu and facet values."""

    label: str
    rows: pd.DataFrame  # all statuses


def _facets(df: pd.DataFrame, manifest: dict[str, Any]) -> list[str]:
    """Swept columns other than model, policy, gmu and load: each value gets its own panel."""
    skip = {"model", "policy", "engine.gmu", manifest.get("load_axis")}
    cols = ["tree" if a == TREE_AXIS else a for a in manifest.get("grid_axes", {}) if a not in skip]
    return [c for c in cols if c in df and df[c].nunique() > 1]


def _cells(df: pd.DataFrame, facets: list[str]) -> list[Cell]:
    keys = ["model", *facets, "engine.gmu"]
    cells = []
    for values, rows in df.groupby(keys, sort=False):
        model, *facet_values, gmu = values
        parts = [_short_model(model)] + [f"{'tree (' + str(v) + ')' if k == 'tree' else f'{k} {v}'}"
                                         for k, v in zip(facets, facet_values)] + [f"gmu {gmu:g}"]
        cells.append(Cell(", ".join(parts), rows))
    return cells


def _columns(n_cells: int, n_gmus: int) -> int:
    """Panels per row: the gmu values side by side, as many groups of them as fit."""
    per_row = n_gmus * max(1, MAX_COLUMNS // n_gmus) if n_gmus <= MAX_COLUMNS else MAX_COLUMNS
    return max(1, min(per_row, n_cells))


def _dodged(loads: pd.Series, k: int, n: int, span_octaves: float) -> np.ndarray:
    offset = DODGE * max(span_octaves, 1.0) * (k - (n - 1) / 2)
    return loads.to_numpy(dtype=float) * 2.0 ** offset


def _draw_cell(ax: plt.Axes, cell: Cell, load: str, loads: list[float], col: str, logy: bool,
               transform: Callable[[pd.Series], pd.Series], policies: list[str]) -> bool:
    """Lines of one metric in one panel; returns whether a point that did not run was marked."""
    ok = cell.rows[cell.rows["status"] == "ok"]
    span = math.log2(max(loads) / min(loads)) if len(loads) > 1 else 1.0
    marked = False
    if ok.empty:
        ax.text(0.5, 0.5, "\n".join(textwrap.wrap(why_not_run(cell.rows), 34)), transform=ax.transAxes,
                ha="center", va="center", fontsize=8, color="#444444",
                bbox={"boxstyle": "round", "facecolor": "#f2f2f2", "edgecolor": "#bbbbbb"})
        ax.set_yticks([])
    for k, policy in enumerate(policies):
        rows = cell.rows[cell.rows["policy"] == policy].sort_values(load)
        line = rows[rows["status"] == "ok"]
        if not line.empty:
            ax.plot(_dodged(line[load], k, len(policies), span), transform(line[col]), "-", marker=_marker(policy),
                    markersize=4, fillstyle="none", linewidth=1.2, color=_color(policy))
        missing = rows[rows["status"] != "ok"]
        if not ok.empty and not missing.empty:  # some loads ran, these did not: an x on the axis
            ax.plot(_dodged(missing[load], k, len(policies), span), np.full(len(missing), 0.03), NOT_RUN_MARKER,
                    color=_color(policy), transform=ax.get_xaxis_transform(), clip_on=False)
            marked = True
    ax.set_xscale("log", base=2)
    ax.set_xticks(loads, [f"{v:g}" for v in loads])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(loads) / 2 ** (0.08 * span + 0.1), max(loads) * 2 ** (0.08 * span + 0.1))
    if logy and not ok.empty:
        ax.set_yscale("log")
        _log_ticks(ax)
    ax.grid(alpha=0.3)
    ax.set_title(cell.label, fontsize=9)
    return marked


def _against_load(
    df: pd.DataFrame,
    manifest: dict[str, Any],
    fig_dir: Path,
    stem: str,
    title: str,
    metrics: list[tuple[str, str, bool, Callable[[pd.Series], pd.Series]]],  # column, y label, log y, transform
    reference: tuple[float, str] | None = None,  # a horizontal line (value, label), e.g. the full pool
    explain: str = "",  # how to read the figure, under it and in its note
) -> Section:
    load = manifest.get("load_axis")
    ok = df[df["status"] == "ok"]
    needed = [m[0] for m in metrics]
    if not load or ok.empty or any(c not in ok for c in needed):
        why = "the grid sweeps no load axis" if not load else "no ok points with those metrics"
        return Section(title, None, f"Not drawn: {why}.", [])
    facets = _facets(df, manifest)
    cells = _cells(df, facets)
    policies = policies_in(df)
    gmus = sorted(df["engine.gmu"].unique())
    loads = sorted(df[load].dropna().unique())
    ncols = _columns(len(cells), len(gmus))
    cell_rows = math.ceil(len(cells) / ncols)
    nm = len(metrics)
    fig, axes = plt.subplots(cell_rows * nm, ncols, figsize=(3.7 * ncols, 2.7 * nm * cell_rows + 1.0),
                             squeeze=False, layout="constrained")
    marked = False
    for idx, cell in enumerate(cells):
        r, c = divmod(idx, ncols)
        for i, (col, ylabel, logy, transform) in enumerate(metrics):
            ax = axes[r * nm + i][c]
            marked |= _draw_cell(ax, cell, load, loads, col, logy, transform, policies)
            if reference and not cell.rows[cell.rows["status"] == "ok"].empty:
                ax.axhline(reference[0], color="black", linewidth=0.8, linestyle="--")
                ax.text(0.02, reference[0], reference[1], transform=ax.get_yaxis_transform(), fontsize=7, va="bottom")
            ax.set_ylabel(ylabel, fontsize=8)
            ax.set_xlabel(LOAD_LABELS.get(load, load), fontsize=8)
    for idx in range(len(cells), cell_rows * ncols):  # the last row's unused panels
        r, c = divmod(idx, ncols)
        for i in range(nm):
            axes[r * nm + i][c].set_visible(False)
    handles = [Line2D([], [], color=_color(p), marker=_marker(p), fillstyle="none", label=p) for p in policies]
    if marked:
        handles.append(Line2D([], [], color="black", marker=NOT_RUN_MARKER, linestyle="none",
                              label="did not run at this load (see report.md)"))
    _header(fig, f"{manifest.get('workload', '')}: {title}", handles)
    spread = (f"Policies at the same load are drawn side by side, {DODGE:.0%}"
              " of the axis apart, so equal values stay visible.")
    fig.supxlabel("\n".join(textwrap.wrap(f"{explain} {spread}".strip(), 160)), fontsize=7)
    _save(fig, fig_dir, stem)
    index = ["model", *facets, "engine.gmu", load]
    tables = []
    for col, ylabel, _, transform in metrics:
        wide = ok.pivot_table(index=index, columns="policy", values=col, sort=False, dropna=False)
        tables.append((ylabel, transform(wide[policies_in(ok)]).reset_index()))
    note = (f"One panel per model and gmu{' (and ' + ', '.join(facets) + ')' if facets else ''}, one line per "
            f"policy (colour and marker). {explain + ' ' if explain else ''}{spread}")
    if marked:
        note += " An x on the load axis marks a point that did not run."
    if caption := _not_run_note(df):
        note += " " + caption
    return Section(title, stem, note, tables)


def _same(s: pd.Series) -> pd.Series:
    return s


def fig_kv_usage(df: pd.DataFrame, manifest: dict[str, Any], fig_dir: Path) -> Section:
    return _against_load(df, manifest, fig_dir, "fig2_peak_kv_usage", "Peak KV + state pool usage against load",
                         [("peak_kv_usage", "peak KV + state pool usage (%)", False, lambda s: 100 * s)],
                         reference=(100.0, "pool full"),
                         explain=f"A policy can plateau below 100% and still be memory-bound (requests waited): a waiting "
                                 "request is admitted only when blocks for its whole prompt and all its state blocks are "
                                 "free, so it waits while smaller gaps in the pool stay unused.")


def fig_latency_throughput(df: pd.DataFrame, manifest: dict[str, Any], fig_dir: Path) -> Section:
    return _against_load(df, manifest, fig_dir, "fig3_ttft_throughput", "p99 TTFT and output throughput against load",
                         [("ttft_p99_s", "p99 TTFT (s, lower is better)", True, _same),
                          ("output_throughput_tok_s", "output tok/s (higher is better)", False, _same)])


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
        bars = ax.bar(x, per_tree.fillna(0), width=width, color=_color(policy))
        if values_on_bars:
            ax.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.3g}" for v in per_tree], fontsize=6, padding=1)
        for xi, v in zip(x, per_tree):
            if math.isnan(v):  # the point did not run: say so where its bar would be
                ax.text(xi, 0, NOT_RUN_MARKER, ha="center", va="bottom", color=_color(policy), fontsize=9)
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
        label = ", ".join(_short_model(v) if k == "model" else f"{k.split('.')[-1]} {v:g}" for k, v in zip(groups, values))
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
    handles = [Patch(color=_color(p), label=p) for p in policies]
    _header(fig, f"{manifest.get('workload', '')}: {title}", handles)
    if caption := _not_run_note(df):
        fig.supxlabel("\n".join(textwrap.wrap(caption, 120)), fontsize=7)
    _save(fig, fig_dir, "fig4_trees")
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
        _ratio_ticks(ax)
    _save(fig, fig_dir, spec.STEM)
    return Section(spec.TITLE, spec.STEM, spec.note(table), [("per point", table)])


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
