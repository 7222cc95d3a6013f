"""vLLM 0.17.1's own scheduler, in lockstep with a simulated run's steps.

    python -m calibrate.scheduler.lockstep --run RUN_DIR [--run RUN_DIR ...] --out FILE.json

RUN_DIR is `specsim run --trace-steps --out RUN_DIR` (or a `specsim validate` case's config run
so): its steps.csv, requests.csv, summary.json and config.yaml. Needs vLLM 0.17.1's Python code
in an interpreter of its own, as calibrate.frontend.cost does (docs/scheduler_check.md lists
the packages); nothing of vLLM's runs on a GPU here.

The run's requests reach vLLM's `Scheduler` (`AsyncScheduler` under async scheduling) at the
times the simulator's engine got them (requests.csv `engine_s`), with their prompt lengths and
`max_tokens` = their output lengths (`ignore_eos`), over vLLM's own `KVCacheManager` on the
run's pool (its block count; the hybrid's groups made by vLLM's `get_kv_cache_groups` from the
model's layers). The calls come in the order vLLM's `EngineCore.step_with_batch_queue` makes
them with its queue of two, which is the order the simulator plans and completes its steps
(sim/engine/core.py): the plan of step k + 1 as step k starts, then step k's outputs through
`update_from_output`, one sampled token for each request whose step ends its known tokens.
Every plan vLLM makes is compared with the simulator's step: the tokens per request and the
requests preempted. The output names the steps compared, each mismatch (the first ones in
full) and the CPU time of each `schedule` and `update_from_output` call by running requests:
the host work vLLM's engine core spends on scheduling, which its GPU step must cover.
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import yaml

from calibrate.scheduler.drive import Arrival, Planned, drive
from calibrate.scheduler.vllm_setup import make_scheduler, model_output, new_request
from sim.engine.step_trace import read_steps

ROOT = Path(__file__).resolve().parents[2]
KEEP_MISMATCHES = 20  # the first mismatches written in full
TIMING_BINS = (0, 1, 8, 32, 64, 128, 256, 384, 512, 768, 1024, 2048)


class RunError(ValueError):
    """A run folder this check cannot replay; the message names the file and why."""


def load_run(run: Path) -> dict:
    for name in ("steps.csv", "requests.csv", "summary.json", "config.yaml"):
        if not (run / name).is_file():
            raise RunError(f"{run / name}: missing; write the run with `specsim run --trace-steps --out {run}`")
    summary = json.loads((run / "summary.json").read_text())
    config = yaml.safe_load((run / "config.yaml").read_text())
    if summary.get("policy") != "none":
        raise RunError(f"{run}: policy {summary.get('policy')!r}: only runs without speculation (policy none) are checked")
    if summary.get("allocator") != "paged":
        raise RunError(f"{run}: allocator {summary.get('allocator')!r}: only vLLM's paged pool is checked")
    with (run / "requests.csv").open(newline="") as f:
        requests = [r for r in csv.DictReader(f) if r["status"] != "rejected"]
    _, steps = read_steps(run / "steps.csv")
    return {"summary": summary, "config": config, "requests": requests, "steps": steps}


class VllmAdapter:
    """vLLM's scheduler behind `drive`'s calls, timing each `schedule` and `update_from_output`."""

    def __init__(self, sched, hasher) -> None:
        self.sched, self.hasher = sched, hasher
        self.timings: list[tuple[int, float, float]] = []  # (running when planned, schedule s, update s)
        self._schedule_s = 0.0
        self._running = 0

    def add(self, a: Arrival) -> None:
        self.sched.add_request(new_request(a.rid, a.prompt, a.output, a.at_s, self.hasher))

    def schedule(self, at_s: float, in_flight):
        sched = self.sched
        running = len(sched.running)
        t0 = time.perf_counter()
        out = sched.schedule()
        self._schedule_s += time.perf_counter() - t0
        self._running = max(self._running, running)
        if out.total_num_scheduled_tokens == 0:
            return None
        samples = [rid for rid in out.num_scheduled_tokens if not sched.requests[rid].is_prefill_chunk]
        planned = Planned(0, at_s, {int(r): n for r, n in out.num_scheduled_tokens.items()},
                          {int(r) for r in out.preempted_req_ids or ()})
        return (out, samples), planned

    def update(self, handle, end_s: float, following) -> None:
        out, samples = handle
        t0 = time.perf_counter()
        self.sched.update_from_output(out, model_output(out, samples))
        self.timings.append((self._running, self._schedule_s, time.perf_counter() - t0))
        self._schedule_s, self._running = 0.0, 0


def traced_plans(run: Path, steps) -> list[Planned]:
    """The simulator's plans of a traced run: each step's tokens per request, and the requests
    it preempted (events.csv logs them as the step starts)."""
    preempted: dict[float, set[int]] = {}
    with (run / "events.csv").open(newline="") as f:
        for e in csv.DictReader(f):
            if e["event"] == "preempt":
                preempted.setdefault(float(e["time_s"]), set()).add(int(e["request_id"]))
    return [Planned(k, s.time_s, {r.rid: (r.prefill or 1) for r in s.requests}, preempted.get(s.time_s, set()))
            for k, s in enumerate(steps)]


def compare(want: list[Planned], got: list[Planned]) -> list[dict]:
    """Every step whose plans differ (tokens per request or preemptions), and a missing or extra plan."""
    out = [_mismatch(w, g) for w, g in zip(want, got) if w.tokens != g.tokens or w.preempted != g.preempted]
    if len(got) != len(want):
        out.append({"step": min(len(got), len(want)), "what": f"{len(want)} steps traced, {len(got)} planned"})
    return out


def lockstep(run: Path) -> tuple[dict, dict]:
    """Replay one run through vLLM's scheduler: the comparison and timings, and the fixture that
    records vLLM's plans (tests/test_scheduler_vs_vllm.py replays it on the simulator's scheduler)."""
    data = load_run(run)
    summary, steps, config = data["summary"], data["steps"], data["config"]
    sem = summary["engine_semantics"]
    setup = {"model": config["model"], "model_overrides": config.get("model_overrides") or {},
             "engine": config["engine"], "num_blocks": summary["num_blocks"],
             "block_tokens": summary["block_size_tokens"], "max_num_seqs": sem["max_num_seqs"],
             "max_num_batched_tokens": sem["max_num_batched_tokens"],
             "async_scheduling": sem["async_scheduling"], "mamba_cache_mode": sem["mamba_cache_mode"]}
    adapter = VllmAdapter(*make_scheduler(**setup))
    arrivals = [Arrival(int(r["request_id"]), int(r["prompt_tokens"]), int(r["output_tokens"]), float(r["engine_s"]))
                for r in data["requests"]]
    starts = [s.time_s for s in steps]
    got = drive(adapter, arrivals, starts, sem["async_scheduling"])
    mismatches = compare(traced_plans(run, steps), got)
    left = [r for r in adapter.sched.requests.values() if not r.is_finished()]
    result = {"run": run.name, "model": config["model"], "requests": len(arrivals),
              "async_scheduling": sem["async_scheduling"], "mamba_cache_mode": sem["mamba_cache_mode"],
              "num_blocks": summary["num_blocks"], "steps_traced": len(steps), "steps_compared": min(len(got), len(steps)),
              "preemptions": sum(len(p.preempted) for p in got), "mismatches": len(mismatches),
              "first_mismatches": mismatches[:KEEP_MISMATCHES], "unfinished_in_vllm": len(left),
              "cpu_by_running": _timing_table(adapter.timings)}
    fixture = {"setup": setup, "arrivals": [[a.rid, a.prompt, a.output, a.at_s] for a in arrivals],
               "step_starts": starts,
               "vllm_plans": [[p.at_s, sorted(p.tokens.items()), sorted(p.preempted)] for p in got]}
    return result, fixture


def _mismatch(want: Planned, got: Planned) -> dict:
    w, g = want.tokens, got.tokens
    differ = sorted(r for r in set(w) & set(g) if w[r] != g[r])
    return {"step": want.step, "time_s": want.at_s, "traced": len(w), "vllm": len(g),
            "only_simulator": sorted(set(w) - set(g))[:10], "only_vllm": sorted(set(g) - set(w))[:10],
            "tokens_differ": {r: [w[r], g[r]] for r in differ[:10]},
            "preempted_simulator": sorted(want.preempted), "preempted_vllm": sorted(got.preempted)}


def _timing_table(timings: list[tuple[int, float, float]]) -> list[dict]:
    rows = []
    for lo, hi in zip(TIMING_BINS, TIMING_BINS[1:]):
        sel = [t for t in timings if lo <= t[0] < hi]
        if sel:
            rows.append({"running_from": lo, "running_to": hi - 1, "steps": len(sel),
                         "schedule_ms_median": 1e3 * statistics.median(t[1] for t in sel),
                         "update_ms_median": 1e3 * statistics.median(t[2] for t in sel),
                         "both_ms_p90": 1e3 * sorted(t[1] + t[2] for t in sel)[int(0.9 * (len(sel) - 1))]})
    return rows


def provenance(runs: list[Path]) -> dict:
    """Where the check ran: date, machine, packages, the repository's commit, and the runs it
    replayed by folder name (each a `specsim run --trace-steps` of a configuration the fixture or
    docs/scheduler_check.md names)."""
    versions = {}
    for p in ("vllm", "torch"):
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m calibrate.scheduler.lockstep " + " ".join(f"--run {r.name}" for r in runs),
            "commit": commit, "python": sys.version.split()[0], "machine": platform.processor() or platform.machine(),
            "packages": versions}


def _write_json(path: Path, doc: dict, indent: int | None = 1) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=indent, separators=None if indent else (",", ":")) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m calibrate.scheduler.lockstep", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, action="append", required=True, help="a `specsim run --trace-steps` folder")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--record", type=Path, help="also write each run's vLLM plans as a fixture here, "
                                               "RUN_NAME.json (tests/data/vllm_scheduler/)")
    args = p.parse_args(argv)
    prov = provenance(args.run)
    results = []
    try:
        for run in args.run:
            print(f"{run}: ...", file=sys.stderr, flush=True)
            result, fixture = lockstep(run)
            print(f"{run}: {result['steps_compared']} plans compared, {result['mismatches']} mismatches", file=sys.stderr)
            results.append(result)
            if args.record:
                args.record.mkdir(parents=True, exist_ok=True)
                _write_json(args.record / f"{run.name}.json", {"provenance": prov, **fixture}, indent=None)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _write_json(args.out, {"what": "vLLM 0.17.1's scheduler in lockstep with simulated runs (docs/scheduler_check.md)",
                           "provenance": prov, "runs": results})
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
