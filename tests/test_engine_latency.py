"""The analytic (roofline) latency model and `make_latency_model`."""

import pytest

from core.config import EngineConfig, load_hardware, load_model, load_policy
from policies import make_policy
from policies.tree import DraftTree
from sim.pricing.analytic import AnalyticLatencyModel, STEP_OVERHEAD_S
from sim.pricing.factory import make_latency_model
from sim.pricing.latency import TERMS, StepBatch

MODELS = ("qwen3.5-35b-a3b", "qwen3.5-397b-a17b")


def analytic(model="qwen3.5-35b-a3b", policy="store_all", widths=(1, 1, 1), **engine):
    m = load_model(model)
    p = make_policy(m, load_policy(policy, {"draft_tree_widths": list(widths)}))
    return AnalyticLatencyModel(m, load_hardware("h200"), p, EngineConfig(**engine))


def decode(seqs, vp=4, context=1000, eager=False, **kw):
    return StepBatch(num_seqs=seqs, prefill_tokens=0, prefill_seqs=0, decode_seqs=seqs, spec_seqs=seqs,
                     verify_positions=vp, context_tokens=seqs * context, max_context=context, eager=eager,
                     draft_depth=3, **kw)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("policy", ["store_all", "reconstruct", "replay"])
def test_every_term_is_priced_where_its_work_is(model, policy):
    lat = analytic(model, policy)
    one, big, flushing, prefill = (lat.step_time(b) for b in (
        decode(1), decode(256, context=4000), decode(64, replay_tokens=64 * 6, flush_seqs=16),
        StepBatch(num_seqs=8, prefill_tokens=8000, prefill_seqs=8, decode_seqs=0, spec_seqs=0,
                  verify_positions=4, context_tokens=0, max_context=0, eager=True, draft_depth=3)))
    single_gpu = load_model(model).tensor_parallel == 1
    for st in (one, big, flushing, prefill):
        assert tuple(st.terms) == TERMS and st.terms["overhead"] == STEP_OVERHEAD_S
        assert (st.terms["allreduce"] == 0) is single_gpu  # no all-reduce on one GPU, two a layer on more
        assert st.total_s == sum(st.terms.values())
    assert prefill.terms["gdn_verify"] == prefill.terms["gdn_commit"] == 0  # a prefill verifies nothing
    # 256 sequences at 4,000 tokens of context cost more than one at 1,000 in every term that carries tokens
    assert all(big.terms[t] > one.terms[t] for t in ("drafter", "gdn", "gdn_verify", "attention", "moe", "lm_head"))
    # commit: store_all's is an index update, reconstruct rebuilds every step, replay writes back when it flushes
    commits = (one.terms["gdn_commit"], flushing.terms["gdn_commit"])
    assert {"store_all": commits[0] == commits[1] == 0, "reconstruct": min(commits) > 0,
            "replay": commits[0] == 0 < commits[1]}[policy]


def test_moe_term_by_hand_one_token():
    """One token touches 8 routed experts + the shared one: their weights, read once, over 40 layers."""
    lat = analytic()
    b = StepBatch(num_seqs=1, prefill_tokens=0, prefill_seqs=0, decode_seqs=1, spec_seqs=0, verify_positions=4,
                  context_tokens=100, max_context=100, eager=False)
    expert = 3 * 2048 * 512  # gate, up, down
    weights = (8 * expert + expert + 2048 * 256) * 2  # routed + shared + router, bf16
    activations = 2048 * 2 * 2  # one token in, one out
    assert lat.step_time(b).terms["moe"] == pytest.approx(40 * (weights + activations) / 4280e9, rel=1e-9)


def test_monotone_in_batch_and_context():
    lat = analytic()
    totals = [lat.step_time(decode(n)).total_s for n in (1, 8, 64, 256)]
    assert totals == sorted(totals) and totals[0] < totals[-1]
    att = [lat.step_time(decode(32, context=c)).terms["attention"] for c in (100, 10_000, 100_000)]
    assert att == sorted(att) and att[0] < att[-1]


def test_gdn_state_traffic_per_policy():
    b = decode(128, vp=40)
    sa = analytic(policy="store_all", widths=(3, 3, 3)).step_time(b).terms
    rc = analytic(policy="reconstruct", widths=(3, 3, 3)).step_time(b).terms
    assert sa["gdn_commit"] == 0.0  # the next step reads the accepted slot: no copy
    assert rc["gdn_commit"] > 0.0  # rebuild the accepted state: read + write one state
    assert sa["gdn_verify"] > 5 * rc["gdn_verify"]  # 41 state reads/writes vs 1 read + pseudo-values
    assert sa["gdn_verify"] + sa["gdn_commit"] > rc["gdn_verify"] + rc["gdn_commit"]
    rp = analytic(policy="replay")
    assert rp.step_time(decode(64, replay_tokens=0, flush_seqs=0)).terms["gdn_commit"] == 0.0
    assert rp.step_time(decode(64, replay_tokens=256, flush_seqs=16)).terms["gdn_commit"] > 0.0


def test_tensor_parallel_all_reduce():
    assert analytic("qwen3.5-35b-a3b").step_time(decode(32)).terms["allreduce"] == 0.0
    assert analytic("qwen3.5-397b-a17b").step_time(decode(32)).terms["allreduce"] > 0.0


def test_eager_launches_cost_only_beyond_gpu_time():
    lat = analytic()
    small_graph, small_eager = lat.step_time(decode(1)), lat.step_time(decode(1, eager=True))
    assert small_graph.terms["overhead"] == pytest.approx(STEP_OVERHEAD_S)
    assert small_eager.terms["overhead"] >= small_graph.terms["overhead"]
    assert small_eager.mode == "eager" and small_graph.mode == "graph"
    big = lat.step_time(decode(512, context=8000, eager=True))
    assert big.terms["overhead"] == pytest.approx(STEP_OVERHEAD_S)  # launches hide behind the GPU work


def test_make_latency_model_sources():
    m = load_model("qwen3.5-35b-a3b")
    hw = load_hardware("h200").model_copy(update={"calibration_dir": None})
    p = make_policy(m, load_policy("store_all"))
    lat = make_latency_model(m, hw, p, EngineConfig())
    assert lat.sources.summary() == "analytic"
    lat = make_latency_model(m, hw, p, EngineConfig(step_overhead_us=250))
    assert lat.sources.by_term["overhead"] == "config" and lat.sources.summary() == "mixed"
    assert lat.step_time(decode(1)).terms["overhead"] == pytest.approx(250e-6)


@pytest.mark.parametrize("kind", ["analytic", "eager_sum", "pipeline"])
def test_drafter_passes_run_over_the_previous_depths_nodes(kind):
    """After its first pass, the MTP drafter runs one pass per further depth over the nodes of
    the depth before (tree (3, 2, 1): 3 then 6 per request), never over the deepest level.
    Every pass is priced from its own width, so differences of K isolate one pass."""
    def drafter(widths, depth):
        if kind == "analytic":
            lm = analytic(widths=widths)
        else:
            m = load_model("qwen3.5-35b-a3b")
            pol = make_policy(m, load_policy("reconstruct", {"draft_tree_widths": list(widths)}))
            lm = make_latency_model(m, load_hardware("h200"), pol, EngineConfig(latency_pricing=kind))
        return lm.step_time(decode(64, vp=16)._replace(draft_depth=depth)).terms["drafter"]

    def later_pass(widths, depth):  # the pass a step with `depth` drafter passes adds to one with depth - 1
        return drafter(widths, depth) - drafter(widths, depth - 1)

    tree = (3, 2, 1)
    assert later_pass(tree, 2) == pytest.approx(later_pass((3, 1, 1), 2), rel=1e-12)  # over 3 nodes each
    assert later_pass(tree, 3) == pytest.approx(later_pass((6, 1, 1), 2), rel=1e-12)  # over 6 nodes each
    assert later_pass(tree, 3) > later_pass((3, 1, 1), 3) > 0  # 6 nodes cost more than 3


def test_later_pass_widths_one_rule_for_every_step_model():
    """Pass d drafts from depth d's nodes; a drafter deeper than its tree repeats the deepest level."""
    assert DraftTree((3, 2, 1)).later_pass_widths(3) == (3, 6)
    assert DraftTree((3, 2)).later_pass_widths(4) == (3, 6, 6)
    assert DraftTree((1, 1, 1)).later_pass_widths(1) == ()
    assert DraftTree(()).later_pass_widths(3) == ()
