"""Hand-made engine scenarios: closed-form timings, preemption order, conservation.

Every scenario uses a constant step time, so times are multiples of DT, and a
deterministic acceptance (every draft accepted, or none) where a closed form needs it.
The closed forms are those of the synchronous engine without prefix caching (OLD:
vLLM before async scheduling and align mode became defaults); the conservation and
invariant tests run under both OLD and the current defaults. tests/test_engine_semantics.py
pins what the current defaults change.
"""
import math
from dataclasses import replace
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import ConfigError, EngineConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.engine.acceptance import AcceptanceModel
from sim.engine.budget import block_layout, memory_budget
from sim.engine.core import run_engine
from sim.engine.metrics import STEP_COLUMNS, summarize
from sim.engine.pool import make_pool
from sim.engine.request import Status
from sim.engine.scheduler import Scheduler
from sim.pricing.constant import ConstantLatencyModel
from workloads.base import RequestSpec

DT = 0.01  # seconds per step
OLD = EngineConfig(async_scheduling=False, truncate_drafts=False, enable_prefix_caching=False)
CURRENT = EngineConfig()
SEMANTICS = {"old": OLD, "current": CURRENT}
ACCEPT_ALL = [[1.0], [1.0], [1.0]]
REJECT_ALL = [[0.0], [0.0], [0.0]]


def setup(policy="store_all", widths=(1, 1, 1), mtp_depth=None, engine=OLD):
    """Model, policy and the engine's block layout (its pool at gmu 0.9)."""
    model = load_model("qwen3.5-35b-a3b")
    if mtp_depth is not None:
        model = model.model_copy(update={"mtp_depth": mtp_depth})
    tree = {"draft_tree_widths": list(widths)} if policy != "none" else {}  # none drafts nothing
    pol = make_policy(model, load_policy(policy, tree))
    budget = memory_budget(model, load_hardware("h200"), engine)
    return model, pol, block_layout(model, pol, budget.pool_bytes, engine), budget.pool_bytes


def semantics_for(name, max_tokens, policy="store_all", widths=(1, 1, 1)):
    """The named semantics; align mode needs a budget of one block, so below that, current without it."""
    engine = SEMANTICS[name]
    block = setup(policy, widths, engine=engine)[2].attn_block_tokens
    if engine.resolved_mamba_cache_mode == "align" and max_tokens < block:
        return engine.model_copy(update={"enable_prefix_caching": False})
    return engine


def scenario(specs, *, policy="store_all", widths=(1, 1, 1), num_blocks=None, accept=None, allocator="paged",
             max_tokens=8192, max_seqs=1024, concurrency=None, arrivals=None, mtp_depth=None,
             admission="full_prompt", seed=0, engine=OLD, round_trip_s=0.0, trace=True):
    model, pol, layout, pool_bytes = setup(policy, widths, mtp_depth, engine)
    if num_blocks is not None:
        layout = replace(layout, num_blocks=num_blocks)
        pool_bytes = num_blocks * layout.block_bytes
    acceptance = AcceptanceModel(pol.tree.widths, seed, {"": accept} if accept else None)
    result = run_engine(
        specs, pool=make_pool(allocator, model, pol, layout, pool_bytes), policy=pol,
        latency=ConstantLatencyModel(DT), acceptance=acceptance, max_num_batched_tokens=max_tokens,
        max_num_seqs=max_seqs, admission=admission, arrivals=arrivals, max_concurrency=concurrency, trace=trace,
        engine=engine, block_tokens=layout.attn_block_tokens, round_trip_s=round_trip_s,
    )
    return result, summarize(result.requests, result.steps, result.duration_s)


def specs(*lengths):
    return [RequestSpec(i, p, o) for i, (p, o) in enumerate(lengths)]


def by_id(result):
    return {r.rid: r for r in result.requests}


# ------------------------------------------------------------------ closed forms
def test_plain_decode_closed_form():
    res, s = scenario(specs((100, 10)), mtp_depth=0)
    r = by_id(res)[0]
    assert r.first_token_s == pytest.approx(DT)  # one prefill step samples the first token
    assert r.finish_s == pytest.approx(10 * DT)  # then one token per step
    assert s["ttft_mean_s"] == pytest.approx(DT)
    assert s["tpot_mean_s"] == pytest.approx(DT)
    assert s["itl_p99_s"] == pytest.approx(DT)
    assert s["e2e_mean_s"] == pytest.approx(10 * DT)
    assert s["num_steps"] == 10
    assert s["mean_accepted_len"] is None


def test_chunked_prefill_closed_form():
    # 20,000 prompt tokens under an 8,192-token budget: 3 prefill steps.
    _, s = scenario(specs((20000, 5)), mtp_depth=0)
    assert s["ttft_mean_s"] == pytest.approx(3 * DT)
    assert s["e2e_mean_s"] == pytest.approx(7 * DT)
    assert s["tpot_mean_s"] == pytest.approx(DT)


@pytest.mark.parametrize("accept,steps_after_first,accepted_len", [(ACCEPT_ALL, 2, 4.0), (REJECT_ALL, 8, 1.0)])
def test_speculative_closed_form(accept, steps_after_first, accepted_len):
    # 9 output tokens: the first from prefill, then 8 from verify steps of 4 (all accepted) or 1.
    _, s = scenario(specs((100, 9)), accept=accept)
    assert s["ttft_mean_s"] == pytest.approx(DT)
    assert s["e2e_mean_s"] == pytest.approx((1 + steps_after_first) * DT)
    assert s["tpot_mean_s"] == pytest.approx(steps_after_first * DT / 8)
    assert s["itl_mean_s"] == pytest.approx(DT)  # one emission per step, however many tokens
    assert s["mean_accepted_len"] == pytest.approx(accepted_len)


def test_closed_loop_concurrency_limit():
    # 4 requests ready at t=0, at most 2 in flight: the second pair is sent when the first finishes.
    res, s = scenario(specs(*[(100, 5)] * 4), mtp_depth=0, concurrency=2)
    r = by_id(res)
    assert [r[i].send_s for i in range(4)] == pytest.approx([0, 0, 5 * DT, 5 * DT])
    assert [r[i].finish_s for i in range(4)] == pytest.approx([5 * DT, 5 * DT, 10 * DT, 10 * DT])
    assert s["ttft_mean_s"] == pytest.approx(DT)  # the clock starts at send: client queueing excluded
    assert s["e2e_mean_s"] == pytest.approx(5 * DT)
    assert s["client_queue_mean_s"] == pytest.approx(2.5 * DT)
    assert s["duration_s"] == pytest.approx(10 * DT)
    assert s["request_throughput"] == pytest.approx(4 / (10 * DT))
    assert s["output_throughput_tok_s"] == pytest.approx(20 / (10 * DT))


def test_open_loop_arrival_waits_for_the_next_step():
    # Request 1 arrives mid-step (t = 1.5 DT); the engine picks it up at the next step boundary.
    res, _ = scenario(specs((100, 5), (100, 5)), mtp_depth=0, arrivals=[0.0, 1.5 * DT])
    r1 = by_id(res)[1]
    assert r1.send_s == pytest.approx(1.5 * DT)
    assert r1.first_scheduled_s == pytest.approx(2 * DT)
    assert r1.first_token_s - r1.send_s == pytest.approx(1.5 * DT)
    assert r1.waiting_s == pytest.approx(0.5 * DT)


# ------------------------------------------------------------------ preemption
def two_fit_three_arrive():
    """store_all (1,1,1), prompts 19 tokens short of one attention block of B tokens, and a
    pool for exactly two such requests (S state blocks + 1 attention block each)."""
    _, _, layout, _ = setup()
    b, state = layout.attn_block_tokens, layout.state_blocks
    return scenario(specs(*[(b - 19, 100)] * 3), num_blocks=2 * (state + 1) + 1, accept=ACCEPT_ALL)  # + null block


def test_preemption_pool_for_two_three_arrive():
    """Two requests fill the pool; the third waits, and growth preempts the newest.

    Admission checks blocks for the whole prompt (no lookahead), so requests 0 and 1 are
    admitted and no block is left. When request 0's KV plus one verify and the lookahead
    crosses the block it needs a second attention block: the newest running request (1)
    is preempted and request 0 finishes alone. Then request 1 (B - 2 tokens to
    recompute: one attention block) and request 2 are both admitted; request 1 soon
    crosses its block and preempts request 2 again, which runs after request 1 is done.
    Every draft is accepted, so each verify step emits 4 tokens.
    """
    res, s = two_fit_three_arrive()
    events = [(round(t / DT), kind, rid) for t, kind, rid in res.steps.events]
    assert events == [
        (0, "admit", 0), (0, "admit", 1),
        (5, "preempt", 1),  # step 6: request 0 at B - 3 computed tokens needs B - 3 + 4 + 3 > B slots
        (26, "finish", 0),  # 1 prefill step + 25 verify steps (1 + 4 x 25 >= 100)
        (26, "admit", 1), (26, "admit", 2),
        (27, "preempt", 2),  # request 1, at B - 2 tokens after its recompute, crosses the block
        (48, "finish", 1),  # recompute prefill (samples a token) + 21 verify steps for the other 82
        (48, "admit", 2),
        (74, "finish", 2),  # its recompute samples its 2nd token, then 25 verify steps for 98
    ]
    r = by_id(res)
    assert (r[0].preemptions, r[1].preemptions, r[2].preemptions) == (0, 1, 1)
    assert r[1].first_token_s == pytest.approx(DT)  # its first token came before the preemption
    assert r[2].waited_for_memory and r[1].waited_for_memory and not r[0].waited_for_memory
    assert s["preemptions"] == 2 and s["waited_for_memory"] == 2 and s["peak_kv_usage"] == 1.0
    assert all(r.generated == r.output for r in res.requests)


def test_no_admission_in_a_step_that_preempted():
    res, _ = two_fit_three_arrive()
    preempt_times = {t for t, kind, _ in res.steps.events if kind == "preempt"}
    admit_times = {t for t, kind, _ in res.steps.events if kind == "admit"}
    assert preempt_times and not preempt_times & admit_times


# ------------------------------------------------------------------ conservation
# Engine settings and the pool, in requests of 1,100 tokens (about the mean here) it
# holds: two (2.5 byte-granular), so growing requests force preemptions.
CONSERVATION_CASES = {
    "store_all-chain": (dict(policy="store_all"), 2),
    "store_all-tree": (dict(policy="store_all", widths=(3, 3, 3)), 2),
    "reconstruct-tree": (dict(policy="reconstruct", widths=(3, 3, 3)), 2),
    "replay": (dict(policy="replay"), 2),
    "first_chunk": (dict(policy="store_all", admission="first_chunk", max_tokens=256), 2),
    "ideal": (dict(policy="store_all", allocator="ideal"), 2.5),
    "small-budget": (dict(policy="store_all", widths=(3, 3, 3), max_tokens=96, max_seqs=8), 2),
}


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("case", CONSERVATION_CASES)
def test_conservation(case, semantics):
    """A tight pool under mixed lengths: every request ends, tokens add up, memory never overflows."""
    lengths = [(40 + 37 * i % 700, 100 + 53 * i % 900) for i in range(60)]
    lengths.append((250_000, 10))  # within the context, longer than the whole pool: rejected
    settings, worth = CONSERVATION_CASES[case]
    policy, widths = settings["policy"], settings.get("widths", (1, 1, 1))
    engine = semantics_for(semantics, settings.get("max_tokens", 8192), policy, widths)
    blocks = math.ceil(worth * setup(policy, widths, engine=engine)[2].blocks_for(1100))
    res, s = scenario(specs(*lengths), num_blocks=blocks, concurrency=24, engine=engine, **settings)
    for r in res.requests:
        assert r.status in (Status.FINISHED, Status.REJECTED)
        if r.status is Status.FINISHED:
            assert r.generated == r.output
            assert r.first_token_s <= r.finish_s and len(r.token_times) >= 1
        else:
            assert r.reject_reason == "exceeds_pool"
    assert s["rejected"] == 1 and s["completed"] == len(lengths) - 1
    assert s["preemptions"] > 0 and s["peak_kv_usage"] > 0.999  # the pool really was the bottleneck
    assert s["total_output_tokens"] == sum(o for _, o in lengths[:-1])
    used = STEP_COLUMNS.index("used_units")
    assert len(res.steps.rows) == s["num_steps"] > 0
    assert all(0 <= row[used] <= res.pool.capacity for row in res.steps.rows)
    assert res.pool.free == res.pool.capacity  # everything given back


@pytest.mark.parametrize("policy, widths", [("store_all", (1, 1, 1)), ("reconstruct", (3, 3, 3))])
def test_pool_rejection_counts_one_verify_tree_and_the_lookahead(policy, widths):
    """A request is rejected when its largest footprint (every token, one verify tree and the
    K lookahead slots) exceeds the pool; one token shorter, it runs to the end alone."""
    model, pol, layout, _ = setup(policy, widths)
    b = layout.attn_block_tokens
    extra = pol.verify_positions + model.mtp_depth  # 1 + N verify positions, K lookahead slots
    blocks = layout.blocks_for(4 * b) + 1  # + vLLM's null block
    fits = 4 * b - extra
    res, s = scenario(specs((fits - 20, 20), (fits - 19, 20)), policy=policy, widths=widths, num_blocks=blocks)
    assert by_id(res)[0].status is Status.FINISHED and by_id(res)[0].generated == 20
    assert by_id(res)[1].reject_reason == "exceeds_pool" and s["rejected_reasons"] == {"exceeds_pool": 1}


def test_prompt_longer_than_context_is_rejected():
    res, s = scenario(specs((300_000, 10), (100, 10)))
    assert by_id(res)[0].reject_reason == "exceeds_context"
    assert s["rejected_reasons"] == {"exceeds_context": 1} and s["completed"] == 1


def test_whole_tree_skips_speculation_when_budget_is_short():
    # Budget 30 tokens < 40 verify positions of a (3,3,3) tree: every decode step is plain.
    _, s = scenario(specs((20, 6)), widths=(3, 3, 3), max_tokens=30, accept=[[1.0]] * 3)
    assert s["mean_accepted_len"] is None
    assert s["e2e_mean_s"] == pytest.approx(6 * DT)


def test_empty_output_is_an_input_error():
    with pytest.raises(ConfigError, match="request 1: prompt_tokens and output_tokens must be >= 1"):
        scenario(specs((10, 5), (10, 0)))


def test_pool_units():
    model, pol, layout, _ = setup()
    layout = replace(layout, num_blocks=101)  # 100 usable: vLLM's block 0 is the null block
    b, state = layout.attn_block_tokens, layout.state_blocks
    paged = make_pool("paged", model, pol, layout, 0)
    assert (paged.units_for(b), paged.units_for(b + 1)) == (1 + state, 2 + state)  # whole attention blocks
    ideal = make_pool("ideal", model, pol, layout, 100 * layout.block_bytes)
    assert ideal.units_for(b + 1) - ideal.units_for(b) == ideal.token_bytes  # byte-granular
    paged.take(100)
    assert paged.usage == 1.0
    with pytest.raises(RuntimeError, match="over-allocated"):
        paged.take(1)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 400)), min_size=1, max_size=25),
    policy=st.sampled_from(["store_all", "reconstruct", "replay"]),
    widths=st.sampled_from([(1, 1, 1), (2, 2, 1), (3, 3, 3)]),
    spare_blocks=st.integers(0, 60),
    max_tokens=st.sampled_from([64, 512, 8192]),
    admission=st.sampled_from(["full_prompt", "first_chunk"]),
    allocator=st.sampled_from(["paged", "ideal"]),
    concurrency=st.sampled_from([None, 1, 4]),
    semantics=st.sampled_from(sorted(SEMANTICS)),
)
def test_invariants_hold_for_random_scenarios(lengths, policy, widths, spare_blocks, max_tokens, admission,
                                              allocator, concurrency, semantics):
    engine = semantics_for(semantics, max_tokens, policy, widths)
    blocks = setup(policy, widths, engine=engine)[2].state_blocks + 2 + spare_blocks  # one short request + null block
    plans, schedule = [], Scheduler.schedule

    def recorded(self, now, in_flight=None):
        plans.append(schedule(self, now, in_flight))
        return plans[-1]
    with patch.object(Scheduler, "schedule", recorded):
        res, s = scenario(specs(*lengths), policy=policy, widths=widths, num_blocks=blocks, max_tokens=max_tokens,
                          admission=admission, allocator=allocator, concurrency=concurrency, engine=engine)
    for r in res.requests:
        if r.status is Status.FINISHED:
            assert r.generated == r.output
            assert r.send_s <= r.first_token_s <= r.finish_s == r.token_times[-1]
            assert r.token_times == sorted(r.token_times)
        else:
            assert r.status is Status.REJECTED and r.reject_reason in ("exceeds_pool", "exceeds_context")
    used = STEP_COLUMNS.index("used_units")
    assert all(0 <= row[used] <= res.pool.capacity for row in res.steps.rows)
    assert res.pool.free == res.pool.capacity
    # No step admits while it preempts. Per plan, not per event time: under async scheduling the next
    # plan, made while a step runs, may preempt a request that step admitted, at the same instant.
    assert not any(p.admitted and p.preempted for p in plans)
    assert s["preemptions"] == sum(1 for _, kind, _ in res.steps.events if kind == "preempt")


@pytest.mark.parametrize("engine", [OLD, CURRENT], ids=["sync", "async"])
def test_running_requests_never_exceed_max_num_seqs(engine):
    # nine requests at once, room for four: the fifth is admitted only when one of the first four ends
    res, s = scenario(specs(*[(100, 30 + 7 * i) for i in range(9)]), max_seqs=4, engine=engine)
    running = [row[STEP_COLUMNS.index("running")] for row in res.steps.rows]
    assert max(running) == 4 and s["completed"] == 9
    first_end = min(r.finish_s for r in res.requests if r.rid < 4)
    assert all(r.first_scheduled_s >= first_end for r in res.requests if r.rid >= 4)


# ------------------------------------------------------------------ align mode's boundary block
def test_boundary_crossing_takes_a_state_block_per_gdn_group_for_one_step():
    """Prefix caching on (align), async, no speculation: each request holds one attention block and
    a state block per GDN group (3 groups). Two requests B - 2 tokens long fill 8 of 10 blocks.
    The planning of step 3 takes request 0 past its block (computed B - 1 with the step in flight,
    + 1): vLLM's MambaManager takes a block per GDN group for the new state besides the next
    attention block, 4 with 2 free, so the newest request is preempted; at request 0's next
    schedule (step 4) `remove_skipped_blocks` frees the 3 old states, which readmit request 1
    (4 blocks, 1 left); its own crossing at step 5 (recomputed B - 1 tokens + 1) then preempts itself."""
    _, _, layout, _ = setup(mtp_depth=0, engine=CURRENT)
    b = layout.attn_block_tokens
    assert (layout.state_blocks, layout.boundary_blocks) == (3, 3)
    res, s = scenario(specs((b - 2, 6), (b - 2, 6)), policy="none", mtp_depth=0, engine=CURRENT,
                      num_blocks=2 * 4 + 2 + 1)  # + vLLM's null block
    events = [(round(t / DT), kind, rid) for t, kind, rid in res.steps.events]
    assert events == [(0, "admit", 0), (0, "admit", 1), (3, "preempt", 1), (4, "admit", 1), (5, "preempt", 1),
                      (6, "finish", 0), (6, "admit", 1), (10, "finish", 1)]
    # free blocks after each step's planning: 8 held, then request 0's 2 + 3 + 3 old (2 free), then
    # its old states back and request 1 readmitted (1 free)
    assert list(res.steps.free)[:5] == [2, 2, 2, 2, 1]
    assert s["preemptions"] == 2 and all(r.generated == r.output for r in res.requests)
