"""Does speculative decoding pay at all? The sweep's `none` points against its speculating ones.

At each point (every config field but the policy) the best speculating policy's output
throughput is divided by the no-speculation baseline's; above 1x speculation pays there,
and the table names the policy that wins. Drawn only when the grid crosses policy `none`.
"""
from __future__ import annotations

from sim.figures.style import header, marker
import matplotlib.pyplot as plt  # noqa: E402  (after figure_style, which picks the file backend)
from matplotlib.lines import Line2D  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from core.config import RunConfig  # noqa: E402
from sim.runs.report import _flatten  # noqa: E402
from sim.runs.speculation import NO_SPECULATION  # noqa: E402

METRIC = "output_throughput_tok_s"
STEM = "fig5_speculation"
TITLE = "Does speculative decoding pay?"


def speculation_table(df: pd.DataFrame, load_axis: str | None) -> pd.DataFrame:
    """One row per point where `none` and at least one speculating policy ran."""
    ok = df[df["status"] == "ok"]
    if NO_SPECULATION not in set(ok["policy"]) or METRIC not in ok:
        return pd.DataFrame()
    # The same point: every config field but the policy and its tree (none pairs with every tree).
    fields = set(_flatten(RunConfig().model_dump(mode="json")))
    point = [c for c in ok.columns if (c in fields or c.startswith(("model_overrides.", "workload_overrides.")))
             and c not in ("policy", "num_speculative_tokens")]
    sig = ok[point].astype(str).apply(tuple, axis=1)
    rows = []
    for _, group in ok.groupby(sig, sort=False):
        base = group[group["policy"] == NO_SPECULATION]
        spec = group[group["policy"] != NO_SPECULATION]
        if base.empty or spec.empty:
            continue
        best = spec.loc[spec[METRIC].idxmax()]
        b = base.iloc[0]
        row = {"model": b["model"], "gmu": b.get("engine.gmu")}
        if load_axis and load_axis in b:
            row["load"] = b[load_axis]
        row.update({"none tok/s": b[METRIC], "best policy": best["policy"], "its tok/s": best[METRIC],
                    "speedup": best[METRIC] / b[METRIC] if b[METRIC] else np.nan,
                    "none p99 TTFT (s)": b.get("ttft_p99_s"), "its p99 TTFT (s)": best.get("ttft_p99_s")})
        rows.append(row)
    return pd.DataFrame(rows)


def verdict_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per model and gmu: at how many loads speculation pays, where, and which policy wins there."""
    rows = []
    for (model, gmu), g in table.groupby(["model", "gmu"], sort=False, dropna=False):
        pays = g[g["speedup"] > 1]
        where = ", ".join(f"{v:g}" for v in pays["load"]) if "load" in g and len(pays) else "-"
        winners = pays["best policy"].value_counts()
        rows.append({"model": model, "gmu": gmu, "points": len(g),
                     "speculation pays at": f"{len(pays)} of {len(g)}", "loads where it pays": where,
                     "winner where it pays": ", ".join(f"{p} ({n})" for p, n in winners.items()) or "-",
                     "best speedup": g["speedup"].max(), "worst speedup": g["speedup"].min()})
    return pd.DataFrame(rows)


def draw_speculation(table: pd.DataFrame, load_label: str | None) -> tuple[plt.Figure, list[plt.Axes]]:
    """One panel per model: the speedup against load, one line per gmu; each point's marker is its
    winning policy's (text labels at close points covered one another)."""
    models = list(dict.fromkeys(table["model"]))
    winners = list(dict.fromkeys(table["best policy"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 3.6), squeeze=False, layout="constrained")
    x = "load" if "load" in table else None
    gmus = sorted(table["gmu"].unique())
    lines = dict(zip(gmus, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, model in zip(axes[0], models):
        rows = table[table["model"] == model]
        for gmu, g in rows.groupby("gmu", sort=True):
            xs = g[x] if x else np.arange(len(g))
            ax.plot(xs, g["speedup"], color=lines[gmu], lw=1.2, zorder=2)
            for policy in winners:
                won = (g["best policy"] == policy).to_numpy()
                ax.scatter(np.asarray(xs)[won], g["speedup"][won], marker=marker(policy), s=36, color=lines[gmu],
                           edgecolor="black", linewidth=0.5, zorder=3)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        if x:
            ax.set_xscale("log")
            ax.set_xlabel(load_label or "load")
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, 0.9), max(hi, 1.1) * 1.08)  # parity and the labels stay inside
        ax.set_ylabel("best speculating policy / none\n(output tok/s, >1x: speculation pays)")
        ax.set_title(model, fontsize=9)
    handles = [Line2D([], [], color=lines[g], lw=1.2, label=f"gmu {g:g}") for g in gmus]
    handles += [Line2D([], [], color="grey", marker=marker(p), markeredgecolor="black", linestyle="none",
                       label=f"{p} wins") for p in winners]
    header(fig, TITLE, handles)
    return fig, list(axes[0])


def note(table: pd.DataFrame) -> str:
    pays = int((table["speedup"] > 1).sum())
    lines = [f"- {row['model']}, gmu {row['gmu']:g}: speculation pays at {row['speculation pays at']} loads"
             + (f" ({row['loads where it pays']}); the winner there: {row['winner where it pays']}"
                if row["loads where it pays"] != "-" else "") + "."
             for _, row in verdict_table(table).iterrows()]
    return (f"Output throughput of the best speculating policy at each point divided by the no-speculation "
            f"baseline's (policy `{NO_SPECULATION}`, vLLM without a speculative config); the dashed line is parity. "
            f"Speculation pays at {pays} of {len(table)} points:\n\n" + "\n".join(lines))


NOT_DRAWN = (f"Not drawn: the grid has no policy `{NO_SPECULATION}` (no speculative decoding) point beside a "
             "speculating one; add `none` to its policy axis.")
