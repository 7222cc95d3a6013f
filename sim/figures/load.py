"""Figures 2 and 3 of a sweep: metrics against the load axis, one panel per model, gmu
and any other swept field, one line per policy (drawn side by side where they coincide)."""
from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.figures.style import (NOT_RUN_MARKER, color, footnote, header, linestyle, log_ticks, marker, save_figure,
                              short_model, why_not_run)
import matplotlib.pyplot as plt  # noqa: E402  (after figure_style, which picks the file backend)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sim.runs.report import Section, policies_in  # noqa: E402
from sim.runs.speculation import NO_SPECULATION  # noqa: E402

TREE_AXIS = "policy_overrides.draft_tree_widths"
LOAD_LABELS = {
    "client.max_concurrency": "maximum concurrency (requests)",
    "client.request_rate": "request rate (requests/s)",
}
# Policies at the same load are drawn this share of the load axis's width apart, so values
# that coincide show as markers side by side instead of one hiding the others.
DODGE = 0.022
MAX_COLUMNS = 4


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
        parts = [short_model(model)] + [f"{'tree (' + str(v) + ')' if k == 'tree' else f'{k} {v}'}"
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
            ax.plot(_dodged(line[load], k, len(policies), span), transform(line[col]), linestyle(policy), marker=marker(policy),
                    markersize=4, fillstyle="none", linewidth=1.2, color=color(policy))
        missing = rows[rows["status"] != "ok"]
        if not ok.empty and not missing.empty:  # some loads ran, these did not: an x on the axis
            ax.plot(_dodged(missing[load], k, len(policies), span), np.full(len(missing), 0.03), NOT_RUN_MARKER,
                    color=color(policy), transform=ax.get_xaxis_transform(), clip_on=False)
            marked = True
    ax.set_xscale("log", base=2)
    ax.set_xticks(loads, [f"{v:g}" for v in loads])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(loads) / 2 ** (0.08 * span + 0.1), max(loads) * 2 ** (0.08 * span + 0.1))
    if logy and not ok.empty:
        ax.set_yscale("log")
        log_ticks(ax)
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
    handles = [Line2D([], [], color=color(p), marker=marker(p), linestyle=linestyle(p), fillstyle="none",
                      label=f"{p} (no speculation)" if p == NO_SPECULATION else p) for p in policies]
    if marked:
        handles.append(Line2D([], [], color="black", marker=NOT_RUN_MARKER, linestyle="none",
                              label="did not run at this load (see report.md)"))
    header(fig, f"{manifest.get('workload', '')}: {title}", handles)
    spread = (f"Policies at the same load are drawn side by side, {DODGE:.0%}"
              " of the axis apart, so equal values stay visible.")
    caption = footnote(fig, df, f"{explain} {spread}".strip())
    save_figure(fig, fig_dir, stem)
    index = ["model", *facets, "engine.gmu", load]
    tables = []
    for col, ylabel, _, transform in metrics:
        wide = ok.pivot_table(index=index, columns="policy", values=col, sort=False, dropna=False)
        tables.append((ylabel, transform(wide[policies_in(ok)]).reset_index()))
    note = (f"One panel per model and gmu{' (and ' + ', '.join(facets) + ')' if facets else ''}, one line per "
            f"policy (colour and marker; the no-speculation baseline `{NO_SPECULATION}` dashed where the grid has it). {explain + ' ' if explain else ''}{spread}")
    if marked:
        note += " An x on the load axis marks a point that did not run."
    note += " " + caption if caption else ""
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
