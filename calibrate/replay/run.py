"""`specsim calibrate replay`: run the steps of simulator runs on the GPU and hold the prediction against them.

For each `--steps RUN/steps.csv` (written by `specsim run --trace-steps`) the whole model
(calibrate.executor.runner) executes the traced steps, each timed as vLLM's engine sees it
(calibrate.replay.timing). Synchronous: wall time from the start of host prep to the sampled
tokens on the host, median of `--reps` runs after a warm-up run (which captures any graph it
needs). Async scheduling (the run's engine.async_scheduling, vLLM's default with MTP): the
steady state of the same step repeated, step N+1 prepared and launched while the GPU runs step N
(the period between steps' tokens on the host, every step waited for). `measured_us` is the one
the run was simulated with (the async period for runs with async scheduling), and
replay_summary.json compares the predictions against it (MEASURED; the JSON names it under
`compared_against`). Which steps: `--max-steps` shares a quota per run equally among the step
kinds it has (calibrate.replay.pick), so rare kinds (prefill-only, mixed) are not drowned by
decode steps, and the replay order interleaves the kinds, each spread over the run; the runs of
one executor take turns of INTERLEAVE_STEPS steps (calibrate.replay.group), so a drift of the
host's speed falls on every run alike. `--step-kinds` keeps only the kinds named; `--passes N`
times every picked step N times, in passes over them all, and the summary holds each step's
fastest pass against the model and reports the spread between passes (calibrate.replay.summary).
`--time-budget-s` is hard: checked before every timed run inside a step, outputs rewritten every
few seconds, and SIGALRM shortly past it interrupts whatever runs (calibrate/replay/README.md). Before
timing, a correctness check runs a mixed and a uniform-decode batch eagerly, piecewise and as a
full graph from the same GDN state (activations poisoned with NaN first) and compares the
outputs (calibrate.replay.check); then the host costs of each op are measured (host.csv,
`calibrate.tables.host`, HOST_PASSES passes, each point from its lowest pass). Torch runs on one CPU
thread (as in vLLM's workers), and a host probe (`calibrate.tables.host.HostProbe`) is taken before
every step: the summary's `host_speed` scores the steps measured at nominal host speed apart
from those of the device's slower regimes.

Writes under `<out>/<model>/`: replay_steps.csv (one row per step: measured, the simulator's
prediction and its terms, the old eager-sum pricing), replay_summary.json (errors per step kind
and per run), replay_check.json, host.csv, gdn_prefill_varlen.csv (calibrate.tables.varlen_prefill) and
a part in provenance.json (calibrate.replay.outputs). The runs and their repricing on the CPU
(`--summarize`) are calibrate.replay.runs'. `--smoke` runs a 2-layer model on synthetic steps of
every kind (outputs under `<out>/<model>/smoke/`).
"""
from __future__ import annotations

import gc
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Sequence

from calibrate.executor.step_layout import query_tokens
from calibrate.replay import host_speed as HS
from calibrate.replay.check import CHECK_TOLERANCE, check_modes, synthetic_steps
from calibrate.replay.group import replay_group
from calibrate.replay.outputs import read_replay_rows, write_outputs, write_side_tables
from calibrate.replay.pick import chosen_steps
from calibrate.replay.runs import Run, load_run
from calibrate.replay.timing import arm_alarm, freeze_heap
from core.config import EngineConfig, load_hardware, load_model, load_policy, policy_names

HOST_PASSES = 4  # passes of the host tables (calibrate.tables.host.lowest_pass)
HOST_RESERVE_S = 25.0 * HOST_PASSES  # seconds of the time budget kept for the host-cost measurement
VARLEN_RESERVE_S = 60.0  # seconds of the time budget kept for the gdn_prefill_varlen table (after host.csv)
# vLLM's workers run torch with one CPU thread ("Reducing Torch parallelism from N threads to 1 to
# avoid unnecessary CPU contention", vllm/utils set_multiprocessing_worker_envs, logged by the
# multiproc executor): with a pool of threads a step's small CPU ops (fla's varlen index
# building) woke spinning workers, and a replay pinned to one CPU ran steps of >= 2 prefills 2.4x
# slower (calibrate/replay/README.md).
TORCH_THREADS = 1


def kv_pool_bytes_for(runs: Sequence[Run], block_size: int, bytes_per_block: int, lookahead: int,
                      cap_bytes: int, extra: Sequence[Sequence] = ()) -> int:
    """KV bytes the busiest step needs (its requests' blocks at once), at most cap_bytes: the traced
    steps and `extra` request lists (the check's and host.csv's own batches: in a pool too small for
    them their requests share blocks, and eager and graph runs of the check no longer agree)."""
    need = 2
    for reqs in [s.requests for run in runs for s in run.steps] + list(extra):
        need = max(need, 1 + sum(-(-(r.context + query_tokens(r) + lookahead) // block_size)
                                 for r in reqs))
    return min(cap_bytes, need * bytes_per_block)


def replay(steps_paths: Sequence[Path], gpu: str, out: Path, *, smoke: bool = False, max_steps: int | None = None,
           time_budget_s: float | None = None, reps: int = 3, warmup: int = 1, mode: str = "vllm",
           kv_pool_gb: float = 24.0, host: bool = True, model_name: str | None = None,
           policy_name: str = "store_all", device: str = "cuda", commit: str | None = None,
           shapes: object | None = None, kinds: list[str] | None = None, resume: Path | None = None,
           host_only: bool = False, host_policies: Sequence[str] | None = None, pin_cpu: int | None = None,
           passes: int = 1, step_kinds: Sequence[str] | None = None, log: Callable[[str], None] = print) -> int:
    """Replay every run (or --smoke's synthetic steps); returns the exit status. `shapes` and
    `kinds` (layer types in order) override the model's (tiny CPU tests). `resume`: a previous
    replay's <out>/<model> folder, whose rows are kept (those steps are not replayed again) and
    whose provenance parts are carried over. host_only: the host tables alone (host.csv and
    host_policies.csv: no check, no varlen table, no steps). host_policies: the policy configs
    host_policies.csv measures (default: every one of the executor's step shape). pin_cpu: the
    replay's thread runs on that CPU alone (after CUDA's own threads have started elsewhere).
    passes: each picked step is measured this many times, in passes over all of an executor's
    steps (`replay_group`); step_kinds: only steps of these kinds are picked."""
    import torch

    from calibrate.device import provenance
    from calibrate.executor.runner import Executor
    from calibrate.model.shapes import LayerShapes
    from calibrate.model.weights import Weights
    from calibrate.tables import host as H
    from calibrate.tables.varlen_prefill import gdn_prefill_varlen_table
    from policies import make_policy
    from sim.engine.budget import block_layout
    from sim.engine.step_trace import step_shape

    t0 = time.perf_counter()
    hard_end = None if time_budget_s is None else t0 + time_budget_s
    hw = load_hardware(gpu)
    runs = [load_run(p) for p in steps_paths]
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("calibrate replay: no CUDA device here")
    if smoke or not runs:
        name = model_name or (runs[0].model.name if runs else "qwen3.5-35b-a3b")
        model = load_model(name)
        engine = EngineConfig(max_num_seqs=hw.max_num_seqs, max_num_batched_tokens=hw.max_num_batched_tokens)
        runs = [Run("smoke", {}, [], model, load_policy(policy_name), engine, smoke=True)]
    models = {r.model.name for r in runs}
    if len(models) > 1:
        raise SystemExit(f"calibrate replay: --steps files mix models {sorted(models)}; replay one model per call")
    model = runs[0].model
    kinds = kinds or (["gdn", "attn"] if smoke else
                      model.layer_pattern * (model.num_layers // len(model.layer_pattern)))
    mdir = out / model.name / ("smoke" if smoke else "")
    env = provenance.environment(device)
    log(f"replay {model.name} on {env['gpu']}: {len(runs)} run(s), "
        f"{sum(len(r.steps) for r in runs)} traced steps, mode {mode}{', smoke' if smoke else ''}")
    shapes = shapes or LayerShapes.from_model(model)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(TORCH_THREADS)
    try:
        with torch.inference_mode():
            tw = time.perf_counter()
            w = Weights.build(shapes, kinds, dev)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            log(f"weights: {torch.cuda.memory_allocated() / 2**30 if dev.type == 'cuda' else 0:.1f} GiB in "
                f"{time.perf_counter() - tw:.1f} s")
            if pin_cpu is not None:
                os.sched_setaffinity(0, {pin_cpu})  # this thread only: CUDA's and torch's threads keep theirs
            probe = H.HostProbe(dev)
            host_probes: dict[str, list[float]] = {}
            quota = None if max_steps is None else max(1, max_steps // len(runs))
            rows: list[dict] = read_replay_rows(resume / "replay_steps.csv") if resume else []
            resumed = list(rows)
            done = {(r["run"], int(r["step"])) for r in rows}
            for run in runs:  # only the picked steps are sized for, priced and replayed, in replay order
                run.steps = [] if host_only else chosen_steps(run, quota, done, step_kinds)
            if resume:
                log(f"resume: {len(rows)} steps kept from {resume}; {sum(len(r.steps) for r in runs)} still to replay")
            freeze_heap()
            checks: list[dict] = []
            host_rows: list[dict] = []
            policy_rows: list[dict] = []
            policy_passes: list[list[dict]] = []
            host_passes: list[list[dict]] = []
            varlen_rows: list[dict] = []
            host_policy = None
            errors_: list[str] = []
            kernels: dict = {}  # per policy: which implementation each core ran
            # One executor per step shape (engine sizes, verify positions, drafter passes, KV block): its
            # runs share the dense pieces' graphs, whatever their policies; runs of a policy are adjacent.
            groups: dict[tuple, list[Run]] = {}
            for run in sorted(runs, key=lambda r: r.policy.name):
                seqs = run.engine.max_num_seqs or hw.max_num_seqs
                tokens = run.engine.max_num_batched_tokens or hw.max_num_batched_tokens
                pol = make_policy(model, run.policy)
                key = (seqs, tokens, step_shape(model, pol, seqs, tokens, run.engine.performance_mode)[:3],
                       block_layout(model, pol, 1 << 40).attn_block_tokens)
                groups.setdefault(key, []).append(run)
            varlen = "gdn" in kinds and not smoke and not host_only
            host_reserve = ((HOST_RESERVE_S / 3 if smoke else HOST_RESERVE_S) + (VARLEN_RESERVE_S if varlen else 0.0)
                            if host and dev.type == "cuda" else 0.0)
            # Backstop past the budget plus its grace: a KeyboardInterrupt wherever it is (outputs kept).
            alarm = arm_alarm(None if time_budget_s is None else time_budget_s - (time.perf_counter() - t0))
            try:
                for gi, (key, group) in enumerate(groups.items()):
                    reserve = host_reserve if gi == 0 else 0.0  # the first executor also measures host.csv
                    left = None if time_budget_s is None else time_budget_s - reserve - (time.perf_counter() - t0)
                    if left is not None and left <= 0:
                        errors_ += [f"{run.name}: skipped, time budget spent" for run in group]
                        continue
                    first = group[0]
                    lay = block_layout(model, make_policy(model, first.policy), 1 << 40)
                    block_bytes = lay.attn_block_tokens * shapes.kv_bytes_per_token * (model.attn_layers + 1)
                    all_steps = [s for run in group for s in run.steps]
                    # At least 8k of context: the check and host.csv use their own batches.
                    max_ctx = max([8192] + [r.context + query_tokens(r) for s in all_steps
                                            for r in s.requests])
                    max_req = max((len(s.requests) for s in all_steps), default=160)
                    positions, depth, sizes = key[2]
                    kv_bytes = kv_pool_bytes_for(group, lay.attn_block_tokens, block_bytes, model.mtp_depth,
                                                 int(kv_pool_gb * 2**30),
                                                 [r for _, r in synthetic_steps(positions, depth, sizes)]) \
                        if all_steps else 4 << 30
                    ex = Executor(model, first.policy, device=dev, max_requests=max_req, max_context=max_ctx,
                                  max_num_seqs=first.engine.max_num_seqs or hw.max_num_seqs,
                                  max_num_batched_tokens=first.engine.max_num_batched_tokens or hw.max_num_batched_tokens,
                                  block_size=lay.attn_block_tokens, kv_pool_bytes=kv_bytes, mode=mode, kinds=kinds,
                                  shapes=shapes, log=log, weights=w, performance_mode=first.engine.performance_mode)
                    log(f"[executor {gi + 1}/{len(groups)}] runs {[r.name for r in group]}: block "
                        f"{lay.attn_block_tokens} tokens, {ex.num_blocks} blocks ({ex.kv_pool_bytes() / 2**30:.1f} GiB "
                        f"KV), capture sizes up to {ex.sizes[-1] if ex.sizes else 0}")
                    freeze_heap()
                    if gi == 0 and ex.graphs is not None and not host_only:
                        try:
                            checks = check_modes(ex, log)
                        except Exception as e:
                            errors_.append(f"check: {type(e).__name__}: {e}")
                            log(f"check FAILED: {traceback.format_exc()}")
                    if reserve:
                        # Before the steps, so a replay cut short still has them: the policies' verify and
                        # commit, then host.csv under vLLM's default (store_all) where replayed; HOST_PASSES
                        # passes of both, each point kept from its lowest pass (calibrate.tables.host.lowest_pass).
                        names = policy_names() if host_policies is None else host_policies
                        default = next((r.policy for r in group if r.policy.mamba_state_commit == "store_all"),
                                       group[0].policy)
                        for k in range(1 if smoke else HOST_PASSES):
                            host_probes.setdefault("host_policies", []).append(probe())
                            try:
                                policy_passes.append(H.measure_policy_host(ex, [load_policy(n) for n in names], log,
                                                                           quick=smoke))
                            except Exception as e:
                                errors_.append(f"host_policies pass {k + 1}: {type(e).__name__}: {e}")
                                log(f"host_policies FAILED: {traceback.format_exc()}")
                            host_probes["host_policies"].append(probe())
                            ex.use_policy(default)
                            host_policy = ex.policy.name
                            host_probes.setdefault("host", []).append(probe())
                            try:
                                host_passes.append(H.measure_host(ex, log, quick=smoke))
                            except Exception as e:
                                errors_.append(f"host pass {k + 1}: {type(e).__name__}: {e}")
                                log(f"host FAILED: {traceback.format_exc()}")
                            host_probes["host"].append(probe())
                            policy_rows, host_rows = H.lowest_pass(policy_passes), H.lowest_pass(host_passes)
                            write_side_tables(mdir, host_rows, [], policy_rows)
                        log(f"host probe (us per launch) before/after each pass: {host_probes}")
                        if varlen and ex.chunk_fn is not None:
                            try:
                                varlen_rows = gdn_prefill_varlen_table(ex, hw, log,
                                                                       end=time.perf_counter() + VARLEN_RESERVE_S)
                            except Exception as e:
                                errors_.append(f"gdn_prefill_varlen: {type(e).__name__}: {e}")
                                log(f"gdn_prefill_varlen FAILED: {traceback.format_exc()}")
                        write_side_tables(mdir, host_rows, varlen_rows, policy_rows)
                        left = None if time_budget_s is None else time_budget_s - (time.perf_counter() - t0)
                    end = None if left is None else time.perf_counter() + left / (len(groups) - gi)
                    if hard_end is not None:  # never past the global budget, whatever the split says
                        end = hard_end if end is None else min(end, hard_end)
                    if reserve:  # the kernels whose launches the host tables time
                        kernels.setdefault("host_tables", ex.kernel_sources())
                    if not host_only:  # no replay_steps.csv or summary to overwrite a replay's with nothing
                        replay_group(ex, group, reps, warmup, end, gpu, rows, errors_, kernels, log,
                                     on_progress=lambda: write_outputs(mdir, rows, HS.tables_probe_us(host_probes)),
                                     probe=probe, passes=passes)
                    if ex.graphs is not None:
                        log(f"[executor {gi + 1}] {len(ex.graphs)} graphs captured in {ex.graphs.capture_s:.1f} s")
                    del ex
                    gc.unfreeze()  # the executor's objects may sit in cycles: let the next collection see them
                    gc.collect()
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
            except KeyboardInterrupt:  # `timeout -s INT` or the budget's alarm: keep what was measured
                errors_.append("interrupted")
                log("interrupted: writing what was measured")
            finally:
                alarm()
    finally:
        torch.set_num_threads(prev_threads)
    if not host_only:
        write_outputs(mdir, rows, HS.tables_probe_us(host_probes))
        provenance.write(mdir / "replay_check.json", {"tolerance": CHECK_TOLERANCE, "cases": checks})
    write_side_tables(mdir, host_rows, varlen_rows, policy_rows)
    part = {**env, "git_commit": commit, "command": " ".join(sys.argv), "job": "host" if host_only else "replay",
            "mode": mode, "host_policies": sorted({r["policy"] for r in policy_rows}),
            "smoke": smoke, "runs": [r.name for r in runs], "steps_replayed": len(rows) - len(resumed),
            "steps_resumed": len(resumed), "reps": reps, "passes": passes, "step_kinds": list(step_kinds or []),
            "warmup": warmup, "kernels": kernels, "host_policy": host_policy, "errors": errors_,
            "host_probe_us": host_probes, "host_passes": len(host_passes),
            "pinned_cpu": pin_cpu, "torch_threads": TORCH_THREADS, "wall_s": round(time.perf_counter() - t0, 1)}
    part["device_time_s"] = part["wall_s"]
    prov = provenance.read(mdir / "provenance.json")
    if resume:
        old = provenance.read(resume / "provenance.json").get("parts", [])
        prov["parts"] = [p for p in old if p not in prov.get("parts", [])] + prov.get("parts", [])
    prov.setdefault("parts", []).append(part)
    provenance.write(mdir / "provenance.json", {"model": model.name, **prov})
    log(f"replay: {len(rows)} steps, {len(errors_)} problems, {part['wall_s']} s; wrote {mdir}")
    failed = any(not c["ok"] for c in checks)
    return 1 if failed or (errors_ and not (rows or host_rows or policy_rows)) else 0
