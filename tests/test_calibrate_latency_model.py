"""CalibratedLatencyModel on synthetic tables with known answers (tests/latency_tables.py): loading, the
tables' sources and fallbacks, kernel rows, and the old eager-sum pricing."""
import csv

import pytest

from core.config import EngineConfig, load_hardware, load_model, load_policy
from core.tables import TABLES, TableError
from latency_tables import EAGER, MODEL, decode, known, load, make_tables, write_csv  # pytest puts tests/ on the path
from policies import make_policy
from sim.pricing.analytic import AnalyticLatencyModel
from sim.pricing.calibrated import CalibratedLatencyModel
from sim.pricing.latency import TERMS, StepBatch


def test_replay_prices_replayed_tokens_and_flushes(tmp_path):
    root = make_tables(tmp_path, kernels=False)
    cols = ("model", "policy", "B", "T", "tree", "replayed_tokens", "flush", "verify_us", "commit_us", "mode")
    write_csv(root / "kernels.csv", [
        {"model": MODEL, "policy": "replay", "B": b, "T": 4, "tree": "1,1,1", "replayed_tokens": rep, "flush": fl,
         "verify_us": 10.0 * b + rep * b, "commit_us": (5.0 if fl else 1.0) * b, "mode": mode}
        for b in (1, 8, 64) for rep, fl in ((0, 1), (12, 0), (12, 1)) for mode in ("graph", "eager")], cols)
    lm = load(root, policy="replay")
    assert lm.sources.by_term["gdn_verify"] == lm.sources.by_term["gdn_commit"] == "calibrated"

    def kernel_terms(replayed, flushing):
        b = StepBatch(num_seqs=8, prefill_tokens=0, prefill_seqs=0, decode_seqs=8, spec_seqs=8, verify_positions=4,
                      context_tokens=8 * 4096, max_context=4096, eager=False, replay_tokens=replayed,
                      flush_seqs=flushing, draft_depth=3)
        t = lm.step_time(b).terms
        return t["gdn_verify"] / 30 * 1e6, t["gdn_commit"] / 30 * 1e6
    # The verify runs over the cache's (4 - 1) x 4 = 12 slots whatever they hold (fixed shapes):
    # the 12-token row, just after a flush as with 6 tokens cached each; the commit follows the flushes.
    assert kernel_terms(0, 8) == pytest.approx((80.0 + 96.0, 40.0))
    assert kernel_terms(8 * 6, 0) == pytest.approx((80.0 + 96.0, 8.0))
    assert kernel_terms(0, 2)[1] == pytest.approx(0.25 * 40.0 + 0.75 * 8.0)
    lm1 = load(root, policy="replay", policy_update={"flush_interval": 1})  # every commit flushes: no cache, the plain verify
    b = StepBatch(num_seqs=8, prefill_tokens=0, prefill_seqs=0, decode_seqs=8, spec_seqs=8, verify_positions=4,
                  context_tokens=8 * 4096, max_context=4096, eager=False, replay_tokens=0, flush_seqs=8, draft_depth=3)
    assert lm1.step_time(b).terms["gdn_verify"] / 30 * 1e6 == pytest.approx(80.0)


def test_none_without_tables(tmp_path):
    assert load(tmp_path) is None


def test_decode_step_is_the_sum_of_its_measured_parts(tmp_path):
    lm = load(make_tables(tmp_path))
    assert lm.sources.summary() == "calibrated"
    b, p, ctx = 16, 4, 4096
    n = b * p
    t = {k: v * 1e6 for k, v in lm.step_time(decode(b)).terms.items()}

    def k(name, **r):
        return known(name, {"tokens": 0, "B": 1, "P": 1, "ctx": 0, **r})
    core = k("attn_decode", B=b, P=p, ctx=ctx)
    assert t["gdn"] == pytest.approx(30 * k("gdn", tokens=n))
    assert t["attention"] == pytest.approx(10 * (k("attn_proj", tokens=n) + core))
    assert t["moe"] == pytest.approx(40 * k("moe", tokens=n))
    # the checkpoint's generation config asks for top-k/top-p: vLLM's sampler beyond the argmax
    assert t["lm_head"] == pytest.approx(k("lm_head", tokens=n) + known("sampler", {"rows": n}))
    # drafter: a pass over all n target tokens, then K - 1 = 2 one-token passes per request
    first = k("mtp_fc", tokens=n) + k("attn_proj", tokens=n) + core + k("moe", tokens=n) + k("lm_head", tokens=b)
    later = k("mtp_fc", tokens=b) + k("attn_proj", tokens=b) + k("attn_decode", B=b, P=1, ctx=ctx) \
        + k("moe", tokens=b) + k("lm_head", tokens=b)
    assert t["drafter"] == pytest.approx(first + 2 * later)
    # kernels.csv at B = 16 (log-log between B = 8 and 64) per GDN layer
    assert 30 * 18 < t["gdn_verify"] < 30 * 74
    assert t["allreduce"] == 0.0  # TP 1
    assert t["overhead"] == pytest.approx(50.0)  # median over graph rows of host minus GPU time
    assert set(t) == set(TERMS)


def test_eager_steps_are_piecewise_or_fully_eager(tmp_path):
    lm = load(make_tables(tmp_path))
    g, e = lm.step_time(decode(16)), lm.step_time(decode(16, eager=True))
    assert e.mode == "eager" and g.mode == "graph"
    # piecewise (vLLM): dense parts replay as graphs, attention cores and GDN kernels launch eagerly
    assert e.terms["moe"] == pytest.approx(g.terms["moe"]) and e.terms["gdn"] == pytest.approx(g.terms["gdn"])
    assert e.terms["attention"] - g.terms["attention"] == pytest.approx(
        10 * (EAGER - 1) * known("attn_decode", {"B": 16, "P": 4, "ctx": 4096}) * 1e-6)
    full = CalibratedLatencyModel.load(lm.model, lm.hw, lm.policy, EngineConfig(latency_pricing="eager_sum"),
                                       lm.fallback, piecewise=False)
    f = full.step_time(decode(16, eager=True))
    assert f.terms["moe"] == pytest.approx(EAGER * g.terms["moe"])
    assert e.terms["overhead"] == g.terms["overhead"] == pytest.approx(50e-6)  # graph rows only


def test_monotone_in_batch_and_context(tmp_path):
    lm = load(make_tables(tmp_path))
    totals = [lm.step_time(decode(b)).total_s for b in (1, 2, 3, 5, 8, 13, 40, 100, 300, 512)]
    assert totals == sorted(totals)
    by_ctx = [lm.step_time(decode(32, ctx=c)).total_s for c in (300, 1000, 5000, 20000, 32768)]
    assert by_ctx == sorted(by_ctx)
    assert lm.out_of_grid() == {}
    lm.step_time(decode(1024, ctx=100))  # beyond B = 512 and below the shortest context: flagged
    flagged = lm.out_of_grid()
    assert any(k.endswith(".B_high") for k in flagged) and any(k.endswith(".ctx_low") for k in flagged)


def test_mixed_prefill_batch(tmp_path):
    lm = load(make_tables(tmp_path))
    mixed = StepBatch(num_seqs=9, prefill_tokens=2048, prefill_seqs=1, decode_seqs=8, spec_seqs=8,
                      verify_positions=4, context_tokens=8 * 4096, max_context=4096, eager=True, draft_depth=3)
    t = lm.step_time(mixed).terms
    pure = lm.step_time(decode(8, eager=True)).terms
    assert t["attention"] > pure["attention"] and t["gdn_verify"] > pure["gdn_verify"]
    assert t["lm_head"] > pure["lm_head"]  # one more sampled row


def test_missing_kernels_fall_back_and_say_so(tmp_path):
    lm = load(make_tables(tmp_path, kernels=False, skip=("gdn_prefill",)))
    assert lm.sources.by_term["gdn_verify"] == "analytic" and lm.sources.summary() == "mixed"
    assert lm.step_time(decode(16)).terms["gdn_verify"] > 0
    with pytest.raises(TableError, match="no fallback"):
        load(tmp_path, fallback=False)


def test_missing_table_is_an_error(tmp_path):
    make_tables(tmp_path, skip=("attn_proj",))
    with pytest.raises(TableError, match="attn_proj.csv: no such calibration table"):
        load(tmp_path)


def test_graph_only_tables_price_the_pipeline_and_refuse_the_eager_sum(tmp_path):
    """A model measured with `--modes graph`: the pipeline reads graph rows only, the eager sum needs both."""
    root = make_tables(tmp_path)
    for f in (root / MODEL).glob("*.csv"):
        if f.name in {f"{n}.csv" for n in TABLES}:
            with f.open(newline="") as fh:
                r = csv.DictReader(fh)
                cols, rows = r.fieldnames, [row for row in r if row["mode"] == "graph"]
            write_csv(f, rows, cols)
    lm = load(root, pricing="pipeline")
    assert {mode for _, mode in lm.tables} == {"graph"}
    assert lm.step_time(decode(8)).total_s == load(make_tables(tmp_path / "both"), pricing="pipeline").step_time(
        decode(8)).total_s
    with pytest.raises(TableError, match="no rows with mode='eager'"):
        load(root, pricing="eager_sum")


def test_an_moe_model_needs_its_moe_table(tmp_path):
    make_tables(tmp_path, skip=("moe",))  # the mlp table is there: a dense model's, not this one's
    with pytest.raises(TableError, match="no moe.csv among its tables"):
        load(tmp_path)


def test_a_dense_model_prices_its_mlp_table_at_every_layer(tmp_path):
    """The same step with a dense MLP where the MoE was: the mlp table times the layers, no routing factor."""
    dense = load_model(MODEL).model_copy(update={"name": MODEL, "moe": None, "mlp": {"intermediate_size": 512}})
    dense = type(dense).model_validate(dense.model_dump())
    h = load_hardware("h200").model_copy(update={"calibration_dir": str(make_tables(tmp_path, skip=("moe",)))})
    pol = make_policy(dense, load_policy("store_all"))
    eng = EngineConfig(latency_pricing="eager_sum")
    lm = CalibratedLatencyModel.load(dense, h, pol, eng, fallback=AnalyticLatencyModel(dense, h, pol, eng))
    n = 16 * 4
    t = lm.step_time(decode(16)).terms
    assert t["moe"] * 1e6 == pytest.approx(40 * known("mlp", {"tokens": n}))
    assert lm.sources.by_term["moe"] == "calibrated"


def test_the_models_own_kernel_bench_comes_before_the_shared_table(tmp_path):
    root = make_tables(tmp_path)
    own = [{"model": MODEL, "policy": "store_all", "B": b, "T": 4, "tree": "1,1,1", "verify_us": 1000 + b,
            "commit_us": 1.0, "total_us": 1001 + b, "mode": mode} for b in (1, 8, 64, 512) for mode in ("graph", "eager")]
    write_csv(root / MODEL / "kernels.csv", own, tuple(own[0]))
    t = load(root).step_time(decode(8)).terms
    assert t["gdn_verify"] * 1e6 == pytest.approx(30 * 1008)


def test_config_overhead_wins(tmp_path):
    lm = load(make_tables(tmp_path), step_overhead_us=123.0)
    assert lm.sources.by_term["overhead"] == "config"
    assert lm.step_time(decode(4)).terms["overhead"] == pytest.approx(123e-6)


def test_derived_hardware_scales_by_term_kind(tmp_path):
    make_tables(tmp_path)
    h200, b200 = load(tmp_path), load(tmp_path, hw="b200")
    assert b200.sources.summary() == "derived"
    small, big = decode(1, p=1), decode(512, p=16)  # 1 token: memory-bound; 8192 tokens: compute-bound
    assert b200.step_time(small).terms["gdn"] == pytest.approx(0.6 * h200.step_time(small).terms["gdn"])
    assert b200.step_time(big).terms["gdn"] == pytest.approx(0.44 * h200.step_time(big).terms["gdn"])
    assert b200.step_time(big).terms["gdn_verify"] == pytest.approx(0.6 * h200.step_time(big).terms["gdn_verify"])


def test_tensor_parallel_adds_modelled_allreduce(tmp_path):
    root = make_tables(tmp_path)
    (root / MODEL).rename(root / "qwen3.5-397b-a17b")
    m = load_model("qwen3.5-397b-a17b")
    h = load_hardware("h200").model_copy(update={"calibration_dir": str(root)})
    pol = make_policy(m, load_policy("store_all"))
    eng = EngineConfig(latency_pricing="eager_sum")
    lm = CalibratedLatencyModel.load(m, h, pol, eng, fallback=AnalyticLatencyModel(m, h, pol, eng))
    assert lm.sources.by_term["allreduce"] == "analytic"
    t = lm.step_time(decode(64)).terms["allreduce"]
    ring = 2 * 7
    per = ring / 8 * 256 * 4096 * 2 / 450e9 + ring * 3e-6
    assert t == pytest.approx(2 * 60 * per + 2 * 3 * per * 0 + _drafter_allreduce(per), rel=1e-9)


def _drafter_allreduce(per_256):
    ring = 2 * 7
    per_64 = ring / 8 * 64 * 4096 * 2 / 450e9 + ring * 3e-6
    return 2 * per_256 + 2 * 2 * per_64


def test_a_batch_shape_is_built_once(tmp_path, monkeypatch):
    # The op list of a shape is built once; a new context only re-prices the attention cores.
    lm = load(make_tables(tmp_path))
    built = []
    shape = type(lm.pricer).shape
    monkeypatch.setattr(type(lm.pricer), "shape", lambda self, b: built.append(b.num_seqs) or shape(self, b))
    batches = [decode(b, ctx=1000 + 7 * i) for i, b in enumerate(list(range(1, 65)) * 4)]
    times = [lm.step_time(b).total_s for b in batches]
    assert sorted(built) == list(range(1, 65))
    assert times[:64] != times[64:128]  # the contexts differ, so the steps do


def test_unmeasured_chain_length_is_interpolated_between_measured_chains(tmp_path):
    root = make_tables(tmp_path, kernels=False)
    cols = ("model", "policy", "B", "T", "tree", "verify_us", "commit_us", "total_us", "mode")
    # Chains of 2 and 8 positions measured; the policy's (1,1,1) chain (4 positions) is not.
    rows = [{"model": MODEL, "policy": "reconstruct", "B": b, "T": t, "tree": tree, "verify_us": v * b,
             "commit_us": 1.0 * b, "total_us": (v + 1.0) * b, "mode": mode}
            for t, tree, v in ((2, "chain", 10.0), (8, "1,1,1,1,1,1,1", 40.0))
            for b in (1, 8, 64) for mode in ("graph", "eager")]
    write_csv(root / "kernels.csv", rows, cols)
    lm = load(root, policy="reconstruct")
    assert lm.sources.by_term["gdn_verify"] == "calibrated"
    verify = lm.kernels["verify"]["graph"]
    # log-log halfway between T = 2 and T = 8: the geometric mean, 20 us per request.
    assert verify(8) == pytest.approx(20.0 * 8)


def test_kernels_selected_by_the_models_state_dtype(tmp_path):
    root = make_tables(tmp_path, kernels=False)
    cols = ("model", "policy", "B", "T", "tree", "state_dtype", "verify_us", "commit_us", "total_us", "mode")
    per = {"float32": 100.0, "bfloat16": 10.0}
    write_csv(root / "kernels.csv", [
        {"model": MODEL, "policy": "store_all", "B": b, "T": 4, "tree": "1,1,1", "state_dtype": dt,
         "verify_us": v * b, "commit_us": 1.0 * b, "total_us": (v + 1) * b, "mode": mode}
        for dt, v in per.items() for b in (1, 8, 64) for mode in ("graph", "eager")], cols)
    lm = load(root)
    want = per["float32" if lm.model.state_dtype_bytes == 4 else "bfloat16"]
    assert lm.kernels["verify"]["graph"](8) == pytest.approx(want * 8)
    # only the other dtype benched: no kernel rows for this model, priced analytically and said so
    other = "bfloat16" if lm.model.state_dtype_bytes == 4 else "float32"
    write_csv(root / "kernels.csv", [
        {"model": MODEL, "policy": "store_all", "B": b, "T": 4, "tree": "1,1,1", "state_dtype": other,
         "verify_us": 5.0 * b, "commit_us": 1.0 * b, "total_us": 6.0 * b, "mode": "graph"} for b in (1, 8)], cols)
    assert load(root).sources.by_term["gdn_verify"] == "analytic"
