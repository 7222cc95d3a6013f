"""CalibratedLatencyModel on synthetic tables with known answers: the pipeline pricing (GPU-time
tables + host model) and the old eager-sum pricing."""
import csv

import pytest

from core.config import EngineConfig, load_hardware, load_model, load_policy
from core.tables import COLUMNS, DECODE_CONV_COLUMNS, HOST_COLUMNS, HOST_OPS, SEQS_COLUMNS, STEP_COLUMNS, TABLES, TableError
from policies import make_policy
from sim.latency import TERMS, StepBatch
from sim.latency_analytic import AnalyticLatencyModel
from sim.latency_calibrated import CalibratedLatencyModel
from sim.dispatch import capture_sizes
from sim.step_trace import assemble_batch

MODEL = "qwen3.5-35b-a3b"
AXES = {"tokens": (1, 4, 16, 64, 256, 1024, 4096, 16384), "B": (1, 4, 16, 64, 256, 512), "P": (1, 4, 16, 64),
        "ctx": (256, 1024, 4096, 32768)}
PREFILL_CTX = (0, 4096, 32768)
EAGER = 3.0  # synthetic eager tables cost 3x graph ones


def known(table, r):
    """Synthetic microseconds per call: increasing in every axis."""
    if table == "attn_decode":
        return 4.0 + 0.01 * r["B"] * r["P"] + 1e-4 * r["B"] * r["ctx"]
    if table == "attn_prefill":
        return 8.0 + 1e-3 * r["tokens"] + 1e-6 * r["tokens"] * r["ctx"]
    if table == "gdn_prefill_varlen":
        return 35.0 + 0.01 * r["tokens"] + 2.0 * r["seqs"]
    return {"gdn": 20.0, "attn_proj": 15.0, "moe": 300.0, "mlp": 280.0, "lm_head": 250.0, "mtp_fc": 6.0,
            "gdn_prefill": 30.0}[table] + 0.01 * r["tokens"]


def write_csv(path, rows, columns):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def make_tables(root, kernels=True, steps=True, skip=()):
    mdir = root / MODEL
    mdir.mkdir(parents=True)
    for name, spec in TABLES.items():
        if name in skip:
            continue
        if spec.axes == ("tokens", "ctx"):
            points = [{"tokens": n, "ctx": c} for n in AXES["tokens"] for c in PREFILL_CTX]
        elif spec.axes == ("B", "P", "ctx"):
            points = [{"B": b, "P": p, "ctx": c} for b in AXES["B"] for p in AXES["P"] for c in AXES["ctx"]]
        elif spec.axes == ("tokens", "seqs"):
            points = [{"tokens": n, "seqs": q} for n in AXES["tokens"] for q in (1, 4, 16)]
        else:
            points = [{"tokens": n} for n in AXES["tokens"]]
        rows = []
        for mode, k in (("graph", 1.0), ("eager", EAGER)):
            for pt in points:
                r = {c: 0 for c in COLUMNS} | {"B": 1, "P": 1, "ctx": 0} | pt
                r["tokens"] = pt.get("tokens", r["B"] * r["P"])
                rows.append(r | {"mode": mode, "us": k * known(name, r)})
        write_csv(mdir / f"{name}.csv", rows, SEQS_COLUMNS if "seqs" in spec.axes else COLUMNS)
    if kernels:
        cols = ("model", "policy", "B", "T", "tree", "verify_us", "commit_us", "total_us", "mode")
        write_csv(root / "kernels.csv", [
            {"model": MODEL, "policy": "store_all", "B": b, "T": 4, "tree": "(1, 1, 1)", "verify_us": 10 + b,
             "commit_us": 2 + 0.1 * b, "total_us": 12 + 1.1 * b, "mode": mode}
            for b in (1, 8, 64, 512) for mode in ("graph", "eager")], cols)
    if steps:
        write_csv(mdir / "step_check.csv", [
            {"mode": m, "B": 8, "P": 4, "ctx": 4096, "kernel": "store_all", "step_us": 1000.0,
             "host_step_us": 1000.0 + extra, "kernel_us": 5.0, "reps": 10}
            for m, extra in (("graph", 40.0), ("graph", 60.0), ("eager", 80.0))], STEP_COLUMNS)
    return root


def load(root, hw="h200", policy="store_all", fallback=True, pricing="eager_sum", policy_update=None, **engine):
    m = load_model(MODEL)
    h = load_hardware(hw).model_copy(update={"calibration_dir": str(root)})
    pol = make_policy(m, load_policy(policy).model_copy(update=policy_update or {}))
    eng = EngineConfig(latency_pricing=pricing, **engine)
    fb = AnalyticLatencyModel(m, h, pol, eng) if fallback else None
    return CalibratedLatencyModel.load(m, h, pol, eng, fallback=fb)


def decode(b, ctx=4096, eager=False, p=4):
    return StepBatch(num_seqs=b, prefill_tokens=0, prefill_seqs=0, decode_seqs=b, spec_seqs=b, verify_positions=p,
                     context_tokens=b * ctx, max_context=ctx, eager=eager, draft_depth=3)


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
    assert t["lm_head"] == pytest.approx(k("lm_head", tokens=n))
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


# ------------------------------------------------------------- pipeline pricing
LAYERS, GDN_LAYERS, ATTN_LAYERS = 40, 30, 10


def k(name, **r):
    return known(name, {"tokens": 0, "B": 1, "P": 1, "ctx": 0, "seqs": 1, **r})


def write_host(mdir, us=1.0, **per_op):
    """host.csv: every op costs `us` (or its override) at any n."""
    rows = [{"op": op, "n": n, "us": per_op.get(op, us), "us_p10": 0, "us_p90": 0, "reps": 5}
            for op in HOST_OPS for n in (1, 4096)]
    write_csv(mdir / "host.csv", rows, HOST_COLUMNS)


def step(reqs, vp=4, depth=3, full_graph_ok=True):
    """A StepBatch dispatched as the engine does: reqs = (query tokens, context, decoding, spec)."""
    return assemble_batch([(n, c, d, s, 0, True) for n, c, d, s in reqs], verify_positions=vp, draft_depth=depth,
                          sizes=capture_sizes(1024, 8192, vp), full_graph_ok=full_graph_ok)


MIXED = [(4, 4096, True, True)] * 8 + [(100, 0, False, False), (60, 4096, False, False)]


def test_mixed_step_priced_from_graph_tables_and_host_model(tmp_path):
    root = make_tables(tmp_path)
    write_host(root / MODEL)
    lm = load(root, pricing="pipeline", async_scheduling=False)
    b = step(MIXED)
    assert (b.kind, b.graph_mode, b.num_tokens, b.run_tokens) == ("mixed_graph", "piecewise", 192, 192)
    t = {name: v * 1e6 for name, v in lm.step_time(b).terms.items()}

    def graph(name, *x):  # the graph-mode table (GPU time); its eager twin costs 3x and is never used
        return lm.tables[(name, "graph")](*x)
    n = 192
    assert t["gdn"] == pytest.approx(GDN_LAYERS * graph("gdn", n))
    assert t["moe"] == pytest.approx(LAYERS * graph("moe", n))
    # decodes at their own context, each prefill chunk at its own
    core = graph("attn_decode", 8, 4, 4096) + graph("attn_prefill", 100, 0) + graph("attn_prefill", 60, 4096)
    assert t["attention"] == pytest.approx(ATTN_LAYERS * (graph("attn_proj", n) + core))
    # the varlen prefill: ONE call per layer over the 160 tokens of both sequences
    verify = lm.kernels["verify"]["graph"](8)
    assert t["gdn_verify"] == pytest.approx(GDN_LAYERS * (verify + graph("gdn_prefill_varlen", 160, 2)))
    assert t["lm_head"] == pytest.approx(graph("lm_head", 32 + 2))
    # host: prepare (1) and the first piece (1) before the GPU starts, finish (1) after it;
    # every later launch (1 us) hides behind GPU work already queued
    assert t["overhead"] == pytest.approx(3.0)
    assert lm.sources.by_term["overhead"] == "calibrated"


def test_decode_core_conv_priced_at_the_decode_tokens_under_the_runs_policy(tmp_path):
    root = make_tables(tmp_path)
    write_host(root / MODEL)
    b = step(MIXED)  # 8 decodes x 4 positions and two prefills
    without = load(root, pricing="pipeline", async_scheduling=False).step_time(b).terms["gdn_verify"] * 1e6
    write_csv(root / MODEL / "gdn_decode_conv.csv", [
        {c: 0 for c in COLUMNS} | {"policy": pol, "mode": "graph", "B": n, "P": 4, "tokens": 4 * n,
                                   "us": base + 0.05 * 4 * n}
        for pol, base in (("store_all", 7.0), ("replay", 30.0)) for n in (1, 4, 16, 64, 256)], DECODE_CONV_COLUMNS)
    lm = load(root, pricing="pipeline", async_scheduling=False)
    assert lm.decode_conv(16) == pytest.approx(7.8)  # the run's policy's rows, not replay's
    t = lm.step_time(b).terms["gdn_verify"] * 1e6
    # once per GDN layer over the 32 decode tokens; the prefill tokens' conv is the varlen call's
    assert t - without == pytest.approx(GDN_LAYERS * lm.decode_conv(32))
    assert 7.0 + 0.05 * 16 < lm.decode_conv(32) < 7.0 + 0.05 * 64
    # the old eager-sum pricing adds it too (the gdn table no longer holds a conv stand-in)
    eager = load(root, pricing="eager_sum").step_time(b).terms["gdn_verify"] * 1e6
    (root / MODEL / "gdn_decode_conv.csv").unlink()
    eager_without = load(root, pricing="eager_sum").step_time(b).terms["gdn_verify"] * 1e6
    assert eager - eager_without == pytest.approx(GDN_LAYERS * lm.decode_conv(32))


def test_varlen_prefill_is_one_call_per_layer(tmp_path):
    root = make_tables(tmp_path, skip=("gdn_prefill_varlen",))
    write_host(root / MODEL, gdn_prefill=1000.0)
    lm = load(root, pricing="pipeline", async_scheduling=False)
    four = step([(100, 0, False, False)] * 4)
    _, ops, *_ = lm.pricer.shape(four)
    assert sum(1 for h, *_ in ops if h == pytest.approx(1000.0)) == GDN_LAYERS  # not one per prefilling request
    # GPU time without a varlen table: the one-sequence curve at the chunk-rounded total (4 x 128)
    t = lm.step_time(four).terms
    assert t["gdn_verify"] * 1e6 == pytest.approx(GDN_LAYERS * lm.tables[("gdn_prefill", "graph")](512))
    # 30 launches of 1 ms: more than the step's GPU work, so the host bounds the step
    assert t["overhead"] > 0 and sum(t.values()) * 1e6 > GDN_LAYERS * 1000.0


def test_full_graph_decode_is_one_replay(tmp_path):
    root = make_tables(tmp_path)
    write_host(root / MODEL, full_graph=7.0, step_prepare=11.0, step_finish=13.0)
    lm = load(root, pricing="pipeline", async_scheduling=False)
    b = step([(4, 4096, True, True)] * 16)
    assert (b.kind, b.graph_mode) == ("uniform_decode", "full")
    t = lm.step_time(b).terms
    assert t["overhead"] * 1e6 == pytest.approx(11.0 + 7.0 + 13.0)
    # async scheduling: prepare and finish overlap the previous and next steps' GPU work
    lm_async = load(root, pricing="pipeline", async_scheduling=True)
    assert lm_async.step_time(b).terms["overhead"] * 1e6 == pytest.approx(7.0)


def test_drafter_passes_cover_every_request(tmp_path):
    root = make_tables(tmp_path)
    write_host(root / MODEL)
    lm = load(root, pricing="pipeline", async_scheduling=False)
    b = step([(4, 4096, True, True)] * 16)
    t = lm.step_time(b).terms["drafter"] * 1e6
    # 64 and 16 tokens, B = 16, ctx = 4096 are grid points: the tables return known() exactly
    first = k("mtp_fc", tokens=64) + k("attn_proj", tokens=64) + k("attn_decode", B=16, P=4, ctx=4096) \
        + k("moe", tokens=64) + k("lm_head", tokens=16)
    later = k("mtp_fc", tokens=16) + k("attn_proj", tokens=16) + k("attn_decode", B=16, P=1, ctx=4096) \
        + k("moe", tokens=16) + k("lm_head", tokens=16)
    assert t == pytest.approx(first + 2 * later)


def test_pipeline_never_sums_eager_tables(tmp_path):
    """The same step in both pricings: eager_sum adds eager rows, the pipeline does not."""
    root = make_tables(tmp_path)
    write_host(root / MODEL)
    b = step(MIXED)
    pipe = load(root, pricing="pipeline", async_scheduling=False).step_time(b).terms
    old = load(root, pricing="eager_sum").step_time(b).terms
    assert old["attention"] > pipe["attention"] and old["gdn_verify"] > pipe["gdn_verify"]
    assert old["moe"] == pytest.approx(pipe["moe"])  # piecewise dense parts: graph tables in both


def test_without_host_table_the_host_is_analytic_and_labelled(tmp_path):
    lm = load(make_tables(tmp_path), pricing="pipeline", async_scheduling=False)
    assert lm.sources.by_term["overhead"] == "mixed"  # prepare/finish from the step check, launches assumed
    assert lm.step_time(step(MIXED)).total_s > 0


def test_host_table_with_an_unknown_op_is_an_error(tmp_path):
    root = make_tables(tmp_path)
    write_csv(root / MODEL / "host.csv", [{"op": "warp_drive", "n": 1, "us": 1, "us_p10": 1, "us_p90": 1, "reps": 1}],
              HOST_COLUMNS)
    with pytest.raises(TableError, match="unknown ops \\['warp_drive'\\]"):
        load(root, pricing="pipeline")


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_pipeline_monotone_in_batch_and_context(tmp_path, async_scheduling):
    root = make_tables(tmp_path)
    write_host(root / MODEL, us=30.0, gdn_prefill=600.0)
    lm = load(root, pricing="pipeline", async_scheduling=async_scheduling)
    totals = [lm.step_time(step([(4, 4096, True, True)] * b)).total_s for b in (1, 2, 5, 13, 40, 100, 128, 300)]
    assert totals == sorted(totals)
    by_ctx = [lm.step_time(step([(4, c, True, True)] * 32)).total_s for c in (300, 1000, 5000, 20000)]
    assert by_ctx == sorted(by_ctx)


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


def test_each_policy_prices_its_own_verify_and_commit_launches(tmp_path):
    # host.csv measured under store_all; host_policies.csv's replay rows price replay's GDN launches
    from core.tables import HOST_POLICY_COLUMNS

    root = make_tables(tmp_path)
    write_host(root / MODEL)
    write_csv(root / MODEL / "host_policies.csv",
              [{"policy": "replay", "op": op, "n": n, "us": us, "us_p10": 0, "us_p90": 0, "reps": 5}
               for op, us in (("gdn_verify", 500.0), ("gdn_commit", 200.0)) for n in (1, 4096)], HOST_POLICY_COLUMNS)
    b = step(MIXED)
    sa, rp = (load(root, policy=p, pricing="pipeline", async_scheduling=False) for p in ("store_all", "replay"))
    assert (sa.host.us("gdn_verify", 8), rp.host.us("gdn_verify", 8), rp.host.us("gdn_commit", 8)) == \
        (pytest.approx(1.0), pytest.approx(500.0), pytest.approx(200.0))
    assert rp.host.us("attn_core", 8) == sa.host.us("attn_core", 8)
    # a piecewise step's eager GDN cores are issued by the host: replay's step is host-bound, at least
    # its layers' 700 us of verify + commit launches; store_all's host costs stay under its GPU time
    assert rp.step_time(b).total_s >= GDN_LAYERS * 700e-6 > sa.step_time(b).total_s
