"""`specsim plan`'s driver: candidate configurations, their probes as sweep points, the rounds.

Every probe run is a `RunConfig`, run and cached by `sim.runs.sweep.run_sweep` exactly as a
sweep point is (same key: the resolved config, the code version, the workload's
fingerprint), so a rerun with one more candidate, a finer tolerance or a longer
`max_requests` runs only the probes it has not stored. The searches of all candidates
advance together: each round collects every candidate's next probe runs into one batch
for the process pool (or Dask cluster).
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.config import ConfigError, RunConfig, load_model, validate
from sim.plan.candidates import Candidate
from sim.plan.search import GROWTH, CapacitySearch, Probe, Verdict, round_rate
from sim.plan.slo import Slo
from sim.runs.grid import set_field
from sim.runs.sweep import warm_workloads, workload_signature

Evaluate = Callable[[list[RunConfig]], list[dict[str, Any]]]  # configs -> sweep records, in order
# Without --start-rate a search starts at the configuration's saturated throughput (one run with
# max_num_seqs requests always in flight), an estimate of its capacity (within 0.8-1.2x of it on
# ShareGPT), with a first bracketing step of START_STEP: the search skips the slow low-rate
# probes. RATE_SPAN bounds the rates either side of the start.
START_STEP = 1.25
RATE_SPAN = 1024.0


# ------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class PlanSettings:
    workload: str
    base: dict[str, Any]  # dotted RunConfig path -> value, the same for every probe run
    slos: list[Slo]
    tolerance: float
    num_requests: int  # the shorter length of a probe (the longer is twice this)
    max_requests: int
    stability: float  # a steady probe's SLO metrics move by at most this x their bound
    start_rate: float | None  # None: each candidate's saturated throughput
    min_rate: float | None  # None: the start / RATE_SPAN
    max_rate: float | None  # None: the start x RATE_SPAN
    arrivals: str  # "poisson" or "trace" (the workload's own timestamps, time-scaled)

    def __post_init__(self) -> None:
        if self.max_requests < 2 * self.num_requests:
            raise ConfigError(f"--max-requests {self.max_requests} must be at least twice --num-requests "
                              f"{self.num_requests}: a probe compares N and 2N requests")
        if not 0 < self.stability < 1:
            raise ConfigError(f"--stability {self.stability:g} must be in (0, 1): the share of each SLO's bound "
                              "its metric may move between two lengths")


class TraceRates:
    """Trace arrivals at a target rate: the trace's gaps scaled by its own rate / the target."""

    def __init__(self, settings: PlanSettings) -> None:
        self.settings = settings
        self._native: dict[int, float] = {}

    def native_rate(self, num_requests: int) -> float:
        if num_requests not in self._native:
            from workloads import load_workload

            s = self.settings
            cfg = config(s, {"num_requests": num_requests}, f"--arrivals trace ({num_requests} requests)")
            w = load_workload(cfg.workload, cfg.num_requests, cfg.seed, cfg.workload_overrides)
            times = [r.arrival_s for r in w.requests]
            if w.arrival != "trace" or any(t is None for t in times):
                raise ConfigError(f"--arrivals trace: workload {s.workload} has no arrival timestamps "
                                  f"(its arrival is {w.arrival!r}); use --arrivals poisson")
            span = max(times) - min(times)
            if span <= 0:
                raise ConfigError(f"--arrivals trace: the first {num_requests} requests of {s.workload} "
                                  "arrive at one instant; a rate cannot scale them")
            self._native[num_requests] = (len(times) - 1) / span
        return self._native[num_requests]


def config(settings: PlanSettings, assignment: dict[str, Any], source: str) -> RunConfig:
    """The settings' fixed fields plus `assignment` (dotted path -> value) as a RunConfig."""
    data: dict[str, Any] = {"workload": settings.workload}
    for path, value in {**settings.base, **assignment}.items():
        set_field(data, path, value)
    return validate(RunConfig, data, source)


def probe_config(settings: PlanSettings, cand: Candidate, rate: float, num_requests: int,
                 trace: TraceRates | None = None) -> RunConfig:
    client: dict[str, Any] = {"client.request_rate": rate}
    if settings.arrivals == "trace":
        assert trace is not None
        client = {"client.use_trace_arrivals": True, "client.time_scale": trace.native_rate(num_requests) / rate}
    return config(settings, {**cand.assignment(), "num_requests": num_requests, **client},
                  f"plan probe ({cand.label}, {rate:g} req/s, {num_requests} requests)")


def gpus_per_replica(cfg: RunConfig) -> int:
    return load_model(cfg.model, cfg.model_overrides).tensor_parallel


# --------------------------------------------------------------------------- rounds
@dataclass
class CandidateResult:
    candidate: Candidate
    slos: list[Slo]
    search: CapacitySearch | None = None  # None until its start rate is known
    probes: dict[float, Probe] = field(default_factory=dict)
    status: str = "searching"  # then found | none_met | above_max | infeasible | failed
    error: str = ""
    gpus: int = 1  # per data-parallel replica (the model's tensor parallelism)

    @property
    def verdicts(self) -> list[Verdict]:
        return sorted((p.verdict for p in self.probes.values() if p.verdict), key=lambda v: v.rate)

    def verdict_at(self, rate: float | None) -> Verdict | None:
        probe = self.probes.get(rate) if rate is not None else None
        return probe.verdict if probe else None

    @property
    def capacity(self) -> float:
        """Requests per second per replica at which every SLO holds (0 if none does)."""
        if self.status in ("found", "above_max") and self.search and self.search.passed is not None:
            return self.search.passed
        return 0.0

    @property
    def at_capacity(self) -> Verdict | None:
        """The probe at the highest passing rate."""
        return self.verdict_at(self.search.passed) if self.search else None

    @property
    def failing_rate(self) -> float | None:
        """The lowest rate that broke an SLO."""
        return self.search.failed if self.search else None

    @property
    def binding(self) -> str:
        """The SLO that breaks first above the capacity: the most violated at the failing rate."""
        v = self.verdict_at(self.failing_rate)
        if v is None or not v.violated:
            return ""
        return max((s for s in self.slos if s.name in v.violated), key=lambda s: _ratio(v, s)).name

    def replicas_for(self, rate: float) -> int | None:
        return math.ceil(rate / self.capacity - 1e-9) if self.capacity > 0 else None


def best(results: list[CandidateResult]) -> CandidateResult:
    """The configuration with the highest capacity per GPU (the first of equals)."""
    return max(results, key=lambda r: r.capacity / r.gpus)


def policy_best(results: list[CandidateResult]) -> list[CandidateResult]:
    """Each policy's configuration with the highest capacity per GPU, in first-seen order."""
    by_policy: dict[str, CandidateResult] = {}
    for r in results:
        held = by_policy.get(r.candidate.policy)
        if held is None or r.capacity / r.gpus > held.capacity / held.gpus:
            by_policy[r.candidate.policy] = r
    return list(by_policy.values())


def _ratio(v: Verdict, slo: Slo) -> float:
    value = slo.value(v.summary)
    return math.inf if value is None else value / slo.bound_s


class Prepared:
    """warm_workloads once per distinct workload sample across all rounds."""

    def __init__(self) -> None:
        self.prints: dict[str, str] = {}

    def __call__(self, configs: list[RunConfig]) -> dict[str, str]:
        new = {workload_signature(c): c for c in configs if workload_signature(c) not in self.prints}
        self.prints.update(warm_workloads(list(new.values())))
        return self.prints


def run_plan(cands: list[Candidate], settings: PlanSettings, evaluate: Evaluate,
             log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
             slots: int = 1) -> list[CandidateResult]:
    """Search every candidate's capacity; returns one result per candidate, in order.

    `slots`: runs the executor does at once. While the searching candidates leave slots
    idle, a probe runs its 2N requests beside its N (the results do not depend on it).
    """
    s = settings
    trace = TraceRates(s) if s.arrivals == "trace" else None
    results = [CandidateResult(c, s.slos) for c in cands]
    for r in results:
        r.gpus = gpus_per_replica(config(s, r.candidate.assignment(), f"plan candidate {r.candidate.label}"))
    starts = {r.candidate: s.start_rate for r in results}
    if s.start_rate is None:
        starts = saturation_starts(results, s, evaluate, log)
    for r in results:
        if r.status == "searching":
            start = starts[r.candidate]
            lo, hi = s.min_rate or start / RATE_SPAN, s.max_rate or start * RATE_SPAN
            if s.start_rate is None:  # a measured start stays inside the rates the user allows
                start = min(max(start, lo), hi)
            r.search = CapacitySearch(start, s.tolerance, lo, hi, START_STEP if s.start_rate is None else GROWTH)
    rounds = 0
    while True:
        batch: list[tuple[CandidateResult, Probe, int]] = []
        ahead = 2 * sum(r.status == "searching" for r in results) <= slots
        for r in results:
            if r.status != "searching":
                continue
            assert r.search is not None
            rate = r.search.next_rate()
            if rate is None:
                r.status = r.search.outcome or "found"
                log(f"plan: {r.candidate.label}: {describe(r)}")
                continue
            probe = r.probes.setdefault(rate, Probe(rate, s.slos, s.num_requests, s.max_requests, s.stability))
            batch += [(r, probe, n) for n in probe.pending(ahead)]
        if not batch:
            return results
        rounds += 1
        searching = sum(r.status == "searching" for r in results)
        log(f"plan: round {rounds}: {len(batch)} runs for {searching} of {len(results)} configurations still searching")
        records = evaluate([probe_config(s, r.candidate, p.rate, n, trace) for r, p, n in batch])
        for (r, probe, n), rec in zip(batch, records):
            if r.status != "searching":
                continue
            if rec["status"] != "ok":  # infeasible (does not fit the memory) or failed: no rate helps
                r.status, r.error = rec["status"], rec.get("error") or ""
                log(f"plan: {r.candidate.label}: {r.status}: {r.error}")
                continue
            probe.add(n, rec["summary"])
        for r in results:  # after the whole batch: a probe's runs may come in any order
            if r.status == "searching" and r.search and (rate := r.search.next_rate()) is not None:
                probe = r.probes[rate]
                if probe.verdict:
                    r.search.record(rate, probe.verdict.met)


def saturation_starts(results: list[CandidateResult], settings: PlanSettings, evaluate: Evaluate,
                      log: Callable[[str], None]) -> dict[Candidate, float]:
    """Each candidate's first rate: its throughput with max_num_seqs requests in flight."""
    s = settings
    log(f"plan: saturated throughput of {len(results)} configurations (where their searches start)")
    configs = [config(s, {**r.candidate.assignment(), "num_requests": s.num_requests,
                          "client.max_concurrency": r.candidate.max_num_seqs}, f"plan start ({r.candidate.label})")
               for r in results]
    starts = {}
    for r, rec in zip(results, evaluate(configs)):
        if rec["status"] != "ok":
            r.status, r.error = rec["status"], rec.get("error") or ""
            log(f"plan: {r.candidate.label}: {r.status}: {r.error}")
            continue
        starts[r.candidate] = round_rate(rec["summary"]["request_throughput"])
    return starts


def describe(r: CandidateResult) -> str:
    if r.status == "found":
        return f"{r.capacity:.4g} req/s per replica ({r.binding} binds above it)"
    if r.status == "above_max":
        return f"every SLO holds up to --max-rate {r.search.max_rate:g} req/s, the highest rate tried"
    if r.status == "none_met":
        return none_met_message(r)
    return f"{r.status}: {r.error}"


def none_met_message(r: CandidateResult) -> str:
    """Which SLO fails at the lowest rate tried, with its value there."""
    v = r.verdict_at(r.failing_rate)
    assert v is not None
    parts = []
    for slo in r.slos:
        if slo.name in v.violated:
            value = slo.value(v.summary)
            shown = "no value (no request measured it)" if value is None else f"{value:.4g} s"
            parts.append(f"{slo} is not met at the lowest rate tried, {v.rate:g} req/s: {slo.name} = {shown}"
                         + (f" ({v.note})" if v.note and slo.name in v.note else ""))
    return "; ".join(parts)
