"""plan.png / plan.pdf: for each policy's best configuration, each SLO metric against the
request rate, with the SLO's bound and the configuration's capacity marked."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: E402

from sim.figures import style  # noqa: E402
from sim.plan.run import CandidateResult, PlanSettings, policy_best  # noqa: E402
from sim.plan.slo import format_seconds  # noqa: E402


# Above capacity a metric grows with the run's length, so its value says only "broken": values
# over CLIP x the bound are drawn at that height, the axis's top.
CLIP = 4.0


def draw(results: list[CandidateResult], settings: PlanSettings, out: Path, title: str) -> None:
    slos = settings.slos
    fig, axes = plt.subplots(1, len(slos), figsize=(5.2 * len(slos), 4.2), squeeze=False)
    shown = [r for r in policy_best(results) if r.verdicts]
    for ax, slo in zip(axes[0], slos):
        for r in shown:
            top = CLIP * slo.bound_s
            points = [(v.rate, min(value, top), v.met) for v in r.verdicts if (value := slo.value(v.summary)) is not None]
            if not points:
                continue
            color, marker = style.color(r.candidate.policy), style.marker(r.candidate.policy)
            rates, values, met = zip(*points)
            ax.plot(rates, values, color=color, linewidth=1.2, zorder=2)
            ax.scatter(rates, values, color=[color if m else "white" for m in met], edgecolor=color,
                       marker=marker, s=30, zorder=3)
            if r.capacity > 0:
                ax.axvline(r.capacity, color=color, linestyle=":", linewidth=1.2)
        ax.axhline(slo.bound_s, color="black", linestyle="--", linewidth=1.0)
        ax.text(0.01, slo.bound_s, f" SLO {slo}", transform=ax.get_yaxis_transform(), va="bottom", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylim(top=CLIP * slo.bound_s * 1.15)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # labels within one decade too
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_seconds(v)))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_xlabel("request rate per replica (req/s)")
        ax.set_ylabel(slo.name)
        ax.grid(True, which="major", alpha=0.3)
    handles = [plt.Line2D([], [], color=style.color(r.candidate.policy), marker=style.marker(r.candidate.policy),
                          label=f"{r.candidate.label}: {r.capacity:.3g} req/s") for r in shown]
    handles += [plt.Line2D([], [], color="grey", linestyle=":", label="capacity (dotted)"),
                plt.Line2D([], [], color="grey", marker="o", markerfacecolor="white", linestyle="",
                           label="probe that fails: an SLO broken, or still growing at the longest run (hollow)"),
                plt.Line2D([], [], linestyle="", label=f"values above {CLIP:g} x the bound are drawn at {CLIP:g} x it")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=1, fontsize=8, frameon=False)
    fig.suptitle(f"Capacity under SLOs: {title}", fontsize=11)
    fig.tight_layout()
    style.save_figure(fig, out, "plan")
