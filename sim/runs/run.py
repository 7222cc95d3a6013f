"""`specsim run`: simulate one configuration; `simulate(cfg)` is the entry point sweeps call.

Writes `summary.json`, `requests.csv` (one row per request), `config.yaml` (the
resolved RunConfig) and, with `trace_steps`, `steps.csv` (one row per engine step:
its requests, dispatch kind and predicted time, the format of `sim.engine.step_trace`, which
`specsim calibrate replay` executes on a GPU), `step_state.csv` (per step: queue and
pool state) and `events.csv` (admissions, preemptions, finishes, rejections).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from core.batch_limits import BatchLimits, batch_limits
from core.config import ConfigError, RunConfig, hardware_names, model_names, parse_set, policy_names, read_yaml, validate
from core.files import StagedOutput, named_path
from policies import DraftTree
from sim.engine.budget import block_layout, memory_budget
from sim.engine.core import EngineResult, run_engine
from sim.engine.metrics import EVENT_COLUMNS, STEP_COLUMNS, measured, request_rows, run_warnings, summarize
from sim.engine.pool import check_one_request_fits, make_pool
from sim.engine.step_trace import write_steps
from sim.pricing.factory import make_latency_model
from sim.runs.startup_checks import check_workload, serve
from workloads import Workload, load_workload, workload_names
from workloads.arrivals import constant_arrival_times, gamma_arrival_times, trace_arrival_times

ARRIVAL_STREAM = 1  # spawn key of the arrival-time stream (acceptance streams use (seed, request_id))


def _arrivals(cfg: RunConfig, workload: Workload) -> tuple[np.ndarray | None, str]:
    """Ready times of the requests and the arrival process's name.

    A trace workload replays its own timestamps when asked to (`use_trace_arrivals`)
    or by default, when the client sets neither a request rate nor a concurrency.
    """
    c = cfg.client
    if c.use_trace_arrivals or (workload.arrival == "trace" and c.request_rate is None and c.max_concurrency is None):
        return trace_arrival_times(workload.requests, c.time_scale), "trace"
    if c.request_rate is not None and c.arrival_process == "constant":
        return constant_arrival_times(len(workload.requests), c.request_rate), "constant"
    if c.request_rate is not None:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(cfg.seed, spawn_key=(ARRIVAL_STREAM,))))
        kind = "poisson" if c.burstiness == 1.0 else "gamma"
        return gamma_arrival_times(len(workload.requests), c.request_rate, c.burstiness, rng), kind
    return None, "closed"  # all ready at t = 0: the concurrency limit alone paces them


# Every file a run may write: a rerun into the same folder removes those it does not write.
RUN_FILES = ("summary.json", "config.yaml", "requests.csv", "steps.csv", "step_state.csv", "events.csv")


def simulate(cfg: RunConfig, out_dir: Path | None = None) -> dict[str, Any]:
    """Run one configuration; return the summary (and write the result files to out_dir,
    all of them or, on any failure, none: the folder keeps the previous run's)."""
    if out_dir is None:
        return _simulate(cfg, None)[0]
    with StagedOutput(Path(out_dir), RUN_FILES) as staged:  # checks the path before the run
        summary = _simulate(cfg, staged)[0]
        staged.publish()
    return summary


def simulate_result(cfg: RunConfig) -> tuple[dict[str, Any], EngineResult]:
    """The summary and the engine's result of one configuration, writing nothing (sim.runs.bench)."""
    return _simulate(cfg, None)


def _simulate(cfg: RunConfig, staged: StagedOutput | None) -> tuple[dict[str, Any], EngineResult]:
    served = serve(cfg)
    cfg, model, hw, policy = served.cfg, served.model, served.hw, served.policy
    eng = cfg.engine
    budget = memory_budget(model, hw, eng)
    layout = block_layout(model, policy, budget.pool_bytes, eng)
    pool = make_pool(eng.allocator, model, policy, layout, budget.pool_bytes)
    check_one_request_fits(pool, model.max_model_len, str(policy.tree))
    workload = load_workload(cfg.workload, cfg.num_requests, cfg.seed, cfg.workload_overrides)
    acceptance = check_workload(served, workload)
    latency = make_latency_model(model, hw, policy, eng)
    limits = batch_limits(eng, hw, model.max_model_len)
    arrivals, arrival_kind = _arrivals(cfg, workload)
    window = (cfg.measure.warmup_fraction, cfg.measure.cooldown_fraction)
    result = run_engine(
        workload.requests, pool=pool, policy=policy, latency=latency, acceptance=acceptance,
        max_num_batched_tokens=limits.max_num_batched_tokens, max_num_seqs=limits.max_num_seqs, admission=eng.admission,
        arrivals=arrivals, max_concurrency=cfg.client.max_concurrency, trace=cfg.trace_steps,
        engine=eng, block_tokens=layout.attn_block_tokens, round_trip_s=cfg.client.round_trip_s,
        tokenize_s_per_token=cfg.client.tokenize_s_per_token, frontend=cfg.client.frontend,
    )
    summary = {
        "model": model.name, "weights": model.weights, "hardware": hw.name, "policy": cfg.policy, "tree": str(policy.tree),
        "workload": workload.name, "gmu": eng.gmu, "max_concurrency": cfg.client.max_concurrency,
        "request_rate": cfg.client.request_rate, "arrival": arrival_kind,
        "num_requests": len(workload.requests), "seed": cfg.seed,
        **summarize(result.requests, result.steps, result.duration_s, *window),
        # requests the latency statistics cover (completed or not): cfg.measure's window
        "measured_requests": len(measured(result.requests, *window)),
        "latency_source": latency.sources.summary(),
        "latency_terms": dict(latency.sources.by_term),
        "latency_notes": dict(latency.sources.notes),
        "acceptance_source": acceptance.source,
        "expected_accepted_len": acceptance.expected_len(),  # the workload default category's mean
        "allocator": pool.kind,
        "num_blocks": layout.num_blocks,
        "block_size_tokens": layout.attn_block_tokens,
        "block_bytes": layout.block_bytes,
        "state_blocks_per_group": layout.state_blocks_per_group,
        "cache_blocks_per_request": layout.cache_blocks,
        "pool_bytes": budget.pool_bytes,
        "activation_source": budget.activation_source,
        "engine_semantics": result.semantics,  # the engine behaviours used (docs/engine.md)
        "warnings": run_warnings(result.requests, *window),
    }
    if staged is not None:
        write_outputs(staged.path, cfg, summary, result)
    return summary, result


def resolved(cfg: RunConfig, result: EngineResult) -> RunConfig:
    """The run's config with the limits its engine ran with filled in (what a replay needs; set
    explicitly, they resolve to themselves in every performance mode, core.batch_limits)."""
    limits = {k: result.semantics[k] for k in BatchLimits._fields}
    return cfg.model_copy(update={"engine": cfg.engine.model_copy(update=limits)})


def _write_csv(path: Path, header: list[str] | tuple[str, ...], rows: list) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def write_outputs(out: Path, cfg: RunConfig, summary: dict[str, Any], result: EngineResult) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    rows = request_rows(result.requests)
    header = list(rows[0]) if rows else ["request_id"]
    _write_csv(out / "requests.csv", header, [[("" if v is None else v) for v in r.values()] for r in rows])
    if cfg.trace_steps:
        write_steps(out / "steps.csv", resolved(cfg, result).model_dump(mode="json"), result.steps.traced_steps())
        _write_csv(out / "step_state.csv", STEP_COLUMNS, result.steps.rows)
        _write_csv(out / "events.csv", EVENT_COLUMNS, result.steps.events)


# ----------------------------------------------------------------------------- CLI
FLAG_KEYS = {  # argparse dest -> dotted RunConfig key
    "model": "model", "hardware": "hardware", "policy": "policy", "workload": "workload",
    "gmu": "engine.gmu", "concurrency": "client.max_concurrency", "request_rate": "client.request_rate",
    "burstiness": "client.burstiness", "num_requests": "num_requests", "seed": "seed",
    "tree": "policy_overrides.draft_tree_widths", "allocator": "engine.allocator", "trace_steps": "trace_steps",
    "num_speculative_tokens": "num_speculative_tokens",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = RunConfig()
    p.add_argument("--config", type=Path, help="a YAML file of RunConfig fields, e.g. configs/run.example.yaml "
                   "(flags and --set override it; fields it leaves out keep their defaults)")
    p.add_argument("--model", help=f"one of {', '.join(model_names())} (default {d.model})")
    p.add_argument("--hardware", help=f"one of {', '.join(hardware_names())} (default {d.hardware})")
    p.add_argument("--policy", help=f"one of {', '.join(policy_names())} (default {d.policy})")
    p.add_argument("--workload", help=f"one of {', '.join(workload_names())}, or a workload YAML (default {d.workload})")
    p.add_argument("--gmu", type=float, help=f"GPU memory utilisation in (0, 1]: the share of device memory vLLM "
                   f"may use (engine.gmu; default {d.engine.gmu})")
    p.add_argument("--concurrency", type=int, help="closed loop: at most this many requests in flight "
                   "(client.max_concurrency; default: none, every request is sent at t = 0)")
    p.add_argument("--request-rate", type=float, help="open loop: requests per second (client.request_rate)")
    p.add_argument("--burstiness", type=float, help=f"Gamma shape of the arrival gaps, 1 = Poisson "
                   f"(client.burstiness; default {d.client.burstiness:g})")
    p.add_argument("--num-requests", type=int, help=f"requests to sample from the workload (default {d.num_requests})")
    p.add_argument("--seed", type=int, help=f"seed of the request sample, arrivals and accepted lengths (default {d.seed})")
    p.add_argument("--num-speculative-tokens", type=int, help="vLLM's num_speculative_tokens: 0 = no speculative "
                   "decoding (the same as --policy none); K > 0 = K MTP drafts per step on a chain of K "
                   "(default: the model's mtp_depth and the policy's tree)")
    p.add_argument("--tree", help="draft tree widths per depth, e.g. 1,1,1 or 3,3,3 (default: the policy's, 1,1,1)")
    p.add_argument("--allocator", choices=["paged", "ideal"], help="paged: vLLM's hybrid block pool; ideal: "
                   f"byte-exact, no block rounding (engine.allocator; default {d.engine.allocator})")
    p.add_argument("--trace-steps", action="store_true", default=None, help="also write steps.csv and events.csv")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any RunConfig field by dotted key, e.g. engine.admission=first_chunk or "
                        "workload_overrides.path=FILE (repeatable)")
    p.add_argument("--out", help="directory for summary.json, requests.csv and config.yaml "
                   "(default: none; without --out nothing is written, the summary is only printed)")


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: {p!r} is not a section (it holds {nxt!r})")
        node = nxt
    node[parts[-1]] = value


def build_config(args: argparse.Namespace) -> RunConfig:
    if args.config and not args.config.is_file():
        raise ConfigError(f"--config {args.config}: no such file (configs/run.example.yaml is an example to copy)")
    data: dict[str, Any] = read_yaml(args.config) if args.config else {}
    sources = [str(args.config)] if args.config else []
    for dest, key in FLAG_KEYS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest == "tree":
            try:
                value = list(DraftTree.parse(value).widths)
            except ValueError as e:
                raise ConfigError(f"--tree: {e}") from None
        _set_dotted(data, key, value)
    for item in args.set:
        _set_dotted(data, *parse_set(item))
        sources.append(f"--set {item}")
    return validate(RunConfig, data, " + ".join(["run configuration", *sources]))


def main(args: argparse.Namespace) -> int:
    out = named_path(args.out)
    cfg = build_config(args)
    summary = simulate(cfg, out)
    keys = ("completed", "rejected", "output_throughput_tok_s", "request_throughput", "ttft_mean_s", "ttft_p99_s",
            "tpot_mean_s", "e2e_mean_s", "peak_kv_usage", "mean_kv_usage", "preemptions", "waited_for_memory",
            "mean_accepted_len", "num_steps", "latency_source")
    width = max(map(len, keys))
    for k in keys:
        v = summary[k]
        print(f"{k:<{width}}  {v:.6g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    for warning in summary["warnings"]:
        print(f"specsim run: warning: {warning}", file=sys.stderr)
    if out is not None:
        print(f"wrote {os.fspath(out)}/summary.json, requests.csv, config.yaml"
              + (", steps.csv, step_state.csv, events.csv" if cfg.trace_steps else ""))
    else:
        print("no files written: add --out DIR to keep summary.json, requests.csv and config.yaml", file=sys.stderr)
    return 0
