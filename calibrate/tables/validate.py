"""`specsim calibrate validate`: held-out interpolation error and the whole-step error.

Held-out: for every table and mode, 20% of the values of its first axis (interior
values only, so every held-out point lies inside the training grid), chosen with a
seeded generator, are removed with all their rows; the interpolator is rebuilt on
the rest and predicts them. Reported: median and p90 absolute percentage error.

Whole step: each row of step_check.csv (a real stacked step on the GPU) against the
latency model's sum of parts for the same StepBatch, without the terms a one-GPU
step cannot contain (all-reduce, host overhead). The GDN recurrence is priced by the
kernel time measured in the same run (kernel_us), so the check isolates the
composition; `sim_err_pct` also gives the error with the simulator's own kernels.csv terms.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from core.config import EngineConfig, HardwareConfig, ModelConfig, load_policy
from core.interp import from_rows
from core.tables import STEP_COLUMNS, TABLES, read_rows

MODES = ("graph", "eager")


def _ape_summary(xs: list[float]) -> dict:
    return {"points": len(xs), "median_ape_pct": round(statistics.median(xs), 2), "p90_ape_pct": round(_pct(xs, 90), 2)}


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def holdout(rows: list[dict], name: str, frac: float, rng: np.random.Generator) -> list[dict]:
    spec = TABLES[name]
    out = []
    for mode in MODES:
        sel = [r for r in rows if r["mode"] == mode]
        first = sorted({float(r[spec.axes[0]]) for r in sel})
        interior = first[1:-1]
        k = min(len(interior), max(1, round(frac * len(first))))
        if not interior:
            continue
        held = set(rng.choice(interior, size=k, replace=False).tolist())
        train = [r for r in sel if float(r[spec.axes[0]]) not in held]
        fit = from_rows(f"{name}[{mode}]", train, spec.axes, spec.scales, fill_low=spec.fill_low)
        for r in sel:
            if float(r[spec.axes[0]]) in held:
                pred = fit(*(float(r[a]) for a in spec.axes))
                out.append({"table": name, "mode": mode, **{a: r[a] for a in spec.axes}, "us": r["us"],
                            "pred_us": pred, "ape_pct": 100 * abs(pred - r["us"]) / r["us"]})
    return out


def step_errors(mdir: Path, model: ModelConfig, hw: HardwareConfig) -> list[dict]:
    from policies import make_policy
    from sim.pricing.analytic import AnalyticLatencyModel
    from sim.pricing.calibrated import CalibratedLatencyModel
    from sim.pricing.latency import StepBatch

    path = mdir / "step_check.csv"
    if not path.exists():
        return []
    out = []
    # The stacked check times each op of an eager step with its own launch: the eager-sum pricing's
    # composition. The step executor's replay checks the pipeline pricing (calibrate/replay/run.py).
    # A check of graph steps alone (tables measured with `--modes graph`, no eager rows to read)
    # prices them with the pipeline, whose graph-step terms are the same sums of graph rows.
    rows = read_rows(path, STEP_COLUMNS)
    eager = any(r["mode"] == "eager" for r in rows)
    engine = EngineConfig(latency_pricing="eager_sum") if eager else EngineConfig()
    for r in rows:
        b, p, ctx = int(r["B"]), int(r["P"]), int(r["ctx"])
        cfg = load_policy("store_all", {"draft_tree_widths": [1] * max(1, p - 1)})
        policy = make_policy(model, cfg)
        # The check runs eager steps fully eagerly (no piecewise graphs): price them so.
        lm = CalibratedLatencyModel.load(model, hw, policy, engine, AnalyticLatencyModel(model, hw, policy, engine),
                                         piecewise=False)
        batch = StepBatch(num_seqs=b, prefill_tokens=0, prefill_seqs=0, decode_seqs=b, spec_seqs=b,
                          verify_positions=p, context_tokens=b * ctx, max_context=ctx, eager=r["mode"] == "eager",
                          draft_depth=model.mtp_depth)
        terms = lm.step_time(batch).terms
        parts = sum(v for t, v in terms.items() if t not in ("overhead", "allreduce", "gdn_verify", "gdn_commit"))
        kernel = model.gdn_layers * float(r["kernel_us"]) * 1e-6 if r["kernel"] != "none" else 0.0
        pred = (parts + kernel) * 1e6
        row = {"mode": r["mode"], "B": b, "P": p, "ctx": ctx, "kernel": r["kernel"], "step_us": r["step_us"],
               "pred_us": round(pred, 1), "err_pct": round(100 * (pred - r["step_us"]) / r["step_us"], 2)}
        if r["kernel"] != "none" and lm.sources.by_term["gdn_verify"] != "analytic":
            sim = (parts + terms["gdn_verify"] + terms["gdn_commit"]) * 1e6
            row["sim_err_pct"] = round(100 * (sim - r["step_us"]) / r["step_us"], 2)
        out.append(row)
    return out


def validate_model(mdir: Path, model: ModelConfig, hw: HardwareConfig, frac: float = 0.2, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    points = []
    for name, spec in TABLES.items():
        path = mdir / f"{name}.csv"
        if path.exists():
            points += holdout(read_rows(path), name, frac, rng)
    apes = [p["ape_pct"] for p in points]
    per_table = {}
    for name in TABLES:
        xs = [p["ape_pct"] for p in points if p["table"] == name]
        if xs:
            per_table[name] = _ape_summary(xs)
    per_mode = {}
    for mode in MODES:
        xs = [p["ape_pct"] for p in points if p["mode"] == mode]
        if xs:
            per_mode[mode] = _ape_summary(xs)
    steps = step_errors(mdir, model, hw)
    errs = [abs(s["err_pct"]) for s in steps]
    return {
        "model": model.name, "holdout_fraction": frac, "seed": seed, "points": len(apes),
        "median_ape_pct": round(statistics.median(apes), 2) if apes else None,
        "p90_ape_pct": round(_pct(apes, 90), 2) if apes else None,
        "per_mode": per_mode,
        "per_table": per_table,
        "step_check": steps,
        "step_median_abs_err_pct": round(statistics.median(errs), 2) if errs else None,
        "step_max_abs_err_pct": round(max(errs), 2) if errs else None,
    }
