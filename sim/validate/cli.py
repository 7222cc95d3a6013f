"""`specsim validate`: every expressible published run of `validation/real/` simulated and compared.

For each case that the simulator can express, `specsim run` of its RunConfig (sim.validate.cases)
writes `runs/<case>/`; its client's metrics of that run (guidellm's or `vllm bench serve`'s,
sim.validate.metrics) are compared with the published ones. Outputs in `--out`: `validation.csv` (case, metric, real, simulated, ratio =
simulated / real), `validation.json` (per case: its source, every metric's real, simulated and
ratio, the run's summary.json path; the cases not expressible with their reasons) and
`figures/validation.png` / `.pdf` (simulated against real per metric, log-log, identity line).
No parameter is fitted to the published numbers: they test the calibration (docs/validation.md).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

from core.config import REPO_ROOT, ConfigError, RunConfig
from core.config_load import parse_set
from core.config_frontend import FrontendCosts
from core.files import StagedOutput, atomic_write_text
from sim.runs.run import simulate
from sim.validate.breakdown import published_bounds, time_breakdown
from sim.validate.cases import Case, load_cases
from sim.validate.client import OVERHEAD_FILE, load_overhead
from sim.validate.metrics import compared, left_out, simulated_metrics

DEFAULT_REAL = REPO_ROOT / "validation" / "real"
# the API server's event loop (sim/engine/frontend.py), as calibrate/frontend/cost.py measured it
FRONTEND_FILE = REPO_ROOT / "validation" / "frontend_cost_2026-12-04.json"
OUT_FILES = ("validation.csv", "validation.json")
CSV_COLUMNS = ("case", "metric", "real", "simulated", "ratio")


def compare(case: Case, metrics: dict[str, float]) -> list[dict[str, Any]]:
    """One row per compared published metric that a simulated run has (sim.validate.metrics.compared)."""
    rows = []
    for metric, sim_key in compared(case.client).items():
        if metric not in case.reported or sim_key not in metrics:
            continue
        real, simulated = float(case.reported[metric]), float(metrics[sim_key])
        ratio = simulated / real if real else math.nan
        rows.append({"case": case.name, "metric": metric, "real": real, "simulated": float(f"{simulated:.8g}"),
                     "ratio": float(f"{ratio:.6g}") if math.isfinite(ratio) else None})
    return rows


def case_config(case: Case, source: Path, overhead: dict[str, Any] | None = None,
                frontend: FrontendCosts | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    cfg = case.run_config(str(source), overhead, overrides)
    if frontend is not None:
        cfg = cfg.model_copy(update={"client": cfg.client.model_copy(update={"frontend": frontend})})
    return cfg


def run_case(case: Case, cfg: RunConfig, run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = simulate(cfg, run_dir)
    with (run_dir / "requests.csv").open(newline="") as f:
        metrics = simulated_metrics(case.client.tool, csv.DictReader(f), summary)
    return summary, compare(case, metrics)


def _csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    return buf.getvalue()


def validate_all(real: Path, out: Path, progress: bool = True, overhead_file: Path | None = OVERHEAD_FILE,
                 frontend_file: Path | None = FRONTEND_FILE, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """`overhead_file`: the API server's measured time outside the engine (sim.validate.client);
    None charges nothing there (the engine alone). `frontend_file`: its event loop's measured
    costs (sim.engine.frontend); None leaves the loop out. `overrides`: dotted RunConfig fields
    set in every case after its own `set` (a what-if; the report names them)."""
    cases = load_cases(real)  # every file checked before anything runs
    overhead = load_overhead(overhead_file) if overhead_file is not None else None
    frontend = load_frontend(frontend_file) if frontend_file is not None else None
    # every case's configuration too, so that a bad --set stops the command before any run
    configs = {case.name: case_config(case, path, overhead, frontend, overrides)
               for path, case in cases if case.expressible}
    rows: list[dict[str, Any]] = []
    report: dict[str, Any] = {"real": str(real), "client_overhead": _overhead_facts(overhead),
                              "frontend": _frontend_facts(frontend_file), "overrides": dict(overrides or {}),
                              "cases": {}, "not_expressible": {}}
    with StagedOutput(out, OUT_FILES, folders=("runs", "figures")) as staged:
        for n, (path, case) in enumerate(cases, 1):
            if not case.expressible:
                report["not_expressible"][case.name] = {"file": str(path), "reason": case.not_expressible}
                continue
            if progress:
                print(f"[{n}/{len(cases)}] {case.name}", file=sys.stderr, flush=True)
            run_dir = staged.path / "runs" / case.name
            summary, case_rows = run_case(case, configs[case.name], run_dir)
            rows += case_rows
            report["cases"][case.name] = {
                "file": str(path), "source": case.source.model_dump(), "client": case.client.tool,
                "summary": str(out / "runs" / case.name / "summary.json"),
                "latency_source": summary["latency_source"], "latency_terms": summary["latency_terms"],
                # a speculating case's accepted lengths, as `specsim run` draws them (sim.engine.acceptance)
                "acceptance_source": summary["acceptance_source"],
                "client_overhead": {k: summary["engine_semantics"][f"client_{k}"]
                                    for k in ("round_trip_s", "tokenize_s_per_token")},
                "metrics": {r["metric"]: {k: r[k] for k in ("real", "simulated", "ratio")} for r in case_rows},
                "not_compared": left_out(case.client, case.reported),
                "time_breakdown": {"simulated": time_breakdown(run_dir / "requests.csv"),
                                   "published": published_bounds(case.reported)},
            }
        atomic_write_text(staged.path / "validation.csv", _csv_text(rows))
        atomic_write_text(staged.path / "validation.json", json.dumps(report, indent=2) + "\n")
        if rows:
            from sim.validate.figure import draw  # matplotlib only when there is something to draw
            draw(rows, staged.path / "figures")
        staged.publish()
    return report


def _overhead_facts(overhead: dict[str, Any] | None) -> dict[str, Any] | None:
    if overhead is None:
        return None
    return {"file": str(overhead["path"].relative_to(REPO_ROOT)) if overhead["path"].is_relative_to(REPO_ROOT)
            else str(overhead["path"]), "round_trip_s": overhead["round_trip_s"], "provenance": overhead["provenance"]}


def load_frontend(path: Path) -> FrontendCosts:
    try:
        return FrontendCosts.model_validate(str(path))
    except ValueError as e:
        raise ConfigError(f"--frontend {path}: " + " ".join(str(e).split("\n")[-1].split())) from None


def _frontend_facts(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    data = json.loads(path.read_text())
    full = path.resolve()
    shown = str(full.relative_to(REPO_ROOT)) if full.is_relative_to(REPO_ROOT) else str(path)
    return {"file": shown, "model": data["model"], "provenance": data.get("provenance", {})}


def _overhead_arg(text: str) -> Path | None:
    return None if text == "none" else Path(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--real", type=Path, default=Path("validation/real"),
                   help="folder of published-run case files (*.yaml)")
    p.add_argument("--out", type=Path, default=Path("results/validation"),
                   help="folder for validation.csv, validation.json, figures/ and runs/")
    p.add_argument("--client-overhead", type=_overhead_arg, default=OVERHEAD_FILE, metavar="FILE",
                   help="the API server's measured time outside the engine (default: the committed "
                        f"{OVERHEAD_FILE.name}); 'none': the engine alone")
    p.add_argument("--frontend", type=_overhead_arg, default=FRONTEND_FILE, metavar="FILE",
                   help="the API server's event loop costs, as calibrate/frontend/cost.py measured them "
                        f"(default: the committed {FRONTEND_FILE.name}); 'none': the loop left out")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a RunConfig field by dotted key set in every case after its own `set`, e.g. "
                        "engine.max_num_seqs=400: a what-if against the published runs, named in "
                        "validation.json (repeatable)")
    p.add_argument("--json", action="store_true", help="print validation.json instead of the table")
    p.add_argument("--no-progress", action="store_true", help="no per-case progress lines on stderr")


def main(args: argparse.Namespace) -> int:
    overrides = dict(parse_set(item, "engine.max_num_seqs=400") for item in args.set)
    report = validate_all(args.real, args.out, progress=not args.no_progress, overhead_file=args.client_overhead,
                          frontend_file=args.frontend, overrides=overrides)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for name, case in report["cases"].items():
        print(name)
        for metric, m in case["metrics"].items():
            ratio = "-" if m["ratio"] is None else f"{m['ratio']:.2f}"
            print(f"  {metric:<26} real {m['real']:>12,.2f}  simulated {m['simulated']:>12,.2f}  ratio {ratio}")
    for name, why in report["not_expressible"].items():
        print(f"{name}: not expressible: {why['reason']}")
    if overrides:
        print("every case with " + ", ".join(f"--set {k}={v}" for k, v in overrides.items()))
    print(f"wrote {args.out}/validation.csv, validation.json, figures/validation.png/.pdf, runs/")
    return 0
