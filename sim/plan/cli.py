"""`specsim plan`: the highest request rate each configuration sustains under SLOs, and how
many GPUs a target load needs.

    specsim plan --workload sharegpt --slo ttft_p99=2s --slo tpot_mean=50ms \\
        --gmu 0.75 0.9 --max-num-seqs 128 256 --rate 100

For every candidate (policy x tree x gmu x max_num_seqs x max_num_batched_tokens) the
search (sim.plan.search) brackets and bisects the Poisson request rate, or the
workload's own arrivals time-scaled (`--arrivals trace`), to `--tolerance`; each probe
compares runs of N and 2N requests without their warm-up and cool-down requests.
Probe runs are sweep points stored under `OUT/points` (sim.runs.sweep), so a rerun resumes.
Writes plan.csv, plan.json, plan.png / plan.pdf and report.md to `--out`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from core.batch_limits import batch_limits
from core.config import REPO_ROOT, ConfigError, RunConfig, load_hardware, load_model, policy_names
from core.files import StagedOutput, named_path
from core.folder_lock import FolderLock
from policies import DraftTree
from sim.engine.budget import served_model
from sim.plan.candidates import Candidate, candidates
from sim.plan.dense import dense_check
from sim.plan.run import PlanSettings, Prepared, best, config, none_met_message, run_plan
from sim.plan.search import check_tolerance
from sim.plan.slo import parse_slos
from sim.runs.code_version import code_version
from sim.runs.grid import check_field
from sim.runs.startup_checks import check_points
from sim.runs.sweep import check_jobs, git_describe, parse_sets, run_sweep
from sim.runs.sweep_executors import connect_dask

PLAN_FILES = ("plan.csv", "plan.json", "plan.png", "plan.pdf", "report.md")
# Fields the planner sets per candidate or probe: `--set` may not fix them.
OWNED = {"policy": "--policy", "policy_overrides.draft_tree_widths": "--tree", "engine.gmu": "--gmu",
         "engine.max_num_seqs": "--max-num-seqs", "engine.max_num_batched_tokens": "--max-num-batched-tokens",
         "client.request_rate": "the search", "client.max_concurrency": "nothing (a plan is an open loop)",
         "client.use_trace_arrivals": "--arrivals", "client.arrival_process": "--arrivals", "client.time_scale": "the search", "num_requests": "--num-requests",
         "measure.warmup_fraction": "--warmup", "measure.cooldown_fraction": "--cooldown",
         "client.burstiness": "--burstiness", "seed": "--seed", "model": "--model", "hardware": "--hardware"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = RunConfig()
    p.add_argument("--workload", required=True, help="workload name (configs/workloads/) or a path to its YAML")
    p.add_argument("--slo", action="append", default=[], metavar="NAME=BOUND", required=True,
                   help="an upper bound every probe must meet, e.g. ttft_p99=2s, tpot_mean=50ms, p99_itl=200ms, "
                        "e2el_median=20s (metric ttft|tpot|itl|e2el, statistic mean|median|p90|p99, unit s|ms|us; "
                        "repeatable)")
    p.add_argument("--model", default=d.model, help="model (configs/models/)")
    p.add_argument("--hardware", default=d.hardware, help="GPU profile (configs/hardware/)")
    p.add_argument("--policy", nargs="+", default=None, help="candidate policies (default: every policy in "
                   "configs/policies/, the one that does not speculate included)")
    p.add_argument("--tree", nargs="+", default=[], help="candidate draft trees for the speculative policies, "
                   "e.g. 1,1,1 3,3,3 (default: each policy's own)")
    p.add_argument("--gmu", nargs="+", type=float, default=[d.engine.gmu], help="candidate GPU memory utilisations")
    p.add_argument("--max-num-seqs", nargs="+", type=int, default=None,
                   help="candidate max_num_seqs values (default: the hardware's)")
    p.add_argument("--max-num-batched-tokens", nargs="+", type=int, default=None,
                   help="candidate max_num_batched_tokens values (default: the hardware's)")
    p.add_argument("--rate", type=float, default=None, help="target load in requests/s: report.md says how many GPUs "
                   "(data-parallel replicas) each policy needs for it")
    p.add_argument("--tolerance", type=float, default=0.05, help="relative tolerance of each capacity: the search "
                   "stops when (lowest failing rate - highest passing rate) / highest passing <= this")
    p.add_argument("--num-requests", type=int, default=1000, help="requests of a probe's shorter run (the longer: twice)")
    p.add_argument("--max-requests", type=int, default=None, help="longest run a probe may double to before it is "
                   "judged not steady (default: 4 x --num-requests)")
    p.add_argument("--warmup", type=float, default=0.1, help="share of a run's first arrivals left out of its metrics")
    p.add_argument("--cooldown", type=float, default=0.1, help="share of a run's last arrivals left out of its metrics")
    p.add_argument("--stability", type=float, default=0.1, help="a probe is steady when each SLO metric moves by at "
                   "most this share of its bound between N and 2N requests")
    p.add_argument("--start-rate", type=float, default=None, help="first rate probed, requests/s (default: "
                   "each configuration's saturated throughput, from one run with max_num_seqs requests in flight)")
    p.add_argument("--min-rate", type=float, default=None, help="lowest rate probed (default: the start / 1024)")
    p.add_argument("--max-rate", type=float, default=None, help="highest rate probed (default: the start x 1024)")
    p.add_argument("--arrivals", choices=["poisson", "constant", "trace"], default="poisson",
                   help="poisson: Poisson arrivals at the rate (Gamma with --burstiness); constant: request i at "
                        "i / rate (guidellm's constant profile); trace: the workload's own timestamps, time-scaled "
                        "to the rate (BurstGPT, Azure traces)")
    p.add_argument("--burstiness", type=float, default=d.client.burstiness,
                   help="Gamma shape of the arrival gaps with --arrivals poisson (1 = Poisson)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the request sample, arrivals and acceptance")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="fix another RunConfig field for every probe, e.g. engine.kv_cache_dtype=fp8 (repeatable)")
    p.add_argument("--dense-check", action="store_true", help="also probe the best configuration on a rate grid of "
                   "step (1 + tolerance) from 1/1.5 to 1.5 x its capacity, and report whether the two agree")
    p.add_argument("--out", default=None, help="plan folder (default: results/plans/<workload>)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--dask-scheduler", default=None, metavar="ADDRESS", help="run probes on this Dask scheduler")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")


def _trees(texts: list[str]) -> list[tuple[int, ...]]:
    out = []
    for text in texts:
        try:
            out.append(tuple(DraftTree.parse(text).widths))
        except ValueError as e:
            raise ConfigError(f"--tree {text}: {e}") from None
    return out


def _base(args: argparse.Namespace) -> dict[str, Any]:
    base: dict[str, Any] = {"model": args.model, "hardware": args.hardware, "seed": args.seed,
                            "client.burstiness": args.burstiness, "measure.warmup_fraction": args.warmup,
                            "measure.cooldown_fraction": args.cooldown}
    if args.arrivals == "constant":
        base["client.arrival_process"] = "constant"
    for field, value in parse_sets(args.set).items():
        if field in OWNED:
            raise ConfigError(f"--set {field}: the plan sets this field; use {OWNED[field]}")
        check_field(field, "--set")
        base[field] = value
    return base


def settings_from(args: argparse.Namespace) -> PlanSettings:
    check_tolerance(args.tolerance)
    if args.num_requests < 10:
        raise ConfigError(f"--num-requests {args.num_requests}: a probe needs at least 10 requests per run")
    if args.rate is not None and args.rate <= 0:
        raise ConfigError(f"--rate {args.rate:g}: the target load must be > 0 requests/s")
    if args.arrivals != "poisson" and args.burstiness != 1.0:
        raise ConfigError(f"--burstiness {args.burstiness:g} shapes Poisson gaps; --arrivals {args.arrivals} has none")
    for flag, value in (("--start-rate", args.start_rate), ("--min-rate", args.min_rate), ("--max-rate", args.max_rate)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} {value:g}: must be > 0 requests/s")
    given = [(flag, v) for flag, v in (("--min-rate", args.min_rate), ("--start-rate", args.start_rate),
                                       ("--max-rate", args.max_rate)) if v is not None]
    for (low, a), (high, b) in zip(given, given[1:]):
        if a > b:
            raise ConfigError(f"{low} {a:g} is above {high} {b:g}: the search probes rates from --min-rate through "
                              "--start-rate to --max-rate; allowed: --min-rate <= --start-rate <= --max-rate")
    return PlanSettings(
        workload=args.workload, base=_base(args), slos=parse_slos(args.slo), tolerance=args.tolerance,
        num_requests=args.num_requests, max_requests=args.max_requests or 4 * args.num_requests,
        stability=args.stability, start_rate=args.start_rate, min_rate=args.min_rate, max_rate=args.max_rate,
        arrivals=args.arrivals)


def candidates_from(args: argparse.Namespace, settings: PlanSettings) -> list[Candidate]:
    # Unset, each limit is vLLM's default under the fixed engine settings (its performance mode).
    base = config(settings, {}, "the plan's fixed settings")
    hw = load_hardware(base.hardware)
    model = served_model(load_model(base.model, base.model_overrides), base.engine)
    limits = batch_limits(base.engine, hw, model.max_model_len)
    return candidates(args.policy or policy_names(), _trees(args.tree), args.gmu,
                      args.max_num_seqs or [limits.max_num_seqs],
                      args.max_num_batched_tokens or [limits.max_num_batched_tokens])


def main(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    cands = candidates_from(args, settings)
    out = named_path(args.out) or REPO_ROOT / "results" / "plans" / Path(args.workload).stem
    check_points([config(settings, {**c.assignment(), "num_requests": settings.num_requests}, f"plan candidate {c.label}")
                  for c in cands], [f"plan candidate {c.label}" for c in cands])
    check_jobs(args.jobs)
    slots = args.jobs or os.cpu_count() or 1
    if args.dask_scheduler:  # fail on a bad address before any work
        client = connect_dask(args.dask_scheduler)
        slots = sum(client.nthreads().values()) or 1
        client.close()
    # The outputs are staged and published together; the folder is locked, so that two plans
    # never write its points and outputs at once.
    with FolderLock(out), StagedOutput(out, PLAN_FILES) as staged:
        return _plan_into(args, settings, cands, out, slots, staged)


def _plan_into(args: argparse.Namespace, settings: PlanSettings, cands: list[Candidate], out: Path, slots: int,
               staged: StagedOutput) -> int:
    from sim.plan.output import write_outputs

    prepare = Prepared()
    # Each round forks a fresh pool: import the simulator here once, so workers start with it.
    import sim.runs.run  # noqa: F401
    progress = not args.no_progress
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else (lambda line: None)
    tally = {"ran": 0, "cached": 0}
    start = time.perf_counter()

    def evaluate(configs: list[RunConfig]) -> list[dict[str, Any]]:
        # a bar per round on a terminal; in a log, the round's one line is enough
        result = run_sweep(configs, out, jobs=args.jobs, dask_scheduler=args.dask_scheduler, prepare=prepare,
                           progress=progress and sys.stderr.isatty())
        tally["ran"] += result.ran
        tally["cached"] += result.cached
        log(f"plan:   {result.ran} run, {result.cached} cached, in {result.wall_s:.1f} s")
        return result.records

    prepare([config(settings, {"num_requests": settings.num_requests}, "--workload")])  # a bad workload fails first
    results = run_plan(cands, settings, evaluate, log, slots)
    searched = [r for r in results if r.status in ("found", "above_max", "none_met")]
    if not searched:  # every candidate infeasible or failed: nothing to plan with
        first = results[0]
        raise ConfigError(f"no candidate could run; {first.candidate.label}: {first.status}: {first.error}")
    if all(r.status == "none_met" for r in searched):
        raise ConfigError(f"no candidate meets the SLOs at any rate: {none_met_message(searched[0])}")
    searched_s = time.perf_counter() - start
    dense = dense_check(results, settings, evaluate, log) if args.dense_check else None
    executor = f"dask {args.dask_scheduler}" if args.dask_scheduler else f"processes x {slots}"
    provenance = {"code_version": code_version(args.hardware), "git": git_describe(), "executor": executor,
                  "search_wall_s": round(searched_s, 1), "wall_s": round(time.perf_counter() - start, 1),
                  "runs": tally["ran"], "cached_runs": tally["cached"]}
    write_outputs(staged.path, out, results, settings, args, dense, provenance)
    staged.publish()
    top = best(results)
    print(f"best: {top.candidate.label}: {top.capacity / top.gpus:.4g} req/s per GPU\n"
          f"wrote {out / 'plan.csv'}, plan.json, plan.png, plan.pdf, report.md", file=sys.stderr)
    return 0
