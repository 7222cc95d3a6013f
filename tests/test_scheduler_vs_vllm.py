"""The simulator's scheduler makes vLLM 0.17.1's plans, step for step.

Each fixture in tests/data/vllm_scheduler/ holds what vLLM 0.17.1's own `Scheduler` and
`KVCacheManager` planned for a run's requests arriving at recorded times, steps starting at
recorded times (`python -m calibrate.scheduler.lockstep --record`, in an interpreter with vLLM's
code; docs/scheduler_check.md): a pool that binds and preempts, with async scheduling and without,
and prefill chunks aligned to mamba blocks under prefix caching. The same calls, in the same order
(calibrate.scheduler.drive), on sim.engine.scheduler.Scheduler must give the same plans: the
tokens of every request in every step, and whom each step preempts."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.scheduler.drive import Arrival, Planned, drive
from core.config import EngineConfig, load_model, load_policy
from policies import make_policy
from sim.engine.budget import block_layout, served_model
from sim.engine.pool import PagedPool
from sim.engine.request import Request
from sim.engine.scheduler import Scheduler
from sim.runs.speculation import speculating_model
from workloads.base import RequestSpec

FIXTURES = sorted((Path(__file__).parent / "data" / "vllm_scheduler").glob("*.json"))


class SimAdapter:
    """sim.engine.scheduler.Scheduler behind drive's calls, as sim.engine.core.Engine calls it."""

    def __init__(self, setup: dict) -> None:
        engine = EngineConfig(**setup["engine"])
        none = load_policy("none")
        model = served_model(speculating_model(load_model(setup["model"], setup["model_overrides"]), none), engine)
        layout = replace(block_layout(model, make_policy(model, none), 1 << 30, engine), num_blocks=setup["num_blocks"])
        assert layout.attn_block_tokens == setup["block_tokens"]
        align = setup["mamba_cache_mode"] == "align"
        self.sched = Scheduler(PagedPool(layout), max_num_batched_tokens=setup["max_num_batched_tokens"],
                               max_num_seqs=setup["max_num_seqs"], verify_positions=1, lookahead=0,
                               admission=engine.admission, max_model_len=model.max_model_len,
                               async_scheduling=setup["async_scheduling"], truncate_drafts=False,
                               align_tokens=layout.attn_block_tokens if align else 0)

    def add(self, a: Arrival) -> None:
        self.sched.add(Request(RequestSpec(a.rid, a.prompt, a.output), a.at_s), a.at_s)

    def schedule(self, at_s, in_flight):
        plan = self.sched.schedule(at_s, in_flight)
        if plan.empty:
            return None
        return plan, Planned(0, at_s, {r.rid: n for r, n in plan.tokens.items()}, {r.rid for r in plan.preempted})

    def update(self, plan, end_s, following) -> None:
        self.sched.update_from_output(plan, end_s, None, following)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_plans_are_vllms(path):
    fx = json.loads(path.read_text())
    arrivals = [Arrival(*a) for a in fx["arrivals"]]
    ours = drive(SimAdapter(fx["setup"]), arrivals, fx["step_starts"], fx["setup"]["async_scheduling"])
    vllm = [Planned(k, at, dict(plan), set(pre)) for k, (at, plan, pre) in enumerate(fx["vllm_plans"])]
    assert len(ours) == len(vllm)
    for mine, theirs in zip(ours, vllm):
        assert (mine.tokens, mine.preempted) == (theirs.tokens, theirs.preempted), f"step {theirs.step}"


def test_the_fixtures_cover_preemption_both_schedulings_and_aligned_chunks():
    fixtures = [json.loads(p.read_text()) for p in FIXTURES]
    assert {f["provenance"]["packages"]["vllm"] for f in fixtures} == {"0.17.1"}
    preempting = [f for f in fixtures if any(pre for _, _, pre in f["vllm_plans"])]
    assert {f["setup"]["async_scheduling"] for f in preempting} == {True, False}
    aligned = [f for f in fixtures if f["setup"]["mamba_cache_mode"] == "align"]
    assert aligned and any(n == f["setup"]["block_tokens"] for f in aligned for _, plan, _ in f["vllm_plans"]
                           for _, n in plan)


def test_another_order_of_calls_is_caught():
    """The comparison can fail: the preempting async fixture replayed as sync scheduling plans otherwise."""
    fx = json.loads(next(p for p in FIXTURES if p.stem == "none-async").read_text())
    fx["setup"]["async_scheduling"] = False
    ours = drive(SimAdapter(fx["setup"]), [Arrival(*a) for a in fx["arrivals"]], fx["step_starts"], False)
    assert any((m.tokens, m.preempted) != (dict(p), set(pre)) for m, (_, p, pre) in zip(ours, fx["vllm_plans"]))
