"""One case, one policy: inputs on the GPU, verify and commit timed against the copy roofline."""
from __future__ import annotations

import gc
import math

import torch

from policies.kernels import reconstruct, reconstruct_deferred, replay, store_all
from policies.kernels.bench_cases import (CHAIN_POLICIES, COLD_BYTES, Case, D, DEVICE, FLUSH_INTERVAL, MAX_COPIES,
                                          MAX_FOOTPRINT, POLICIES, REHEARSAL, STATE_DTYPES, STORE_ALL_REFERENCE,
                                          policy_bytes)
from policies.kernels.bench_timing import allocated, sync, time_eager, time_graph
from policies.kernels.treewy import MAX_POSITIONS


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
    sync()
    base = allocated()
    xs = [make_copy(c, seed) for seed in range(copies)]
    acc = torch.full((c.B,), c.T - 1, dtype=torch.int32, device=DEVICE)  # deepest node: longest path
    rss: list[replay.ReplayState | reconstruct_deferred.DeferredState | None] = [None] * copies
    sync()
    inputs_mem = allocated()

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
    hint = {"chain": c.is_chain} if policy in CHAIN_POLICIES else {}  # check=False reads no parents
    o, ctx = mod.verify(**{**xs[0], "state": state_arg(0)}, check=False, **hint)
    set_phase(0)
    mod.commit(ctx, acc, check=False)
    sync()
    extra = 0 if REHEARSAL else torch.cuda.max_memory_allocated() - inputs_mem
    del o, ctx
    for i in range(copies):
        state_arg(i)

    def reset() -> None:
        for i in range(copies):
            set_phase(i)

    verify_calls = [lambda i=i: mod.verify(**{**xs[i], "state": state_arg(i)}, check=False, **hint)
                    for i in range(copies)]
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
    sync()
    if not REHEARSAL:
        torch.cuda.empty_cache()
    if allocated() > base + (64 << 20):
        print(f"warning: {(allocated() - base) >> 20} MiB still allocated after {c}", flush=True)
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
