"""`specsim bench`: the simulator's speed on the cases a user waits for (`make bench-sim`).

Each case runs in a process of its own, so its wall time is the whole process's
(imports, tables, workload, engine, summary) and its peak memory its own. Printed per
case: wall and CPU seconds, the engine's event loop alone, requests per second,
request-steps per second (requests scheduled, summed over the engine's steps), peak
resident memory, and the targets beside them. The paper grid on ShareGPT is a whole
`specsim sweep --jobs 2` into a fresh folder (`--cases grid` runs it; it takes the
longest). CPU time is printed beside wall time because a busy machine inflates the
latter; compare two checkouts on the same machine at the same time, not against the
targets alone. `--profile` prints the hottest functions (cProfile) of each simulated case.
Last, the calibrated latency model's price of one decode step, per call.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from core.config import REPO_ROOT, EngineConfig, RunConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.budget import served_model
from sim.latency import StepBatch
from sim.latency_factory import make_latency_model

STEP_TIME_TARGET_US = 100.0  # one decode step priced by the latency model, per call
GRID = "configs/grids/paper.yaml"
GRID_TARGET_S = 30.0


@dataclass(frozen=True)
class Case:
    name: str
    num_requests: int
    concurrency: int
    wall_target_s: float
    engine_target_s: float | None = None
    memory_target_mb: float | None = None


CASES = (
    Case("1k-c128", 1_000, 128, 0.8, engine_target_s=0.15),
    Case("100k-c128", 100_000, 128, 20.0, memory_target_mb=500.0),
    Case("2k-c1", 2_000, 1, 3.0),
)
CASE_NAMES = tuple(c.name for c in CASES) + ("grid",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", nargs="+", choices=CASE_NAMES, default=list(CASE_NAMES), metavar="CASE",
                   help=f"which cases to run (default all: {', '.join(CASE_NAMES)})")
    p.add_argument("--workload", default="sharegpt")
    p.add_argument("--policy", default="store_all")
    p.add_argument("--profile", action="store_true", help="print the top functions by own time of each case")
    p.add_argument("--child", choices=[c.name for c in CASES], help=argparse.SUPPRESS)  # one case, JSON out


def main(args: argparse.Namespace) -> int:
    if args.child:
        return _child(next(c for c in CASES if c.name == args.child), args)
    print(f"{'case':>10} {'wall_s':>7} {'target':>6} {'cpu_s':>6} {'engine_s':>8} {'target':>6} {'req/s':>7} "
          f"{'req-steps/s':>11} {'peak_MB':>7} {'target':>6}")
    ok = True
    for case in CASES:
        if case.name not in args.cases:
            continue
        cmd = [sys.executable, "-m", "sim", "bench", "--child", case.name, "--workload", args.workload,
               "--policy", args.policy] + (["--profile"] if args.profile else [])
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode:
            print(f"{case.name:>10} failed:\n{out.stderr}", file=sys.stderr)
            return 1
        *profile, last = out.stdout.rstrip("\n").split("\n")
        r = json.loads(last)
        ok &= wall <= case.wall_target_s and (case.engine_target_s is None or r["engine_s"] <= case.engine_target_s) \
            and (case.memory_target_mb is None or r["peak_mb"] <= case.memory_target_mb)
        print(f"{case.name:>10} {wall:>7.2f} {case.wall_target_s:>6g} {r['cpu_s']:>6.2f} {r['engine_s']:>8.3f} "
              f"{_target(case.engine_target_s):>6} {r['requests'] / wall:>7.0f} {r['request_steps'] / r['engine_s']:>11.0f} "
              f"{r['peak_mb']:>7.0f} {_target(case.memory_target_mb):>6}")
        if profile:
            print("\n".join(profile))
    if "grid" in args.cases:
        ok &= _grid(args.workload)
    per_call = step_time_us(args)
    ok &= per_call <= STEP_TIME_TARGET_US
    print(f"latency model: {per_call:.1f} us per decode step priced (target <= {STEP_TIME_TARGET_US:g} us)")
    return 0 if ok else 1


def _target(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def _child(case: Case, args: argparse.Namespace) -> int:
    from sim.run import simulate_result

    cfg = RunConfig.model_validate({"workload": args.workload, "policy": args.policy,
                                    "num_requests": case.num_requests, "client": {"max_concurrency": case.concurrency}})
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    summary, result = simulate_result(cfg)
    if prof:
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
        print(text.getvalue())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"requests": summary["num_requests"], "request_steps": result.steps.request_steps,
                      "engine_s": result.wall_s, "cpu_s": usage.ru_utime + usage.ru_stime,
                      "peak_mb": usage.ru_maxrss / 1024}))  # Linux reports kilobytes
    return 0


def _grid(workload: str) -> bool:
    """The paper grid as a user runs it: a whole sweep into a fresh folder, two workers."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "sim", "sweep", "--workload", workload, "--grid", GRID, "--jobs", "2",
               "--out", out, "--no-progress"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if done.returncode:
        print(f"grid failed:\n{done.stderr}", file=sys.stderr)
        return False
    print(f"{'grid':>10} {wall:>7.1f} {GRID_TARGET_S:>6g}  ({GRID} on {workload}, --jobs 2, whole sweep)")
    return wall <= GRID_TARGET_S


def step_time_us(args: argparse.Namespace) -> float:
    """Mean wall time of `step_time` over decode batches of 1..256 requests, 8 times, each
    at another context length (so no call repeats the one before)."""
    eng = EngineConfig()
    model = served_model(load_model("qwen3.5-35b-a3b"), eng)
    policy = make_policy(model, load_policy(args.policy))
    latency = make_latency_model(model, load_hardware("h200"), policy, eng)
    vp, depth = 1 + policy.tree.num_nodes, policy.tree.depth
    batches = [StepBatch(num_seqs=b, prefill_tokens=0, prefill_seqs=0, decode_seqs=b, spec_seqs=b,
                         verify_positions=vp, context_tokens=b * (1000 + 7 * i), max_context=1000 + 7 * i,
                         eager=False, draft_depth=depth)
               for i, b in enumerate(list(range(1, 257)) * 8)]
    t0 = time.perf_counter()
    for b in batches:
        latency.step_time(b)
    return (time.perf_counter() - t0) / len(batches) * 1e6
