"""Hand-made engine scenarios: closed-form timings, preemption order, conservation.

Every scenario uses a constant step time, so times are multiples of DT, and a
deterministic acceptance (every draft accepted, or none) where a closed form needs it.
"""
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import ConfigError, EngineConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.acceptance import AcceptanceModel
from sim.budget import block_layout, memory_budget
from sim.engine import run_engine
from sim.latency_constant import ConstantLatencyModel
from sim.metrics import STEP_COLUMNS, summarize
from sim.pool import make_pool
from sim.request import Status
from workloads.base import RequestSpec

DT = 0.01  # seconds per step
ACCEPT_ALL = [[1.0], [1.0], [1.0]]
REJECT_ALL = [[0.0], [0.0], [0.0]]


def scenario(specs, *, policy="store_all", widths=(1, 1, 1), num_blocks=None, accept=None, allocator="paged",
             max_tokens=8192, max_seqs=1024, concurrency=None, arrivals=None, mtp_depth=None,
             admission="full_prompt", seed=0):
    model = load_model("qwen3.5-35b-a3b")
    if mtp_depth is not None:
        model = model.model_copy(update={"mtp_depth": mtp_depth})
    pol = make_policy(model, load_policy(policy, {"draft_tree_widths": list(widths)}))
    budget = memory_budget(model, load_hardware("h200"), EngineConfig(gmu=0.9))
    layout = block_layout(model, pol, budget.pool_bytes)
    pool_bytes = budget.pool_bytes
    if num_blocks is not None:
        layout = replace(layout, num_blocks=num_blocks)
        pool_bytes = num_blocks * layout.block_bytes
    acceptance = AcceptanceModel(pol.tree.widths, seed, {"": accept} if accept else None)
    result = run_engine(
        specs, pool=make_pool(allocator, model, pol, layout, pool_bytes), policy=pol,
        latency=ConstantLatencyModel(DT), acceptance=acceptance, max_num_batched_tokens=max_tokens,
        max_num_seqs=max_seqs, admission=admission, arrivals=arrivals, max_concurrency=concurrency, trace=True,
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
def test_preemption_pool_for_two_three_arrive():
    """store_all (1,1,1): 12 state blocks + 1 attention block (560 tokens) per 541-token prompt.

    A 26-block pool admits two requests (13 blocks each) and leaves none free. When
    request 0's KV crosses 560 tokens it needs a 14th block: the newest running request
    (1) is preempted, request 0 takes its block and finishes alone. Request 1 (now
    558 tokens to recompute: 14 blocks) waits for that; request 2 waits until request 1
    is done. Every draft is accepted, so each verify step emits 4 tokens.
    """
    res, s = scenario(specs(*[(541, 100)] * 3), num_blocks=26, accept=ACCEPT_ALL)
    events = [(round(t / DT), kind, rid) for t, kind, rid in res.steps.events]
    assert events == [
        (0, "admit", 0), (0, "admit", 1),
        (5, "preempt", 1),  # step 6: request 0 at 557 computed tokens needs 557 + 4 + 3 > 560 slots
        (26, "finish", 0),  # 1 prefill step + 25 verify steps (1 + 4 x 25 >= 100)
        (26, "admit", 1),
        (48, "finish", 1),  # recompute prefill (1 token) + 21 verify steps for the other 82
        (48, "admit", 2),
        (74, "finish", 2),
    ]
    r = by_id(res)
    assert (r[0].preemptions, r[1].preemptions, r[2].preemptions) == (0, 1, 0)
    assert r[1].first_token_s == pytest.approx(DT)  # its first token came before the preemption
    assert r[2].waited_for_memory and r[1].waited_for_memory and not r[0].waited_for_memory
    assert s["preemptions"] == 1 and s["waited_for_memory"] == 2 and s["peak_kv_usage"] == 1.0
    assert all(r.generated == r.output for r in res.requests)


def test_no_admission_in_a_step_that_preempted():
    res, _ = scenario(specs(*[(541, 100)] * 3), num_blocks=26, accept=ACCEPT_ALL)
    preempt_times = {t for t, kind, _ in res.steps.events if kind == "preempt"}
    admit_times = {t for t, kind, _ in res.steps.events if kind == "admit"}
    assert preempt_times and not preempt_times & admit_times


# ------------------------------------------------------------------ conservation
# Engine settings and pool blocks: about 3 requests' worth for store_all (12 state blocks
# per chain request, 120 per (3,3,3) request), so growing requests force preemptions.
CONSERVATION_CASES = {
    "store_all-chain": (dict(policy="store_all"), 40),
    "store_all-tree": (dict(policy="store_all", widths=(3, 3, 3)), 365),
    "reconstruct-tree": (dict(policy="reconstruct", widths=(3, 3, 3)), 60),
    "replay": (dict(policy="replay"), 60),
    "first_chunk": (dict(policy="store_all", admission="first_chunk", max_tokens=256), 40),
    "ideal": (dict(policy="store_all", allocator="ideal"), 40),
    "small-budget": (dict(policy="store_all", widths=(3, 3, 3), max_tokens=96, max_seqs=8), 365),
}


@pytest.mark.parametrize("case", CONSERVATION_CASES)
def test_conservation(case):
    """A tight pool under mixed lengths: every request ends, tokens add up, memory never overflows."""
    lengths = [(40 + 37 * i % 700, 100 + 53 * i % 900) for i in range(60)]
    lengths.append((250_000, 10))  # within the context, longer than the whole pool: rejected
    settings, blocks = CONSERVATION_CASES[case]
    res, s = scenario(specs(*lengths), num_blocks=blocks, concurrency=24, **settings)
    for r in res.requests:
        assert r.status in (Status.FINISHED, Status.REJECTED)
        if r.status is Status.FINISHED:
            assert r.generated == r.output
            assert r.first_token_s <= r.finish_s and len(r.token_times) >= 1
        else:
            assert r.reject_reason == "exceeds_pool"
    assert s["rejected"] == 1 and s["completed"] == len(lengths) - 1
    assert s["preemptions"] > 0 and s["peak_kv_usage"] == 1.0  # the pool really was the bottleneck
    assert s["total_output_tokens"] == sum(o for _, o in lengths[:-1])
    used = STEP_COLUMNS.index("used_units")
    assert len(res.steps.rows) == s["num_steps"] > 0
    assert all(0 <= row[used] <= res.pool.capacity for row in res.steps.rows)
    assert res.pool.free == res.pool.capacity  # everything given back


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
    model = load_model("qwen3.5-35b-a3b")
    pol = make_policy(model, load_policy("store_all"))
    layout = replace(block_layout(model, pol, 1 << 34), num_blocks=100)
    paged = make_pool("paged", model, pol, layout, 0)
    assert (paged.units_for(560), paged.units_for(561)) == (1 + 12, 2 + 12)  # 560-token attention blocks
    ideal = make_pool("ideal", model, pol, layout, 100 * layout.block_bytes)
    state = 30 * model.gdn_page_bytes_per_gpu(3) * 4  # 30 GDN layers x (state + conv) x 4 copies
    assert ideal.units_for(561) == 561 * 10 * 2 * 2 * 256 * 2 + state  # 10 attention layers, 2 KV heads of 256
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
)
def test_invariants_hold_for_random_scenarios(lengths, policy, widths, spare_blocks, max_tokens, admission,
                                              allocator, concurrency):
    model = load_model("qwen3.5-35b-a3b")
    pol = make_policy(model, load_policy(policy, {"draft_tree_widths": list(widths)}))
    blocks = block_layout(model, pol, 1 << 34).state_blocks + 1 + spare_blocks  # room for one short request
    res, s = scenario(specs(*lengths), policy=policy, widths=widths, num_blocks=blocks, max_tokens=max_tokens,
                      admission=admission, allocator=allocator, concurrency=concurrency)
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
    kinds = {}
    for t, kind, _ in res.steps.events:
        kinds.setdefault(t, set()).add(kind)
    assert not any({"admit", "preempt"} <= k for k in kinds.values())
    assert s["preemptions"] == sum(1 for _, kind, _ in res.steps.events if kind == "preempt")
