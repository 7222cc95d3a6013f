"""The block-FP8 checkpoints: weight bytes from the tensor list, their memory budget, and
their own calibration folder (an FP8 model never priced from bf16 tables)."""
from __future__ import annotations

import math

import pytest

from core.config import EngineConfig, load_hardware, load_model, load_policy
from core.projections import elements
from core.weight_bytes import FP8_BLOCK, SCALE_BYTES, attn_quantised, block_scales, ffn_quantised, quantised_projections
from policies import make_policy
from sim.engine.budget import memory_budget
from sim.pricing.factory import make_latency_model


def test_projection_shapes_match_a_published_fp8_tensor_count():
    # An FP8 export of Qwen3.5-35B-A3B that quantised every expert, shared expert and
    # attention projection (not GDN, no MTP) published 30,880 FP8 tensors of 32.61 GB.
    m = load_model("qwen3.5-35b-a3b-fp8")
    attn, ffn = attn_quantised(m), ffn_quantised(m)
    tensors = sum(p.count for p in attn) * m.attn_layers + sum(p.count for p in ffn) * m.num_layers
    assert tensors == 30_880
    assert round((elements(attn) * m.attn_layers + elements(ffn) * m.num_layers) / 1e9, 2) == 32.61


def test_fp8_bytes_are_bf16_less_a_byte_per_quantised_element_plus_float32_scales():
    bf16, fp8 = load_model("qwen3.5-35b-a3b"), load_model("qwen3.5-35b-a3b-fp8")
    q = quantised_projections(fp8)
    n_elements = sum(p.out * p.inp * p.count for p in q)
    scales = sum(math.ceil(p.out / FP8_BLOCK) * math.ceil(p.inp / FP8_BLOCK) * p.count for p in q)
    assert scales == block_scales(q) and n_elements == elements(q)
    assert fp8.weight_bytes_per_gpu == math.ceil(bf16.weight_bytes_per_gpu - n_elements + SCALE_BYTES * scales)
    # GDN's a/b projections (32 heads wide), the router and the shared-expert gate stay bf16.
    assert {p.name for p in q} == {"in_proj_qkv", "in_proj_z", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj",
                                   "experts.gate_proj", "experts.up_proj", "experts.down_proj",
                                   "shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj"}
    assert 35.0e9 < fp8.weight_bytes_per_gpu < 36.0e9
    # the MTP layer's attention and experts are in the list: one attention layer more than the target
    per_attn, per_ffn = sum(p.count for p in attn_quantised(fp8)), sum(p.count for p in ffn_quantised(fp8))
    assert sum(p.count for p in q) == per_attn * (fp8.attn_layers + 1) + 3 * fp8.gdn_layers \
        + per_ffn * (fp8.num_layers + 1) == 31_745


@pytest.mark.parametrize("base", ["qwen3.5-35b-a3b", "qwen3.5-397b-a17b"])
def test_fp8_override_equals_the_fp8_model_and_scales_with_tensor_parallel(base):
    named = load_model(f"{base}-fp8")
    over = load_model(base, {"weights": "fp8"})
    assert over.weight_bytes_per_gpu == named.weight_bytes_per_gpu
    assert over.calibration_name == named.calibration_name == f"{base}-fp8"
    assert load_model(base).calibration_name == base
    tp = named.tensor_parallel
    tp2 = load_model(f"{base}-fp8", {"tensor_parallel": 2 * tp})
    assert tp2.weight_bytes_per_gpu == math.ceil(named.weight_bytes_per_gpu * tp / (2 * tp))
    assert named.projection_weight_bytes == 1 and load_model(base).projection_weight_bytes == 2


def test_397b_fp8_shards_its_tensor_list_over_eight_gpus():
    # Shapes as the bf16 checkpoint's, served at TP 8 as it is: 45 GDN and 15 attention layers, 512
    # experts of width 1024, the MTP layer; 24.5 M float32 scales on 400.7 G fp8 elements.
    bf16, fp8 = load_model("qwen3.5-397b-a17b"), load_model("qwen3.5-397b-a17b-fp8")
    assert fp8.tensor_parallel == bf16.tensor_parallel == 8
    q = quantised_projections(fp8)
    n_elements, scales = elements(q), block_scales(q)
    assert (sum(p.count for p in q), round(n_elements / 1e9, 1), round(scales / 1e6, 1)) == (94_078, 400.7, 24.5)
    model_wide = bf16.total_params * 2 - n_elements + SCALE_BYTES * scales
    assert fp8.weight_bytes_per_gpu == math.ceil(math.ceil(model_wide) / 8)
    assert 49.0e9 < fp8.weight_bytes_per_gpu < 49.5e9  # 393.4 GB over 8 GPUs against bf16's 794


def test_397b_fp8_fits_where_the_bf16_checkpoint_does_not():
    hw = load_hardware("h200")
    eng = EngineConfig(gmu=0.6)
    with pytest.raises(Exception, match="does not fit on h200 at gmu 0.6"):
        memory_budget(load_model("qwen3.5-397b-a17b"), hw, eng)
    fp8 = memory_budget(load_model("qwen3.5-397b-a17b-fp8"), hw, eng)
    assert 27 * 2**30 < fp8.pool_bytes < 29 * 2**30


def test_fp8_pool_is_larger_by_the_weight_bytes_at_the_same_gmu():
    hw = load_hardware("h200")
    eng = EngineConfig(gmu=0.9)
    bf16 = memory_budget(load_model("qwen3.5-35b-a3b"), hw, eng)
    fp8 = memory_budget(load_model("qwen3.5-35b-a3b-fp8"), hw, eng)
    saved = bf16.weight_bytes - fp8.weight_bytes
    assert fp8.pool_bytes - bf16.pool_bytes == saved - (fp8.activation_bytes - bf16.activation_bytes)
    assert 31.5 < saved / 2**30 < 32.5


@pytest.mark.parametrize("name,override,folder", [("qwen3.5-35b-a3b-fp8", {}, "qwen3.5-35b-a3b-fp8"),
                                                  ("qwen3.5-35b-a3b", {"weights": "fp8"}, "qwen3.5-35b-a3b-fp8"),
                                                  ("qwen3.5-397b-a17b-fp8", {}, None)])
def test_fp8_model_is_never_priced_from_bf16_tables(name, override, folder):
    # An FP8 checkpoint reads its own folder's tables (qwen3.5-35b-a3b-fp8, measured), never the bf16
    # model's; without one (the 397B's FP8 shard) the roofline prices it at one byte per projection
    # weight, and says so.
    hw, eng = load_hardware("h200"), EngineConfig()
    bf16, m = load_model("qwen3.5-35b-a3b"), load_model(name, override)
    ref = make_latency_model(bf16, hw, make_policy(bf16, load_policy("store_all")), eng)
    lat = make_latency_model(m, hw, make_policy(m, load_policy("store_all")), eng)
    assert {t.name.split("/")[0] for t in ref.tables.values()} == {"qwen3.5-35b-a3b"}
    if folder is None:
        assert lat.sources.summary() == "analytic"
    else:
        assert {t.name.split("/")[0] for t in lat.tables.values()} == {folder}
        assert lat.sources.by_term["moe"] == lat.sources.by_term["gdn"] == "calibrated"


def test_a_grid_crosses_the_checkpoints_with_a_weights_axis(tmp_path):
    from sim.runs.grid import load_grid
    path = tmp_path / "g.yaml"
    path.write_text("description: both checkpoints\nfixed: {num_requests: 10}\n"
                    "axes:\n  model_overrides.weights: [bf16, fp8]\n  model: [qwen3.5-35b-a3b]\n")
    points = load_grid(path, "sharegpt").points("sharegpt")
    assert [p.model_overrides for p in points] == [{"weights": "bf16"}, {"weights": "fp8"}]
    with pytest.raises(Exception, match="unknown grid field 'model_overrides.hidden_size'"):
        path.write_text("description: x\naxes:\n  model_overrides.hidden_size: [1]\n")
        load_grid(path, "sharegpt")


def test_roofline_reads_fp8_projections_at_one_byte_and_the_bf16_lm_head_at_two():
    from sim.pricing.analytic import AnalyticLatencyModel
    hw, eng = load_hardware("h200"), EngineConfig()
    fp8, bf16 = load_model("qwen3.5-35b-a3b-fp8"), load_model("qwen3.5-35b-a3b")
    a8 = AnalyticLatencyModel(fp8, hw, make_policy(fp8, load_policy("store_all")), eng)
    a16 = AnalyticLatencyModel(bf16, hw, make_policy(bf16, load_policy("store_all")), eng)
    assert (a8.wb, a8.lm_wb, a16.wb, a16.lm_wb) == (1, 2, 2, 2)
