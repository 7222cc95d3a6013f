"""What `specsim plan` writes: plan.csv, plan.json, report.md (and, through sim.plan.figure,
plan.png / plan.pdf), each written whole or not at all."""
from __future__ import annotations

import argparse
import io
import json
import shlex
from pathlib import Path
from typing import Any

import pandas as pd

from sim.plan.dense import DenseCheck
from sim.plan.run import START_STEP, CandidateResult, PlanSettings, best, policy_best
from sim.plan.search import GROWTH, Verdict
from sim.plan.slo import format_seconds

# Why a replica of a plan for rate / replicas sees the traffic the plan probed.
SPLIT = {"poisson": "random routing of a Poisson stream gives each replica a Poisson stream of rate / replicas",
         "constant": "round-robin routing of evenly spaced requests gives each replica evenly spaced requests",
         "trace": "each replica is assumed to see the trace's pattern at rate / replicas (a time-scaled copy)"}
# Run-summary fields shown at each configuration's capacity besides its SLO metrics.
AT_CAPACITY = ("request_throughput", "output_throughput_tok_s", "peak_kv_usage", "preemptions", "mean_accepted_len")


def row(r: CandidateResult, settings: PlanSettings, rate: float | None) -> dict[str, Any]:
    c, at = r.candidate, r.at_capacity
    out: dict[str, Any] = {
        "policy": c.policy, "tree": c.tree_label, "gmu": c.gmu, "max_num_seqs": c.max_num_seqs,
        "max_num_batched_tokens": c.max_num_batched_tokens, "status": r.status,
        "capacity_rps": r.capacity, "gpus_per_replica": r.gpus, "capacity_rps_per_gpu": r.capacity / r.gpus,
        "failing_rate_rps": r.failing_rate, "binding_slo": r.binding,
    }
    for slo in settings.slos:
        out[f"{slo.name}_s"] = slo.value(at.summary) if at else None
    for key in AT_CAPACITY:
        out[key] = at.summary.get(key) if at else None
    out["steady_at_capacity"] = at.steady if at else None
    # How many request lifetimes the longest run at capacity spans: a steady state needs many
    e2e = at.summary.get("e2e_mean_s") if at else None
    out["run_span_over_e2e"] = at.num_requests / at.rate / e2e if e2e else None
    out["probes"] = len(r.verdicts)
    if rate is not None:
        replicas = r.replicas_for(rate)
        out["replicas_needed"] = replicas
        out["gpus_needed"] = replicas * r.gpus if replicas else None
    out["note"] = r.error or (at.note if at else "")
    return out


def _verdict(v: Verdict, settings: PlanSettings) -> dict[str, Any]:
    return {"rate_rps": v.rate, "met": v.met, "steady": v.steady, "num_requests": v.num_requests, "lengths": v.lengths, "cut": v.cut,
            "violated": list(v.violated), "note": v.note,
            "metrics_s": {s.name: s.value(v.summary) for s in settings.slos}}


def plan_command(args: argparse.Namespace, out: Path) -> str:
    """The plan's command with every choice spelled out, for report.md and plan.json."""
    parts = ["specsim", "plan", "--workload", args.workload, "--model", args.model, "--hardware", args.hardware]
    for slo in args.slo:
        parts += ["--slo", slo]
    for flag, values in (("--policy", args.policy), ("--tree", args.tree), ("--gmu", args.gmu),
                         ("--max-num-seqs", args.max_num_seqs), ("--max-num-batched-tokens", args.max_num_batched_tokens)):
        if values:
            parts += [flag, *map(str, values)]
    for flag, value in (("--rate", args.rate), ("--tolerance", args.tolerance), ("--num-requests", args.num_requests),
                        ("--max-requests", args.max_requests), ("--warmup", args.warmup), ("--cooldown", args.cooldown),
                        ("--stability", args.stability), ("--start-rate", args.start_rate),
                        ("--min-rate", args.min_rate), ("--max-rate", args.max_rate), ("--arrivals", args.arrivals),
                        ("--burstiness", args.burstiness), ("--seed", args.seed)):
        if value is not None:
            parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    for item in args.set:
        parts += ["--set", item]
    parts += ["--dense-check"] if args.dense_check else []
    parts += ["--out", str(out)]
    return shlex.join(parts)


def write_outputs(folder: Path, out: Path, results: list[CandidateResult], settings: PlanSettings,
                  args: argparse.Namespace, dense: DenseCheck | None, provenance: dict[str, Any]) -> None:
    """Write the plan's files into `folder` (a staging folder for `out`, the plan's --out);
    `provenance`: code version, git commit, executor, wall times and run counts, for plan.json."""
    from sim.plan.figure import draw

    rows = [row(r, settings, args.rate) for r in results]
    buf = io.StringIO()
    pd.DataFrame(rows).to_csv(buf, index=False, float_format="%.6g")
    (folder / "plan.csv").write_text(buf.getvalue())
    doc = {
        "command": plan_command(args, out), **provenance,
        "workload": settings.workload, "model": args.model, "hardware": args.hardware,
        "slos": [{"name": s.name, "summary_field": s.key, "bound_s": s.bound_s} for s in settings.slos],
        "target_rate_rps": args.rate,
        "search": {"tolerance": settings.tolerance, "num_requests": settings.num_requests,
                   "max_requests": settings.max_requests, "warmup_fraction": args.warmup,
                   "cooldown_fraction": args.cooldown, "stability": settings.stability,
                   "start_rate_rps": settings.start_rate, "min_rate_rps": settings.min_rate,
                   "max_rate_rps": settings.max_rate, "arrivals": settings.arrivals},
        "best": best(results).candidate.label,
        "candidates": [{**rw, "label": r.candidate.label, "probes": [_verdict(v, settings) for v in r.verdicts]}
                       for rw, r in zip(rows, results)],
    }
    if dense:
        doc["dense_check"] = {"candidate": dense.candidate, "plan_capacity_rps": dense.plan_capacity,
                              "dense_capacity_rps": dense.dense_capacity, "agrees": dense.agrees,
                              "probes": [_verdict(v, settings) for v in dense.verdicts]}
    (folder / "plan.json").write_text(json.dumps(doc, indent=1) + "\n")
    draw(results, settings, folder, f"{args.model} on {args.hardware}, {settings.workload}")
    (folder / "report.md").write_text(report(results, rows, settings, args, dense, doc["command"]))


def _gpus_sentence(r: CandidateResult, rate: float | None) -> str:
    c = r.candidate
    where = f"gmu {c.gmu:g}, max_num_seqs {c.max_num_seqs}, max_num_batched_tokens {c.max_num_batched_tokens}"
    where = (f"tree {c.tree_label}, " if c.tree else "") + where
    if r.status == "none_met":
        return f"**{c.policy}** meets the SLOs at no rate tried (down to {r.failing_rate:g} req/s) in any configuration."
    if r.status in ("infeasible", "failed"):
        return f"**{c.policy}** could not run ({r.status}: {r.error})."
    per_gpu = r.capacity / r.gpus
    limit = (f"beyond it {r.binding} breaks" if r.binding else
             f"every SLO still holds at --max-rate {r.search.max_rate:g} req/s")
    gpus = "" if r.gpus == 1 else f" ({r.gpus} GPUs per replica)"
    if rate is None:
        return (f"**{c.policy}** sustains {per_gpu:.4g} req/s per GPU{gpus} at best ({where}); {limit}.")
    replicas = r.replicas_for(rate)
    return (f"**{c.policy}** needs {replicas * r.gpus} GPUs ({replicas} data-parallel replicas{gpus}) for "
            f"{rate:g} req/s: its best configuration ({where}) sustains {per_gpu:.4g} req/s per GPU; {limit}.")


def report(results: list[CandidateResult], rows: list[dict[str, Any]], settings: PlanSettings,
           args: argparse.Namespace, dense: DenseCheck | None, command: str) -> str:
    s, rate = settings, args.rate
    top = best(results)
    lines = [f"# Capacity plan: {args.model} on {args.hardware}, {s.workload}", "",
             f"SLOs: {', '.join(map(str, s.slos))}. Arrivals: {s.arrivals}"
             + (f" (burstiness {args.burstiness:g})" if s.arrivals == "poisson" and args.burstiness != 1 else "")
             + (f". Target load: {rate:g} req/s." if rate is not None else "."), ""]
    if top.capacity > 0:
        gpus = f"; {rate:g} req/s needs {top.replicas_for(rate) * top.gpus} GPUs" if rate is not None else ""
        lines += [f"**Best overall: {top.candidate.label}**, {top.capacity / top.gpus:.4g} req/s per GPU{gpus}.", ""]
    lines += ["## Per policy (its best configuration)", ""]
    lines += [f"- {_gpus_sentence(r, rate)}" for r in policy_best(results)]
    lines += ["", "## Every configuration", "", _markdown(rows, s), ""]
    start = (f"{s.start_rate:g} req/s, by a factor of {GROWTH:g}" if s.start_rate else
             f"its saturated throughput (one run with max_num_seqs requests always in flight), by a factor of "
             f"{START_STEP:g}")
    lines += ["## How capacity is decided", "",
              f"A configuration's capacity is the highest request rate, per data-parallel replica, at which every SLO "
              f"holds, found by raising or lowering the rate from {start} that squares at each step, until one rate passes and one "
              f"fails, then bisecting (geometric midpoints) until (failing - passing) / passing <= {s.tolerance:g}. "
              f"Each probe runs the configuration at {s.num_requests} requests; a run that already breaks an SLO by "
              f"more than {s.stability:g} x its bound fails the probe, otherwise it also runs {2 * s.num_requests}; the latency "
              f"metrics leave out the first {args.warmup:.0%} and last {args.cooldown:.0%} of arrivals (an empty engine "
              f"at the start, a draining one at the end). A probe is steady when every SLO metric moves by at most "
              f"{s.stability:g} x its bound between the two lengths; otherwise it doubles the longer run, up to "
              f"{s.max_requests} requests. The verdict is the longest run's; a probe whose metric is still growing at "
              f"{s.max_requests} requests fails (its queue has no steady state). A target load splits evenly over "
              f"replicas: {SPLIT[s.arrivals]}.", ""]
    verdicts = [v for r in results for v in r.verdicts]
    cut = sum(1 for v in verdicts if v.cut)
    unsteady = sum(1 for v in verdicts if not v.cut and not v.steady)
    spans = [rw["run_span_over_e2e"] for rw in rows if rw["run_span_over_e2e"]]
    lines += [f"{len(verdicts)} probes: {cut} failed on a run over an SLO by more than the margin, {unsteady} of "
              f"the others were not steady at their longest run (plan.json lists each with its note)."
              + (f" At capacity the longest run's arrivals span {min(spans):.0f} to {max(spans):.0f} mean E2E latencies "
                 "(run_span_over_e2e)." if spans else ""), ""]
    if dense:
        lines += ["## Dense check", "",
                  f"{dense.candidate} probed at {len(dense.rates)} rates from {dense.rates[0]:g} to "
                  f"{dense.rates[-1]:g} req/s (steps of 1 + {s.tolerance:g}): the highest rate below which every "
                  f"grid rate passes is {dense.dense_capacity:.4g} req/s, the search's {dense.plan_capacity:.4g} "
                  f"req/s: {'within' if dense.agrees else 'NOT within'} the tolerance {s.tolerance:g}.", ""]
    lines += ["![capacity](plan.png)", "", "## Command", "", "```", command, "```", ""]
    return "\n".join(lines)


def _markdown(rows: list[dict[str, Any]], settings: PlanSettings) -> str:
    cols = ["policy", "tree", "gmu", "max_num_seqs", "max_num_batched_tokens", "capacity_rps_per_gpu", "binding_slo",
            *[f"{s.name}_s" for s in settings.slos], "status"]
    head = ["policy", "tree", "gmu", "max_num_seqs", "max_num_batched_tokens", "req/s per GPU", "binding SLO",
            *[f"{s.name} at capacity" for s in settings.slos], "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rw in rows:
        cells = []
        for c in cols:
            v = rw.get(c)
            if c.endswith("_s") and isinstance(v, float):
                cells.append(format_seconds(v))
            elif isinstance(v, float):
                cells.append(f"{v:.4g}")
            else:
                cells.append("" if v is None else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
