"""The step loop's shortcuts give what the plain computation gives: accepted counts drawn in
blocks, blocks asked for only past what a request holds, dispatch from totals, the per-step
request count, what a finished request still holds, and how a run leaves the collector."""
import gc

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import GiB
from sim.engine.acceptance import AcceptanceStream
from sim.engine.pool import make_pool
from sim.pricing.dispatch import capture_sizes, dispatch, dispatch_counts
from test_engine_scenarios import CURRENT, scenario, setup, specs


@pytest.mark.parametrize("thresholds", [(0.86, 0.86, 0.86), (0.9, 0.5), (0.3,), (1.0, 0.0, 1.0)])
def test_block_draws_match_one_draw_per_verify(thresholds):
    # The per-verify rule on the stream's own uniforms: count the leading depths below their threshold.
    stream = AcceptanceStream(7, 42, thresholds)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([7, 42])))
    for block in range(3):  # across refills
        u = rng.random(len(thresholds) * 64).reshape(64, len(thresholds))
        for row in u:
            expected = 0
            while expected < len(thresholds) and row[expected] < thresholds[expected]:
                expected += 1
            assert stream.accepted_drafts() == expected


@pytest.mark.parametrize("allocator", ["paged", "ideal"])
def test_tokens_held_is_the_edge_of_the_units(allocator):
    model, pol, layout, _ = setup(engine=CURRENT)
    pool = make_pool(allocator, model, pol, layout, 10 * GiB)
    for tokens in (1, 7, layout.attn_block_tokens - 1, layout.attn_block_tokens, 3 * layout.attn_block_tokens + 5,
                   100_000):
        units = pool.units_for(tokens)
        held = pool.tokens_held(units)
        assert held >= tokens and pool.units_for(held) == units and pool.units_for(held + 1) > units


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.booleans()), min_size=1, max_size=40), st.sampled_from([1, 4]),
       st.booleans())
def test_dispatch_from_totals_matches_dispatch(reqs, uniform_len, full_ok):
    lens = [uniform_len if dec and i % 3 else n for i, (n, dec) in enumerate(reqs)]
    decoding = [dec for _, dec in reqs]
    sizes = capture_sizes(1024, 8192, uniform_len)
    uniform = all(n == uniform_len for n in lens)
    assert dispatch_counts(sum(lens), len(lens), sum(decoding), uniform, sizes, full_ok) == \
        dispatch(lens, decoding, uniform_len, sizes, full_ok)


def test_request_steps_count_every_scheduled_request():
    result, summary = scenario(specs((300, 40), (2000, 25), (50, 60)), engine=CURRENT, concurrency=2)
    assert result.steps.request_steps == sum(len(s.requests) for s in result.steps.traced_steps())
    assert result.steps.request_steps > summary["num_steps"]  # two requests share most steps


@pytest.mark.parametrize("collecting", [True, False])
def test_a_run_freezes_nothing_and_leaves_the_collector_as_it_found_it(collecting, monkeypatch):
    # Freezing what exists at a run's start froze a sweep worker's earlier runs' garbage with it:
    # unfrozen into the oldest generation, it waited for full passes that seldom came (a worker
    # grew by a few hundred MB a grid). The loop runs with the collector resting instead.
    during = []
    run = simpy.Environment.run

    def watched(self, *a, **k):
        during.append((gc.get_freeze_count(), gc.isenabled()))
        return run(self, *a, **k)

    monkeypatch.setattr(simpy.Environment, "run", watched)
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        scenario(specs((300, 40), (500, 25)), engine=CURRENT, trace=False)
        after = gc.get_freeze_count(), gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert during == [(0, False)]
    assert after == (0, collecting)


def test_a_finished_request_holds_no_acceptance_stream():
    result, summary = scenario(specs((300, 40), (500, 25)), engine=CURRENT, accept=[[0.8]] * 3)
    assert summary["mean_accepted_len"] is not None  # they did verify drafts
    assert all(r.acceptance is None for r in result.requests)



@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(0, 100), max_size=30), max_size=40), st.integers(1, 9))
def test_gaps_gathered_in_chunks_are_each_requests_gaps_in_turn(emissions, chunk):
    from types import SimpleNamespace
    from sim.engine import metrics
    requests = [SimpleNamespace(token_times=sorted(t)) for t in emissions]
    expected = [g for r in requests for g in np.diff(r.token_times).tolist()]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(metrics, "GAP_CHUNK", chunk)
        assert metrics._gaps(requests).tolist() == expected


def test_percentiles_taken_in_place_are_those_of_the_values():
    from sim.engine.metrics import PERCENTILES, _stats
    values = np.random.default_rng(3).exponential(size=10_001)
    got = _stats("x", values.copy())
    assert got["x_mean_s"] == float(values.mean())
    assert [got[f"x_{k}_s"] for k in PERCENTILES] == [float(np.percentile(values, q)) for q in PERCENTILES.values()]
