"""A latency model where every step costs the same: closed-form checks of the engine."""
from __future__ import annotations

from sim.pricing.latency import TERMS, LatencySources, StepBatch, StepTime


class ConstantLatencyModel:
    """Each step takes `step_s` seconds, all of it booked as fixed overhead."""

    def __init__(self, step_s: float) -> None:
        if step_s <= 0:
            raise ValueError(f"step_s must be positive, got {step_s}")
        self.step_s = step_s
        self.sources = LatencySources({t: "config" for t in TERMS})

    def step_time(self, batch: StepBatch) -> StepTime:
        terms = dict.fromkeys(TERMS, 0.0)
        terms["overhead"] = self.step_s
        return StepTime(terms, "eager" if batch.eager else "graph")
