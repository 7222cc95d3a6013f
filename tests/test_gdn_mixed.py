"""A mixed step's decodes through vLLM's chunked GDN path (sim/pricing/calibration_tables.load_gdn_mixed,
CalibratedParts.mixed_decodes_us, calibrate/benches/gdn_mixed.py): the committed tables, the rule's
scope (no speculation, a prefill beside the decodes) and the bench's gather and scatter."""
from __future__ import annotations

import pytest
import torch

from calibrate.benches.gdn_mixed import MixedStep
from calibrate.model.shapes import LayerShapes
from core.config import REPO_ROOT, load_model
from core.tables import GDN_MIXED_COLUMNS, read_rows
from latency_tables import MODEL, load, make_tables, write_csv  # pytest puts tests/ on the path
from sim.engine.step_trace import assemble_batch
from sim.pricing.calibration_tables import load_gdn_mixed
from sim.pricing.dispatch import capture_sizes

H200 = REPO_ROOT / "results/calibration/h200"
GDN_LAYERS = 30


def test_committed_tables_price_the_measured_extra_and_no_negative_one():
    for model in ("qwen3.5-35b-a3b", "qwen3.5-35b-a3b-fp8", "qwen3.5-27b", "qwen3-next-80b-a3b", "qwen3.5-397b-a17b"):
        rows = read_rows(H200 / model / "gdn_mixed.csv", GDN_MIXED_COLUMNS)
        grid = load_gdn_mixed(H200 / model)
        for r in rows:
            if r["B"] >= 1:
                assert grid(r["B"], r["tokens"]) >= max(0.0, r["extra_us"]) - 1e-6
            assert r["extra_us"] == pytest.approx(r["us"] - r["prefill_alone_us"], abs=0.02)
    # where the measurements already rise along both axes, the grid is the measurement (the 35B's largest batch)
    grid = load_gdn_mixed(H200 / "qwen3.5-35b-a3b")
    for r in read_rows(H200 / "qwen3.5-35b-a3b" / "gdn_mixed.csv", GDN_MIXED_COLUMNS):
        if r["B"] == 1024:
            assert grid(1024, r["tokens"]) == pytest.approx(r["extra_us"])
    # the 35B at 512 decodes: the chunked path costs several times the decode kernel's 2 x state bytes
    assert load_gdn_mixed(H200 / "qwen3.5-35b-a3b")(512, 1024) > 3000.0


def _mixed_table(mdir, per_decode_us=10.0):
    write_csv(mdir / "gdn_mixed.csv", [
        {c: 0 for c in GDN_MIXED_COLUMNS} | {"model": MODEL, "mode": "eager", "B": b, "tokens": n,
                                             "us": 500 + per_decode_us * b, "prefill_alone_us": 500.0,
                                             "extra_us": per_decode_us * b - (300 if b == 4 else 0)}
        for b in (0, 1, 4, 64, 512) for n in (256, 8192)], GDN_MIXED_COLUMNS)


def _step(reqs, depth):
    return assemble_batch([(n, c, d, s, 0, True) for n, c, d, s in reqs], verify_positions=4 if depth else 1,
                          draft_depth=depth, sizes=capture_sizes(1024, 8192, 4 if depth else 1), full_graph_ok=True)


def test_only_a_step_without_speculation_that_also_prefills_takes_the_chunked_path(tmp_path):
    root = make_tables(tmp_path)
    _mixed_table(root / MODEL)
    lm = load(root, pricing="pipeline", policy="store_all")
    plain = load(make_tables(tmp_path / "without"), pricing="pipeline", policy="store_all")
    decodes = [(1, 4096, True, False)] * 64
    mixed = _step(decodes + [(200, 0, False, False)], 0)
    assert (mixed.decode_seqs, mixed.spec_seqs, mixed.prefill_seqs) == (64, 0, 1)
    assert lm.mixed_decodes_us(mixed) == pytest.approx(640.0)
    t, t0 = lm.step_time(mixed).terms, plain.step_time(mixed).terms
    verify = plain.kernel_us("verify", "graph", 64)
    assert verify < 640.0  # the table's chunked path is dearer than the decode kernel here
    assert (t["gdn_verify"] - t0["gdn_verify"]) * 1e6 == pytest.approx(GDN_LAYERS * (640.0 - verify))
    # decodes alone, or speculating beside a prefill: their own kernels, as before
    for b in (_step(decodes, 0), _step([(4, 4096, True, True)] * 8 + [(200, 0, False, False)], 3)):
        assert lm.mixed_decodes_us(b) is None
        assert lm.step_time(b).terms["gdn_verify"] == pytest.approx(plain.step_time(b).terms["gdn_verify"])
    # a noisy negative difference at few decodes counts as zero, more decodes never cost less than
    # fewer (the one-decode row's 10 us), and the decode kernel stays the floor
    few = _step([(1, 4096, True, False)] * 4 + [(200, 0, False, False)], 0)
    assert lm.mixed_decodes_us(few) == pytest.approx(10.0)
    assert plain.kernel_us("verify", "graph", 4) > 10.0
    assert lm.step_time(few).terms["gdn_verify"] == pytest.approx(plain.step_time(few).terms["gdn_verify"])


def test_bench_gathers_every_state_zeroes_the_prefills_and_scatters_the_finals():
    s = LayerShapes.from_model(load_model("qwen3.5-35b-a3b"))
    s = s.__class__(**{**s.__dict__, "gdn_k_heads": 2, "gdn_v_heads": 4, "head_k_dim": 8, "head_v_dim": 8})
    m = MixedStep(s, 3, 5, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert m.cu_seqlens.tolist() == [0, 1, 2, 3, 8]  # decodes first, then the prefill
    before = m.pool.clone()
    seen = {}

    def fake_chunk(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
                   state_v_first):
        seen["initial"] = initial_state.clone()
        return v, initial_state + 1.0
    m.run(fake_chunk)
    assert torch.equal(seen["initial"][:3], before[m.idx[:3]]) and bool((seen["initial"][3] == 0).all())
    assert torch.equal(m.pool[m.idx[:3]], before[m.idx[:3]] + 1) and bool((m.pool[m.idx[3]] == 1).all())
    untouched = torch.ones(m.pool.shape[0], dtype=torch.bool)
    untouched[m.idx] = False
    assert torch.equal(m.pool[untouched], before[untouched])
