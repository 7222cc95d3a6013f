"""The cases `specsim bench` times, and how one case is measured in a checkout.

A run case (one `specsim run`-like simulation) is a child process of its own, `python -m sim
bench --child CASE`, so its wall time is the whole process's (imports, tables, workload, engine,
summary) and its peak memory its own; the child prints one JSON line with what only it knows
(the engine's event loop, request-steps). A sweep case is `specsim sweep --jobs 2` into a fresh
folder, timed from outside, its CPU time and peak memory those of its processes. Either runs in
any checkout of the project (`--vs`): the command runs there, with that checkout's code.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

MB = 1e6  # the targets' unit: bytes per megabyte


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    wall_target_s: float
    engine_target_s: float | None = None
    memory_target_mb: float | None = None
    num_requests: int = 0  # a run case's requests (0: a sweep case)
    concurrency: int = 0
    workloads: tuple[str, ...] = ()  # a sweep case's workloads, swept one after the other

    @property
    def sweep(self) -> bool:
        return bool(self.workloads)


GRID = "configs/grids/paper.yaml"
GENERATED = ("generation-heavy", "balanced-chat", "summarize-heavy", "synthetic-fixed")
CASES = (
    Case("1k-c128", "sharegpt, 1,000 requests, concurrency 128", 0.8, engine_target_s=0.15, num_requests=1_000,
         concurrency=128),
    Case("100k-c128", "sharegpt, 100,000 requests, concurrency 128", 20.0, memory_target_mb=500.0,
         num_requests=100_000, concurrency=128),
    Case("2k-c1", "sharegpt, 2,000 requests, concurrency 1", 3.0, num_requests=2_000, concurrency=1),
    Case("grid", f"{GRID} on sharegpt, --jobs 2", 30.0, workloads=("sharegpt",)),
    Case("generated", f"{GRID} on {', '.join(GENERATED)}, --jobs 2, one after the other", 240.0,
         workloads=GENERATED),
)
CASE_NAMES = tuple(c.name for c in CASES)


@dataclass
class Measure:
    """One timed run of a case."""

    wall_s: float
    cpu_s: float
    peak_mb: float
    engine_s: float | None = None  # the engine's event loop (run cases)
    requests: int = 0  # requests simulated (all workloads of a sweep case's points)
    request_steps: int = 0  # requests scheduled, summed over the engine's steps (run cases)
    points: int = 0  # a sweep case's points
    extra: dict = field(default_factory=dict)

    def row(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "extra" and v is not None}


class BenchError(RuntimeError):
    """A case failed in its checkout: the message says which and why."""


HERE = Path(__file__).resolve().parents[2]  # this checkout: its bench measures the sweep cases


def measure(case: Case, checkout: Path, workload: str, policy: str) -> Measure:
    """Run `case` once with the code of `checkout`."""
    if case.sweep:  # this checkout's bench runs the sweeps, so that their rusage is theirs alone
        cmd, cwd = [sys.executable, "-m", "sim", "bench", "--child", case.name, "--checkout", str(checkout)], HERE
    else:
        cmd, cwd = [sys.executable, "-m", "sim", "bench", "--child", case.name, "--workload", workload,
                    "--policy", policy], checkout
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env={**os.environ, "PYTHONPATH": str(cwd)}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise BenchError(f"{case.name} in {checkout} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout.rstrip("\n").split("\n")[-1])
    # A checkout older than this file reports its peak in MiB only.
    peak = r["peak_bytes"] / MB if "peak_bytes" in r else r["peak_mb"] * 2 ** 20 / MB
    return Measure(wall, r["cpu_s"], peak, r.get("engine_s"), r["requests"], r.get("request_steps", 0),
                   r.get("points", 0))


def sweep_child(case: Case, checkout: Path) -> int:
    """`specsim bench --child SWEEP_CASE --checkout DIR`: the case's sweeps with DIR's code, one
    after the other into a fresh folder; one JSON line of their CPU time and peak memory."""
    points = requests = 0
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    with tempfile.TemporaryDirectory() as tmp:
        for workload in case.workloads:
            out = Path(tmp) / workload
            cmd = [sys.executable, "-m", "sim", "sweep", "--workload", workload, "--grid", GRID, "--jobs", "2",
                   "--out", str(out), "--no-progress"]
            done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
            if done.returncode:
                print(f"the {workload} sweep in {checkout} failed (exit {done.returncode}):\n{done.stderr[-2000:]}",
                      file=sys.stderr)
                return 1
            for p in (out / "points").glob("*.json"):
                rec = json.loads(p.read_text())
                points += 1
                if rec["status"] == "ok":
                    requests += rec["summary"]["num_requests"]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the sweeps and their workers
    print(json.dumps({"requests": requests, "points": points, "cpu_s": usage.ru_utime + usage.ru_stime,
                      "peak_bytes": usage.ru_maxrss * 1024}))  # the largest of them; Linux reports kilobytes
    return 0


def child(case: Case, workload: str, policy: str, profile: bool) -> int:
    """`specsim bench --child CASE`: simulate the case here and print one JSON line."""
    import cProfile
    import io
    import pstats

    from core.config import RunConfig
    from sim.runs.run import simulate_result

    cfg = RunConfig.model_validate({"workload": workload, "policy": policy, "num_requests": case.num_requests,
                                    "client": {"max_concurrency": case.concurrency}})
    prof = cProfile.Profile() if profile else None
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
                      "peak_bytes": usage.ru_maxrss * 1024, "peak_mb": usage.ru_maxrss / 1024}))
    return 0
