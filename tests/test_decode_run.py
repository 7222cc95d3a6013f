"""The decode group (sim.engine.decode_group) and its decode runs (sim.engine.decode_run) change how the engine
reaches each step, never what happens: every output of a run with them equals, float for float,
that of the same run planned one request and one step at a time. And the pieces they are built
from give what their one-at-a-time twins give."""
import copy
import functools
import json
import random
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import EngineConfig, RunConfig, load_hardware, load_model, load_policy
from core.interp import GridInterpolator
from policies import make_policy
from policies.replay import ReplayCache, ReplayCaches
from sim.engine import scheduler as scheduler_module
from sim.engine.acceptance import AcceptanceStream
from sim.engine.budget import served_model
from sim.engine.core import run_engine
from sim.engine.decode_group import DecodeGroup
from sim.engine.decode_run import DecodeRuns, landing_delay
from sim.engine.metrics import request_rows
from sim.engine.step_trace import BatchTotals, batch_of_totals
from sim.pricing.dispatch import capture_sizes
from sim.pricing.factory import make_latency_model
from sim.pricing.latency import TERMS
from sim.runs import run as run_module
from sim.runs.run import simulate_result
from test_engine_scenarios import CURRENT, OLD, scenario, specs

# Each covers a path of the runs: every policy, trees, sync and async scheduling, align mode and
# none, preemption while decoding, a token budget that cuts drafts, open-loop arrivals that cut
# runs, the client's round trip, the ideal allocator, both pricings, an analytic-priced model,
# concurrency 1 (the by-context prices) and a lone request's last prompt token decoded alone.
CASES = {
    "store_all-c8": {"client": {"max_concurrency": 8}},
    "reconstruct-c1": {"policy": "reconstruct", "client": {"max_concurrency": 1}, "num_requests": 40},
    "replay-c1": {"policy": "replay", "client": {"max_concurrency": 1}, "num_requests": 40},
    "replay-c16-sync": {"policy": "replay", "client": {"max_concurrency": 16},
                        "engine": {"async_scheduling": False}},
    "deferred-c32": {"policy": "reconstruct_deferred", "client": {"max_concurrency": 32}},
    "none-c1": {"policy": "none", "client": {"max_concurrency": 1}, "num_requests": 30},
    "none-c64-align": {"policy": "none", "workload": "balanced-chat", "client": {"max_concurrency": 64}},
    "none-sync-c8": {"policy": "none", "client": {"max_concurrency": 8}, "engine": {"async_scheduling": False}},
    "tree-c16": {"policy_overrides": {"draft_tree_widths": [2, 2, 1]}, "client": {"max_concurrency": 16}},
    "preempt-async": {"engine": {"gmu": 0.6}, "client": {"max_concurrency": 256}, "num_requests": 400},
    "preempt-sync": {"engine": {"gmu": 0.6, "async_scheduling": False}, "client": {"max_concurrency": 256},
                     "num_requests": 400},
    "preempt-replay": {"policy": "replay", "engine": {"gmu": 0.6}, "client": {"max_concurrency": 256},
                       "num_requests": 400},
    "budget": {"engine": {"max_num_batched_tokens": 300, "max_num_seqs": 128, "enable_prefix_caching": False},
               "client": {"max_concurrency": 128}},
    "poisson": {"client": {"request_rate": 6.0}, "num_requests": 150},
    "round-trip": {"client": {"max_concurrency": 8, "round_trip_s": 0.01, "tokenize_s_per_token": 1e-5}},
    "ideal": {"engine": {"allocator": "ideal", "gmu": 0.6}, "client": {"max_concurrency": 128}},
    "eager-sum": {"policy": "replay", "engine": {"latency_pricing": "eager_sum"}, "client": {"max_concurrency": 8}},
    "analytic": {"model": "qwen3.5-27b", "client": {"max_concurrency": 8}},
    "max-seqs": {"engine": {"max_num_seqs": 6}, "client": {"max_concurrency": 20}},
    "397b": {"model": "qwen3.5-397b-a17b", "policy": "replay", "client": {"max_concurrency": 32}},
}


ALWAYS_JOINED = ()  # cases whose runs all stop at their first step (none so far)


def run(cfg: dict, monkeypatch, group: bool):
    """The summary, request rows, step durations and pool usage of one configuration."""
    with monkeypatch.context() as m:
        if not group:
            m.setattr(run_module, "run_engine", functools.partial(run_engine, decode_group=False))
        summary, result = simulate_result(RunConfig.model_validate(cfg))
    return (json.dumps(summary, sort_keys=True), request_rows(result.requests), result.steps.durations.tolist(),
            result.steps.usage.tolist())


@pytest.mark.parametrize("keep", [2, scheduler_module.KEEP], ids=["keep-2", "keep-default"])
@pytest.mark.parametrize("name", CASES)
def test_group_and_runs_change_no_output(name, keep, monkeypatch):
    # keep-2 keeps a group from step to step at every concurrency, not only at the default's
    cfg = {"workload": "generation-heavy", "num_requests": 120, "seed": 3, **CASES[name]}
    monkeypatch.setattr(scheduler_module, "KEEP", keep)
    joined, ran = [], []
    join, advance = DecodeGroup.join, DecodeRuns.advance

    def counted_join(self, reqs):
        joined.append(len(reqs))
        return join(self, reqs)

    def counted_advance(self, plan, now, horizon):
        delay = advance(self, plan, now, horizon)
        ran.append(delay is not None)
        return delay

    monkeypatch.setattr(DecodeGroup, "join", counted_join)
    monkeypatch.setattr(DecodeRuns, "advance", counted_advance)
    with_group = run(cfg, monkeypatch, group=True)
    assert sum(joined), "no request joined the decode group: the case tests nothing"
    assert any(ran) or name in ALWAYS_JOINED, "no decode run was taken"
    assert with_group == run(cfg, monkeypatch, group=False)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1500), st.integers(1, 120)), min_size=1, max_size=14),
       st.sampled_from(["store_all", "replay", "reconstruct", "none"]), st.booleans(),
       st.sampled_from([None, 30, 60]), st.sampled_from([None, 1, 3]), st.integers(0, 3))
def test_group_changes_nothing_in_hand_made_scenarios(lengths, policy, current, blocks, concurrency, seed):
    # A traced run plans every request on its own (no decode group while tracing); an untraced one keeps one.
    # (a group kept from step to step from two members: these scenarios hold a few requests)
    engine = CURRENT if current else OLD
    kw = dict(policy="store_all" if policy == "none" else policy, mtp_depth=0 if policy == "none" else None,
              num_blocks=blocks, concurrency=concurrency, seed=seed, engine=engine,
              arrivals=[0.013 * i for i in range(len(lengths))] if seed % 2 else None)
    try:
        traced, s1 = scenario(specs(*lengths), **kw)
    except Exception as e:  # a pool too small for the requests: both must refuse alike
        with pytest.raises(type(e)), mock.patch.object(scheduler_module, "KEEP", 2):
            scenario(specs(*lengths), trace=False, **kw)
        return
    with mock.patch.object(scheduler_module, "KEEP", 2):
        plain, s2 = scenario(specs(*lengths), trace=False, **kw)
    assert s1 == s2
    assert request_rows(traced.requests) == request_rows(plain.requests)


# ------------------------------------------------------------------ the pieces
def test_acceptance_stream_ahead_then_skip_reads_the_same_counts():
    one, two = AcceptanceStream(5, 9, (0.8, 0.7, 0.6)), AcceptanceStream(5, 9, (0.8, 0.7, 0.6))
    rng = random.Random(1)
    for _ in range(60):
        k = rng.randint(1, 700)
        ahead = two.ahead(k).tolist()
        assert two.ahead(k).tolist() == ahead  # looking does not use them
        taken = rng.randint(0, k)
        two.skip(taken)
        assert [one.accepted_drafts() for _ in range(taken)] == ahead[:taken]
        # read one at a time in between, across the blocks' ends
        single = rng.randint(0, 90)
        assert [two.accepted_drafts() for _ in range(single)] == [one.accepted_drafts() for _ in range(single)]
    with pytest.raises(ValueError):
        AcceptanceStream(5, 9, (0.8,)).skip(1)


@pytest.mark.parametrize("interval", [1, 2, 4, 5])
def test_replay_caches_as_arrays_follow_each_caches_rules(interval):
    rng = np.random.default_rng(interval)
    for _ in range(50):
        caches = []
        for _ in range(int(rng.integers(1, 6))):
            c = ReplayCache(interval)
            for _ in range(int(rng.integers(0, 9))):
                c.committed(int(rng.integers(1, 5)))
            caches.append(c)
        alone = [copy.copy(c) for c in caches]
        many = ReplayCaches(interval)
        many.add(caches)
        committed = rng.integers(1, 5, size=(len(caches), int(rng.integers(1, 14))))
        replayed, flush = many.work_ahead(committed)
        for i, c in enumerate(alone):
            for k in range(committed.shape[1] + 1):
                assert (replayed[i, k], flush[i, k]) == c.verify_work()
                if k < committed.shape[1]:
                    c.committed(int(committed[i, k]))
        step = rng.integers(1, 5, size=len(caches))  # one more verify each, as the group commits it
        many.fast_forward(committed.shape[1], replayed[:, -1])
        assert [tuple(w) for w in zip(*many.verify_work())] == [c.verify_work() for c in alone]
        many.committed(step)
        for c, s in zip(alone, step.tolist()):
            c.committed(s)
        leaving = [0, len(caches) - 1]
        keep = np.ones(len(caches), bool)
        keep[leaving] = False
        many.remove(keep, [(i, caches[i]) for i in leaving])
        for i in leaving:
            assert (caches[i].steps, caches[i].tokens) == (alone[i].steps, alone[i].tokens)
        assert len(many.steps) == int(keep.sum())


def test_curve_over_an_array_is_the_curve_at_each_point():
    rng = random.Random(4)
    for _ in range(200):
        ctx = sorted({rng.uniform(0, 5000) for _ in range(rng.randint(2, 7))})
        seqs = sorted(rng.sample(range(1, 60), 2))
        grid = GridInterpolator("g", ("B", "ctx"), (seqs, ctx), [rng.uniform(1, 100) for _ in range(2 * len(ctx))],
                                ("log", "linear"), extrapolate=True)
        curve = grid.partial(rng.uniform(seqs[0], 1.5 * seqs[-1]))
        x = np.array([rng.uniform(-100, 7000) for _ in range(40)] + ctx)
        assert curve.many(x).tolist() == [curve(v) for v in x.tolist()]


@pytest.mark.parametrize("model_name", ["qwen3.5-35b-a3b", "qwen3.5-397b-a17b"])
@pytest.mark.parametrize("policy_name", ["store_all", "replay", "reconstruct_deferred", "none"])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_pipeline_prices_steps_at_once_as_one_by_one(model_name, policy_name, async_scheduling):
    engine = EngineConfig(async_scheduling=async_scheduling)
    model = served_model(load_model(model_name), engine)
    spec = policy_name != "none"
    if not spec:
        model = model.model_copy(update={"mtp_depth": 0})
    policy = make_policy(model, load_policy(policy_name))
    latency = make_latency_model(model, load_hardware("h200"), policy, engine)
    vp, depth = (policy.verify_positions, model.mtp_depth) if spec else (1, 0)
    rng = random.Random(7)
    for rows in (1, 3, 64, 700):
        contexts = np.array(sorted(rng.randint(rows, rows * 9000) for _ in range(30)))
        replayed = np.array([rng.randint(0, 12 * rows) for _ in contexts]) if policy_name == "replay" else None
        flush = rng.randint(0, rows) if policy_name == "replay" else (rows if spec else 0)
        head = BatchTotals(rows, rows * vp, rows, True, rows if spec else 0, 0, 0, flush, int(contexts[0]),
                           int(contexts[0]), ())
        batch = batch_of_totals(head, verify_positions=vp, draft_depth=depth, sizes=capture_sizes(1024, 8192, vp),
                                full_graph_ok=not policy.forces_eager())
        many = latency.step_times(batch, contexts, replayed)
        for k, c in enumerate(contexts.tolist()):
            one = latency.step_time(batch._replace(context_tokens=c, max_context=c,
                                                   replay_tokens=int(replayed[k]) if replayed is not None else 0))
            assert many.total_s[k] == one.total_s and many.mode == one.mode
            assert many.terms_s[k].tolist() == [one.terms[t] for t in TERMS]


def test_landing_delay_lands_exactly_or_says_none():
    rng = random.Random(2)
    for _ in range(20000):
        now = rng.uniform(0, 100)
        end = now
        for _ in range(rng.randint(1, 50)):
            end += rng.uniform(1e-4, 0.1)
        d = landing_delay(now, end)
        assert d is None or now + d == end
    assert landing_delay(0.5, 0.5 + 2 ** -53 * 3) is not None
