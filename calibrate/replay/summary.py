"""The replay's summary: each replayed step's prediction against its measurement, per step kind.

Pure Python over replay_steps.csv rows (calibrate/replay/outputs.py writes them): errors per kind,
the fastest of several passes, the repeatability of steps measured twice, and the host-speed
views: steps measured at nominal host speed apart from the device's slower regimes
(`host_speed`), and every host-bound step scored at its own measured host speed
(`calibrate.replay.host_speed`) when the host tables' probe is known.
"""
from __future__ import annotations

import math
import statistics
from typing import Sequence

from calibrate.replay import host_speed as HS

SUMMARY_KINDS = ("uniform_decode", "mixed_graph", "mixed_eager", "prefill_only", "all")
# The summary compares every step against the time the simulator priced it as: the async
# scheduling period where the run used it (vLLM's default with MTP), else the synchronous time.
MEASURED = "measured_us"
MEASURED_NOTE = {
    "measured_us": "the step as the run was simulated: async-scheduling steady state (period between consecutive "
                   "steps' tokens on the host, the next step prepared and launched meanwhile) for runs with "
                   "engine.async_scheduling, else the synchronous time",
    "measured_sync_us": "synchronous step: host prep to sampled tokens on the host, median of --reps after warm-up",
    "measured_async_us": "async-scheduling steady state: period between consecutive steps' tokens on the host",
}
# The simulator prices an uncontended host: the replay's fastest regime. A row is nominal when the
# host probe before it (calibrate.tables.host.HostProbe) is within NOMINAL_TOLERANCE of the replay's
# PROBE_REF_QUANTILE of probes; host-bound steps measured in a slower regime say nothing of the model.
NOMINAL_TOLERANCE = 0.10
PROBE_REF_QUANTILE = 0.1


def errors(rows: Sequence[dict], pred: str = "predicted_us", measured: str | None = None) -> dict:
    """n, median and p90 absolute percentage error, and bias (mean signed % error) of `pred` vs
    `measured` (default MEASURED: the step as the run was simulated)."""
    m = measured or MEASURED
    rel = [(r[pred] - r[m]) / r[m] for r in rows if _num(r.get(pred)) and _num(r.get(m)) and r[m] > 0]
    if not rel:
        return {"n": 0, "median_ape": None, "p90_ape": None, "bias": None}
    ape = [abs(x) for x in rel]
    p90 = _quantile(ape, 0.9)
    return {"n": len(rel), "median_ape": round(100 * statistics.median(ape), 3), "p90_ape": round(100 * p90, 3),
            "bias": round(100 * statistics.fmean(rel), 3)}


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not math.isnan(v)


def per_kind(rows: Sequence[dict], measured: str, pred: str = "predicted_us") -> dict:
    """errors() of `pred` for each of SUMMARY_KINDS ("all": every row)."""
    return {k: errors([r for r in rows if k == "all" or r["kind"] == k], pred, measured) for k in SUMMARY_KINDS}


def fastest_passes(rows: Sequence[dict], measured: str | None = None) -> list[dict]:
    """One row per step (run, step): the fastest of its passes by `measured` (a step measured once
    is its own row), with `passes` (how many) and `pass_spread_pct` ((slowest - fastest) / fastest,
    in %). The host tables keep each point's lowest pass, so a host-bound step is held against the
    model at the same, fastest, host speed; rows without a step number stay apart."""
    m = measured or MEASURED
    by: dict[object, list[dict]] = {}
    for r in rows:
        key = (r["run"], int(r["step"])) if _num(r.get("step")) else id(r)
        by.setdefault(key, []).append(r)
    out = []
    for same in by.values():
        timed = [r for r in same if _num(r.get(m))]
        if len(timed) < 2:
            out += same
            continue
        lo, hi = min(r[m] for r in timed), max(r[m] for r in timed)
        best = min(timed, key=lambda r: r[m])
        out.append({**best, "passes": len(timed), "pass_spread_pct": 100 * (hi - lo) / lo if lo > 0 else math.nan})
    return out


def pass_spread(rows: Sequence[dict]) -> dict:
    """Per kind, over the steps measured in more than one pass (rows of `fastest_passes`): how many,
    and the median and p90 of their spread between passes in percent (the noise one pass has)."""
    out = {}
    for kind in SUMMARY_KINDS[:-1]:
        d = [r["pass_spread_pct"] for r in rows if r["kind"] == kind and r.get("passes", 1) > 1
             and _num(r.get("pass_spread_pct"))]
        if d:
            out[kind] = {"steps": len(d), "median_pct": round(statistics.median(d), 3),
                         "p90_pct": round(_quantile(d, 0.9), 3)}
    return out


def summarize(rows: Sequence[dict], measured: str | None = None, tables_probe_us: float | None = None) -> dict:
    """replay_summary.json: errors per step kind (in %), sums, the same for the old pricing, per run,
    all against the `measured` column (default MEASURED), which the JSON names; a step measured in
    several passes counts once, at its fastest (`fastest_passes`). With the host tables' probe,
    `at_host_speed` scores every pass of every step at its own host speed (calibrate.replay.host_speed)."""
    m = measured or MEASURED
    every_pass = rows
    rows = fastest_passes(rows, m)
    note = MEASURED_NOTE.get(m, "")
    if any(r.get("passes", 1) > 1 for r in rows):
        note += "; a step measured in several passes: its fastest"
    out: dict = {"compared_against": m, "compared_against_note": note}
    out.update(per_kind(rows, m))
    sums = _sum_error(rows, m)
    out["sum_measured_s"], out["sum_predicted_s"] = sums["sum_measured_s"], sums["sum_predicted_s"]
    out["old_eager_sum"] = per_kind(rows, m, "old_predicted_us")
    out["old_eager_sum"]["sum_predicted_s"] = _sum_error(rows, m, "old_predicted_us")["sum_predicted_s"]
    out["runs"] = {}
    for run in sorted({r["run"] for r in rows}):
        rr = [r for r in rows if r["run"] == run]
        out["runs"][run] = {**_sum_error(rr, m),
                            "kinds": {k: sum(1 for r in rr if r["kind"] == k) for k in SUMMARY_KINDS[:-1]}}
    # Per policy (run names `<policy>-g<gmu>-c<conc>`, as `make replay-steps` writes them): a policy
    # whose host work the model lacks shows here, not only in the pooled kinds.
    policy_of = {run: str(run).split("-")[0] for run in out["runs"]}
    out["policies"] = {p: per_kind([r for r in rows if policy_of[r["run"]] == p], m)
                       for p in sorted(set(policy_of.values()))}
    out["repeatability"] = repeatability(rows, m)
    out["pass_spread"] = pass_spread(rows)
    out["host_speed"] = host_speed(rows, m)
    if tables_probe_us is not None:
        scaled = HS.with_host_speed(every_pass, tables_probe_us)  # each pass at its own host speed
        out["at_host_speed"] = {"tables_probe_us": tables_probe_us, "kinds_scaled": list(HS.HOST_BOUND_KINDS),
                                "rule": f"{HS.HOST_TERM} x (step's host probe / tables' probe); GPU terms unscaled",
                                **per_kind(scaled, m, HS.COLUMN)}
    out["units"] = ("median_ape, p90_ape, bias and sum_error_pct in percent; "
                    f"bias = mean of (predicted - {m}) / {m}")
    return out


def repeatability(rows: Sequence[dict], measured: str | None = None) -> dict:
    """The same step measured twice: runs `<policy>-g<gmu>-c<conc>` that differ only in gmu replay
    identical traces where memory never binds (c1, c32), so a step of both, with the same token
    count, was measured at two times of the replay. Per kind: pairs, median and p90 of
    |a - b| / mean(a, b) in percent (the noise floor no model can beat)."""
    m = measured or MEASURED
    at: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        parts = str(r["run"]).split("-")
        if len(parts) == 3 and parts[1].startswith("g") and _num(r.get(m)) and "step" in r:
            at.setdefault((parts[0], parts[2], int(r["step"]), r.get("tokens")), {})[parts[1]] = r
    diffs: dict[str, list[float]] = {}
    for by_gmu in at.values():
        same = [by_gmu[g] for g in sorted(by_gmu)]
        for r, o in zip(same, same[1:]):
            a, b = r[m], o[m]
            diffs.setdefault(r["kind"], []).append(100 * abs(a - b) / ((a + b) / 2))
    out = {}
    for kind, d in sorted(diffs.items()):
        out[kind] = {"pairs": len(d), "median_pct": round(statistics.median(d), 3),
                     "p90_pct": round(_quantile(d, 0.9), 3)}
    return out


def _quantile(xs: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile (no interpolation: a value that was measured)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def probe_ref(rows: Sequence[dict]) -> float | None:
    """The fastest host regime's probe (us per launch): PROBE_REF_QUANTILE of the rows' host probes."""
    probes = [r["host_probe_us"] for r in rows if _num(r.get("host_probe_us"))]
    return _quantile(probes, PROBE_REF_QUANTILE) if probes else None


def nominal_rows(rows: Sequence[dict]) -> list[dict]:
    """The rows measured at nominal host speed (probe within NOMINAL_TOLERANCE of probe_ref);
    every row when none was probed (replays before the probe)."""
    ref = probe_ref(rows)
    if ref is None:
        return list(rows)
    return [r for r in rows if _num(r.get("host_probe_us")) and r["host_probe_us"] <= ref * (1 + NOMINAL_TOLERANCE)]


def host_speed(rows: Sequence[dict], measured: str | None = None) -> dict:
    """The host probe's spread over the replay and the errors per kind at nominal host speed (and
    apart, in the slower regimes), with the repeatability of steps measured twice at nominal speed."""
    m = measured or MEASURED
    probed = [r for r in rows if _num(r.get("host_probe_us"))]
    if not probed:
        return {"rows_probed": 0}
    ref = probe_ref(probed)
    nominal = nominal_rows(probed)
    keep = {id(r) for r in nominal}
    slow = [r for r in probed if id(r) not in keep]
    probes = [r["host_probe_us"] for r in probed]
    return {"rows_probed": len(probed), "ref_us": ref, "tolerance": NOMINAL_TOLERANCE,
            "probe_p50_us": _quantile(probes, 0.5), "probe_p90_us": _quantile(probes, 0.9),
            "probe_max_us": max(probes), "nominal_rows": len(nominal),
            "nominal": per_kind(nominal, m), "slower": per_kind(slow, m), "nominal_sum": _sum_error(nominal, m),
            "nominal_repeatability": repeatability(nominal, m),
            "nominal_runs": {run: _sum_error([r for r in nominal if r["run"] == run], m)
                             for run in sorted({r["run"] for r in nominal})}}


def _sum_error(rows: Sequence[dict], m: str, pred: str = "predicted_us") -> dict:
    ms = sum(r[m] for r in rows if _num(r.get(m)))
    p = sum(r[pred] for r in rows if _num(r.get(pred)))
    return {"n": len(rows), "sum_measured_s": round(ms * 1e-6, 6), "sum_predicted_s": round(p * 1e-6, 6),
            "sum_error_pct": round(100 * (p - ms) / ms, 3) if ms else None}
