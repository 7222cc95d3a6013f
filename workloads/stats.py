"""Summary statistics of a workload: length percentiles, arrival rate, a histogram."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from workloads.base import Workload

PERCENTILES = (50, 90, 99)


def _lengths(values: np.ndarray) -> dict[str, float]:
    # linear interpolation, as vLLM's benchmark reports percentiles
    out = {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}
    return {"mean": float(values.mean()), **out, "max": float(values.max()), "min": float(values.min())}


def workload_stats(w: Workload) -> dict[str, Any]:
    prompt = np.array([r.prompt_tokens for r in w.requests])
    output = np.array([r.output_tokens for r in w.requests])
    stats: dict[str, Any] = {
        "workload": w.name,
        "source": w.source,
        "count": len(w.requests),
        "prompt_tokens": _lengths(prompt),
        "output_tokens": _lengths(output),
        "default_arrival": w.arrival,
    }
    times = [r.arrival_s for r in w.requests]
    if all(t is not None for t in times) and len(times) > 1 and times[-1] > times[0]:
        gaps = np.diff(np.asarray(times, dtype=float))
        stats["trace_duration_s"] = float(times[-1] - times[0])
        stats["arrival_rate_per_s"] = float(len(gaps) / (times[-1] - times[0]))
        stats["gap_cv"] = float(gaps.std() / gaps.mean())  # 1 for a Poisson process
    else:
        stats["arrival_rate_per_s"] = None  # set by the client: --request-rate or a concurrency limit
    categories = Counter(r.category for r in w.requests if r.category)
    if categories:
        stats["categories"] = dict(sorted(categories.items()))
    if w.acceptance:
        stats["acceptance_categories"] = sorted(w.acceptance)
    return stats


def format_stats(s: dict[str, Any]) -> str:
    lines = [f"workload  {s['workload']}", f"source    {s['source']}", f"requests  {s['count']:,}", ""]
    lines.append(f"{'tokens':<8}" + "".join(f"{k:>10}" for k in ("mean", "p50", "p90", "p99", "max")))
    for kind in ("prompt", "output"):
        d = s[f"{kind}_tokens"]
        lines.append(f"{kind:<8}" + "".join(f"{d[k]:>10,.1f}" for k in ("mean", "p50", "p90", "p99", "max")))
    lines.append("")
    if s["arrival_rate_per_s"] is None:
        lines.append(f"arrivals  {s['default_arrival']} by default; the rate is the client's "
                     "(request rate or maximum concurrency)")
    else:
        lines.append(f"arrivals  trace: {s['arrival_rate_per_s']:.3f} requests/s over {s['trace_duration_s']:,.1f} s "
                     f"(gap CV {s['gap_cv']:.2f}; 1 = Poisson)")
    if "categories" in s:
        lines.append("categories  " + ", ".join(f"{c} {n}" for c, n in s["categories"].items()))
    if "acceptance_categories" in s:
        lines.append("acceptance  " + ", ".join(repr(c) for c in s["acceptance_categories"]))
    return "\n".join(lines)


def save_histogram(w: Workload, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    prompt = np.array([r.prompt_tokens for r in w.requests])
    output = np.array([r.output_tokens for r in w.requests])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, values, label in ((axes[0], prompt, "prompt"), (axes[1], output, "output")):
        lo, hi = max(values.min(), 1), max(values.max(), 2)
        bins = np.geomspace(lo, hi, 40) if hi / lo > 20 else 40  # long tails read better on log bins
        ax.hist(values, bins=bins, color="tab:blue" if label == "prompt" else "tab:orange")
        if not isinstance(bins, int):
            ax.set_xscale("log")
        ax.axvline(np.median(values), color="k", lw=1, ls="--", label=f"median {np.median(values):.0f}")
        ax.set_xlabel(f"{label} tokens")
        ax.set_ylabel("requests")
        ax.legend()
    fig.suptitle(f"{w.name}: {len(w.requests):,} requests")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
