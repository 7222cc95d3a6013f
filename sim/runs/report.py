"""A sweep's table (points.csv) and its report.md.

points.csv has one row per point: the resolved config (dotted columns), the draft
tree and its state blocks, every summary metric, `memory_bound` and the ratios
against the `store_all` baseline at the same point. docs/design.md#the-study-grid: a point is
memory-bound when the baseline exhausts the pool there (peak KV usage reaches 100%,
requests wait for memory or are preempted); every ratio is reported separately for
memory-bound and slack points.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.config import ConfigError, GiB, RunConfig, load_model, load_policy
from core.files import atomic_write_text, read_text
from policies import make_policy

BASELINE = "store_all"
# Ratio metric -> (label, which way is better). The ratio is policy / baseline.
RATIO_METRICS: dict[str, tuple[str, str]] = {
    "output_throughput_tok_s": ("throughput", "higher"),
    "ttft_p99_s": ("p99 TTFT", "lower"),
    "e2e_mean_s": ("mean E2E latency", "lower"),
    "tpot_mean_s": ("mean TPOT", "lower"),
}
FULL_POOL = 0.999  # peak KV usage at or above this is an exhausted pool
POLICY_ORDER = ("store_all", "reconstruct", "replay")
# What each kind of points.csv column holds (printed at the end of report.md).
COLUMNS: dict[str, str] = {
    "key": "hash of the resolved config, the code version and the workload's requests; the point is stored "
           "as points/<key>.json",
    "status": "ok; infeasible (the configuration cannot run, e.g. the weights do not fit the budget); "
              "failed (the simulator raised)",
    "<config path>": "the resolved RunConfig, one column per field, dotted (engine.gmu, client.max_concurrency, "
                     "policy_overrides.draft_tree_widths, ...)",
    "tree": "the policy's draft tree as widths per depth",
    "state_blocks_per_group": "GDN state blocks a request holds in each GDN group (1 + the policy's speculative blocks; in mamba cache mode align 1 more for a step after each block boundary it crosses)",
    "<summary key>": "every key of the simulator's summary (summary.json of `specsim run`); nested ones dotted "
                     "(latency_terms.gdn, mean_step_time_by_term_s.moe)",
    "peak_kv_gib": "peak_kv_usage x pool_bytes: the most KV/state pool memory in use at once, GiB per GPU",
    "memory_bound": f"true where `{BASELINE}` at the same point (all config fields but the policy) exhausted "
                    f"the pool: peak_kv_usage >= {FULL_POOL}, waited_for_memory > 0 or preemptions > 0; "
                    "empty where that baseline did not run",
    "ratio_<metric>": f"<metric> / the `{BASELINE}` baseline's at the same point, for "
                      + ", ".join(RATIO_METRICS),
    "error": "why an infeasible or failed point did not run",
}


def ratio_column(metric: str) -> str:
    return f"ratio_{metric}"


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        elif isinstance(v, (list, tuple)):
            out[prefix + k] = json.dumps(v)
        else:
            out[prefix + k] = v
    return out


def _policy_facts(config: dict[str, Any], cache: dict[str, tuple[str, int]]) -> tuple[str, int]:
    """(tree as 'w1,w2,..', state blocks per GDN group) of a point's policy."""
    sig = json.dumps([config["model"], config["policy"], config.get("policy_overrides", {})], sort_keys=True)
    if sig not in cache:
        policy_cfg = load_policy(config["policy"], config.get("policy_overrides"))
        policy = make_policy(load_model(config["model"]), policy_cfg)
        cache[sig] = (str(policy.tree), policy.state_blocks_per_group())  # the tree `none` ignores is empty
    return cache[sig]


def build_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per point record (as `sim.runs.sweep` stores them), with baseline columns."""
    rows, cache, sigs = [], {}, []
    for rec in records:
        # "The same point" as the baseline = every config field but the policy (and the tree, which
        # a point that does not speculate has none of: sim.runs.grid).
        sigs.append(_point_sig(rec["config"]))
        # Fresh records keep insertion order, stored ones come back with sorted keys: put both
        # in RunConfig's field order (and summaries sorted) so points.csv does not depend on
        # which points were cached.
        config = _flatten(RunConfig.model_validate(rec["config"]).model_dump(mode="json"))
        tree, blocks = _policy_facts(rec["config"], cache)
        row = {"key": rec["key"], "status": rec["status"], **config, "tree": tree, "state_blocks_per_group": blocks}
        # The summary echoes some config fields (model, gmu, max_concurrency, ...): keep the config's.
        echoes = set(row) | {c.rsplit(".", 1)[-1] for c in config}
        summary = _flatten(rec.get("summary") or {})
        row.update({k: summary[k] for k in sorted(summary) if k not in echoes})
        row["error"] = rec.get("error") or ""
        rows.append(row)
    df = pd.DataFrame(rows)
    if "peak_kv_usage" in df and "pool_bytes" in df:
        df["peak_kv_gib"] = df["peak_kv_usage"] * df["pool_bytes"] / GiB
    return _with_baseline(df, pd.Series(sigs, index=df.index, dtype=object))


def _point_sig(config: dict[str, Any]) -> str:
    """A point's config without its policy, with its tree apart: `[rest, tree or None]`."""
    rest = {k: v for k, v in config.items() if k != "policy"}
    overrides = dict(rest.get("policy_overrides") or {})
    tree = overrides.pop("draft_tree_widths", None)
    rest["policy_overrides"] = overrides
    return json.dumps([rest, tree], sort_keys=True)


def _baseline_sigs(sig: pd.Series, base: pd.Series) -> pd.Series:
    """Each point's baseline signature: its own; for a point without a tree, the one baseline
    that differs from it in its tree alone (none where several do)."""
    loose = sig.map(lambda s: json.dumps(json.loads(s)[0], sort_keys=True))
    treeless = sig.map(lambda s: json.loads(s)[1] is None)
    counts = loose[base].value_counts()
    unique = pd.Series(sig[base].values, index=loose[base].values)
    unique = unique[unique.index.isin(counts[counts == 1].index)]
    return sig.where(sig.isin(set(sig[base])) | ~treeless, loose.map(unique))


def _exhausted(df: pd.DataFrame) -> pd.Series:
    full = pd.Series(False, index=df.index)
    if "peak_kv_usage" in df:
        full |= df["peak_kv_usage"].fillna(0) >= FULL_POOL
    for col in ("waited_for_memory", "preemptions"):
        if col in df:
            full |= df[col].fillna(0) > 0
    return full


def _with_baseline(df: pd.DataFrame, sig: pd.Series) -> pd.DataFrame:
    if df.empty:
        return df
    base = (df["policy"] == BASELINE) & (df["status"] == "ok")
    base_rows = df[base].assign(_sig=sig[base]).set_index("_sig")
    sig = _baseline_sigs(sig, base)
    bound = _exhausted(base_rows)
    df["memory_bound"] = sig.map(bound).astype("boolean")
    for metric in RATIO_METRICS:
        if metric in df:
            ratio = df[metric] / sig.map(base_rows[metric])
            df[ratio_column(metric)] = ratio.where(df["status"] == "ok")
    return df[[c for c in df.columns if c != "error"] + ["error"]]


def write_points_csv(records: list[dict[str, Any]], path: Path) -> pd.DataFrame:

    df = build_table(records)
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    atomic_write_text(path, buf.getvalue())
    return df


POINT_COLUMNS = ("key", "status", "policy")  # what every figure and ratio reads


def read_points_csv(path: Path) -> pd.DataFrame:
    """A sweep's points.csv; a binary, truncated or hand-cut file is a ConfigError (the
    sweep rewrites it from its point files)."""
    text = read_text(path, "a sweep's points.csv")
    fix = "rerun the sweep to rewrite it from its point files"
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or not set(POINT_COLUMNS) <= set(rows[0]):
        raise ConfigError(f"{path}: not a sweep's points table (needs columns {', '.join(POINT_COLUMNS)}); {fix}")
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(rows[0]):
            raise ConfigError(f"{path}: line {line} has {len(row)} fields, the header {len(rows[0])}: the file is "
                              f"truncated or was edited; {fix}")
    df = pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""], dtype={"error": object})
    if "memory_bound" in df:
        df["memory_bound"] = df["memory_bound"].map({True: True, False: False, "True": True, "False": False}).astype("boolean")
    df["error"] = df["error"].fillna("")
    return df


# ------------------------------------------------------------------------ statistics
def geomean(values: pd.Series) -> float:
    v = values.dropna()
    v = v[v > 0]
    return float(np.exp(np.log(v).mean())) if len(v) else math.nan


def policies_in(df: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(df["policy"]))
    return [p for p in POLICY_ORDER if p in present] + [p for p in present if p not in POLICY_ORDER]


def breakdown_table(df: pd.DataFrame) -> pd.DataFrame:
    """Geometric mean (and range, count) of each ratio per model, policy and class."""
    ok = df[(df["status"] == "ok") & (df["policy"] != BASELINE) & df["memory_bound"].notna()]
    rows = []
    for model in dict.fromkeys(ok["model"]):
        for policy in policies_in(ok[ok["model"] == model]):
            sel = ok[(ok["model"] == model) & (ok["policy"] == policy)]
            for metric, (label, better) in RATIO_METRICS.items():
                col = ratio_column(metric)
                if col not in sel:
                    continue
                for cls, mask in (("memory-bound", sel["memory_bound"]), ("slack", ~sel["memory_bound"])):
                    vals = sel.loc[mask.astype(bool), col].dropna()
                    rows.append({
                        "model": model, "policy": policy, "metric": f"{label} ({better} is better)", "class": cls,
                        "n": len(vals), "geomean": geomean(vals),
                        "min": vals.min() if len(vals) else math.nan, "max": vals.max() if len(vals) else math.nan,
                    })
    return pd.DataFrame(rows, columns=["model", "policy", "metric", "class", "n", "geomean", "min", "max"])


# -------------------------------------------------------------------------- markdown
def _cell(v: Any) -> str:
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "-"
        return f"{v:.4g}" if abs(v) < 1e3 else f"{v:,.0f}"
    if v is pd.NA or v is None:
        return "-"
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "(no rows)\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------- report.md
@dataclass
class Section:
    """One figure and the tables behind it."""

    title: str
    figure: str | None  # file stem under figures/, None when not drawn
    note: str
    tables: list[tuple[str, pd.DataFrame]]


def _latency_sources(ok: pd.DataFrame) -> str:
    if "latency_source" not in ok or ok.empty:
        return "no ok points, so no latency model was used.\n"
    counts = ok["latency_source"].value_counts()
    out = "Step latencies came from: " + ", ".join(f"**{src}** ({n} points)" for src, n in counts.items()) + ".\n"
    terms = [c for c in ok.columns if c.startswith("latency_terms.")]
    if terms:
        rows = [{"term": c.removeprefix("latency_terms."), "source": ", ".join(sorted(ok[c].dropna().astype(str).unique()))} for c in terms]
        out += "\nPer latency term:\n\n" + md_table(pd.DataFrame(rows))
    return out


def _not_ok(df: pd.DataFrame, manifest: dict[str, Any]) -> str:
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return "All points ran.\n"
    cols = [c for c in ("model", "hardware", "engine.gmu", "policy", "tree", manifest.get("load_axis")) if c and c in bad]
    rows = []
    for (status, error), group in bad.groupby(["status", "error"], sort=False):
        where = {c: ", ".join(str(v) for v in dict.fromkeys(group[c])) for c in cols}
        rows.append({"status": status, "points": len(group), **where, "error": error[:400]})
    return (f"{len(bad)} of {len(df)} points did not run: *infeasible* = the configuration is impossible "
            "(e.g. the weights do not fit the memory budget), *failed* = the simulator raised. "
            "Points with the same error are one row.\n\n" + md_table(pd.DataFrame(rows)))


def write_report(path: Path, df: pd.DataFrame, manifest: dict[str, Any], sections: list[Section]) -> None:

    ok = df[df["status"] == "ok"]
    counts = df["status"].value_counts()
    lines = [
        f"# Sweep report: {manifest.get('workload', '?')}",
        "",
        f"- command: `{manifest.get('command', '?')}`",
        f"- code version: `{', '.join(manifest.get('code_versions', []))}` (hash of the simulator sources, configs and "
        f"calibration tables); made from " + (f"git `{manifest['git']}`" if manifest.get("git") else
                                              f"`{manifest.get('package', 'gdn-specsim')}`, outside a git checkout"),
        *([f"- workload data: `{data['path']}` (from {data['from']})"] if (data := manifest.get("data_file")) else []),
        "- engine semantics (docs/engine.md): " + ", ".join(
            f"{k} {'/'.join(map(str, dict.fromkeys(ok[c])))}" for k in ("async_scheduling", "truncate_drafts",
            "mamba_cache_mode", "client_round_trip_s", "client_tokenize_s_per_token") if (c := f"engine_semantics.{k}") in ok),
        f"- grid: `{manifest.get('grid', '?')}`; {len(df)} points: "
        + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "infeasible", "failed")),
        "- sweep calls on this folder (latest last): "
        + "; ".join(f"{c['ran']} run + {c['cached']} cached in {c['wall_s']:.1f} s on {c['executor']}" for c in manifest.get("history", [])[-5:]),
        "",
        "## Latency source",
        "",
        _latency_sources(ok),
        "## Points that did not run",
        "",
        _not_ok(df, manifest),
    ]
    for n, s in enumerate(sections, 1):
        lines += [f"## Figure {n}: {s.title}", ""]
        if s.figure:
            lines += [f"![{s.title}](figures/{s.figure}.png) ([PDF](figures/{s.figure}.pdf))", ""]
        lines += [s.note, ""]
        for caption, table in s.tables:
            lines += [f"**{caption}**", "", md_table(table)]
    columns = pd.DataFrame({"column": [f"`{c}`" for c in COLUMNS], "meaning": list(COLUMNS.values())})
    lines += ["## Columns of points.csv", "", md_table(columns)]
    atomic_write_text(path, "\n".join(lines).rstrip() + "\n")
