"""`specsim report --readme`: the README's numbers, computed from the outputs committed in docs/.

README.md holds generated blocks between `<!-- generated: NAME -->` and
`<!-- end generated: NAME -->`. This module renders each block from committed outputs: the
sweep folders (`docs/sweeps/<name>/points.csv`, `sweep.json`), the single runs
(`docs/runs/<workload>-<policy>.json`, summary.json files), the validation against published
runs (`docs/validation/`) and the step executor's replay summary (results/calibration);
`--write` puts them into the README, `--check` fails when the README says something else.
`make docs` reruns everything and writes both, so the README cannot drift from the outputs.
A new block is one function `(docs folder) -> markdown` in BLOCKS, in the README's order, and
a `generated` pair of comments in the README.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from core.config import REPO_ROOT, ConfigError, GiB, MiB
from sim.runs.report import BASELINE, breakdown_table, md_table, policies_in, read_points_csv

DOCS = REPO_ROOT / "docs"
PAPER_SWEEP = "sweeps/sharegpt"
TREES_SWEEP = "sweeps/sharegpt-trees"
# The single runs of the README's "one point, every policy" table, in table order.
RUN_WORKLOAD = "sharegpt"
RUN_POLICIES = ("none", "store_all", "reconstruct", "reconstruct_deferred", "replay")
RUN_ARGS = "--model qwen3.5-35b-a3b --hardware h200 --gmu 0.6 --concurrency 128 --num-requests 1000 --seed 0"
# The step executor's replay the step-check block reports (committed with the calibration).
STEP_REPLAY = REPO_ROOT / "results" / "calibration" / "h200" / "qwen3.5-35b-a3b" / "replay_summary.json"
STEP_KINDS = ("uniform_decode", "mixed_graph", "mixed_eager", "prefill_only", "all")
SPEED = "bench/sim_speed.json"  # `make docs`'s simulator benchmark
SPEED_CASES = ("1k-c128", "100k-c128", "2k-c1", "grid")  # its cases (the generated workloads' grids take minutes)
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S)


def _read_sweep(docs: Path, name: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    folder = docs / name
    if not (folder / "points.csv").is_file() or not (folder / "sweep.json").is_file():
        raise ConfigError(f"{folder}: no points.csv and sweep.json; `make docs` writes them")
    return read_points_csv(folder / "points.csv"), json.loads((folder / "sweep.json").read_text())


def _read_run(docs: Path, workload: str, policy: str) -> dict[str, Any]:
    path = docs / "runs" / f"{workload}-{policy}.json"
    if not path.is_file():
        raise ConfigError(f"{path}: missing; `make docs` writes it")
    return json.loads(path.read_text())


def _x(v: float) -> str:
    """A ratio as the figures print it."""
    return f"{v:.2f}x"


# ------------------------------------------------------------------------- blocks
def headline(docs: Path) -> str:
    """Figure 1's numbers: geometric-mean ratios per model and policy, memory-bound / slack."""
    df, manifest = _read_sweep(docs, PAPER_SWEEP)
    table = breakdown_table(df)
    rows = []
    for (model, policy), group in table.groupby(["model", "policy"], sort=False):
        row = {"model": model, "policy": policy}
        for metric, cells in group.groupby("metric", sort=False):
            by = {r["class"]: r for _, r in cells.iterrows()}
            row["points"] = " / ".join(str(by[c]["n"]) if c in by else "0" for c in ("memory-bound", "slack"))
            row[metric.split(" (")[0]] = " / ".join(_x(by[c]["geomean"]) if c in by and by[c]["n"] else "-"
                                     for c in ("memory-bound", "slack"))
        rows.append(row)
    bad = df[df["status"] != "ok"]
    why = "; ".join(f"{model} at gmu {gmu:g}" for (model, gmu), _ in bad.groupby(["model", "engine.gmu"], sort=False))
    text = (f"`{manifest['grid']}` on `{manifest['workload']}`: {len(df)} points"
            + (f", {len(bad)} could not run ({why})" if len(bad) else "")
            + f". Cells: the policy's metric / `{BASELINE}`'s at the same point, geometric mean over "
            "memory-bound / slack points (figure 1's bars).\n\n")
    wide = pd.DataFrame(rows)
    return text + md_table(wide[["model", "policy", "points", *[c for c in wide if c not in ("model", "policy", "points")]]])


def one_point(docs: Path) -> str:
    """The single runs: every policy at one memory-bound point."""
    rows, pools = [], set()
    for policy in RUN_POLICIES:
        s = _read_run(docs, RUN_WORKLOAD, policy)
        pools.add((s["pool_bytes"], s["num_blocks"], s["block_bytes"], s["block_size_tokens"]))
        rows.append({
            "policy": policy, "state blocks per GDN group": f"{s['state_blocks_per_group']}"
            + (f" (+ {s['cache_blocks_per_request']} cache)" if s["cache_blocks_per_request"] else ""),
            "out tok/s": f"{s['output_throughput_tok_s']:.0f}", "p99 TTFT (s)": f"{s['ttft_p99_s']:.2f}",
            "mean TPOT (ms)": f"{1000 * s['tpot_mean_s']:.1f}", "waited for memory": s["waited_for_memory"],
        })
    pool, blocks, block_bytes, tokens = sorted(pools)[0]
    intro = (f"`specsim run {RUN_ARGS} --workload {RUN_WORKLOAD} --policy P`: {blocks:,} blocks of "
             f"{block_bytes / MiB:.2f} MiB ({pool / GiB:.2f} GiB).\n\n")
    return intro + md_table(pd.DataFrame(rows))


def trees(docs: Path) -> str:
    """Output throughput per tree shape and policy at the trees grid's largest gmu and load."""
    df, manifest = _read_sweep(docs, TREES_SWEEP)
    ok = df[df["status"] == "ok"]
    load = manifest.get("load_axis")
    gmu = ok["engine.gmu"].max()
    at = ok[ok["engine.gmu"] == gmu]
    where = f"gmu {gmu:g}"
    if load:
        at = at[at[load] == at[load].max()]
        where += f", {load.split('.')[-1]} {at[load].max():g}"
    wide = at.pivot_table(index="tree", columns="policy", values="output_throughput_tok_s", sort=False)
    wide = wide[policies_in(at)].map(lambda v: f"{v:.0f}").reset_index()
    wide["tree"] = wide["tree"].map(lambda t: f"({t})")
    return f"Output tok/s, `{manifest['grid']}` on `{manifest['workload']}` at {where}:\n\n" + md_table(wide)


def provenance(docs: Path) -> str:
    """Which code made docs/: the commit and code version its sweeps recorded."""
    manifests = [_read_sweep(docs, name)[1] for name in (PAPER_SWEEP, TREES_SWEEP)]
    commits = sorted({m.get("git") or "unknown" for m in manifests})
    versions = sorted({v for m in manifests for v in m.get("code_versions", [])})
    return (f"From `docs/sweeps/` and `docs/runs/`, written by `make docs` at commit `{', '.join(commits)}` "
            f"(code version `{', '.join(versions)}`).\n")


def models(docs: Path) -> str:
    """Each model config: its feed-forward block, TP size, what prices its steps on the H200 (the latency
    model a store_all run builds from the committed tables) and how far `make validate` put it from the
    published vLLM runs of it (docs/validation/validation.csv)."""
    from core.config import EngineConfig, load_hardware, load_model, load_policy, model_names
    from policies import make_policy
    from sim.pricing.factory import make_latency_model
    from sim.validate.cases import load_cases
    from sim.validate.cli import DEFAULT_REAL

    hw = load_hardware("h200")
    path = docs / VALIDATION / "validation.csv"
    runs = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=["case", "metric", "ratio"])
    model_of = {c.name: c.model for _, c in load_cases(DEFAULT_REAL)}
    rows = []
    for name in model_names():
        m = load_model(name)
        ffn = f"dense {m.mlp.intermediate_size:,}" if m.dense else f"MoE {m.moe.num_experts}, top {m.moe.top_k}"
        lat = make_latency_model(m, hw, make_policy(m, load_policy("store_all")), EngineConfig())
        src = lat.sources.by_term
        other = ", ".join(f"{t} {v}" for t, v in src.items() if v != "calibrated")
        priced = ("analytic" if set(src.values()) == {"analytic"} else
                  "calibrated" + (f" ({other})" if other else ""))
        mine = runs[runs["case"].map(model_of.get) == name]
        checks = []
        # Requests/s, not tokens/s: guidellm's token rates are compared only where every token was timed.
        for metric, label in (("request_throughput", "req/s"), ("ttft_mean_ms", "TTFT")):
            ratio = mine.loc[mine["metric"] == metric, "ratio"]
            if len(ratio):
                checks.append(f"{label} {ratio.min():.2f}-{ratio.max():.2f}x")
        cases = mine["case"].nunique()
        rows.append({"model": name, "FFN": ffn, "TP": m.tensor_parallel, "H200": priced,
                     "vs vLLM": f"{cases}: " + ", ".join(checks) if cases else "none"})
    return md_table(pd.DataFrame(rows))


VALIDATION = "validation"  # docs/validation/: `make validate`'s validation.csv and validation.json, copied
# GPUStack's TPOT rows did not time the thinking tokens (docs/guidellm.md), so a case compares
# no TPOT; duration and mean latency are what its targets name beside mean and median TTFT.
VALIDATION_METRICS = (("duration_s", "duration"), ("latency_mean_s", "mean latency"), ("ttft_mean_ms", "mean TTFT"),
                      ("ttft_median_ms", "median TTFT"))
# The case names' server flags, shortened for the table (its legend says so).
CASE_SHORT = (("-prefix-caching", " pc"), ("-throughput-mode", " tm"), ("-fp8-kv", " fp8-kv"), ("-fp8", " fp8"))


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _case(name: str) -> str:
    short = name.removeprefix("gpustack-h200-qwen3.5-35b-a3b-").removesuffix("-bf16-baseline")
    for long, abbrev in CASE_SHORT:
        short = short.replace(long, abbrev)
    return short


def validation(docs: Path) -> str:
    """Published vLLM runs against the simulator: simulated over published, per case and metric."""
    path = docs / VALIDATION / "validation.csv"
    if not path.is_file():
        raise ConfigError(f"{path}: missing; `make docs` writes it (from `make validate`)")
    df = pd.read_csv(path)
    rows = []
    for case, group in df.groupby("case", sort=False):
        by = group.set_index("metric")
        row = {"case": _case(case)}
        for metric, label in VALIDATION_METRICS:
            if metric in by.index:
                row[label] = f"{by.loc[metric]['ratio']:.2f}x"
        rows.append(row)
    report = json.loads((docs / VALIDATION / "validation.json").read_text())
    skipped = len(report.get("not_expressible", {}))
    return (f"Simulated / published (values in `docs/validation/`; pc: prefix caching, tm: "
            f"`--performance-mode=throughput`; {skipped} more cases not expressible).\n\n" + md_table(pd.DataFrame(rows)))


def breakdown(docs: Path) -> str:
    """Where each case's simulated request spends its time (sim.validate.breakdown), beside the
    published TTFT and latency - TTFT that bound the same parts."""
    report = json.loads((docs / VALIDATION / "validation.json").read_text())
    rows = []
    for case, c in report["cases"].items():
        sim, pub = c["time_breakdown"]["simulated"], c["time_breakdown"]["published"]
        ttft = sim["frontend_s"] + sim["engine_queue_s"] + sim["prefill_s"]
        rows.append({"case": _case(case), "client queue": f"{sim['client_queue_s']:.2f}",
                     "API server": f"{sim['frontend_s']:.2f}", "engine queue": f"{sim['engine_queue_s']:.2f}",
                     "prefill": f"{sim['prefill_s']:.2f}",
                     "TTFT: simulated / published": f"{ttft:.2f} / {pub['ttft_s']:.2f}" if "ttft_s" in pub else "",
                     "decode: simulated / published": (f"{sim['decode_s']:.2f} / {pub['decode_s']:.2f}"
                                                       if "decode_s" in pub else "")})
    return "Mean seconds per request.\n\n" + md_table(pd.DataFrame(rows))


def step_check(docs: Path) -> str:
    """The step model against the GPU step executor (the committed replay summary)."""
    s = json.loads(STEP_REPLAY.read_text())

    def err(e: dict) -> str:
        return f"{e['median_ape']:.1f} / {e['p90_ape']:.1f} / {e['bias']:+.1f}"
    rows = [{"step kind": k, "steps": s[k]["n"], "median / p90 / bias %": err(s[k])} for k in STEP_KINDS if k in s]
    return (f"`{STEP_REPLAY.relative_to(REPO_ROOT)}`: {s['sum_measured_s']:.1f} s of steps measured, "
            f"{s['sum_predicted_s']:.1f} s predicted.\n\n" + md_table(pd.DataFrame(rows)))


def speed(docs: Path) -> str:
    """`make docs`'s run of the simulator benchmark (docs/bench/sim_speed.json), against its targets."""
    path = docs / SPEED
    if not path.is_file():
        raise ConfigError(f"{path}: missing; `make docs` writes it")
    b = json.loads(path.read_text())

    def fig(v: float | None, spec: str, target: float | None) -> str:
        return "" if v is None else format(v, spec) + (f" / {target:g}" if target else "")
    rows = [{"case": f"`{c['case']}`", "wall (s)": fig(c["median"]["wall_s"], ".2f", c["targets"]["wall_s"]),
             "engine loop (s)": fig(c["median"]["engine_s"], ".3f", c["targets"]["engine_s"]),
             "request-steps/s": fig(c["median"]["request_steps_per_s"], ",.0f", None),
             "peak MB": fig(c["median"]["peak_mb"], ",.0f", c["targets"]["peak_mb"])} for c in b["cases"]]
    return (f"At `{b['commit']}`, {b['date']}, {b['machine']['cores']} shared cores of an {b['machine']['cpu']} "
            f"([record]({DOCS.name}/{SPEED}); measured / target):\n\n" + md_table(pd.DataFrame(rows)))


# Each block of the README by name, in the README's order; a section another module adds is one more entry.
BLOCKS: dict[str, Callable[[Path], str]] = {"headline": headline, "one-point": one_point, "trees": trees,
                                            "provenance": provenance, "models": models, "step-check": step_check,
                                            "validation": validation, "speed": speed}


# docs/validation.md's generated blocks (`make docs` writes them with the README's).
DOC_BLOCKS: dict[str, Callable[[Path], str]] = {"breakdown": breakdown}


def render(docs: Path = DOCS) -> dict[str, str]:
    return {name: make(docs) for name, make in {**BLOCKS, **DOC_BLOCKS}.items()}


def fill(readme: str, blocks: dict[str, str]) -> str:
    """README text with every generated block replaced; a block the README names but this
    module does not know is an error (so a typo cannot leave stale numbers)."""
    unknown = sorted({m["name"] for m in BLOCK.finditer(readme)} - set(blocks))
    if unknown:
        raise ConfigError(f"README names generated block(s) {unknown}; known: {', '.join(blocks)}")
    return BLOCK.sub(lambda m: m.group(1) + blocks[m["name"]] + m.group(4), readme)


# ---------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--readme", action="store_true", required=True,
                   help="print the README's generated blocks (the only report there is so far)")
    p.add_argument("--docs", type=Path, default=DOCS, help="folder of the committed outputs (default: docs/)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--write", type=Path, metavar="README", help="replace the generated blocks in this file")
    what.add_argument("--check", type=Path, metavar="README", help="exit 1 if this file's blocks differ")


def main(args: argparse.Namespace) -> int:
    blocks = render(args.docs)
    if not (args.write or args.check):
        for name, text in blocks.items():
            print(f"<!-- generated: {name} -->\n{text}<!-- end generated: {name} -->\n")
        return 0
    path = args.write or args.check
    text = path.read_text()
    new = fill(text, blocks)
    if args.write:
        path.write_text(new)
        print(f"wrote the generated blocks of {path}")
        return 0
    stale = [m["name"] for m, n in zip(BLOCK.finditer(text), BLOCK.finditer(new)) if m["body"] != n["body"]]
    if stale:
        print(f"{path}: generated block(s) {', '.join(stale)} differ from {args.docs}; "
              f"run `specsim report --readme --write {path}`", file=sys.stderr)
        return 1
    print(f"{path}: every generated block matches {args.docs}")
    return 0
