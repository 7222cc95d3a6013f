"""Host-side cost of each op of a step (host.csv): the time to ISSUE it, with the GPU kept busy.

A step's host and GPU overlap: while the GPU works through queued kernels, Python
prepares and launches the next ones. What the host model needs is each op's issue
time alone: a long `torch.cuda._sleep` kernel is queued first, so every launch below
only enqueues; the op is issued `reps` times and each call timed with the host clock.
If the sleep finished before the last call was issued the sample is void (retried
with a longer sleep): an op that synchronises shows up as void every time.

Rows: op, n, us (median), us_p10, us_p90, reps (core.tables.HOST_OPS says what n counts
for each op); host_policies.csv: the same with a `policy` column first, for the ops each
commit policy launches itself (core.tables.HOST_POLICY_OPS), measured under every policy.
gdn_verify and gdn_prefill include the core's one gating launch.
step_finish is timed with the GPU idle: waiting on the step's tokens (already copied to
pinned memory) plus the Python bookkeeping after the GPU is done.

`HostProbe` measures how fast the host issues work at one moment; the replay records it
beside every step and every host table, since the device's host runs in speed regimes.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Iterator, Sequence

import torch

from calibrate.device.timing import spread, wall_times
from core.tables import HOST_COLUMNS as COLUMNS

OPS = ("step_prepare", "step_finish", "sample", "attn_core", "gdn_verify", "gdn_commit", "gdn_prefill",
       "eager_dense_gdn", "eager_dense_attn", "eager_moe", "full_graph", "piece_graph", "drafter_pass")
SLEEP_US = 200_000  # the busy kernel: longer than any op's `reps` issues take together
PROBE_LAUNCHES = 64  # launches per probe block; a probe is the median of PROBE_BLOCKS blocks
PROBE_BLOCKS = 3
PROBE_SLEEP_US = 3_000  # keeps the GPU busy past a probe's ~1 ms of launches


def cycles_per_us() -> float:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(10_000_000)
    e1.record()
    e1.synchronize()
    return 10_000_000 / (e0.elapsed_time(e1) * 1e3)


def issue_times(fn: Callable[[], object], reps: int, cycles_per_us: float) -> list[float] | None:
    """Host time (us) of each of `reps` calls of fn issued behind a busy GPU; None if the GPU went idle."""
    for sleep_us in (SLEEP_US, 4 * SLEEP_US):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(sleep_us * cycles_per_us))
        busy = torch.cuda.Event()
        busy.record()
        ts = wall_times(fn, reps)
        idle = busy.query()
        torch.cuda.synchronize()
        if not idle:
            return ts
    return None


def gpu_times(fn: Callable[[], object], reps: int, cycles_per_us: float) -> list[float] | None:
    """GPU time (us) of each of `reps` calls of fn queued back to back behind a busy GPU: CUDA events
    around each call, the launch gaps hidden as in a graph; None if the GPU went idle meanwhile."""
    for sleep_us in (SLEEP_US, 4 * SLEEP_US):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(sleep_us * cycles_per_us))
        busy = torch.cuda.Event()
        busy.record()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        marks[0].record()
        for e in marks[1:]:
            fn()
            e.record()
        idle = busy.query()
        torch.cuda.synchronize()
        if not idle:
            return [a.elapsed_time(b) * 1e3 for a, b in zip(marks, marks[1:])]
    return None


class HostProbe:
    """The host's speed now: the time (us) to issue one small eager op (an in-place add on a
    16-element tensor; median of PROBE_BLOCKS blocks of PROBE_LAUNCHES launches, per launch)
    behind a busy GPU, so each launch only enqueues. The device's host runs in regimes: the
    same host-bound step measured 45, 62 or 88 ms in stretches of minutes (calibrate/replay/README.md),
    and a host-bound step's time is comparable with the host tables only at the same host speed.
    About 1 ms a call; leaves the GPU idle."""

    def __init__(self, device: torch.device | str) -> None:
        self.x = torch.zeros(16, device=device)
        self.cuda = self.x.is_cuda
        self.cycles = cycles_per_us() if self.cuda else 0.0

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda._sleep(int(PROBE_SLEEP_US * self.cycles))
        blocks = []
        for _ in range(PROBE_BLOCKS):
            t0 = time.perf_counter()
            for _ in range(PROBE_LAUNCHES):
                self.x.add_(1.0)
            blocks.append((time.perf_counter() - t0) * 1e6 / PROBE_LAUNCHES)
        if self.cuda:
            torch.cuda.synchronize()
        return round(statistics.median(blocks), 3)


TIMING_FIELDS = ("us", "us_p10", "us_p90", "reps")


def _row(op: str, n: int, ts: Sequence[float]) -> dict:
    us, p10, p90 = spread(ts)
    return {"op": op, "n": n, "us": round(us, 2), "us_p10": round(p10, 2), "us_p90": round(p90, 2), "reps": len(ts)}


Record = Callable[..., None]


def _recorder(rows: list[dict], log: Callable[[str], None], reps: int, tag: dict | None = None) -> Record:
    """record(op, n, fn, reps): one row of fn's issue times (tag's fields first), or a log line why not."""
    cpu = cycles_per_us()
    label = "".join(f" {v}" for v in (tag or {}).values())

    def record(op: str, n: int, fn: Callable[[], object], r: int = reps) -> None:
        assert op in OPS, op
        try:
            ts = issue_times(fn, r, cpu)
        except Exception as e:  # one op must not cost the table
            log(f"  host{label} {op} n={n}: FAILED ({type(e).__name__}: {e})")
            return
        if ts is None:
            log(f"  host{label} {op} n={n}: the GPU went idle while issuing (the op synchronises?); not recorded")
            return
        rows.append({**(tag or {}), **_row(op, n, ts)})
        log(f"  host{label} {op} n={n}: {rows[-1]['us']:.1f} us")
    return record


def decode_requests(ex: object, b: int) -> list:
    """b decoding requests of the executor's uniform-decode shape (a chain of its drafts)."""
    from sim.engine.step_trace import TracedRequest as R

    return [R(i, 0, 1000 + 7 * i, (1,) * ex.depth if ex.depth else (), 1) for i in range(b)]


def decode_batches(ex: object, quick: bool) -> list[int]:
    """The decode batches the host and core tables are measured at (those the executor holds)."""
    return [b for b in (1, 4, 16, 64, 128, 256) if b * ex.positions <= ex.max_tokens - 256
            and b <= ex.max_step_requests][:4 if quick else 6]


def _record_core(record: Record, ex: object, gdn: int, st: object, b: int) -> None:
    """gdn_verify (with the core's gating launch: its inputs) and gdn_commit of one GDN layer."""
    def verify() -> tuple:
        qkv, g, beta, nd = ex.gdn_inputs(gdn, st)
        return ex.verify(gdn, st, qkv[:nd], g[:nd], beta[:nd])
    record("gdn_verify", b, verify)
    ctxs = verify()
    record("gdn_commit", b, lambda: ex.commit(gdn, st, ctxs))


def measure_policy_host(ex: object, policies: Sequence, log: Callable[[str], None] = print,
                        quick: bool = False) -> list[dict]:
    """host_policies.csv rows: gdn_verify and gdn_commit (core.tables.HOST_POLICY_OPS) under each
    policy config, at host.csv's decode batches (commits that append, not flush). A policy of
    another step shape than the executor's is skipped (logged). Leaves the executor on the last."""
    if "gdn" not in ex.kinds or not ex.depth:
        return []
    gdn = ex.kinds.index("gdn")
    rows: list[dict] = []
    for pol in under_each_policy(ex, policies, log, "host"):
        record = _recorder(rows, log, 5 if quick else 10, {"policy": pol.mamba_state_commit})
        for b in decode_batches(ex, quick):
            st = ex.prepare(decode_requests(ex, b), mode="eager")
            _record_core(record, ex, gdn, st, b)
    return rows


def under_each_policy(ex: object, policies: Sequence, log: Callable[[str], None], what: str) -> Iterator:
    """Each policy config in turn, the executor switched to it; one of another step shape than the
    executor's is skipped, with a log line naming `what` was being measured."""
    for pol in policies:
        try:
            ex.use_policy(pol)
        except ValueError as e:
            log(f"  {what} {pol.name}: skipped ({e})")
            continue
        yield pol


def lowest_pass(passes: Sequence[Sequence[dict]]) -> list[dict]:
    """One table from several passes of it: per point (every field but the timings), the row of
    the pass whose median is lowest. The device's host runs in speed regimes that last from
    seconds to minutes (calibrate/replay/README.md); a single pass caught a switch mid-table (2026-12-01:
    reconstruct's gdn_verify 297 us at 16 requests, 545-568 at 64 and 128), and the lowest pass
    is the table at the fastest regime seen, the nominal host speed the replay's steps are scored at."""
    best: dict[tuple, dict] = {}
    for rows in passes:
        for r in rows:
            key = tuple((k, v) for k, v in r.items() if k not in TIMING_FIELDS)
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    return list(best.values())


def measure_host(ex: object, log: Callable[[str], None] = print, quick: bool = False) -> list[dict]:
    """host.csv rows for the executor's model and policy (its graphs are captured as needed)."""
    from sim.engine.step_trace import TracedRequest as R

    rows: list[dict] = []
    reps = 5 if quick else 10
    record = _recorder(rows, log, reps)
    gdn = ex.kinds.index("gdn") if "gdn" in ex.kinds else None
    attn = ex.kinds.index("attn") if "attn" in ex.kinds else None
    cap = ex.sizes[-1] if ex.sizes else 0
    for b in decode_batches(ex, quick):
        reqs = decode_requests(ex, b)
        record("step_prepare", b, lambda: ex.prepare(reqs, mode="eager"))
        st = ex.prepare(reqs, mode="eager")
        ex.launch(st)
        torch.cuda.synchronize()
        rows.append(_row("step_finish", b, wall_times(lambda: ex.finish(st), reps)))
        n = st.n
        slots, seq_lens, cu = ex.i64.d("slots", n), ex.i32.d("seq_lens", st.R), ex.i32.d("cu_q", st.R + 1)
        record("attn_core", b, lambda: ex.attn_core(0, st, n, st.R, st.max_q, slots, seq_lens, cu))
        record("sample", st.n_logits, lambda: ex.sample(st))
        if gdn is not None and ex.depth:
            _record_core(record, ex, gdn, st, b)
    if gdn is not None:
        for p in [1, 2, 4, 8, 16, 32][:4 if quick else 6]:
            st = ex.prepare([R(100 + i, 128, 512 * (i % 2), (), 0) for i in range(p)], mode="eager")

            def prefill() -> None:
                qkv, g, beta, nd = ex.gdn_inputs(gdn, st)
                ex.prefill(gdn, st, qkv[nd:st.n], g[nd:st.n], beta[nd:st.n])
            prefill()  # a step's first varlen call builds fla's index tensors (one synchronous copy)
            record("gdn_prefill", p, prefill)
    for n in [t for t in (16, 64, 256, 512, 1024, 2048, 4096, 8192) if t <= ex.max_tokens - 256][:5 if quick else 8]:
        x = ex.x
        if gdn is not None:
            record("eager_dense_gdn", n, lambda: (ex.pre(gdn, n, x), ex.post_core(gdn, n, x)))
        if attn is not None:
            record("eager_dense_attn", n, lambda: (ex.pre(attn, n, x), ex.post_core(attn, n, x)))
        record("eager_moe", n, lambda: ex.ffn(0, n, x))
    if ex.graphs is not None:
        for size in [s for s in ex.sizes if s in (4, 16, 64, 128, 256, 512) or s == cap][:4 if quick else 8]:
            if ex.positions > 1 and size % ex.positions == 0 and ex.full_capturable:
                reqs = decode_requests(ex, size // ex.positions)
                ex.run(reqs)  # captures its full graph
                g = ex.graphs.graphs.get(("full", ex.policy_key, size, False))
                if g is not None:
                    record("full_graph", size, g.replay, 5)
            ex.run([R(200, size - 1 if size > 1 else 1, 0, (), 0)])  # a prefill-only step: piecewise
            g = ex.graphs.graphs.get(("t", 1, size))
            if g is not None:
                record("piece_graph", size, g.replay)
    if ex.depth:
        for n in [t for t in (4, 64, 256, 1024, 4096) if t <= ex.max_tokens - 256][:3 if quick else 5]:
            st = ex.prepare([R(300, n, 0, (), 0)])
            ex.launch(st)
            torch.cuda.synchronize()
            record("drafter_pass", n, lambda: ex.draft_pass(st, 0, None), 5)
    return rows
