"""CalibratedLatencyModel's pipeline pricing on synthetic tables with known answers (tests/latency_tables.py):
GPU-time tables of graph rows and the host model (host.csv, host_policies.csv)."""
import pytest

from core.tables import COLUMNS, DECODE_CONV_COLUMNS, HOST_COLUMNS, HOST_OPS, TableError
from latency_tables import MODEL, known, load, make_tables, write_csv  # pytest puts tests/ on the path
from sim.engine.step_trace import assemble_batch
from sim.pricing.dispatch import capture_sizes

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
    # logits rows: every verify position and each prefill's last token, through the LM head and the sampler
    assert t["lm_head"] == pytest.approx(graph("lm_head", 32 + 2) + lm.sampler_us(32 + 2))
    assert lm.sampler_us(34) > lm.sampler_us(16) == pytest.approx(known("sampler", {"rows": 16}))
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
    # GPU time without a varlen table: the one-sequence curve at the chunk-rounded total (4 x 128),
    # plus the causal conv over the 400 tokens by its bytes (8,192 bf16 channels read and written)
    # at the H200's copy rate
    t = lm.step_time(four).terms
    conv_us = 2 * 400 * 8192 * 2 / 4280e9 * 1e6
    assert t["gdn_verify"] * 1e6 == pytest.approx(GDN_LAYERS * (lm.tables[("gdn_prefill", "graph")](512) + conv_us))
    assert "conv" in lm.sources.notes["gdn_verify"]
    # 30 launches of 1 ms: more than the step's GPU work, so the host bounds the step
    assert t["overhead"] > 0 and sum(t.values()) * 1e6 > GDN_LAYERS * 1000.0


def test_prefill_conv_is_priced_at_the_gpus_own_copy_rate(tmp_path):
    # A derived GPU (the B200) scales the measured recurrence by its memory-bound factor (0.6) but
    # prices the conv's bytes at its own copy rate (7,133 GB/s), once, with no factor on top.
    root = make_tables(tmp_path, skip=("gdn_prefill_varlen",))
    h200, b200 = (load(root, hw=hw, pricing="pipeline", async_scheduling=False) for hw in ("h200", "b200"))
    four = step([(100, 0, False, False)] * 4)
    recurrence = h200.tables[("gdn_prefill", "graph")](512)
    conv_s = 2 * 400 * 8192 * 2 / 7133e9
    assert b200.step_time(four).terms["gdn_verify"] == pytest.approx(GDN_LAYERS * (0.6 * recurrence * 1e-6 + conv_s))


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
