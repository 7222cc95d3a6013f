"""`specsim bench`: the simulator's speed on the cases a user waits for (`make bench-sim`).

Per case (sim.runs.bench_cases.CASES): wall and CPU seconds, the engine's event loop alone (run
cases), requests per second, request-steps per second (requests scheduled, summed over the
engine's steps) and peak memory, beside the case's targets; the median of `--runs` runs. This
machine's speed drifts, with other jobs on it, by more than most changes move the simulator,
so `--vs DIR` runs each case in another checkout of the project as well, the two in turn
(here, there, here, ...), and reports each figure's ratio, here / there, as the median of the
pairs' ratios: a figure that only the pair's ratio makes meaningful. `--out FILE` keeps every
run's figures with the machine, packages, commit and code version. Last, the calibrated latency
model's price of one decode step, per call. Exit 1 when a target is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from core.config import ConfigError, EngineConfig, load_hardware, load_model, load_policy
from core.files import atomic_write_text
from policies import make_policy
from sim.engine.budget import served_model
from sim.pricing.factory import make_latency_model
from sim.pricing.latency import StepBatch
from sim.runs.bench_cases import CASE_NAMES, CASES, HERE, BenchError, Case, Measure, child, measure, sweep_child

STEP_TIME_TARGET_US = 100.0  # one decode step priced by the latency model, per call
FIGURES = ("wall_s", "cpu_s", "engine_s", "peak_mb")  # the ratios reported beside --vs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", nargs="+", choices=CASE_NAMES, default=list(CASE_NAMES), metavar="CASE",
                   help=f"which cases to run (default all: {', '.join(CASE_NAMES)})")
    p.add_argument("--runs", type=int, default=1, help="runs of each case; the median is reported")
    p.add_argument("--vs", type=Path, metavar="DIR",
                   help="another checkout of this project: each case runs there too, in turn, and the ratios are reported")
    p.add_argument("--out", type=Path, metavar="FILE", help="write every run's figures and their provenance as JSON")
    p.add_argument("--workload", default="sharegpt", help="the run cases' workload")
    p.add_argument("--policy", default="store_all", help="the run cases' policy")
    p.add_argument("--profile", action="store_true", help="print the top functions by own time of each run case")
    p.add_argument("--child", choices=CASE_NAMES, help=argparse.SUPPRESS)  # one case, one JSON line
    p.add_argument("--checkout", type=Path, help=argparse.SUPPRESS)  # a sweep case's checkout


def main(args: argparse.Namespace) -> int:
    if args.child:
        case = next(c for c in CASES if c.name == args.child)
        if case.sweep:
            return sweep_child(case, args.checkout)
        return child(case, args.workload, args.policy, args.profile)
    vs = _checkout(args.vs) if args.vs is not None else None
    if args.runs < 1:
        raise ConfigError(f"--runs must be a positive number of runs, got {args.runs}")
    if args.out is not None and not args.out.parent.is_dir():
        raise ConfigError(f"--out {args.out}: its folder {args.out.parent} does not exist")
    cases = [c for c in CASES if c.name in args.cases]
    results, ok = [], True
    for case in cases:
        try:
            here, there = _runs(case, args, vs)
        except BenchError as e:
            print(f"specsim bench: {e}", file=sys.stderr)
            return 1
        results.append(_result(case, here, there))
        ok &= results[-1]["met"]
    _table(results, vs)
    per_call = step_time_us(args.policy)
    ok &= per_call <= STEP_TIME_TARGET_US
    print(f"latency model: {per_call:.1f} us per decode step priced (target <= {STEP_TIME_TARGET_US:g} us)")
    if args.out is not None:
        atomic_write_text(args.out, json.dumps(_record(args, vs, results, per_call), indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if ok else 1


def _checkout(path: Path) -> Path:
    path = path.resolve()
    if not (path / "sim" / "__main__.py").is_file():
        raise ConfigError(f"--vs {path}: not a checkout of this project (no sim/__main__.py there)")
    return path


def _runs(case: Case, args: argparse.Namespace, vs: Path | None) -> tuple[list[Measure], list[Measure]]:
    """The case's runs here and, in turn, in `vs`; a line per run as it ends (they take minutes)."""
    here: list[Measure] = []
    there: list[Measure] = []
    for i in range(args.runs):
        here.append(measure(case, HERE, args.workload, args.policy))
        line = f"{case.name} run {i + 1}/{args.runs}: {here[-1].wall_s:.2f} s"
        if vs is not None:
            there.append(measure(case, vs, args.workload, args.policy))
            line += f", --vs {there[-1].wall_s:.2f} s"
        print(line, file=sys.stderr, flush=True)
    return here, there


def _median(runs: list[Measure], figure: str) -> float | None:
    values = [getattr(m, figure) for m in runs if getattr(m, figure) is not None]
    return statistics.median(values) if values else None


def _result(case: Case, here: list[Measure], there: list[Measure]) -> dict:
    med = {f: _median(here, f) for f in ("wall_s", "cpu_s", "engine_s", "peak_mb")}
    met = med["wall_s"] <= case.wall_target_s
    if case.engine_target_s is not None:
        met &= med["engine_s"] <= case.engine_target_s
    if case.memory_target_mb is not None:
        met &= med["peak_mb"] <= case.memory_target_mb
    steps = statistics.median(m.request_steps / m.engine_s for m in here) if here[0].engine_s else None
    out = {"case": case.name, "what": case.what, "targets": {"wall_s": case.wall_target_s,
                                                             "engine_s": case.engine_target_s,
                                                             "peak_mb": case.memory_target_mb},
           "median": {**med, "requests_per_s": statistics.median(m.requests / m.wall_s for m in here),
                      "request_steps_per_s": steps},
           "met": met, "runs": [m.row() for m in here]}
    if there:
        out["vs_runs"] = [m.row() for m in there]
        out["ratio"] = {f: statistics.median(getattr(a, f) / getattr(b, f) for a, b in zip(here, there))
                        for f in FIGURES if getattr(here[0], f) and getattr(there[0], f)}
    return out


def _table(results: list[dict], vs: Path | None) -> None:
    head = (f"{'case':>10} {'wall_s':>7} {'target':>6} {'cpu_s':>7} {'engine_s':>8} {'target':>6} {'req/s':>7} "
            f"{'req-steps/s':>11} {'peak_MB':>7} {'target':>6}")
    print(head + ("   ratio to --vs: wall  cpu  engine  peak" if vs else ""))
    for r in results:
        m, t = r["median"], r["targets"]
        line = (f"{r['case']:>10} {m['wall_s']:>7.2f} {t['wall_s']:>6g} {m['cpu_s']:>7.2f} {_f(m['engine_s'], 8, '.3f')} "
                f"{_f(t['engine_s'], 6, 'g')} {m['requests_per_s']:>7.0f} {_f(m['request_steps_per_s'], 11, '.0f')} "
                f"{m['peak_mb']:>7.0f} {_f(t['peak_mb'], 6, 'g')}")
        if "ratio" in r:
            line += "   " + "  ".join(f"{f.split('_')[0]} {r['ratio'][f]:.2f}" for f in FIGURES if f in r["ratio"])
        print(line + ("" if r["met"] else "   target missed"))


def _f(v: float | None, width: int, spec: str) -> str:
    return f"{'-' if v is None else format(v, spec):>{width}}"


def _record(args: argparse.Namespace, vs: Path | None, results: list[dict], per_call: float) -> dict:
    """The runs with what they ran on and from."""
    from sim.runs.code_version import code_version
    from sim.runs.sweep import git_describe

    import numpy
    import simpy
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": _machine(),
            "python": platform.python_version(), "packages": {"numpy": numpy.__version__, "simpy": simpy.__version__},
            "commit": git_describe(), "code_version": code_version("h200"),
            "command": "specsim bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
            "vs": {"checkout": str(vs), "commit": _commit(vs)} if vs else None, "runs_per_case": args.runs,
            "workload": args.workload, "policy": args.policy, "cases": results, "step_time_us": per_call}


def _machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    mem = next((int(line.split()[1]) * 1024 for line in _lines("/proc/meminfo") if line.startswith("MemTotal")), None)
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem / 1e9, 1) if mem else None,
            "system": platform.platform()}


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def _commit(checkout: Path) -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=checkout, capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def step_time_us(policy: str) -> float:
    """Mean wall time of `step_time` over decode batches of 1..256 requests, 8 times, each
    at another context length (so no call repeats the one before)."""
    eng = EngineConfig()
    model = served_model(load_model("qwen3.5-35b-a3b"), eng)
    pol = make_policy(model, load_policy(policy))
    latency = make_latency_model(model, load_hardware("h200"), pol, eng)
    vp, depth = 1 + pol.tree.num_nodes, pol.tree.depth
    batches = [StepBatch(num_seqs=b, prefill_tokens=0, prefill_seqs=0, decode_seqs=b, spec_seqs=b,
                         verify_positions=vp, context_tokens=b * (1000 + 7 * i), max_context=1000 + 7 * i,
                         eager=False, draft_depth=depth)
               for i, b in enumerate(list(range(1, 257)) * 8)]
    t0 = time.perf_counter()
    for b in batches:
        latency.step_time(b)
    return (time.perf_counter() - t0) / len(batches) * 1e6
