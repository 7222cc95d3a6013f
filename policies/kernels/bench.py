"""Time verify and commit of every policy per GDN layer on a GPU, against the copy roofline.

    python3 -m policies.kernels.bench --out results/calibration/h200 [--quick] [--git-commit SHA]
        [--policies reconstruct --reference-store-all --stem kernels_reconstruct]
    python3 -m policies.kernels.bench --out results/calibration/h200 --merge RUN/kernels.csv --merge-run run3
    python3 -m policies.kernels.bench --out results/calibration/h200 --merge-variants FILE --variant pp \
        --merge-run round1-pp --merge-keep-run run3

Writes kernels.csv (one row per model, policy, B, tree, mode) and
kernels_provenance.json (GPU, versions, command, copy bandwidth, reconstruct's kernels
one by one against T, the fla reference); `--stem` renames both. Graph timings: a CUDA graph of
back-to-back calls on distinct buffers (at least 512 MB together, so each call starts
with a cold L2), median over replays divided by the calls per graph. Eager timings:
the same calls launched from Python one by one (argument checks off), median.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import triton

from policies.kernels import reconstruct, reconstruct_deferred, replay, store_all, treewy
from policies.kernels.inputs import chain, full, random_inputs, rel_err
from policies.kernels.treewy import (MAX_POSITIONS, Tuning, lengths_or_full, solve, state_pass, tree_prep, verify_kernel,
                                     wy_state)
from policies.kernels.variants import VARIANT_CASES, VARIANTS, check_tuning

# GDN_BENCH_REHEARSAL=1 on a machine without a GPU (with TRITON_INTERPRET=1): the same command
# end to end at toy sizes on the CPU (wall-clock timings, no graphs), so a device call cannot
# fail on a typo. Its numbers mean nothing.
REHEARSAL = os.environ.get("GDN_BENCH_REHEARSAL") == "1" and not torch.cuda.is_available()
DEVICE = "cpu" if REHEARSAL else "cuda"
D = 16 if REHEARSAL else 128  # head dim (d_k = d_v) of both models
MODELS = {                    # per GDN layer on one GPU: (q/k heads, v heads)
    "qwen3.5-35b-a3b": (16, 32),
    "qwen3.5-397b-a17b": (2, 8),  # tensor parallel 8: 16/8 q/k heads, 64/8 v heads
}
BATCHES = (1, 8, 32, 64, 128, 256)
KERNELS_B = 64                # batch of the kernel-by-kernel table
if REHEARSAL:
    MODELS = {"qwen3.5-35b-a3b": (1, 2), "qwen3.5-397b-a17b": (1, 1)}
    BATCHES = (1, 64, 128)
    KERNELS_B = 2
TREES = {"1,1,1": (1, 1, 1), "1,1,1,1,1,1,1": (1,) * 7, "2,2,2": (2, 2, 2), "3,3,3": (3, 3, 3),
         "4,4,4": (4, 4, 4)}
CHAINS = (2, 16, 32, 64)      # extra chains (positions T), beside (1,1,1) = 4 and (1,)*7 = 8
POLICIES = ("store_all", "reconstruct", "replay", "reconstruct_deferred")
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# --reference-store-all: store_all timed beside a filtered run at these (model, tree, B)
STORE_ALL_REFERENCE = {("qwen3.5-35b-a3b", "1,1,1", 64), ("qwen3.5-35b-a3b", "1,1,1", 128),
                       ("qwen3.5-35b-a3b", "3,3,3", 128)}
if REHEARSAL:
    STORE_ALL_REFERENCE = {("qwen3.5-35b-a3b", "1,1,1", 2), ("qwen3.5-35b-a3b", "1,1,1", 3)}
FLUSH_INTERVAL = 4            # replay's m: flush every 4th commit
COLD_BYTES = 1 if REHEARSAL else 512 << 20  # distinct buffers per graph, so L2 (60 MB) starts cold
MAX_COPIES = 128              # at B = 1 that is still 80-320 MB of distinct buffers
MAX_FOOTPRINT = 40 << 30      # one call's buffers; larger cases are skipped (listed in provenance)
FIELDS = ["model", "policy", "B", "T", "tree", "depth", "replayed_tokens", "flush", "mode", "verify_us",
          "commit_us", "total_us", "verify_bytes", "commit_bytes", "bytes", "gbs", "pct_of_copy_bw",
          "extra_mem_bytes", "copies", "state_dtype"]


@dataclass(frozen=True)
class Case:
    model: str
    hk: int
    hv: int
    B: int
    tree: str
    parents: tuple[int, ...]
    state_dtype: str = "float32"

    @property
    def T(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        d = [0] * self.T
        for t in range(1, self.T):
            d[t] = d[self.parents[t]] + 1
        return max(d)


def cases(quick: bool, dtypes: tuple[str, ...] = ("float32",), batches: tuple[int, ...] = BATCHES,
          models: tuple[str, ...] = tuple(MODELS)) -> list[Case]:
    """Batches in the order given (smallest first by default), the models and state dtypes per
    batch: a run cut by --budget-s loses the last B. Quick: B = 128 (the targets) before B = 1."""
    return [dataclasses.replace(c, state_dtype=d) for c in _cases(quick, batches, models) for d in dtypes]


def _cases(quick: bool, batches: tuple[int, ...], models: tuple[str, ...]) -> list[Case]:
    out = []
    for B in ((128, 1) if quick else batches):
        if REHEARSAL and B > 2:
            B = 2 if B == 64 else 3  # toy batches; keep 64 and 128 apart for the store_all reference

        for model, (hk, hv) in MODELS.items():
            if model not in models or (quick and model != "qwen3.5-35b-a3b"):
                continue
            for name, w in TREES.items():
                if quick and name not in ("1,1,1", "3,3,3"):
                    continue
                out.append(Case(model, hk, hv, B, name, tuple(full(w))))
            for T in (() if quick else CHAINS):
                out.append(Case(model, hk, hv, B, "chain", tuple(chain(T))))
    return out


# ---------------------------------------------------------------- bytes each call must move
def _sizes(c: Case) -> dict[str, int]:
    return dict(S=c.B * c.hv * D * D * STATE_DTYPES[c.state_dtype].itemsize,
                inp=c.B * c.T * (2 * c.hk * D * 2 + c.hv * D * 2 + 2 * c.hv * 4),  # bf16 q,k,v; f32 g,beta
                o=c.B * c.T * c.hv * D * 2, u=c.B * c.T * c.hv * D * 4,
                path_uk=c.B * (c.depth + 1) * (c.hv * D * 4 + c.hk * D * 2))


def policy_bytes(c: Case, policy: str, replayed: int, flush: bool) -> tuple[int, int]:
    s = _sizes(c)
    if policy == "store_all":
        return s["S"] * (1 + c.T) + s["inp"] + s["o"], 2 * s["S"]
    if policy == "reconstruct":
        return s["S"] + s["inp"] + s["o"] + s["u"], 2 * s["S"] + s["path_uk"]
    if policy == "reconstruct_deferred":  # verify: the previous commit's write and its pending path
        return 2 * s["S"] + s["path_uk"] + s["inp"] + s["o"] + s["u"], 2 * s["path_uk"]
    per_tok_cache = c.B * (c.hk * D * 2 + c.hv * D * 2 + 2 * c.hv * 4)
    per_tok_u = c.B * c.hv * D * 4
    verify = s["S"] + s["inp"] + replayed * per_tok_cache + s["o"] + s["u"] + replayed * per_tok_u
    if flush:
        commit = 2 * s["S"] + s["path_uk"] + replayed * c.B * (c.hv * D * 4 + c.hk * D * 2)
    else:
        commit = 2 * (c.depth + 1) * per_tok_cache
    return verify, commit


# ---------------------------------------------------------------- timing
def _sync() -> None:
    if not REHEARSAL:
        torch.cuda.synchronize()


def _allocated() -> int:
    return 0 if REHEARSAL else torch.cuda.memory_allocated()


def _wall_us(calls: list[Callable[[], object]]) -> float:
    """Rehearsal timing: wall clock of one pass over the calls, per call."""
    t0 = time.perf_counter()
    for f in calls:
        f()
    return (time.perf_counter() - t0) * 1e6 / len(calls)


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second (eager torch copy_, see ANCHORS.md)."""
    if REHEARSAL:
        src = torch.randn(1 << 20)
        return 2 * src.numel() * 4 / (_wall_us([lambda: src.clone()]) * 1e-6)
    src = torch.randn(nbytes // 4, device=DEVICE)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def time_graph(calls: list[Callable[[], object]], reset: Callable[[], None] | None = None, reps: int = 8) -> float:
    """Median microseconds per call of a captured graph of `calls`, back to back."""
    if REHEARSAL:
        if reset:
            reset()
        return _wall_us(calls)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in calls:
            f()
        if reset:
            reset()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in calls:
            f()
    times = []
    for _ in range(reps + 2):
        if reset:
            reset()       # outside the timed region
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / len(calls))
    del graph
    return statistics.median(times[2:])


def time_eager(call: Callable[[int], object], copies: int, reset: Callable[[], None] | None = None,
               reps: int = 3) -> float:
    times = []
    for r in range(reps + 1):
        if reset:
            reset()
        _sync()
        t0 = time.perf_counter()
        call(r % copies)
        _sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times[1:])


# ---------------------------------------------------------------- one case, one policy
def make_copy(c: Case, seed: int) -> dict[str, torch.Tensor]:
    """One set of verify inputs on the GPU: bf16 q, k, v; float32 g, beta, state."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    B, T = c.B, c.T
    return dict(q=torch.randn(B, T, c.hk, D, device=DEVICE, generator=gen).div_(D ** 0.5).bfloat16(),
                k=torch.nn.functional.normalize(torch.randn(B, T, c.hk, D, device=DEVICE, generator=gen), dim=-1).bfloat16(),
                v=torch.randn(B, T, c.hv, D, device=DEVICE, generator=gen).bfloat16(),
                g=-torch.rand(B, T, c.hv, device=DEVICE, generator=gen),
                beta=torch.rand(B, T, c.hv, device=DEVICE, generator=gen) * 0.98 + 0.01,
                parent=torch.tensor(c.parents, dtype=torch.int32, device=DEVICE).expand(B, T).contiguous(),
                state=torch.randn(B, c.hv, D, D, device=DEVICE, generator=gen).to(STATE_DTYPES[c.state_dtype]),
                lengths=None)


def fill_cache(rs: replay.ReplayState, seed: int) -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    rs.k.copy_(torch.nn.functional.normalize(torch.randn(rs.k.shape, device=DEVICE, generator=gen), dim=-1))
    rs.v.normal_(generator=gen)
    rs.g.uniform_(-1.0, 0.0, generator=gen)
    rs.beta.uniform_(0.01, 0.99, generator=gen)


def run_policy(c: Case, policy: str, replayed: int, flush: bool, copy_bw: float,
               modes: tuple[str, ...] = ("graph", "eager")) -> list[dict]:
    mods = {"store_all": store_all, "reconstruct": reconstruct, "replay": replay,
            "reconstruct_deferred": reconstruct_deferred}
    mod = mods[policy]
    vb, cb = policy_bytes(c, policy, replayed, flush)
    per_call = vb  # every policy's verify touches all of its buffers once
    if per_call > MAX_FOOTPRINT:
        return []
    copies = 1 if per_call > (8 << 30) else min(MAX_COPIES, max(2, math.ceil(COLD_BYTES / per_call)))
    _sync()
    base = _allocated()
    xs = [make_copy(c, seed) for seed in range(copies)]
    acc = torch.full((c.B,), c.T - 1, dtype=torch.int32, device=DEVICE)  # deepest node: longest path
    rss: list[replay.ReplayState | reconstruct_deferred.DeferredState | None] = [None] * copies
    _sync()
    inputs_mem = _allocated()

    def state_arg(i: int):
        if policy == "reconstruct_deferred":
            if rss[i] is None:
                rss[i] = reconstruct_deferred.DeferredState.start(xs[i]["state"], max_path=c.depth + 1, hk=c.hk)
            return rss[i]
        if policy != "replay":
            return xs[i]["state"]
        if rss[i] is None:
            m = FLUSH_INTERVAL if replayed else 1
            rss[i] = replay.ReplayState.start(xs[i]["state"], flush_interval=m, max_path=c.depth + 1, hk=c.hk)
            if replayed:
                fill_cache(rss[i], 100 + i)
        return rss[i]

    def set_phase(i: int) -> None:
        """Replay: a full cache before a flush; one path short of full before an append."""
        if policy == "replay":
            rs = rss[i]
            rs.count.fill_(rs.capacity - (0 if flush else c.depth + 1))
            rs.steps = rs.flush_interval - 1 if flush else 0

    # Extra memory of one step (persistent replay cache included): allocator peak over the inputs.
    if not REHEARSAL:
        torch.cuda.reset_peak_memory_stats()
    o, ctx = mod.verify(**{**xs[0], "state": state_arg(0)}, check=False)
    set_phase(0)
    mod.commit(ctx, acc, check=False)
    _sync()
    extra = 0 if REHEARSAL else torch.cuda.max_memory_allocated() - inputs_mem
    del o, ctx
    for i in range(copies):
        state_arg(i)

    def reset() -> None:
        for i in range(copies):
            set_phase(i)

    verify_calls = [lambda i=i: mod.verify(**{**xs[i], "state": state_arg(i)}, check=False) for i in range(copies)]
    reset()
    ctxs = [f()[1] for f in verify_calls]
    commit_calls = [lambda i=i: mod.commit(ctxs[i], acc, check=False) for i in range(copies)]
    if policy == "reconstruct_deferred":
        for f in commit_calls:  # every timed verify applies a full pending path (depth + 1 nodes)
            f()
    rows = []
    for mode in modes:
        reset()
        if mode == "graph":
            # Phase fixed before capture: the captured commit is the flush or the append.
            v_us = time_graph(verify_calls)
            c_us = time_graph(commit_calls, reset=reset)
        else:
            v_us = time_eager(lambda i: verify_calls[i](), copies)
            c_us = time_eager(lambda i: commit_calls[i](), copies, reset=reset)
        total = v_us + c_us
        rows.append(dict(model=c.model, policy=policy, B=c.B, T=c.T, tree=c.tree, depth=c.depth,
                         replayed_tokens=replayed, flush=int(flush), mode=mode, verify_us=round(v_us, 2),
                         commit_us=round(c_us, 2), total_us=round(total, 2), verify_bytes=vb, commit_bytes=cb,
                         bytes=vb + cb, gbs=round((vb + cb) / total / 1e3, 1),
                         pct_of_copy_bw=round(100 * (vb + cb) / (total * 1e-6) / copy_bw, 1),
                         extra_mem_bytes=extra, copies=copies, state_dtype=c.state_dtype))
    del xs, ctxs, rss, verify_calls, commit_calls
    gc.collect()
    _sync()
    if not REHEARSAL:
        torch.cuda.empty_cache()
    if _allocated() > base + (64 << 20):
        print(f"warning: {(_allocated() - base) >> 20} MiB still allocated after {c}", flush=True)
    return rows


def policy_variants(c: Case, policies: tuple[str, ...] = POLICIES,
                    reference_store_all: bool = False) -> list[tuple[str, int, bool]]:
    """(policy, replayed tokens, commit flushes). Replay: a cache just flushed (m = 1, every
    commit flushes) and one holding m - 1 steps of accepted paths, committed both ways.
    `policies` filters; `reference_store_all` adds store_all at STORE_ALL_REFERENCE cases."""
    full_cache = (FLUSH_INTERVAL - 1) * (c.depth + 1)
    out = [("store_all", 0, True), ("reconstruct", 0, True), ("reconstruct_deferred", 0, True), ("replay", 0, True)]
    if full_cache + c.T <= MAX_POSITIONS:
        out += [("replay", full_cache, False), ("replay", full_cache, True)]
    ref = reference_store_all and (c.model, c.tree, c.B) in STORE_ALL_REFERENCE
    return [v for v in out if v[0] in policies or (ref and v[0] == "store_all")]


# ---------------------------------------------------------------- extras for the provenance
def kernels_vs_T(copy_bw: float, B: int = 64, model: str = "qwen3.5-35b-a3b",
                 Ts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)) -> list[dict]:
    """reconstruct on chains, kernel by kernel (graph timing): the tree prep, the state pass
    (the kernel `treewy.TUNING` picks; the blocked verify's solve also alone)
    and the commit to the deepest node; each pass over the state with its % of copy bandwidth."""
    hk, hv = MODELS[model]
    out = []
    for T in Ts:
        c = Case(model, hk, hv, B, "chain", tuple(chain(T)))
        copies = max(2, math.ceil(COLD_BYTES / policy_bytes(c, "reconstruct", 0, True)[0]))
        xs = [make_copy(c, s) for s in range(copies)]
        acc = torch.full((B,), T - 1, dtype=torch.int32, device=DEVICE)
        for x in xs:
            x["lengths"] = lengths_or_full(None, B, T, DEVICE)
            x["mask"], x["gc"] = tree_prep(x["parent"], x["lengths"], x["g"])
            x["ctx"] = reconstruct.verify(**{n: x[n] for n in ("q", "k", "v", "g", "beta", "parent", "state",
                                                                "lengths")}, check=False)[1]
        t = dict(prep=[lambda x=x: tree_prep(x["parent"], x["lengths"], x["g"]) for x in xs],
                 state_pass=[lambda x=x: state_pass(x["q"], x["k"], x["v"], x["beta"], x["state"], x["mask"], x["gc"],
                                                    x["lengths"]) for x in xs],
                 commit=[lambda x=x: wy_state(x["ctx"], acc, out=x["state"]) for x in xs])
        if verify_kernel(T) == "blocked":
            t["solve"] = [lambda x=x: solve(x["q"], x["k"], x["v"], x["beta"], x["mask"], x["gc"], x["lengths"])
                          for x in xs]
        row = dict(model=model, B=B, T=T, state_pass_kernel=verify_kernel(T))
        row.update({f"{name}_us": round(time_graph(calls), 2) for name, calls in t.items()})
        vb, cb = policy_bytes(c, "reconstruct", 0, True)  # the state pass moves all of verify's bytes but g's
        row["state_pass_pct_of_copy_bw"] = round(100 * vb / (row["state_pass_us"] * 1e-6) / copy_bw, 1)
        row["commit_pct_of_copy_bw"] = round(100 * cb / (row["commit_us"] * 1e-6) / copy_bw, 1)
        out.append(row)
        del xs, t
    return out


def run_variants(copy_bw: float, out: Path, deadline: float, names: tuple[str, ...]) -> list[str]:
    """Each tuning of `names`: the exactness check, then graph timings of reconstruct and
    reconstruct_deferred at VARIANT_CASES (35B-A3B, float32 state). Writes variants.csv as it
    goes; returns what did not run. A failing variant is logged and skipped."""
    model = "qwen3.5-35b-a3b"
    hk, hv = MODELS[model]
    fields = ["variant", "tuning", "check", "policy", "model", "B", "T", "tree", "verify_us", "commit_us",
              "total_us", "bytes", "pct_of_copy_bw", "state_dtype"]
    skipped = []
    with (out / "variants.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for name in names:
            tuning = VARIANTS[name]
            if time.time() > deadline:
                skipped.append(f"variant {name}: not run (time budget)")
                continue
            try:
                errs = check_tuning(tuning, hk, hv, D, DEVICE, exact_outputs=False)
            except Exception as exc:  # one broken variant must not stop the others
                print(f"variant {name}: check failed to run: {type(exc).__name__}: {exc}", flush=True)
                skipped.append(f"variant {name}: check raised {type(exc).__name__}: {exc}")
                _recover()
                continue
            # states in float32 (~1e-7 when right); outputs in bf16 against the rounded reference
            ok = max(errs["reconstruct_state"], errs["deferred_state"]) < 1e-5 and \
                max(errs["reconstruct_o"], errs["deferred_o"]) < 1e-2
            print(f"variant {name} ({tuning.label()}): check {'ok' if ok else 'FAILED'} "
                  + " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)
            if not ok:
                skipped.append(f"variant {name}: inexact {errs}")
                continue
            old = treewy.TUNING
            treewy.TUNING = tuning
            try:
                for tree, parents, B in VARIANT_CASES:
                    if REHEARSAL:
                        B = 2
                    c = Case(model, hk, hv, B, tree, parents)
                    for policy in ("reconstruct", "reconstruct_deferred"):
                        if time.time() > deadline:
                            skipped.append(f"variant {name} {policy} B={B} T={c.T}: not run (time budget)")
                            continue
                        try:
                            rows = run_policy(c, policy, 0, True, copy_bw, modes=("graph",))
                        except Exception as exc:
                            print(f"variant {name} {policy} T={c.T}: {type(exc).__name__}: {exc}", flush=True)
                            skipped.append(f"variant {name} {policy} B={B} T={c.T}: {type(exc).__name__}: {exc}")
                            _recover()
                            continue
                        for r in rows:
                            w.writerow(dict(variant=name, tuning=tuning.label(), check=max(errs.values()), policy=policy,
                                            model=model, B=B, T=c.T, tree=tree, verify_us=r["verify_us"],
                                            commit_us=r["commit_us"], total_us=r["total_us"], bytes=r["bytes"],
                                            pct_of_copy_bw=r["pct_of_copy_bw"], state_dtype=c.state_dtype))
                            print(f"variant {name:20} {policy:20} B={B:<3} T={c.T:<3} {tree:6} verify "
                                  f"{r['verify_us']:8.1f} commit {r['commit_us']:7.1f} total {r['total_us']:8.1f} us "
                                  f"{r['pct_of_copy_bw']:5.1f}%", flush=True)
                        fh.flush()
            finally:
                treewy.TUNING = old
    return skipped


def _recover() -> None:
    """After a failed case: free what it left so the next one starts clean."""
    gc.collect()
    if not REHEARSAL:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def fla_reference(copy_bw: float, quick: bool = False) -> dict:
    """fla's fused_recurrent_gated_delta_rule on chains (final state only), if the wheel is there."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as exc:  # an outside reference: its absence is reported, not fatal
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    import fla
    res = {"available": True, "version": fla.__version__, "rows": []}
    model = "qwen3.5-35b-a3b"
    hk, hv = MODELS[model]
    for B in ((1, 128) if quick else BATCHES):
        if REHEARSAL and B > 2:
            B = 2
        for T in (4, 16):
            c = Case(model, hk, hv, B, "chain", tuple(chain(T)))
            s = _sizes(c)
            nbytes = 2 * s["S"] + s["inp"] + s["o"]
            copies = max(2, math.ceil(COLD_BYTES / nbytes))
            xs = [make_copy(c, i) for i in range(copies)]
            calls = [lambda x=x: fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"],
                                                                  scale=1.0, initial_state=x["state"],
                                                                  output_final_state=True, state_v_first=True)
                     for x in xs]
            us = time_graph(calls)
            o_fla, s_fla = calls[0]()
            o_ours, ctx = reconstruct.verify(**{**xs[0], "state": xs[0]["state"].clone()}, check=False)
            s_ours = reconstruct.commit(ctx, torch.full((B,), T - 1, dtype=torch.int32, device=DEVICE), check=False)
            res["rows"].append(dict(model=model, B=B, T=T, us=round(us, 2), bytes=nbytes,
                                    pct_of_copy_bw=round(100 * nbytes / (us * 1e-6) / copy_bw, 1),
                                    rel_err_o_vs_reconstruct=rel_err(o_ours.float(), o_fla.float()),
                                    rel_err_state_vs_reconstruct=rel_err(s_ours, s_fla)))
            del xs, calls
    return res


def environment(args: argparse.Namespace) -> dict:
    if REHEARSAL:
        return dict(gpu="none (CPU rehearsal, TRITON_INTERPRET=1, toy sizes)", torch=torch.__version__,
                    triton=triton.__version__, git_commit=args.git_commit,
                    command=" ".join([os.path.basename(sys.executable)] + sys.argv))
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    p = torch.cuda.get_device_properties(0)
    return dict(gpu=torch.cuda.get_device_name(0), sms=p.multi_processor_count,
                l2_bytes=getattr(p, "L2_cache_size", None), nvidia_smi=smi.stdout.strip(),
                torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                python=platform.python_version(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                git_commit=args.git_commit, command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                tuning=dataclasses.asdict(treewy.TUNING))


def summary(out: Path, stem: str) -> str:
    """The short table printed last (a device call returns only the end of its output): per
    variant case the fastest tuning against the default, then the main table's graph rows."""
    lines = []
    vpath = out / "variants.csv"
    if vpath.exists():
        rows = list(csv.DictReader(vpath.open()))
        keys = sorted({(r["policy"], r["tree"], int(r["T"]), int(r["B"])) for r in rows})
        lines.append("variants (graph, verify + commit us, % of copy bw): default | best")
        for k in keys:
            rs = [r for r in rows if (r["policy"], r["tree"], int(r["T"]), int(r["B"])) == k]
            best = min(rs, key=lambda r: float(r["total_us"]))
            d = next((r for r in rs if r["variant"] == "default"), None)
            dd = f"{float(d['total_us']):8.1f} ({d['pct_of_copy_bw']}%)" if d else "       -"
            lines.append(f"  {k[0][:20]:20} {k[1]:6} T={k[2]:<3} B={k[3]:<3} {dd} | {float(best['total_us']):8.1f} "
                         f"({best['pct_of_copy_bw']}%) {best['variant']}: v {best['verify_us']} c {best['commit_us']}")
        by_v: dict[str, float] = {}
        for r in rows:
            by_v[r["variant"]] = by_v.get(r["variant"], 0.0) + float(r["total_us"])
        lines.append("  sum over cases: " + ", ".join(f"{v} {t:.0f}" for v, t in sorted(by_v.items(), key=lambda x: x[1])))
    kpath = out / f"{stem}.csv"
    if kpath.exists():
        lines.append("main table (graph): policy tree B dtype verify commit total %bw")
        for r in csv.DictReader(kpath.open()):
            if r["mode"] == "graph":
                lines.append(f"  {r['policy'][:20]:20} {r['tree']:13} B={r['B']:<3} {r['state_dtype'][:4]} "
                             f"r={r['replayed_tokens']:<2} f={r['flush']} {r['verify_us']:>9} {r['commit_us']:>8} "
                             f"{r['total_us']:>9} {r['pct_of_copy_bw']}%")
    return "\n".join(lines)


# --merge: the rows of one case are identified by these columns (a table without `state_dtype`
# predates the column: its bytes formula is float32 states, so its rows are float32).
MERGE_KEY = ("model", "policy", "B", "T", "tree", "depth", "replayed_tokens", "flush", "mode", "state_dtype")


def _driver(prov: dict) -> str:
    parts = [p.strip() for p in str(prov.get("nvidia_smi", "")).split(",")]
    return parts[1] if len(parts) > 1 else str(prov.get("driver", ""))


def _part(run: str, prov: dict, rows: int) -> dict:
    """One provenance part (calibrate.provenance's fields) for the rows of one device run."""
    dt = prov.get("device_time_s")
    if isinstance(dt, dict):  # e.g. {"this_call_command_wall_s": ..., "earlier_call_s": ...}: all device time
        dt = round(sum(v for v in dt.values() if isinstance(v, (int, float))), 1) or None
    if not isinstance(dt, (int, float)):
        dt = prov.get("wall_s")
    return {"run": run, "rows": rows, "gpu": prov.get("gpu", ""), "driver": _driver(prov),
            "torch": prov.get("torch", ""), "triton": prov.get("triton", ""), "cuda": prov.get("cuda", ""),
            "date": prov.get("date", ""), "git_commit": prov.get("git_commit", ""), "command": prov.get("command", ""),
            "tuning": prov.get("tuning", prov.get("dot_precision", "")), "device_time_s": dt, "provenance": prov}


def variant_rows(path: Path, variant: str) -> tuple[list[dict], dict]:
    """One tuning's rows of a `--variants` file (variants.csv, from run_variants) as rows of the kernels
    table, and the provenance of the run that wrote it. run_variants times each case with run_policy
    in graph mode (the table's graph timing), no replayed tokens, commit with a flush; its own columns
    give the times, bytes and pct_of_copy_bw; depth follows from the tree, gbs from bytes and total_us,
    the verify/commit split of bytes from policy_bytes (kept only where it sums to the file's bytes).
    Not in the file, so left empty: extra_mem_bytes, copies."""
    with path.open(newline="") as fh:
        src = [r for r in csv.DictReader(fh) if r["variant"] == variant]
    if not src:
        raise ValueError(f"{path}: no rows of variant {variant!r}")
    rows = []
    for r in src:
        T = int(r["T"])
        parents = tuple(chain(T)) if r["tree"] == "chain" else tuple(full(tuple(int(w) for w in r["tree"].split(","))))
        if len(parents) != T:
            raise ValueError(f"{path}: tree {r['tree']} has {len(parents)} positions, row says T = {T}")
        hk, hv = MODELS.get(r["model"], (0, 0))
        c = Case(r["model"], hk, hv, int(r["B"]), r["tree"], parents, r.get("state_dtype") or "float32")
        vb, cb = policy_bytes(c, r["policy"], 0, True) if hk else (None, None)
        split = vb is not None and vb + cb == int(r["bytes"])
        total = float(r["total_us"])
        rows.append(dict(model=r["model"], policy=r["policy"], B=r["B"], T=r["T"], tree=r["tree"], depth=c.depth,
                         replayed_tokens=0, flush=1, mode="graph", verify_us=r["verify_us"],
                         commit_us=r["commit_us"], total_us=r["total_us"], verify_bytes=vb if split else "",
                         commit_bytes=cb if split else "", bytes=r["bytes"],
                         gbs=round(int(r["bytes"]) / total / 1e3, 1), pct_of_copy_bw=r["pct_of_copy_bw"],
                         extra_mem_bytes="", copies="", state_dtype=c.state_dtype))
        rows[-1] = {k: str(v) for k, v in rows[-1].items()}  # as read from a CSV: merge keys compare strings
    p = path.with_name(f"{path.stem}_provenance.json")
    vprov = json.loads(p.read_text()) if p.exists() else {}
    prov = dict(vprov.get("source_provenance", vprov))
    part = next(iter(vprov.get("parts", [])), {})
    prov.update(device_time_s=part.get("device_time_s", prov.get("device_time_s")), tuning=src[0]["tuning"],
                variant=variant, source_part=part)
    return rows, prov


def merge(out_csv: Path, new_csv: Path, run: str, base_run: str, notes: list[str] | None = None,
          new: tuple[list[dict], dict] | None = None, keep_runs: tuple[str, ...] = (),
          command: str = "", part_extra: dict | None = None) -> dict[str, int]:
    """Rows of new_csv (run `run`) replace the rows of out_csv with the same MERGE_KEY; out_csv's other
    rows stay (in place, then the new keys in new_csv's order). A `run` column names each row's run
    (out_csv rows without one: `base_run`). STEM_provenance.json beside each file: out's becomes
    {"parts": [one per run, with that run's whole provenance], "merge": ...}. Returns rows per run.
    `new`: (rows, provenance) to merge instead of reading new_csv (e.g. variant_rows); `keep_runs`: runs whose
    rows must not be replaced (ValueError); `part_extra`: fields added to the new run's part."""
    def read(path: Path) -> tuple[list[str], list[dict]]:
        with path.open(newline="") as fh:
            r = csv.DictReader(fh)
            return list(r.fieldnames or []), list(r)

    def prov_of(path: Path) -> dict:
        p = path.with_name(f"{path.stem}_provenance.json")
        return json.loads(p.read_text()) if p.exists() else {}

    def key(r: dict) -> tuple:
        return tuple(r.get(k) or ("float32" if k == "state_dtype" else "") for k in MERGE_KEY)

    old_fields, old = read(out_csv)
    if new is None:
        new_fields, new_rows = read(new_csv)
        new_prov = prov_of(new_csv)
    else:
        new_rows, new_prov = new
        new_fields = list(FIELDS)
    new = new_rows
    for r in old:
        r["state_dtype"] = r.get("state_dtype") or "float32"
        r["run"] = r.get("run") or base_run
    for r in new:
        r["state_dtype"] = r.get("state_dtype") or "float32"
        r["run"] = run
    fresh = {key(r): r for r in new}
    if len(fresh) != len(new):
        raise ValueError(f"{new_csv}: rows repeat a key ({', '.join(MERGE_KEY)})")
    kept = sorted({r["run"] for r in old if r["run"] in keep_runs and key(r) in fresh})
    if kept:
        raise ValueError(f"{new_csv}: would replace rows of run(s) {', '.join(kept)} (kept)")
    merged, used = [], set()
    for r in old:
        k = key(r)
        if k in fresh:
            if k not in used:
                merged.append(fresh[k])
                used.add(k)
        else:
            merged.append(r)
    merged += [r for r in new if key(r) not in used]
    fields = [f for f in FIELDS if f in old_fields or f in new_fields or f == "state_dtype"]
    fields += [f for f in old_fields + new_fields if f not in fields and f != "run"] + ["run"]
    counts: dict[str, int] = {}
    for r in merged:
        counts[r["run"]] = counts.get(r["run"], 0) + 1
    old_prov = prov_of(out_csv)
    parts = [p for p in old_prov.get("parts", []) if p["run"] != run] if "parts" in old_prov \
        else [_part(base_run, old_prov, 0)]
    parts.append({**_part(run, new_prov, 0), **(part_extra or {})})
    for p in parts:
        p["rows"] = counts.get(p["run"], 0)
    merges = old_prov.get("merge", {}).get("history", []) if "parts" in old_prov else []
    merges.append({"run": run, "from": str(new_csv), "replaced": len(used), "added": len(fresh) - len(used),
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "notes": list(notes or [])})
    prov = {"parts": parts,
            "merge": {"key": list(MERGE_KEY), "rule": "a later run's row replaces an earlier run's row of the "
                      "same key; column `run` names each row's part", "command": command or shlex.join(["python3", "-m", "policies.kernels.bench"] + sys.argv[1:]),
                      "history": merges}}
    with out_csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(merged)
    out_csv.with_name(f"{out_csv.stem}_provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m policies.kernels.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for kernels.csv and kernels_provenance.json")
    ap.add_argument("--quick", action="store_true", help="35B only, B in {128, 1}, trees (1,1,1) and (3,3,3)")
    ap.add_argument("--budget-s", "--time-budget-s", dest="budget_s", type=float, default=0.0,
                    help="start no new case after this many seconds (0: no limit); the rest is listed as not run")
    ap.add_argument("--git-commit", default=os.environ.get("GIT_COMMIT", "unknown"),
                    help="commit of the code measured (the device copy has no .git)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help=f"comma-separated policies to time (default: all of {','.join(POLICIES)}; empty: none)")
    ap.add_argument("--state-dtype", default="float32",
                    help=f"comma-separated state dtypes of the main table ({','.join(STATE_DTYPES)})")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)),
                    help="comma-separated batch sizes of the main table, in the order they run (a --budget-s cut "
                         "loses the last)")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated models of the main table (default: all of {','.join(MODELS)})")
    ap.add_argument("--modes", default="graph,eager",
                    help="comma-separated timing modes of the main table: graph (CUDA-graph replay: what the "
                         "pipeline pricing reads), eager (the old eager-sum pricing)")
    ap.add_argument("--tuning", default="",
                    help="kernel choice for the whole run, e.g. 'verify_bv=16,verify_warps=2' (fields of treewy.Tuning)")
    ap.add_argument("--variants", default="",
                    help=f"first time these tunings ('all' or a comma list of {','.join(VARIANTS)}) at the target "
                         "shapes, into variants.csv")
    ap.add_argument("--variants-budget-s", type=float, default=0.0,
                    help="start no new variant case after this many seconds of the run (0: only --budget-s)")
    ap.add_argument("--reference-store-all", action="store_true",
                    help="also time store_all at 35B-A3B (1,1,1), B in {64, 128}, and (3,3,3), B = 128, as a "
                         "same-run reference")
    ap.add_argument("--no-fla", action="store_true", help="skip the fla outside reference")
    ap.add_argument("--stem", default="kernels", help="output names: STEM.csv and STEM_provenance.json")
    ap.add_argument("--kernel-ts", default="1,2,4,8,16,32,64,128",
                    help="chain lengths T of the kernel-by-kernel table (B = 64; empty: none)")
    ap.add_argument("--merge", type=Path, default=None,
                    help="no run: merge this kernels CSV (from another device run) into OUT/STEM.csv, its rows "
                         "replacing those of the same case (MERGE_KEY); provenance parts per run")
    ap.add_argument("--merge-run", default="", help="with --merge: the label of the merged run (column `run`)")
    ap.add_argument("--merge-base-run", default="run1",
                    help="with --merge: the label of OUT/STEM.csv's rows that have no `run` yet")
    ap.add_argument("--merge-note", action="append", default=[], help="with --merge: a note kept in the provenance")
    ap.add_argument("--merge-variants", type=Path, default=None,
                    help="no run: merge one tuning (--variant) of this --variants file (variants.csv, graph timings) "
                         "into OUT/STEM.csv as a run of its own (--merge-run), like --merge")
    ap.add_argument("--variant", default="", help="with --merge-variants: the tuning (column `variant`) to merge")
    ap.add_argument("--merge-keep-run", action="append", default=[],
                    help="with --merge/--merge-variants: fail rather than replace any row of this run")
    args = ap.parse_args(argv)
    if args.merge is not None or args.merge_variants is not None:
        if not args.merge_run:
            ap.error("--merge/--merge-variants need --merge-run (the merged run's label)")
        if args.merge is not None and args.merge_variants is not None:
            ap.error("--merge and --merge-variants exclude each other")
        command = shlex.join(["python3", "-m", "policies.kernels.bench"] + list(sys.argv[1:] if argv is None else argv))
        src, new, extra = args.merge, None, None
        if args.merge_variants is not None:
            if not args.variant:
                ap.error("--merge-variants needs --variant")
            src = args.merge_variants
            new = variant_rows(src, args.variant)
            extra = {"source_file": str(src), "variant": args.variant, "conversion_command": command}
        try:
            counts = merge(args.out / f"{args.stem}.csv", src, args.merge_run, args.merge_base_run,
                           args.merge_note, new=new, keep_runs=tuple(args.merge_keep_run), command=command,
                           part_extra=extra)
        except ValueError as exc:
            print(f"bench --merge: {exc}", file=sys.stderr)
            return 2
        print(f"merged {src} into {args.out / args.stem}.csv: rows per run {counts}")
        return 0
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if any(p not in POLICIES for p in policies):
        ap.error(f"--policies takes a comma-separated subset of {','.join(POLICIES)}, got {args.policies!r}")
    dtypes = tuple(d.strip() for d in args.state_dtype.split(",") if d.strip())
    if not dtypes or any(d not in STATE_DTYPES for d in dtypes):
        ap.error(f"--state-dtype takes a comma-separated subset of {','.join(STATE_DTYPES)}, got {args.state_dtype!r}")
    try:
        batches = tuple(int(b) for b in args.batches.split(",") if b.strip())
    except ValueError:
        batches = ()
    if not batches or any(b not in BATCHES for b in batches):
        ap.error(f"--batches takes a comma-separated subset of {','.join(map(str, BATCHES))}, got {args.batches!r}")
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    if not models or any(m not in MODELS for m in models):
        ap.error(f"--models takes a comma-separated subset of {','.join(MODELS)}, got {args.models!r}")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or any(m not in ("graph", "eager") for m in modes):
        ap.error(f"--modes takes a comma-separated subset of graph,eager, got {args.modes!r}")
    variants = tuple(VARIANTS) if args.variants == "all" else tuple(v for v in args.variants.split(",") if v)
    if any(v not in VARIANTS for v in variants):
        ap.error(f"--variants takes 'all' or a comma-separated subset of {','.join(VARIANTS)}, got {args.variants!r}")
    try:
        treewy.TUNING = Tuning.parse(args.tuning) if args.tuning else treewy.TUNING
    except (ValueError, TypeError) as exc:
        ap.error(f"--tuning: {exc}")
    if not torch.cuda.is_available() and not REHEARSAL:
        print("bench: needs a CUDA GPU (run it through the device tool)", file=sys.stderr)
        return 2
    t_start = time.time()
    deadline = t_start + args.budget_s if args.budget_s else math.inf
    args.out.mkdir(parents=True, exist_ok=True)
    prov = environment(args)
    copy_bw = copy_bandwidth()
    prov["copy_bw_bytes_per_s"] = copy_bw
    print(f"copy bandwidth {copy_bw / 1e12:.3f} TB/s (1 GiB device-to-device, read + write)", flush=True)
    prov["bytes_formula"] = {
        "store_all": "verify S(1+T) + inputs + o; commit 2S (read the accepted slot, write the state)",
        "reconstruct": "verify S + inputs + o + u; commit 2S + path (u, k)",
        "reconstruct_deferred": "verify 2S (the previous step's commit: read, write) + pending path (u, k) + inputs "
                                "+ o + u; commit 2 x path (u, k) (read, write the pending slots)",
        "replay": "verify S + inputs + cached inputs + o + u (cache + tree); commit flush 2S + path (u, k) over "
                  "cache + path, append 2 x path inputs",
        "units": "S = B Hv 128 128 x (4: float32 state, 2: bfloat16, column state_dtype); q, k, v, o bf16; "
                 "g, beta, u float32",
    }
    prov["policies"] = list(policies) + (["store_all (reference: 35B (1,1,1), B 64, 128; (3,3,3), B 128)"]
                                         if args.reference_store_all and "store_all" not in policies else [])
    prov["state_dtypes"] = list(dtypes)
    prov["batches"], prov["modes"] = list(batches), list(modes)
    prov["tuning"] = treewy.TUNING.label()
    prov_path = args.out / f"{args.stem}_provenance.json"
    skipped: list[str] = []
    if variants:
        prov["variants"] = {v: VARIANTS[v].label() for v in variants}
        v_deadline = min(deadline, t_start + args.variants_budget_s) if args.variants_budget_s else deadline
        skipped += run_variants(copy_bw, args.out, v_deadline, variants)
        prov_path.write_text(json.dumps(prov, indent=1) + "\n")
    try:
        prov["fla_fused_recurrent"] = ({"available": False, "reason": "--no-fla"} if args.no_fla
                                       else fla_reference(copy_bw, args.quick))
    except Exception as exc:  # an outside reference failing must not lose our own measurements
        prov["fla_fused_recurrent"] = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
        _recover()
    print("fla", json.dumps(prov["fla_fused_recurrent"])[:3000], flush=True)
    kts = tuple(int(t) for t in args.kernel_ts.split(",") if t.strip())
    try:
        prov["kernels_vs_T"] = kernels_vs_T(copy_bw, B=KERNELS_B, Ts=kts) if "reconstruct" in policies and kts else []
    except Exception as exc:  # the per-kernel table failing must not lose the main rows
        prov["kernels_vs_T"] = [{"error": f"{type(exc).__name__}: {exc}"}]
        _recover()
    for r in prov["kernels_vs_T"]:
        print("kernels", r, flush=True)
    prov_path.write_text(json.dumps(prov, indent=1) + "\n")  # partial, rewritten at the end
    csv_path = args.out / f"{args.stem}.csv"
    with csv_path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for c in cases(args.quick, dtypes, batches, models):
            if time.time() > deadline:
                skipped.append(f"{c.model} B={c.B} T={c.T} {c.tree} {c.state_dtype}: not run "
                               f"(time budget {args.budget_s:.0f} s)")
                continue
            for policy, replayed, flush in policy_variants(c, policies, args.reference_store_all):
                try:
                    rows = run_policy(c, policy, replayed, flush, copy_bw, modes=modes)
                except Exception as exc:  # one failing case is logged; the rest still run
                    print(f"FAILED {policy} {c}: {type(exc).__name__}: {exc}", flush=True)
                    skipped.append(f"{c.model} {policy} B={c.B} T={c.T} {c.state_dtype}: {type(exc).__name__}: {exc}")
                    _recover()
                    continue
                if not rows:
                    skipped.append(f"{c.model} {policy} B={c.B} T={c.T}: one call's buffers exceed {MAX_FOOTPRINT >> 30} GiB")
                for r in rows:
                    w.writerow(r)
                    if r["mode"] == "graph":
                        print(f"{c.model[:14]:14} {policy[:14]:14} r={replayed:<3} f={int(flush)} B={c.B:<3} T={c.T:<3} "
                              f"{c.tree:14} {c.state_dtype[:4]} verify {r['verify_us']:9.1f} commit {r['commit_us']:8.1f} "
                              f"us {r['pct_of_copy_bw']:5.1f}% extra {r['extra_mem_bytes'] / 2**20:9.1f} MiB", flush=True)
                fh.flush()
    prov["skipped"] = skipped
    prov["wall_s"] = round(time.time() - t_start, 1)
    prov_path.write_text(json.dumps(prov, indent=1) + "\n")
    print(summary(args.out, args.stem), flush=True)
    for r in prov["fla_fused_recurrent"].get("rows", []):
        print(f"  fla fused_recurrent chain T={r['T']} B={r['B']}: {r['us']} us ({r['pct_of_copy_bw']}%), "
              f"state vs reconstruct {r['rel_err_state_vs_reconstruct']:.1e}")
    for line in skipped:
        print("skipped:", line)
    print(f"wrote {csv_path} in {prov['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
