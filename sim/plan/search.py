"""The capacity search of `specsim plan`: per rate, a steady-state probe; per configuration,
bracketing then bisection on the rate. Pure logic: the caller runs the simulations.

A probe at one rate runs the same configuration at two lengths, N and 2N requests, each
measuring latency over its requests minus a warm-up (the first arrivals, which meet an
empty engine) and a cool-down (the last, which meet a draining one). The probe is steady
when every SLO metric moves by at most `stability` x its bound between the two lengths;
if not, it doubles the longer length until it is, or until `max_requests`. The N-request
run goes first: a run that breaks an SLO by more than the stability margin fails the probe
without the longer runs. Otherwise the verdict is
the longest run's: every SLO met. A probe that never steadies and whose metric still
grows by more than the stability margin fails even if the longest run met the bound: a
queue that keeps growing has no steady state, and a longer run would break the bound.

The search multiplies the rate from `start` while probes pass and divides it while they fail,
by a factor that squares each step, until one rate passes and one fails (or it leaves
[min_rate, max_rate]); then it bisects
geometrically until (fail - pass) / pass <= tolerance. The capacity is the highest rate
that passed. Rates are rounded to RATE_DIGITS significant digits so that a rerun (and a
cached probe) lands on the same numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.config import ConfigError
from sim.plan.slo import Slo

RATE_DIGITS = 5
MIN_TOLERANCE = 1e-3  # finer than the rate's rounding and than any simulation's resolution of a rate
MAX_TOLERANCE = 0.5
GROWTH = 2.0  # the first bracketing step from a start the user gave


def round_rate(rate: float) -> float:
    return float(f"{rate:.{RATE_DIGITS}g}")


def check_tolerance(tolerance: float) -> None:
    if not MIN_TOLERANCE <= tolerance <= MAX_TOLERANCE:
        raise ConfigError(f"--tolerance {tolerance:g}: the relative tolerance must be in "
                          f"[{MIN_TOLERANCE:g}, {MAX_TOLERANCE:g}] (rates are resolved to {RATE_DIGITS} significant "
                          f"digits; above {MAX_TOLERANCE:g} the bracket alone decides)")


# -------------------------------------------------------------------------- probes
@dataclass
class Verdict:
    rate: float
    met: bool
    steady: bool
    num_requests: int  # of the run the verdict is read from (the longest)
    summary: dict[str, Any]
    violated: tuple[str, ...] = ()  # SLOs over their bound, or still growing, at this rate
    note: str = ""  # why a probe is not steady
    lengths: int = 2  # run lengths it took
    cut: bool = False  # failed because a run broke an SLO by more than the stability margin


class Probe:
    """One rate of one configuration: runs at doubling lengths until its SLO metrics are stable.

    Each run decides in turn, the shortest first: one that breaks an SLO by more than the
    stability margin fails the probe there (from an empty engine at its start, a longer run
    only queues more), which spares the longer runs for the probes that fail. When cores are idle
    the caller may run 2N beside N (`pending(ahead=True)`); the verdict is the same.
    """

    def __init__(self, rate: float, slos: list[Slo], num_requests: int, max_requests: int, stability: float) -> None:
        self.rate, self.slos, self.max_requests, self.stability = rate, slos, max_requests, stability
        self.runs: dict[int, dict[str, Any]] = {}
        self._wanted = [num_requests]  # the lengths the next decision needs
        self.verdict: Verdict | None = None

    def pending(self, ahead: bool = False) -> list[int]:
        """Lengths still to run (empty once decided); `ahead`: with the first, the second too."""
        if self.verdict:
            return []
        wanted = self._wanted + ([2 * self._wanted[0]] if ahead and len(self._wanted) == 1 else [])
        return [n for n in wanted if n not in self.runs]

    def add(self, num_requests: int, summary: dict[str, Any]) -> None:
        self.runs[num_requests] = summary
        while not self.verdict and all(n in self.runs for n in self._wanted):  # a run fetched ahead may decide more
            n = self._wanted[-1]
            if broken := self._broken(self.runs[n]):
                self.verdict = Verdict(self.rate, False, False, n, self.runs[n], broken,
                                       f"broke {', '.join(broken)} by more than {self.stability:g} x the bound at {n} "
                                       "requests", lengths=len(self._wanted), cut=True)
            elif len(self._wanted) == 1:
                self._wanted.append(2 * n)
            else:
                self._decide()

    def _broken(self, summary: dict[str, Any]) -> tuple[str, ...]:
        """SLOs a run breaks by more than the stability margin: no longer run would mend them."""
        return tuple(s.name for s in self.slos
                     if s.value(summary) is None or s.value(summary) > (1 + self.stability) * s.bound_s)

    def _decide(self) -> None:
        short, long = self._wanted[-2:]
        a, b = self.runs[short], self.runs[long]
        moved = [s for s in self.slos if _moved(s, a, b) > self.stability * s.bound_s]
        if moved and 2 * long <= self.max_requests:
            self._wanted.append(2 * long)
            return
        growing = [s for s in moved if _grew(s, a, b)]
        violated = tuple(s.name for s in self.slos if not s.met(b) or s in growing)
        note = ""
        if growing:
            note = (f"not steady: {', '.join(s.name for s in growing)} still growing from {short} to {long} requests "
                    f"(by more than {self.stability:g} x the bound)")
        elif moved:
            note = f"not steady at {long} requests: {', '.join(s.name for s in moved)} still moving"
        self.verdict = Verdict(self.rate, not violated, not moved, long, b, violated, note, len(self.runs))


def _moved(slo: Slo, a: dict[str, Any], b: dict[str, Any]) -> float:
    va, vb = slo.value(a), slo.value(b)
    if va is None or vb is None:
        return 0.0 if va is vb else math.inf
    return abs(vb - va)


def _grew(slo: Slo, a: dict[str, Any], b: dict[str, Any]) -> bool:
    va, vb = slo.value(a), slo.value(b)
    return va is not None and vb is not None and vb > va


# -------------------------------------------------------------------------- search
@dataclass
class CapacitySearch:
    """`step`: the first bracketing factor; each further step squares it (2, 4, 16, ... from a
    guess, 1.25, 1.56, 2.4, ... from an estimate), so a bad start costs few probes."""
    start: float
    tolerance: float
    min_rate: float
    max_rate: float
    step: float = GROWTH
    passed: float | None = None  # highest rate that met every SLO
    failed: float | None = None  # lowest rate that did not
    tried: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.min_rate <= self.start <= self.max_rate:
            raise ConfigError(f"the rates must satisfy 0 < --min-rate <= --start-rate <= --max-rate; got "
                              f"{self.min_rate:g}, {self.start:g}, {self.max_rate:g}")

    @property
    def outcome(self) -> str | None:
        """None while searching; 'found', 'none_met' (even min_rate fails) or 'above_max'."""
        if self.passed is not None and self.failed is not None:
            return "found" if self._bisect() is None else None
        if self.failed is not None and self.failed <= self.min_rate:
            return "none_met"
        if self.passed is not None and self.passed >= self.max_rate:
            return "above_max"
        return None

    def _bisect(self) -> float | None:
        lo, hi = self.passed, self.failed
        if (hi - lo) / lo <= self.tolerance:
            return None
        mid = round_rate(math.sqrt(lo * hi))
        return mid if lo < mid < hi else None

    def next_rate(self) -> float | None:
        """The rate to probe next (the same one until it is recorded); None when done."""
        if self.outcome is not None:
            return None
        if self.passed is None and self.failed is None:
            return round_rate(self.start)
        if self.passed is not None and self.failed is not None:
            return self._bisect()
        # Bracketing: every probe so far stepped the same way; the factor squares each step.
        factor = self.step ** (2 ** (len(self.tried) - 1))
        if self.failed is None:
            return round_rate(min(self.passed * factor, self.max_rate))
        return round_rate(max(self.failed / factor, self.min_rate))

    def record(self, rate: float, met: bool) -> None:
        self.tried.append(rate)
        if met:
            self.passed = rate if self.passed is None else max(self.passed, rate)
        else:
            self.failed = rate if self.failed is None else min(self.failed, rate)
