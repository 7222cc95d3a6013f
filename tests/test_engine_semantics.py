"""The engine behaviours of current vLLM (docs/engine.md), each against the older one.

Scenarios use a constant step time DT, so every time is a multiple of it, and
deterministic acceptance where a closed form needs it (helpers from
test_engine_scenarios).
"""
import numpy as np
import pytest

from core.config import ConfigError, EngineConfig, RunConfig
from sim.engine.scheduler import Scheduler
from workloads import load_workload
from test_engine_scenarios import ACCEPT_ALL, CURRENT, DT, OLD, by_id, scenario, setup, specs

SYNC = OLD  # synchronous, no prefix caching, no draft truncation
ASYNC = OLD.model_copy(update={"async_scheduling": True})
TRUNCATE = OLD.model_copy(update={"truncate_drafts": True})
ALIGN = OLD.model_copy(update={"enable_prefix_caching": True})


def test_current_defaults_are_vllms():
    engine = EngineConfig()
    assert engine.async_scheduling and engine.truncate_drafts
    assert engine.enable_prefix_caching and engine.resolved_mamba_cache_mode == "align"
    assert EngineConfig(enable_prefix_caching=False).resolved_mamba_cache_mode == "none"
    assert RunConfig().client.round_trip_s == 0.0


# ------------------------------------------------------------------ async scheduling
def one_slot_pool():
    """mtp 0: requests 0 and 1 fit together; request 2 fits only once request 0 is gone."""
    model, pol, layout, _ = setup(mtp_depth=0)
    return layout.blocks_for(100) * 2 + 1  # + the null block


@pytest.mark.parametrize("engine,delay", [(SYNC, 1), (ASYNC, 2)], ids=["sync", "async"])
def test_finished_request_frees_its_blocks_one_step_later_under_async(engine, delay):
    # Request 0 finishes at 5 DT while request 1 still runs. Synchronously, step 5 (planned
    # after step 4's outputs) admits request 2. Async, step 5 was planned at 4 DT, while
    # request 0 still held its blocks: request 2 waits for step 6.
    res, _ = scenario(specs((100, 5), (100, 20), (100, 5)), mtp_depth=0, num_blocks=one_slot_pool(), engine=engine)
    r = by_id(res)
    assert r[0].finish_s == pytest.approx(5 * DT)
    admitted = {rid: round(t / DT) for t, kind, rid in res.steps.events if kind == "admit"}
    assert admitted == {0: 0, 1: 0, 2: 4 + delay}
    assert r[2].first_token_s == pytest.approx((5 + delay) * DT)
    assert r[2].waited_for_memory


@pytest.mark.parametrize("engine,steps", [(SYNC, 3), (ASYNC, 4)], ids=["sync", "async"])
def test_request_that_may_be_done_gets_one_more_verify(engine, steps):
    # 9 outputs, every draft accepted: prefill (1 token), then verifies of 4 at steps 1 and 2.
    # Async plans step 3 before step 2's outputs are known; one more token would not end the
    # request (5 + 1 < 9), so step 3 verifies again and its tokens are discarded.
    res, s = scenario(specs((100, 9)), accept=ACCEPT_ALL, engine=engine)
    r = by_id(res)[0]
    assert s["num_steps"] == steps
    assert r.finish_s == pytest.approx(3 * DT) and s["duration_s"] == pytest.approx(3 * DT)
    assert r.generated == 9 and r.spec_steps == 2  # the discarded verify is not counted
    assert s["e2e_mean_s"] == pytest.approx(3 * DT)


def test_request_surely_done_gets_no_extra_step():
    # 2 outputs: the first verify ends it whatever it accepts, so async plans nothing after it.
    _, s = scenario(specs((100, 2)), accept=ACCEPT_ALL, engine=ASYNC)
    assert s["num_steps"] == 2


def test_preempted_while_in_flight_keeps_that_steps_tokens():
    # test_engine_scenarios.two_fit_three_arrive under async: the plan made at 4 DT (step 5)
    # preempts request 1 while its step 4 runs; step 4's tokens still reach it at 5 DT, and
    # its recompute covers them (vLLM appends a preempted request's in-flight outputs).
    _, _, layout, _ = setup()
    b, state = layout.attn_block_tokens, layout.state_blocks
    res, s = scenario(specs(*[(b - 19, 100)] * 3), num_blocks=2 * (state + 1) + 1, accept=ACCEPT_ALL, engine=ASYNC)
    r1 = by_id(res)[1]
    assert r1.preemptions == 1
    assert [round(t / DT) for t in r1.token_times[:5]] == [1, 2, 3, 4, 5]  # the last one after the preemption
    assert r1.waiting_s == pytest.approx((26 - 4) * DT)  # preempted by the plan at 4 DT, readmitted at 26 DT
    assert r1.spec_steps == 4 + 21 and r1.generated == 100  # 17 tokens kept, a recompute token, 21 verifies
    assert all(r.generated == r.output for r in res.requests) and res.pool.free == res.pool.capacity


@pytest.mark.parametrize("engine,first_step", [(SYNC, 2), (ASYNC, 3)], ids=["sync", "async"])
def test_arrival_starts_a_step_later_under_async(engine, first_step):
    # Request 1 arrives during step 1 (at 1.5 DT). Async, step 2 was planned at 1 DT.
    res, _ = scenario(specs((100, 8), (100, 5)), mtp_depth=0, arrivals=[0.0, 1.5 * DT], engine=engine)
    assert by_id(res)[1].first_token_s == pytest.approx((first_step + 1) * DT)


def test_async_is_the_same_run_when_memory_and_arrivals_do_not_bind():
    # One request alone, no drafts: every step's outputs would not change the next plan.
    sync, s1 = scenario(specs((300, 12)), mtp_depth=0, engine=SYNC)
    asyn, s2 = scenario(specs((300, 12)), mtp_depth=0, engine=ASYNC)
    assert by_id(sync)[0].token_times == pytest.approx(by_id(asyn)[0].token_times)
    assert s1["num_steps"] == s2["num_steps"]  # a 1-token decode is surely done one step ahead


# ------------------------------------------------------------------ draft truncation
@pytest.mark.parametrize("engine,truncated", [(SYNC, False), (TRUNCATE, True)], ids=["whole", "truncated"])
def test_drafts_truncated_to_the_budget(monkeypatch, engine, truncated):
    # Budget 6: request 0 verifies 1 + 3 positions, request 1 gets the 2 left: 1 + 1 draft
    # (truncated) or a plain 1-token decode (the old rule), while request 0 runs.
    seen = plans(monkeypatch)
    res, _ = scenario(specs((3, 41), (3, 41)), accept=ACCEPT_ALL, max_tokens=6, engine=engine)
    r = by_id(res)
    second = [(n, spec) for rid, start, n, total, spec in seen if rid == 1 and start == total - 1]
    assert second[:10] == [(2, True) if truncated else (1, False)] * 10  # request 0's 10 verifies
    assert r[0].spec_tokens == 4 * r[0].spec_steps == 40
    assert r[1].generated == 41 and r[1].spec_tokens <= 4 * r[1].spec_steps


@pytest.mark.parametrize("engine", [SYNC, TRUNCATE], ids=["whole", "truncated"])
def test_a_budget_of_exactly_the_verify_positions_verifies_the_whole_draft(engine):
    # Budget 4 = 1 + 3 drafts: every decode verifies the whole chain, under either rule
    res, _ = scenario(specs((3, 41)), accept=ACCEPT_ALL, max_tokens=4, engine=engine)
    r = by_id(res)[0]
    assert (r.spec_steps, r.spec_tokens, r.generated) == (10, 40, 41)


def test_a_draft_cut_to_one_token_is_a_plain_decode(monkeypatch):
    # Budget 5: request 0 verifies 1 + 3, the one token left is request 1's: no draft is left to verify
    seen = plans(monkeypatch)
    res, _ = scenario(specs((3, 41), (3, 41)), accept=ACCEPT_ALL, max_tokens=5, engine=TRUNCATE)
    second = [(n, spec) for rid, start, n, total, spec in seen if rid == 1 and start == total - 1]
    assert second[:10] == [(1, False)] * 10  # request 0's 10 verifies
    r = by_id(res)[1]
    assert r.generated == 41 and r.spec_tokens == 4 * r.spec_steps  # its verifies came after request 0 ended


def test_a_tree_is_not_truncated():
    # A (3,3,3) tree of 40 positions never fits a budget of 30: plain decodes only.
    _, s = scenario(specs((20, 6)), widths=(3, 3, 3), max_tokens=30, accept=[[1.0]] * 3, engine=TRUNCATE)
    assert s["mean_accepted_len"] is None


# ------------------------------------------------------------------ align mode
def plans(monkeypatch):
    """Record every scheduled (request, first token, tokens, num_tokens, spec)."""
    seen = []
    schedule = Scheduler.schedule

    def recording(self, now, in_flight=None):
        plan = schedule(self, now, in_flight)
        for req, n in plan.tokens.items():
            seen.append((req.rid, req.computed + req.inflight - n, n, req.num_tokens, req in plan.spec))
        return plan

    monkeypatch.setattr(Scheduler, "schedule", recording)
    return seen


def test_short_budget_starts_no_unaligned_prefill(monkeypatch):
    # Budget = one block B. Request 0 (short) runs; the budget left beside it is under one
    # block, so request 1's long prompt waits in align mode and is chunked beside it otherwise.
    b = setup(engine=ALIGN)[2].attn_block_tokens
    for engine, waits in ((ALIGN, True), (SYNC, False)):
        res, _ = scenario(specs((100, 30), (3 * b + 5, 4)), max_tokens=b, engine=engine)
        r = by_id(res)
        assert (r[1].first_scheduled_s >= r[0].finish_s) is waits
    seen = plans(monkeypatch)
    scenario(specs((100, 30), (3 * b + 5, 4)), max_tokens=b, engine=ALIGN)
    chunks = [(start, n, total) for rid, start, n, total, spec in seen if rid == 1 and start < total - 1]
    last = (3 * b + 5) // b * b - b  # the last cached boundary, one block back for MTP (eagle prune)
    for start, n, total in chunks:
        assert (start + n) % b == 0 or start >= last, (start, n)
    assert [n for _, n, _ in chunks] == [b, b, b, 5]  # whole blocks up to and past the last cached one, then the rest


@pytest.mark.parametrize("policy", ["store_all", "reconstruct"])
def test_align_chunks_end_on_block_boundaries(monkeypatch, policy):
    seen = plans(monkeypatch)
    b = setup(policy, engine=CURRENT)[2].attn_block_tokens
    lengths = [(50 + 613 * i % 5000, 20 + 17 * i % 60) for i in range(12)]
    scenario(specs(*lengths), policy=policy, max_tokens=2 * b + 100, concurrency=6, engine=CURRENT)
    prefill = [(start, n, total) for _, start, n, total, spec in seen if not spec and start < total - 1]
    assert prefill
    for start, n, total in prefill:
        last = max(total - total % b - b, 0)
        assert (start + n) % b == 0 or start >= last, (start, n, total)


def test_align_needs_a_budget_of_one_block():
    b = setup(engine=ALIGN)[2].attn_block_tokens
    with pytest.raises(ConfigError, match="max_num_batched_tokens .* >= the block size"):
        scenario(specs((100, 5)), max_tokens=b - 1, engine=ALIGN)


# ------------------------------------------------------------------ admission, client
def test_admission_checks_the_whole_prompt_without_lookahead():
    # A prompt of exactly one block fits a pool of exactly one request's blocks: the check
    # is on min(num_tokens, max_model_len) tokens, the lookahead comes with the first verify.
    model, pol, layout, _ = setup()
    b = layout.attn_block_tokens
    res, s = scenario(specs((b - 10, 5), (b, 1)), num_blocks=2 * layout.blocks_for(b) + 1, accept=ACCEPT_ALL)
    assert {r.rid: round(r.first_scheduled_s / DT) for r in res.requests} == {0: 0, 1: 0}


@pytest.mark.parametrize("engine", [OLD, CURRENT], ids=["old", "current"])
def test_whole_prompt_admission_spares_preemptions(engine):
    """Two requests, a pool of one long request plus a little: the whole-prompt check keeps
    the second one waiting until the first is done; checking only its first chunk admits it
    into blocks the first one's growth needs, and the two preempt each other."""
    layout = setup(engine=engine)[2]
    b = layout.attn_block_tokens
    lengths = specs((int(4.5 * b), 200), (5 * b, 200))
    blocks = layout.blocks_for(int(4.5 * b) + 64) + layout.state_blocks + 3
    _, whole = scenario(lengths, num_blocks=blocks, max_tokens=2 * b, engine=engine)
    _, chunk = scenario(lengths, num_blocks=blocks, max_tokens=2 * b, engine=engine, admission="first_chunk")
    assert whole["preemptions"] == 0 and whole["completed"] == 2
    assert chunk["preemptions"] >= 10 and chunk["completed"] == 2


def test_round_trip_delays_the_engine_and_counts_in_ttft():
    rt = 0.25 * DT
    res, s = scenario(specs((100, 3), (100, 3)), mtp_depth=0, concurrency=1, round_trip_s=rt)
    r = by_id(res)
    assert r[0].send_s == 0.0 and r[0].first_scheduled_s == pytest.approx(rt)
    assert r[0].first_token_s == pytest.approx(rt + DT)
    assert r[1].send_s == pytest.approx(r[0].finish_s)  # the semaphore frees at the last token
    assert r[1].first_scheduled_s == pytest.approx(r[0].finish_s + rt)  # reaches the engine a round trip later
    assert s["ttft_mean_s"] == pytest.approx(rt + DT)
    assert s["tpot_mean_s"] == pytest.approx(DT)


def test_semantics_are_reported():
    res, _ = scenario(specs((100, 5)), engine=CURRENT)
    assert res.semantics["async_scheduling"] and res.semantics["truncate_drafts"]
    assert res.semantics["mamba_cache_mode"] == "align"
    assert res.semantics["align_block_tokens"] == setup(engine=CURRENT)[2].attn_block_tokens
    tree, _ = scenario(specs((100, 5)), widths=(3, 3, 3), engine=CURRENT)
    assert not tree.semantics["truncate_drafts"]  # a tree cannot be cut


# ------------------------------------------------------------------ output lengths (--ignore-eos off)
def test_workload_output_cap_and_resample():
    fixed = load_workload("synthetic-fixed", 400, 3)
    assert {r.output_tokens for r in fixed.requests} == {256}  # the data's lengths, as with --ignore-eos
    capped = load_workload("synthetic-fixed", 400, 3, {"output_cap": 100})
    assert {r.output_tokens for r in capped.requests} == {100} and "capped at 100" in capped.source
    dist = {"median": 80, "sigma": 0.5, "min": 4, "max": 300}
    drawn = load_workload("synthetic-fixed", 400, 3, {"output_resample": dist, "output_cap": 200})
    out = np.array([r.output_tokens for r in drawn.requests])
    assert out.min() >= 4 and out.max() <= 200 and np.median(out) == pytest.approx(80, rel=0.1)
    assert [r.prompt_tokens for r in drawn.requests] == [r.prompt_tokens for r in fixed.requests]
    again = load_workload("synthetic-fixed", 400, 3, {"output_resample": dist, "output_cap": 200})
    assert [r.output_tokens for r in again.requests] == out.tolist()  # seeded
    with pytest.raises(ConfigError, match="output_cap"):
        load_workload("synthetic-fixed", 10, 0, {"output_cap": 0})


@pytest.mark.timeout(60)  # the bug it guards against made the engine loop for ever
@pytest.mark.parametrize("engine", [SYNC, ASYNC], ids=["sync", "async"])
def test_a_step_that_preempts_admits_nobody(engine):
    # Old vLLM's first-chunk admission with a 256-token budget: a running request that outgrows
    # its block preempts the newest one, whose first chunk would fit the blocks it freed at once;
    # the step that preempts leaves the waiting queue alone (vLLM's scheduler admits no new
    # request once one was preempted), so the victim waits a step and the run ends.
    _, _, layout, _ = setup()
    b, state = layout.attn_block_tokens, layout.state_blocks
    res, s = scenario(specs((b - 19, 200), (b + 10, 200), (b + 10, 200)), num_blocks=(1 + state) + (2 + state) + 1,
                      accept=ACCEPT_ALL, engine=engine, admission="first_chunk", max_tokens=256)
    kinds: dict[float, set[str]] = {}
    for t, kind, _ in res.steps.events:
        kinds.setdefault(t, set()).add(kind)
    preempting = [t for t, k in kinds.items() if "preempt" in k]
    assert len(preempting) == s["preemptions"] == 20  # one victim a step: first-chunk admission thrashes
    assert all("admit" not in kinds[t] for t in preempting)
    assert s["completed"] == 3
