"""What sampling adds to a step (sim/pricing/sampler_cost.py, docs/sampling.md): the path the requests'
sampling selects (engine.sampling over the model's generation_sampling), the table rows each path is
read at, another vocabulary's scaling, and the committed H200 table's measured rows."""
from __future__ import annotations

import pytest

from core.config import REPO_ROOT, EngineConfig, load_model
from core.tables import read_rows, SAMPLER_COLUMNS
from latency_tables import MODEL, decode, known, load, make_tables  # pytest puts tests/ on the path
from sim.pricing.sampler_cost import load_sampler

H200 = REPO_ROOT / "results/calibration/h200/sampler.csv"


def test_engine_sampling_model_takes_the_checkpoints_generation_config():
    assert EngineConfig().sampling_path("top_k_top_p") == "top_k_top_p"
    assert EngineConfig(sampling="greedy").sampling_path("top_k_top_p") == "greedy"
    assert EngineConfig(sampling="random").sampling_path("greedy") == "random"
    # the Qwen checkpoints' generation_config.json sets top_k and top_p
    assert {load_model(m).generation_sampling for m in ("qwen3.5-35b-a3b", "qwen3-next-80b-a3b", "qwen3.5-27b")} \
        == {"top_k_top_p"}
    with pytest.raises(ValueError, match="sampling"):
        EngineConfig(sampling="beam")


def test_each_path_reads_its_own_rows_and_greedy_adds_nothing(tmp_path):
    make_tables(tmp_path)
    vocab = load_model(MODEL).vocab_size
    path = tmp_path / "sampler.csv"
    top = load_sampler(path, "top_k_top_p", vocab)
    rnd = load_sampler(path, "random", vocab)
    for rows in (1, 16, 1024):
        assert top.us(rows) == pytest.approx(known("sampler", {"rows": rows}))  # peaked rows, this vocabulary
        assert rnd.us(rows) == pytest.approx(0.5 * known("sampler", {"rows": rows}))
    assert top.us(0) == 0.0 and top.note == "" and load_sampler(path, "greedy", vocab).us(512) == 0.0
    # a vocabulary not timed: the nearest one's rows, scaled by the ratio, and said so
    other = load_sampler(path, "top_k_top_p", 2000)
    assert other.us(16) == pytest.approx(2.0 * 9 * known("sampler", {"rows": 16}))
    assert "scaled by the vocabulary ratio" in other.note
    # no table for this GPU: priced as greedy, and said so
    none = load_sampler(tmp_path / "absent.csv", "random", vocab)
    assert none.us(64) == 0.0 and "priced as greedy argmax" in none.note


def test_a_greedy_engine_prices_the_lm_head_table_alone(tmp_path):
    root = make_tables(tmp_path)
    b = decode(16)
    rows = b.decode_tokens
    for pricing in ("pipeline", "eager_sum"):
        model = load(root, pricing=pricing)
        greedy = load(root, pricing=pricing, sampling="greedy")
        t, g = model.step_time(b).terms, greedy.step_time(b).terms
        assert (t["lm_head"] - g["lm_head"]) * 1e6 == pytest.approx(known("sampler", {"rows": rows}))
        assert t["moe"] == g["moe"] and model.sources.by_term["lm_head"] == "calibrated"
    missing = load(make_tables(tmp_path / "no-sampler", sampler=False), pricing="pipeline")
    assert missing.sources.by_term["lm_head"] == "mixed" and "greedy" in missing.sources.notes["lm_head"]


def test_committed_h200_table_holds_what_the_pricing_reads():
    rows = read_rows(H200, SAMPLER_COLUMNS)
    for sampling, dist in (("top_k_top_p", "peaked"), ("random", "gaussian")):
        for vocab in (248320, 151936):
            sel = {int(r["rows"]): r for r in rows if (r["sampling"], r["dist"], r["vocab"], r["mode"])
                   == (sampling, dist, vocab, "graph")}
            assert sorted(sel) == [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096]
            cost = load_sampler(H200, sampling, vocab)
            for n, r in sel.items():
                assert cost.us(n) == pytest.approx(r["extra_us"]) and r["extra_us"] == pytest.approx(
                    r["sampled_us"] - r["greedy_us"], abs=0.02)
    # vLLM's kernel from 8 rows, its sort below; the top-k/top-p mask costs more than sampling without it
    top, rnd = load_sampler(H200, "top_k_top_p", 248320), load_sampler(H200, "random", 248320)
    assert all(top.us(n) > rnd.us(n) for n in (1, 8, 64, 512, 4096))
    assert top.us(4) > top.us(8)  # the sort at 4 rows is slower than the Triton kernel at 8: kept, not smoothed
    assert {r["path"] for r in rows if r["sampling"] == "top_k_top_p" and r["rows"] < 8} == {"torch-sort"}
