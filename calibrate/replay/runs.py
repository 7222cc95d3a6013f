"""The simulator runs a replay holds its measurements against: their traced steps and configs, and their pricing.

A run is one `specsim run --trace-steps` output (RUN/steps.csv: the steps, each with the
simulator's prediction and its terms, and the run's model, policy and engine). `reprice` prices
the traced steps again with today's latency model (`specsim calibrate replay --summarize`, on the
CPU), `old_pricer` with the simulator's old eager-sum pricing, the comparison of each row.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from core.config import EngineConfig, ModelConfig, PolicyConfig, load_hardware, load_model, load_policy
from core.errors import ConfigError


@dataclass
class Run:
    name: str
    meta: dict
    steps: list  # sim.engine.step_trace.TracedStep
    model: ModelConfig
    policy: PolicyConfig
    engine: EngineConfig
    smoke: bool = False  # --smoke: synthetic steps of every kind instead of traced ones


def load_run(path: Path) -> Run:
    from sim.engine.step_trace import read_steps

    meta, steps = read_steps(path)
    model = load_model(meta["model"])
    policy = load_policy(meta["policy"], meta.get("policy_overrides") or None)
    engine = EngineConfig(**meta.get("engine", {}))
    return Run(path.parent.name, meta, steps, model, policy, engine)


def old_pricer(run: Run, hw_name: str, log: Callable[[str], None]) -> Callable[[object], float] | None:
    """The simulator's old eager-sum pricing of a traced step (us), if the simulator still offers it."""
    try:
        from policies import make_policy
        from sim.engine.step_trace import batch_of
        from sim.pricing.factory import make_latency_model

        engine = run.engine.model_copy(update={"latency_pricing": "eager_sum"})
        pol = make_policy(run.model, run.policy)
        lat = make_latency_model(run.model, load_hardware(hw_name), pol, engine)
        return lambda step: lat.step_time(batch_of(step, run.model, pol, engine)).total_s * 1e6
    except Exception as e:  # the old pricing is a comparison only: go on without it
        log(f"  old eager-sum pricing unavailable ({type(e).__name__}: {e})")
        return None


def shape_columns(step: object) -> dict[str, int]:
    """replay_steps.csv's columns that say which step a row timed."""
    from calibrate.executor.step_layout import query_tokens

    return {"tokens": sum(query_tokens(r) for r in step.requests), "requests": len(step.requests),
            "decodes": sum(1 for r in step.requests if r.prefill == 0),
            "prefills": sum(1 for r in step.requests if r.prefill > 0),
            "context_tokens": sum(r.context for r in step.requests)}


def reprice(rows: list[dict], runs: dict[str, Run], hw_name: str, log: Callable[[str], None]) -> None:
    """Recompute predicted_us (the run's own pricing, today's tables) and old_predicted_us in place (CPU).
    A steps file regenerated since the replay must hold the very steps it timed: a row whose step
    differs in shape (tokens, requests, decodes, prefills, context) is refused, not re-priced."""
    from policies import make_policy
    from sim.engine.step_trace import batch_of
    from sim.pricing.factory import make_latency_model

    for name, run in runs.items():
        pol = make_policy(run.model, run.policy)
        lat = make_latency_model(run.model, load_hardware(hw_name), pol, run.engine)
        old = old_pricer(run, hw_name, log)
        by_step = {s.step: s for s in run.steps}
        for r in rows:
            if r["run"] == name and int(r["step"]) in by_step:
                s = by_step[int(r["step"])]
                shape = shape_columns(s)
                if any(int(float(r[k])) != v for k, v in shape.items()):
                    raise ConfigError(f"--steps for run {name}: step {r['step']} is not the step replay_steps.csv "
                                      f"timed ({ {k: r[k] for k in shape} } there, {shape} here): trace the run "
                                      "with the commit and tables the replay's provenance names")
                t = lat.step_time(batch_of(s, run.model, pol, run.engine))
                r["predicted_us"] = t.total_s * 1e6
                for k, v in t.terms.items():
                    r[f"pred_{k}"] = v * 1e6
                if old is not None:
                    r["old_predicted_us"] = old(s)
