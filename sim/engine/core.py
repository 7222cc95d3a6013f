"""The engine: one SimPy process stepping a vLLM-v1-style continuous-batching loop.

Each step is vLLM's plan, execute, update: the scheduler's `schedule` picks tokens and
allocates blocks (preempting if it must) into a `StepPlan` keyed by request; the latency
model prices the batch and simulated time advances by that step time; the step's result
(drafts accepted per verifying request: the next count of the request's own acceptance
stream, read as the outputs are processed) goes through `Scheduler.update_from_output`,
which advances every scheduled request at once, emits its tokens at the end of the step
that produced them and retires the finished ones. Per-step work is O(scheduled requests);
there are no per-token or per-request-per-step events. Where every running request decodes
and nothing else can happen, a run of such steps is advanced at once (sim.engine.decode_run).

Async scheduling (`EngineConfig.async_scheduling`, vLLM's default with MTP): step N+1
is planned when step N starts, before step N's outputs are processed, as vLLM's
`step_with_batch_queue` does with two batches in its queue. So blocks freed by a
request that step N finishes serve step N + 2; a request that step N may finish
gets an extra verify in step N + 1 whose tokens are discarded; a request arriving
while step N runs starts in step N + 2. Step times are the latency model's; under
async scheduling that is the pipelined period (GPU time of a step, or the host
work that overlaps it when that is longer): docs/engine.md says what overlaps.
"""
from __future__ import annotations

import gc
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import simpy

from core.config import ConfigError, EngineConfig
from core.config_frontend import FrontendCosts
from policies import CommitPolicy
from sim.engine.acceptance import AcceptanceModel
from sim.engine.client import Client
from sim.engine.decode_group import DecodeGroup
from sim.engine.decode_run import DecodeRuns
from sim.engine.frontend import FrontendLoop
from sim.engine.frontend_steps import candidates, serve, serve_run
from sim.engine.metrics import StepLog
from sim.engine.pool import Pool
from sim.engine.request import Request, Status
from sim.engine.scheduler import Scheduler
from sim.engine.step_plan import StepPlan
from sim.engine.step_prices import PricedStep, StepPrices
from sim.engine.step_trace import BatchColumns, BatchTotals, TracedRequest, add_totals, column_totals
from sim.pricing.dispatch import capture_sizes
from sim.pricing.latency import LatencyModel, StepBatch
from workloads.base import RequestSpec

@dataclass
class EngineResult:
    requests: list[Request]
    steps: StepLog
    duration_s: float
    pool: Pool
    semantics: dict[str, object]  # the engine behaviours this run used (docs/engine.md), for the summary
    wall_s: float = 0.0  # host time the event loop took (sim.runs.bench; in no output file)


class Engine:
    def __init__(self, env: simpy.Environment, scheduler: Scheduler, latency: LatencyModel, policy: CommitPolicy,
                 steps: StepLog, acceptance: AcceptanceModel | None, performance_mode: str = "balanced") -> None:
        """`acceptance`: the draws of a speculating run (None without speculation). Where the
        scheduler keeps a decode group, runs of decode steps advance at once (sim.engine.decode_run)."""
        self.env = env
        self.acceptance = acceptance
        self.scheduler = scheduler
        self.policy = policy
        self.steps = steps
        self.spec_enabled = scheduler.verify_positions > 1
        self.draft_depth = policy.model.mtp_depth if self.spec_enabled else 0  # drafter passes a step runs
        self.commit_state_kept = policy.request_state() is not None  # replay's input cache, per request
        self.async_scheduling = scheduler.async_scheduling
        # vLLM's capture sizes (sim.pricing.dispatch) are fixed for the run, so asked once
        self.prices = StepPrices(latency, steps, verify_positions=scheduler.verify_positions,
                                 draft_depth=self.draft_depth,
                                 sizes=capture_sizes(scheduler.max_seqs, scheduler.max_tokens,
                                                     scheduler.verify_positions, performance_mode=performance_mode),
                                 full_graph_ok=not policy.forces_eager())
        self.runs = DecodeRuns(scheduler, self.prices, steps) if scheduler.group is not None else None
        self.on_done = lambda req: None  # the client's callback for finished requests
        self.frontend: FrontendLoop | None = None  # the API server's loop between engine and client (sim.engine.frontend)
        self._wake: simpy.Event | None = None

    def submit(self, req: Request) -> bool:
        """A request arrives; False if it can never run here (rejected with a reason)."""
        reason = self.scheduler.reject_reason(req)
        if reason:
            req.status = Status.REJECTED
            req.reject_reason = reason
            if self.steps.trace:
                self.steps.events.append((self.env.now, "reject", req.rid))
            return False
        # Its acceptance stream and the policy's bookkeeping live while it is in the engine.
        if self.acceptance is not None:
            req.acceptance = self.acceptance.stream(req.rid, req.category, req.output)
        req.commit_state = self.policy.request_state()
        self.scheduler.add(req, self.env.now)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        return True

    def run(self) -> Generator[simpy.Event, None, None]:
        env, sched, log, prices = self.env, self.scheduler, self.steps, self.prices
        pool = sched.pool
        rows, free = log.price_rows, log.free
        runs = self.runs
        plan: StepPlan | None = None  # the step the GPU runs next
        ran = False  # a decode run ended before this step: the loop takes it
        while True:
            if plan is None:
                if not sched.running and not sched.waiting:
                    self._wake = env.event()
                    yield self._wake  # never fires once the client has nothing left: the run ends
                    self._wake = None
                    continue
                plan = self._plan(env.now)
                if plan is None:
                    continue  # every running request was preempted; readmit them now
            if runs is not None and not ran and not sched.waiting:
                front, group = self.frontend, sched.group
                served = (len(group.times), int(group.generated.sum())) if front is not None else None
                delay = runs.advance(plan, env.now, env.peek())
                if delay is not None:
                    if served is not None:
                        serve_run(front, group, *served)
                    yield env.timeout(delay)
                    ran = True
                    if not self.async_scheduling:
                        plan = None  # sync: the step after the run is planned after its outputs
                    continue
            ran = False
            now = env.now
            totals = self._totals(plan)
            if log.trace:
                batch = prices.batch(totals, self._traced(plan))
                priced = prices.price(totals, batch)
                self._trace_step(now, plan, batch, priced)
            else:
                priced = prices.price(totals)
            rows.append(priced.row)
            free.append(pool.free)
            log.request_steps += totals.num_seqs
            # Async scheduling plans the next step now, from the outputs of the steps before this one.
            following = self._plan(now, step_in_flight=plan) if self.async_scheduling else None
            yield env.timeout(priced.duration_s)
            self._complete(plan, env.now, following)
            plan = following

    def _trace_step(self, now: float, plan: StepPlan, batch: StepBatch, priced: PricedStep) -> None:
        log, sched = self.steps, self.scheduler
        st = log.price(priced.row)
        log.events.extend((now, "preempt", r.rid) for r in plan.preempted)
        log.events.extend((now, "admit", r.rid) for r in plan.admitted)
        log.rows.append((now, priced.duration_s, batch.num_seqs, batch.num_tokens, batch.prefill_tokens,
                         batch.spec_seqs, len(sched.running), len(sched.waiting), len(plan.preempted),
                         sched.pool.used, sched.pool.usage, st.mode))
        log.record(now, batch, st)

    def _plan(self, now: float, step_in_flight: StepPlan | None = None) -> StepPlan | None:
        """The scheduler's next step (`step_in_flight`: the step running while it is planned, async
        scheduling); None when it holds no request (plan again later)."""
        plan = self.scheduler.schedule(now, step_in_flight)
        if not plan.empty:
            return plan
        if plan.preempted:
            if self.steps.trace:
                self.steps.events.extend((now, "preempt", r.rid) for r in plan.preempted)
            return None
        if step_in_flight is not None:
            return None  # nothing to add while a step runs (vLLM launches no batch): plan after its outputs
        sched = self.scheduler
        raise RuntimeError(f"engine stalled at t={now}: {len(sched.waiting)} waiting, nothing schedulable")

    def _totals(self, plan: StepPlan) -> BatchTotals:
        """The BatchTotals the latency model prices for this plan: the requests planned one by one
        gathered into columns over the batch (sim.engine.step_trace.BatchColumns), or a lone request's own,
        with the decode group's added."""
        group = self.scheduler.group
        if not plan.group or not group.size:
            return self._own_totals(plan)
        if not plan.tokens:
            return group.totals()
        return add_totals(self._own_totals(plan), group.totals())

    def _own_totals(self, plan: StepPlan) -> BatchTotals:
        vp = self.scheduler.verify_positions
        scheduled, spec_reqs = plan.tokens, plan.spec
        if len(scheduled) == 1:  # concurrency 1: most steps of a closed loop at low load
            ((r, n),) = scheduled.items()
            ctx = r.computed
            if spec_reqs:
                replayed, flush = r.commit_state.verify_work() if self.commit_state_kept else (0, True)
                return BatchTotals(1, n, 1, n == vp, 1, vp - n, replayed, 1 if flush else 0, ctx, ctx, ())
            if n == 1 and ctx + 1 == r.prompt + r.generated:  # a 1-token decode
                return BatchTotals(1, 1, 1, not self.spec_enabled, 0, 0, 0, 0, ctx, ctx, ())
            return BatchTotals(1, n, 0, False, 0, 0, 0, 0, ctx, ctx, ((n, ctx),))
        reqs = list(scheduled)
        tokens = list(scheduled.values())
        contexts = [r.computed for r in reqs]
        if len(spec_reqs) == len(reqs):
            spec = decoding = [True] * len(reqs)
        else:
            spec = [r in spec_reqs for r in reqs]
            # A 1-token step at the end of the known tokens decodes; anything else is a prompt chunk.
            decoding = [sp or (n == 1 and ctx + 1 == r.prompt + r.generated)
                        for sp, n, ctx, r in zip(spec, tokens, contexts, reqs)]
        replayed = flush = None
        if self.commit_state_kept:
            work = [r.commit_state.verify_work() if sp else (0, True) for sp, r in zip(spec, reqs)]
            replayed, flush = [w[0] for w in work], [w[1] for w in work]
        return column_totals(BatchColumns(tokens, contexts, decoding, spec, replayed, flush), verify_positions=vp,
                             draft_depth=self.draft_depth)

    def _traced(self, plan: StepPlan) -> tuple[TracedRequest, ...]:
        """The plan's requests in detail, for the step trace. A chain truncated to the token budget
        verifies its first n - 1 drafts. A verify's accepted count is reported when it completes
        (StepLog.accepted); one whose outputs are discarded (async: its request already finished)
        keeps the bonus token's 1."""
        vp = self.scheduler.verify_positions
        widths = self.policy.tree.widths
        out = []
        for r, n in plan.tokens.items():
            sp = r in plan.spec
            ctx = r.computed
            dec = sp or (n == 1 and ctx + 1 == r.prompt + r.generated)
            replayed, flush = r.commit_state.verify_work() if sp and self.commit_state_kept else (0, True)
            out.append(TracedRequest(r.rid, 0 if dec else n, ctx, ((widths if n == vp else widths[:n - 1]) if sp else ()),
                                     1 if dec else 0, replayed, flush))
        return tuple(out)

    def _sample_traced(self, req: Request, tokens: int) -> int:
        """A verify's accepted drafts (`update_from_output`'s rule), recorded in the step trace."""
        a = req.acceptance.accepted_drafts(tokens - 1)
        self.steps.accepted(req.rid, a + 1)
        return a

    def _complete(self, plan: StepPlan, now: float, following: StepPlan | None) -> None:
        """The step's outputs to the scheduler (`following`: the step planned while it ran);
        finished requests back to the client."""
        front = self.frontend
        placed = candidates(self.scheduler, plan) if front is not None else None
        finished = self.scheduler.update_from_output(plan, now, self._sample_traced if self.steps.trace else None,
                                                     following)
        written = serve(front, placed, now, finished) if front is not None else {}
        for req in finished:
            # A finished request keeps what the metrics read, and the few counters of its policy
            # state that a plan already made for it (async scheduling) still prices.
            req.acceptance = None
            if self.steps.trace:
                self.steps.events.append((now, "finish", req.rid))
            at = written.get(req, now)
            if at > now:  # the client learns of it when the API server's loop has written its last event
                self.env.timeout(at - now).callbacks.append(lambda _, req=req: self.on_done(req))
            else:
                self.on_done(req)


def run_engine(specs: Sequence[RequestSpec], *, pool: Pool, policy: CommitPolicy, latency: LatencyModel,
               acceptance: AcceptanceModel, max_num_batched_tokens: int, max_num_seqs: int,
               admission: str = "full_prompt", arrivals: Sequence[float] | None = None,
               max_concurrency: int | None = None, trace: bool = False, engine: EngineConfig | None = None,
               block_tokens: int | None = None, round_trip_s: float = 0.0,
               tokenize_s_per_token: float = 0.0, decode_group: bool = True,
               frontend: FrontendCosts | None = None) -> EngineResult:
    """Simulate `specs` through one engine; `arrivals` are ready times (default: all at 0).

    `engine` supplies the vLLM behaviours (async scheduling, draft truncation, mamba
    cache mode; default: current vLLM's); `block_tokens` is the scheduler's block size
    for align mode (default: the paged pool's attention block); `round_trip_s` and
    `tokenize_s_per_token` the client's time outside the engine per request (sim.engine.client);
    `frontend` the API server's event loop's costs (sim.engine.frontend; None: not modelled);
    `decode_group` False plans and processes every request on its own, one step at a time (the
    same results, slower: sim.engine.decode_group, sim.engine.decode_run); a traced run always does.
    """
    if arrivals is not None and len(arrivals) != len(specs):
        raise ValueError(f"{len(arrivals)} arrival times for {len(specs)} requests")
    bad = next((s for s in specs if s.prompt_tokens < 1 or s.output_tokens < 1), None)
    if bad is not None:
        raise ConfigError(f"request {bad.request_id}: prompt_tokens and output_tokens must be >= 1 "
                          f"(got {bad.prompt_tokens} and {bad.output_tokens})")
    engine = engine or EngineConfig()
    model = policy.model
    spec_on = model.mtp_depth > 0
    mamba_mode = engine.resolved_mamba_cache_mode
    align = 0
    if mamba_mode == "align":
        layout = getattr(pool, "layout", None)
        align = block_tokens or (layout.attn_block_tokens if layout is not None else 0)
        if not align:
            raise ValueError("mamba cache mode 'align' needs block_tokens (the pool has no block layout)")
        if align > max_num_batched_tokens:
            raise ConfigError(f"engine.mamba_cache_mode 'align' needs max_num_batched_tokens "
                              f"({max_num_batched_tokens}) >= the block size ({align} tokens), "
                              "or no prefill chunk could ever start")
    chain = all(w == 1 for w in policy.tree.widths)  # a tree cannot be cut to a budget
    env = simpy.Environment(initial_time=0.0)
    scheduler = Scheduler(
        pool, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        verify_positions=policy.verify_positions if spec_on else 1,
        lookahead=model.mtp_depth, admission=admission, max_model_len=model.max_model_len,
        async_scheduling=engine.async_scheduling, truncate_drafts=engine.truncate_drafts and chain,
        align_tokens=align,
        group=DecodeGroup(verify_positions=policy.verify_positions if spec_on else 1, lookahead=model.mtp_depth,
                          sync=not engine.async_scheduling, states=policy.request_states())
        if decode_group and not trace else None,
    )
    steps = StepLog(trace, pool.capacity)
    sim = Engine(env, scheduler, latency, policy, steps, acceptance if spec_on else None, engine.performance_mode)
    times = [0.0] * len(specs) if arrivals is None else [float(t) for t in arrivals]
    requests = [Request(s, t) for s, t in zip(specs, times)]
    sim.frontend = FrontendLoop(frontend) if frontend is not None else None
    client = Client(env, requests, max_concurrency, sim.submit, round_trip_s, tokenize_s_per_token, sim.frontend)
    sim.on_done = client.on_done
    env.process(client.arrivals())
    env.process(sim.run())
    start = time.perf_counter()
    # The collector rests while the loop runs: its full passes rescanned the workload, tables and
    # requests (at 1,000 requests a sixth of the loop), and the loop makes next to no cycles.
    # (Freezing what exists instead also froze an earlier run's garbage in a sweep worker, whose
    # memory then grew by a few hundred MB a grid.) The run's objects are collected as young
    # ones afterwards, the earlier runs' as before.
    collecting = gc.isenabled()
    gc.disable()
    try:
        env.run()
    finally:
        if collecting:
            gc.enable()
    wall_s = time.perf_counter() - start
    unfinished = [r for r in requests if r.status not in (Status.FINISHED, Status.REJECTED)]
    if unfinished:
        raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished requests, e.g. {unfinished[0]}")
    # The benchmark's duration ends at the last response; a discarded async step may run past it.
    end = max((r.finish_s if r.finish_s is not None else r.send_s or 0.0 for r in requests), default=0.0)
    semantics = {"performance_mode": engine.performance_mode, "max_num_batched_tokens": max_num_batched_tokens,
                 "max_num_seqs": max_num_seqs, "cudagraph_max_size": max(sim.prices.sizes, default=0),
                 "async_scheduling": engine.async_scheduling, "truncate_drafts": scheduler.truncate_drafts,
                 "mamba_cache_mode": mamba_mode, "align_block_tokens": align, "client_round_trip_s": round_trip_s,
                 "client_tokenize_s_per_token": tokenize_s_per_token,
                 "frontend": frontend.model_dump() if frontend is not None else None,
                 "frontend_busy_s": sim.frontend.busy_s if sim.frontend is not None else None}
    return EngineResult(requests, steps, end, pool, semantics, wall_s)
