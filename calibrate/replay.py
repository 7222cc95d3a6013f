"""`specsim calibrate replay`: run the steps of simulator runs on the GPU and hold the prediction against them.

For each `--steps RUN/steps.csv` (written by `specsim run --trace-steps`) the whole
model (calibrate.executor) executes the traced steps, each timed as vLLM's engine
sees it. Synchronous: wall time from the start of host prep to the sampled tokens on
the host, median of `--reps` runs after a warm-up run (which captures any graph it
needs). Async scheduling (the run's engine.async_scheduling, vLLM's default with MTP):
the steady state of the same step repeated, step N+1 prepared and launched while the
GPU runs step N (the period between steps' tokens on the host, every step waited for).
`measured_us` is the one the run was simulated with (the async period for runs with async
scheduling), and replay_summary.json compares the predictions against it (MEASURED; the JSON
names it under `compared_against`). Which steps: `--max-steps` shares a quota per run equally
among the step kinds it has (`pick`), so rare kinds (prefill-only, mixed) are not drowned by
decode steps, and the replay order interleaves the kinds, each spread over the run; the runs
of one executor take turns of INTERLEAVE_STEPS steps, so a drift of the host's speed falls on
every run alike. `--step-kinds` keeps only the kinds named; `--passes N` times every picked step
N times, in passes over them all, and the summary holds each step's fastest pass against the
model (`fastest_passes`) and reports the spread between passes (`pass_spread`).
`--time-budget-s` is hard: checked before every timed run inside a step, outputs rewritten
every few seconds, and SIGALRM shortly past it interrupts whatever runs (calibrate/REPLAY.md).
Before timing, a correctness check runs a mixed and a uniform-decode batch eagerly,
piecewise and as a full graph from the same GDN state (activations poisoned with NaN
first) and compares the outputs; then the host costs of each op are measured
(host.csv, `calibrate.host`, HOST_PASSES passes, each point from its lowest pass). Torch runs
on one CPU thread (as in vLLM's workers), and a host probe (`calibrate.host.HostProbe`) is taken
before every step: the summary's `host_speed` scores the steps measured at nominal host speed
apart from those of the device's slower regimes.

Writes under `<out>/<model>/`: replay_steps.csv (one row per step: measured, the
simulator's prediction and its terms, the old eager-sum pricing), replay_summary.json
(errors per step kind and per run), replay_check.json, host.csv, gdn_prefill_varlen.csv
(calibrate.varlen_prefill) and a part in provenance.json. `--smoke` runs a 2-layer model
on synthetic steps of every kind (outputs under `<out>/<model>/smoke/`).
"""
from __future__ import annotations

import csv
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from core.config import EngineConfig, ModelConfig, PolicyConfig, load_hardware, load_model, load_policy, policy_names
from core.files import atomic_write_text
from calibrate import host_speed as HS
from calibrate.replay_summary import (  # noqa: F401 (the summary API, re-exported)
    SUMMARY_KINDS, MEASURED, MEASURED_NOTE, NOMINAL_TOLERANCE, PROBE_REF_QUANTILE,
    errors, per_kind, fastest_passes, pass_spread, summarize, repeatability,
    probe_ref, nominal_rows, host_speed, _num, _quantile, _sum_error)

BASE_COLUMNS = ("run", "step", "kind", "mode", "tokens", "padded_tokens", "requests", "decodes", "prefills",
                "context_tokens", "measured_us", "measured_sync_us", "measured_async_us", "measured_sync_min_us",
                "measured_sync_max_us", "reps", "pass", "host_probe_us", "predicted_us",
                "old_predicted_us")
HOST_PASSES = 4  # passes of the host tables (calibrate.host.lowest_pass)
HOST_RESERVE_S = 25.0 * HOST_PASSES  # seconds of the time budget kept for the host-cost measurement
PROGRESS_S = 5.0  # replay_steps.csv and the summary are rewritten at least this often
ALARM_GRACE_S = 15.0  # past the budget by this much, SIGALRM interrupts whatever runs (graph capture included)
VARLEN_RESERVE_S = 60.0  # seconds of the time budget kept for the gdn_prefill_varlen table (after host.csv)
CHECK_TOLERANCE = 2e-2  # relative L2 between modes: bf16 rounding differs with the padded GEMM shapes
# vLLM's workers run torch with one CPU thread ("Reducing Torch parallelism from N threads to 1 to
# avoid unnecessary CPU contention", vllm/utils set_multiprocessing_worker_envs, logged by the
# multiproc executor): with a pool of threads a step's small CPU ops (fla's varlen index
# building) woke spinning workers, and a replay pinned to one CPU ran steps of >= 2 prefills 2.4x
# slower (calibrate/REPLAY.md).
TORCH_THREADS = 1
INTERLEAVE_STEPS = 8  # steps of one run per turn (take_turns)
ASYNC_STEPS = 4  # pipelined steps per async timing of a short step: the period over 3 intervals
ASYNC_WORK_S = 0.15  # a longer step gets fewer pipelined steps (at least 2: one interval of >= 75 ms)


def async_steps(sync_us: float) -> int:
    """Pipelined steps for the async timing of a step whose synchronous time is sync_us: about
    ASYNC_WORK_S of steps, between 2 and ASYNC_STEPS (long mixed steps cost the budget most)."""
    return max(2, min(ASYNC_STEPS, round(ASYNC_WORK_S * 1e6 / max(sync_us, 1.0))))


# ------------------------------------------------------------------ summaries (pure Python)
def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: (round(v, 3) if isinstance(v, float) else v) for c, v in r.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())


def read_replay_rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            if k not in ("run", "kind", "mode"):
                r[k] = (int(v) if v.lstrip("-").isdigit() else float(v)) if v not in ("", None) else math.nan
    return rows


def sample(n_steps: int, quota: int | None) -> list[int]:
    """Indices of at most `quota` of n_steps, evenly spread over the run (first and last kept)."""
    if quota is None or quota >= n_steps:
        return list(range(n_steps))
    if quota <= 1:
        return [0][:quota]
    return sorted({round(i * (n_steps - 1) / (quota - 1)) for i in range(quota)})


def pick(kinds: Sequence[str], quota: int | None) -> list[int]:
    """Indices of at most `quota` of a run's steps (every step without a quota), in replay order.

    The quota is shared equally among the step kinds present, smallest kind first (a kind with
    fewer steps than its share leaves the rest to the others); each kind's steps are spread evenly
    over the run (`sample`). The order interleaves the kinds in proportion to their counts, each
    in van der Corput order (`spread_order`), so a replay cut short still has every kind, each
    from the run's start, middle and end."""
    by: dict[str, list[int]] = {}
    for i, k in enumerate(kinds):
        by.setdefault(k, []).append(i)
    left = len(kinds) if quota is None else min(quota, len(kinds))
    todo = sorted(by, key=lambda k: (len(by[k]), k))
    keyed: list[tuple[float, int]] = []
    for j, k in enumerate(todo):
        share = min(len(by[k]), left // (len(todo) - j))
        left -= share
        chosen = [by[k][i] for i in sample(len(by[k]), share)]
        keyed += [((r + 0.5) / len(chosen), chosen[i]) for r, i in enumerate(spread_order(len(chosen)))]
    return [i for _, i in sorted(keyed)]


def chosen_steps(run: Run, quota: int | None, done: set[tuple[str, int]],
                 step_kinds: Sequence[str] | None = None) -> list:
    """The run's steps to replay, in replay order: those of `step_kinds` (every kind by default),
    `pick`ed under `quota`, less those already measured (`done`: (run, step) of resumed rows)."""
    steps = [s for s in run.steps if step_kinds is None or s.kind in step_kinds]
    return [steps[i] for i in pick([s.kind for s in steps], quota) if (run.name, steps[i].step) not in done]


def spread_order(n: int) -> list[int]:
    """0..n-1 in van der Corput order: every prefix is spread over the whole run, so a replay
    cut short by its time budget still samples the run's start, middle and end."""
    order: list[int] = []
    seen: set[int] = set()
    k = 0
    while len(order) < n:
        x, f, j = 0.0, 0.5, k
        while j:
            x += f * (j & 1)
            j >>= 1
            f /= 2
        i = int(x * n)
        if i not in seen:
            seen.add(i)
            order.append(i)
        k += 1
    return order


def flushes(step: object) -> bool:
    """The replay kernels flush a whole batch or none: flush when most speculating requests do."""
    spec = [r for r in step.requests if r.prefill == 0 and r.tree]
    return bool(spec) and 2 * sum(r.flush for r in spec) >= len(spec)


# ------------------------------------------------------------------ runs
@dataclass
class Run:
    name: str
    meta: dict
    steps: list  # sim.step_trace.TracedStep
    model: ModelConfig
    policy: PolicyConfig
    engine: EngineConfig
    smoke: bool = False  # --smoke: synthetic steps of every kind instead of traced ones


def load_run(path: Path) -> Run:
    from sim.step_trace import read_steps

    meta, steps = read_steps(path)
    model = load_model(meta["model"])
    policy = load_policy(meta["policy"], meta.get("policy_overrides") or None)
    engine = EngineConfig(**meta.get("engine", {}))
    return Run(path.parent.name, meta, steps, model, policy, engine)


def old_pricer(run: Run, hw_name: str, log: Callable[[str], None]) -> Callable[[object], float] | None:
    """The simulator's old eager-sum pricing of a traced step (us), if the simulator still offers it."""
    try:
        from policies import make_policy
        from sim.latency_factory import make_latency_model
        from sim.step_trace import batch_of

        engine = run.engine.model_copy(update={"latency_pricing": "eager_sum"})
        pol = make_policy(run.model, run.policy)
        lat = make_latency_model(run.model, load_hardware(hw_name), pol, engine)
        return lambda step: lat.step_time(batch_of(step, run.model, pol, engine)).total_s * 1e6
    except Exception as e:  # the old pricing is a comparison only: go on without it
        log(f"  old eager-sum pricing unavailable ({type(e).__name__}: {e})")
        return None


def reprice(rows: list[dict], runs: dict[str, Run], hw_name: str, log: Callable[[str], None]) -> None:
    """Recompute predicted_us (the run's own pricing, today's tables) and old_predicted_us in place (CPU)."""
    from policies import make_policy
    from sim.latency_factory import make_latency_model
    from sim.step_trace import batch_of

    for name, run in runs.items():
        pol = make_policy(run.model, run.policy)
        lat = make_latency_model(run.model, load_hardware(hw_name), pol, run.engine)
        old = old_pricer(run, hw_name, log)
        by_step = {s.step: s for s in run.steps}
        for r in rows:
            if r["run"] == name and int(r["step"]) in by_step:
                s = by_step[int(r["step"])]
                t = lat.step_time(batch_of(s, run.model, pol, run.engine))
                r["predicted_us"] = t.total_s * 1e6
                for k, v in t.terms.items():
                    r[f"pred_{k}"] = v * 1e6
                if old is not None:
                    r["old_predicted_us"] = old(s)


# ------------------------------------------------------------------ GPU side
class BudgetSpent(Exception):
    """The replay's time budget ran out inside a step (the step is dropped, outputs are kept)."""


def check_deadline(end: float | None) -> None:
    if end is not None and time.perf_counter() > end:
        raise BudgetSpent("time budget spent inside a step")


def time_step(ex: object, reqs: Sequence, flush: bool, reps: int, warmup: int,
              end: float | None = None) -> tuple[list[float], object]:
    """Wall times (us) of `reps` runs of one step, each from host prep to tokens on the host.
    Checks the deadline `end` before every run (BudgetSpent)."""
    for _ in range(warmup):
        check_deadline(end)
        out = ex.run(reqs, flush)
    ts = []
    gc_was = gc.isenabled()
    gc.disable()  # a collection inside a timed step is noise vLLM does not have (it freezes its heap)
    try:
        for _ in range(reps):
            check_deadline(end)
            t0 = time.perf_counter()
            out = ex.run(reqs, flush)
            ts.append((time.perf_counter() - t0) * 1e6)
    finally:
        if gc_was:
            gc.enable()
    return ts, out


def time_step_async(ex: object, reqs: Sequence, flush: bool, steps: int, end: float | None = None) -> float:
    """Wall time (us) per step in vLLM's async scheduling steady state: the host prepares and
    launches step N+1 while the GPU runs step N, then waits for step N's tokens.

    The period between consecutive steps' tokens reaching the host (`finish` returning), over
    max(steps, 2) pipelined steps: max(host prep + launch, GPU time) in steady
    state; every launched step is waited for. (The
    version before this one timed one prepare/launch/finish after a gc.collect() during which the
    previous step's GPU work had already finished, and never waited for the step it launched:
    it measured the host launch alone, ~3 ms for every full-graph step.)"""
    k = max(steps, 2)  # at least one interval
    gc_was = gc.isenabled()
    gc.disable()
    try:
        check_deadline(end)
        st = ex.prepare(reqs, flush)
        ex.launch(st)
        done: list[float] = []
        for _ in range(k):
            check_deadline(end)
            nxt = ex.prepare(reqs, flush)
            ex.launch(nxt)
            ex.finish(st)
            done.append(time.perf_counter())
            st = nxt
        ex.finish(st)  # waited for, untimed: no next step is prepared behind it
    finally:
        if gc_was:
            gc.enable()
    # Intervals between tokens on the host, each with the next step's prep and launch inside
    # it; the first finish opens the first interval (its step started from an idle GPU).
    return (done[-1] - done[0]) * 1e6 / (len(done) - 1)


def synthetic_steps(positions: int, depth: int, sizes: Sequence[int]) -> list[tuple[str, list]]:
    """Steps of every kind for --smoke and the correctness check (TracedRequest rows)."""
    from sim.step_trace import TracedRequest as R

    tree = (1,) * depth if depth else ()
    acc = min(3, positions)

    def dec(rid: int, ctx: int) -> R:
        return R(rid, 0, ctx, tree, acc)
    top = sizes[-1] if sizes else 64
    return [
        ("uniform_decode", [dec(i, 300 + 37 * i) for i in range(3)]),
        ("uniform_decode", [dec(i, 1000 + 11 * i) for i in range(32)]),
        ("uniform_decode", [dec(i, 2000 + 5 * i) for i in range(max(1, top // max(1, positions)))]),
        ("mixed_graph", [dec(i, 500 + i) for i in range(3)] + [R(10, 37, 0, (), 0)]),
        ("mixed_graph", [dec(i, 800 + i) for i in range(16)] + [R(20, 100, 600, (), 0), R(21, 64, 0, (), 0)]),
        ("mixed_eager", [dec(i, 900 + i) for i in range(32)] + [R(30, 2048, 1024, (), 0)]),
        ("prefill_only", [R(40, 200, 0, (), 0)]),
        ("prefill_only", [R(41, 4096, 0, (), 0), R(42, 1000, 3000, (), 0)]),
    ]


def check_modes(ex: object, log: Callable[[str], None]) -> list[dict]:
    """Eager vs piecewise vs full graph on the same batches from the same state: outputs must agree."""
    import torch

    results = []
    cases = synthetic_steps(ex.positions, ex.depth, ex.sizes)
    for kind, reqs in (cases[0], cases[3]):
        saved = ex.snapshot(len(reqs) + 1)
        ref = None
        for mode in ("eager", "vllm"):
            ex.run(reqs, mode=mode)  # captures its graphs: their warm-up commits, so restore after
            n = sum(r.prefill or ex_positions(r) for r in reqs)
            ex.restore(saved)
            ex.poison(n)
            out = ex.run(reqs, mode=mode)
            x = ex.x[:n].float().clone()
            row = {"kind": kind, "mode": mode, "executed": out.mode, "finite": bool(torch.isfinite(x).all())}
            if ref is None:
                ref = (x, out.tokens)
            else:
                row["rel_err"] = float((x - ref[0]).norm() / ref[0].norm().clamp_min(1e-30))
                row["tokens_equal"] = round(sum(a == b for a, b in zip(out.tokens, ref[1])) / len(ref[1]), 3)
            row["ok"] = row["finite"] and row.get("rel_err", 0.0) <= CHECK_TOLERANCE
            results.append(row)
            log(f"  check {kind} {mode} ({out.mode}): finite {row['finite']}, rel err {row.get('rel_err', 0):.2e}, "
                f"tokens equal {row.get('tokens_equal', 1.0):.3f}{'' if row['ok'] else '  FAILED'}")
        ex.restore(saved)
    return results


def ex_positions(r: object) -> int:
    from calibrate.executor import verify_positions

    return verify_positions(tuple(r.tree))


def kv_pool_bytes_for(runs: Sequence[Run], block_size: int, bytes_per_block: int, lookahead: int,
                      cap_bytes: int, extra: Sequence[Sequence] = ()) -> int:
    """KV bytes the busiest step needs (its requests' blocks at once), at most cap_bytes: the traced
    steps and `extra` request lists (the check's and host.csv's own batches: in a pool too small for
    them their requests share blocks, and eager and graph runs of the check no longer agree)."""
    need = 2
    for reqs in [s.requests for run in runs for s in run.steps] + list(extra):
        need = max(need, 1 + sum(-(-(r.context + (r.prefill or ex_positions(r)) + lookahead) // block_size)
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

    from calibrate import host as H
    from calibrate.varlen_prefill import gdn_prefill_varlen_table
    from sim.step_trace import step_shape
    from calibrate import provenance
    from calibrate.executor import Executor, Weights
    from calibrate.shapes import LayerShapes
    from policies import make_policy
    from sim.budget import block_layout

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
                key = (seqs, tokens, step_shape(model, pol, seqs, tokens)[:3],
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
                    max_ctx = max([8192] + [r.context + (r.prefill or ex_positions(r)) for s in all_steps
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
                                  shapes=shapes, log=log, weights=w)
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
                        # passes of both, each point kept from its lowest pass (calibrate.host.lowest_pass).
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
                    replay_group(ex, group, reps, warmup, end, gpu, rows, errors_, kernels, log,
                                 on_progress=lambda: write_outputs(mdir, rows, HS.tables_probe_us(host_probes)), probe=probe, passes=passes)
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


def run_steps(ex: object, run: Run) -> list[tuple[object, bool]]:
    """(step, flush) to replay for one run: its picked steps in pick()'s order (none left when a
    --resume holds them all), or synthetic steps of every kind for --smoke."""
    if run.smoke:
        synthetic = [(_synthetic_traced(reqs, j), False)
                     for j, (_, reqs) in enumerate(synthetic_steps(ex.positions, ex.depth, ex.sizes))]
        return [synthetic[i] for i in spread_order(len(synthetic))]
    return [(s, flushes(s)) for s in run.steps]


def take_turns(counts: dict[str, int], per_turn: int) -> list[tuple[str, int, int]]:
    """(run, first, stop) slices of each run's steps, the runs taking turns of `per_turn` steps:
    the host's speed drifts over a replay (calibrate/REPLAY.md), and runs replayed one after the
    other would each get a different part of that drift (the 2,080-step replay of 2026-12-01: store_all's, replayed last)."""
    out, start = [], dict.fromkeys(counts, 0)
    while any(start[n] < c for n, c in counts.items()):
        for name, c in counts.items():
            if start[name] < c:
                out.append((name, start[name], min(c, start[name] + per_turn)))
                start[name] = out[-1][2]
    return out


def replay_group(ex: object, group: Sequence[Run], reps: int, warmup: int, end: float | None, gpu: str,
                 rows: list[dict], errors_: list[str], kernels: dict, log: Callable[[str], None],
                 on_progress: Callable[[], None], probe: Callable[[], float] | None = None, passes: int = 1) -> None:
    """Time the steps of an executor's runs, the runs taking turns (`take_turns`), until `end`,
    appending a row per step to `rows`; `probe` (calibrate.host.HostProbe) is taken right before
    each step, and the executor switches policy when the run's differs. With `passes` > 1 every
    step is timed again in each later pass over them all (its rows numbered by `pass`), so a
    budget cut leaves whole passes first."""
    todo = {run.name: run_steps(ex, run) for run in group}
    by_name = {run.name: run for run in group}
    old = {run.name: old_pricer(run, gpu, log) if todo[run.name] and not run.smoke else None for run in group}
    tr = last_write = time.perf_counter()
    turns = take_turns({n: len(v) for n, v in todo.items()}, INTERLEAVE_STEPS)
    try:
        for p in range(1, passes + 1):
            done = dict.fromkeys(todo, 0)
            for name, first, stop in turns:
                run = by_name[name]
                if run.policy.name not in kernels or ex.policy != run.policy:
                    ex.use_policy(run.policy)
                    if run.policy.name not in kernels:
                        kernels[run.policy.name] = ex.kernel_sources()
                        log(f"[{run.name}] policy {run.policy.name}: kernels {kernels[run.policy.name]}")
                for j in range(first, stop):
                    step, flush = todo[name][j]
                    check_deadline(end)
                    try:
                        host_probe = probe() if probe is not None else math.nan
                        ts, o = time_step(ex, step.requests, flush, reps, warmup, end)
                        async_us = time_step_async(ex, step.requests, flush, async_steps(statistics.median(ts)), end)
                    except BudgetSpent:
                        raise
                    except Exception as e:  # one bad step must not cost the run
                        errors_.append(f"{name} step {step.step}: {type(e).__name__}: {e}")
                        log(f"  step {step.step} FAILED: {traceback.format_exc()}")
                        done[name] = j + 1
                        continue
                    rows.append({**_step_row(ex, run, step, o, ts, async_us, host_probe, old[name]), "pass": p})
                    done[name] = j + 1
                    if j % 25 == 0 or j == len(todo[name]) - 1:
                        r = rows[-1]
                        log(f"  {name} pass {p} {j + 1}/{len(todo[name])} step {step.step} {r['kind']}/{o.mode} "
                            f"{r['tokens']} tok: {r['measured_us']:.0f} us (pred {step.predicted_us:.0f}); "
                            f"{len(ex.graphs) if ex.graphs else 0} graphs, {time.perf_counter() - tr:.0f} s")
                    if time.perf_counter() - last_write > PROGRESS_S:
                        on_progress()  # a replay killed past its limit keeps what it measured
                        last_write = time.perf_counter()
    except BudgetSpent:
        for name, steps in todo.items():
            if done[name] < len(steps):
                errors_.append(f"{name}: pass {p} stopped after {done[name]} of {len(steps)} steps, time budget")
        log(f"  time budget: stopping in pass {p} of {passes} with {sum(done.values())} of "
            f"{sum(map(len, todo.values()))} steps replayed")
    on_progress()


def _step_row(ex: object, run: Run, step: object, o: object, ts: list[float], async_us: float, host_probe: float,
              old: Callable[[object], float] | None) -> dict:
    """replay_steps.csv's row of one timed step."""
    return {"run": run.name, "step": step.step, "kind": step.kind or o.kind, "mode": o.mode,
            "tokens": sum(r.prefill or ex_positions(r) for r in step.requests),
            "padded_tokens": o.padded_tokens, "requests": len(step.requests),
            "decodes": sum(1 for r in step.requests if r.prefill == 0),
            "prefills": sum(1 for r in step.requests if r.prefill > 0),
            "context_tokens": sum(r.context for r in step.requests),
            "measured_us": async_us if run.meta.get("engine", {}).get("async_scheduling") else statistics.median(ts),
            "measured_sync_us": statistics.median(ts), "measured_async_us": async_us,
            "measured_sync_min_us": min(ts), "measured_sync_max_us": max(ts),
            "reps": len(ts), "host_probe_us": host_probe, "predicted_us": step.predicted_us,
            "old_predicted_us": old(step) if old else math.nan,
            **{f"pred_{k}": v for k, v in step.terms_us.items()}}


def freeze_heap() -> None:
    """One full collection, then gc.freeze(): the traced steps of every run, the weights' and
    graphs' Python objects (~400k objects for 18 runs) move to the permanent generation. Without
    it each step's gc.collect() walked them all (0.2-0.3 s a call, two calls a step: most of the
    ~0.7 s of host time per 3-5 ms step in an early replay). vLLM freezes its heap the same way."""
    gc.collect()
    gc.freeze()


def arm_alarm(budget_s: float | None) -> Callable[[], None]:
    """SIGALRM at budget_s + ALARM_GRACE_S raising KeyboardInterrupt (the outputs are then written);
    returns the disarm. A no-op off the main thread, without SIGALRM or without a budget."""
    import signal
    import threading

    if budget_s is None or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        return lambda: None

    def fire(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"time budget {budget_s} s + {ALARM_GRACE_S} s grace spent")
    prev = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(1e-3, budget_s + ALARM_GRACE_S))

    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, prev)
    return disarm


def write_outputs(mdir: Path, rows: list[dict], tables_probe_us: float | None = None) -> None:
    """replay_steps.csv (a pred_<term> column per predicted term) and replay_summary.json (with the
    host-bound steps at their own host speed when the host tables' probe is given)."""
    terms = sorted({k for r in rows for k in r if k.startswith("pred_")})
    write_csv(mdir / "replay_steps.csv", rows, (*BASE_COLUMNS, *terms))
    (mdir / "replay_summary.json").write_text(json.dumps(summarize(rows, tables_probe_us=tables_probe_us), indent=2) + "\n")


def write_side_tables(mdir: Path, host_rows: list[dict], varlen_rows: list[dict],
                      policy_rows: Sequence[dict] = ()) -> None:
    """host.csv, host_policies.csv and gdn_prefill_varlen.csv, where measured."""
    from calibrate.host import COLUMNS as HOST
    from core.tables import HOST_POLICY_COLUMNS, SEQS_COLUMNS

    if host_rows:
        write_csv(mdir / "host.csv", host_rows, HOST)
    if policy_rows:
        write_csv(mdir / "host_policies.csv", list(policy_rows), HOST_POLICY_COLUMNS)
    if varlen_rows:
        write_csv(mdir / "gdn_prefill_varlen.csv", varlen_rows, SEQS_COLUMNS)


def _synthetic_traced(reqs: list, i: int) -> object:
    from sim.step_trace import TracedStep

    return TracedStep(i, 0.0, "", tuple(reqs), math.nan, {})  # kind: as the executor dispatches it
