"""`specsim plan --dense-check`: the best configuration probed at every rate of a dense grid,
to hold the search's capacity against (they agree to within the tolerance when the
configuration's SLO metrics grow with the rate)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from core.config import ConfigError
from sim.plan.candidates import Candidate
from sim.plan.run import CandidateResult, Evaluate, PlanSettings, TraceRates, best, probe_config
from sim.plan.search import Probe, Verdict, round_rate


def dense_rates(capacity: float, tolerance: float, span: float = 1.5) -> list[float]:
    """A rate grid from capacity / span to capacity x span in steps of (1 + tolerance)."""
    lo, n = capacity / span, math.ceil(math.log(span * span) / math.log1p(tolerance))
    return sorted({round_rate(lo * (1 + tolerance) ** i) for i in range(n + 1)})


def dense_capacity(verdicts: list[Verdict]) -> float:
    """The highest grid rate below which every rate of the grid met every SLO (0 if the first fails)."""
    last = 0.0
    for v in sorted(verdicts, key=lambda v: v.rate):
        if not v.met:
            break
        last = v.rate
    return last


def dense_sweep(cand: Candidate, rates: list[float], settings: PlanSettings, evaluate: Evaluate) -> list[Verdict]:
    """Probe every rate of a grid (the same steady-state probe as the search's)."""
    s = settings
    trace = TraceRates(s) if s.arrivals == "trace" else None
    probes = [Probe(rate, s.slos, s.num_requests, s.max_requests, s.stability) for rate in rates]
    while batch := [(p, n) for p in probes for n in p.pending()]:
        records = evaluate([probe_config(s, cand, p.rate, n, trace) for p, n in batch])
        for (p, n), rec in zip(batch, records):
            if rec["status"] != "ok":
                raise ConfigError(f"dense check of {cand.label}: the run at {p.rate:g} req/s is {rec['status']}: "
                                  f"{rec.get('error')}")
            p.add(n, rec["summary"])
    return [p.verdict for p in probes if p.verdict]


@dataclass(frozen=True)
class DenseCheck:
    candidate: str  # the configuration's label
    plan_capacity: float  # the search's, req/s per replica
    dense_capacity: float  # the grid's (dense_capacity)
    rates: list[float]
    verdicts: list[Verdict]
    agrees: bool  # within the plan's tolerance


def dense_check(results: list[CandidateResult], settings: PlanSettings, evaluate: Evaluate,
                log: Callable[[str], None]) -> DenseCheck:
    """The best configuration's dense grid (dense_rates) around its capacity."""
    top = best(results)
    if top.status != "found":
        raise ConfigError(f"--dense-check needs a configuration with a capacity inside [--min-rate, --max-rate]; "
                          f"the best, {top.candidate.label}, is {top.status}")
    rates = dense_rates(top.capacity, settings.tolerance)
    log(f"plan: dense check of {top.candidate.label}: {len(rates)} rates from {rates[0]:g} to {rates[-1]:g} req/s")
    verdicts = dense_sweep(top.candidate, rates, settings, evaluate)
    capacity = dense_capacity(verdicts)
    return DenseCheck(top.candidate.label, top.capacity, capacity, rates, verdicts,
                      abs(capacity - top.capacity) <= settings.tolerance * max(capacity, top.capacity))
