"""`specsim bench`: wall time and simulated steps per second of whole points (`make bench-sim`).

Speed targets: a 1,000-request point at concurrency 128 in <= 2 s and at
concurrency 1 in <= 10 s of wall time on one core. `--profile` prints the hottest
functions (cProfile) of each point. CPU time is printed beside wall time because a
busy machine inflates the latter. Last, the calibrated latency model's price of one
decode step, per call (target: under 100 us, so the engine's own work dominates a point).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from core.config import EngineConfig, RunConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.budget import served_model
from sim.latency import StepBatch
from sim.latency_factory import make_latency_model
from sim.run import simulate

TARGETS_S = {128: 2.0, 1: 10.0}  # concurrency -> wall-time target for 1,000 requests, seconds
STEP_TIME_TARGET_US = 100.0  # one decode step priced by the latency model, per call


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="qwen3.5-35b-a3b")
    p.add_argument("--policy", default="store_all")
    p.add_argument("--workload", default="synthetic-fixed")
    p.add_argument("--gmu", type=float, default=0.6)
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, nargs="+", default=sorted(TARGETS_S, reverse=True))
    p.add_argument("--profile", action="store_true", help="print the top functions by own time")


def main(args: argparse.Namespace) -> int:
    print(f"{'concurrency':>11} {'wall_s':>8} {'cpu_s':>7} {'target_s':>8} {'steps':>7} {'steps/s':>9}  sim_duration_s")
    ok = True
    for conc in args.concurrency:
        cfg = RunConfig.model_validate({
            "model": args.model, "policy": args.policy, "workload": args.workload, "num_requests": args.num_requests,
            "engine": {"gmu": args.gmu}, "client": {"max_concurrency": conc},
        })
        prof = cProfile.Profile() if args.profile else None
        t0, c0 = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        summary = simulate(cfg)
        if prof:
            prof.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        target = TARGETS_S.get(conc) if args.num_requests == 1000 else None
        ok &= target is None or wall <= target
        print(f"{conc:>11} {wall:>8.3f} {cpu:>7.3f} {target if target else '-':>8} {summary['num_steps']:>7} "
              f"{summary['num_steps'] / wall:>9.0f}  {summary['duration_s']:.2f}")
        if prof:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
            print(out.getvalue())
    per_call = step_time_us(args)
    ok &= per_call <= STEP_TIME_TARGET_US
    print(f"latency model: {per_call:.1f} us per decode step priced (target <= {STEP_TIME_TARGET_US:g} us)")
    return 0 if ok else 1


def step_time_us(args: argparse.Namespace) -> float:
    """Mean wall time of `step_time` over decode batches of 1..256 requests, 8 times, each
    at another context length (so no call repeats the one before)."""
    eng = EngineConfig(gmu=args.gmu)
    model = served_model(load_model(args.model), eng)
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
