"""vLLM's pool rules (docs/vllm.md#one-pool-for-a-hybrid): grouping with padding layers, the block
size and page padding, the MTP layer, fp32 vs bf16 pages, align mode, blocks per request,
the null block, and the budget's profile-run peak."""
import json

import pytest

from core.config import ConfigError, EngineConfig, GiB, load_hardware, load_model, load_policy
from policies import make_policy
from sim.engine.budget import (SAMPLER_ANCHOR_BYTES, block_layout, estimated_sampler_bytes, kv_cache_groups, memory_budget,
                        served_model)
from sim.engine.pool import make_pool

NONE = EngineConfig(enable_prefix_caching=False)
ALIGN = EngineConfig()  # vLLM's default: prefix caching on, so "align" for a GDN hybrid


def layout(model="qwen3.5-35b-a3b", policy="store_all", engine=ALIGN, pool=10 * GiB, **overrides):
    m = served_model(load_model(model, overrides), engine)
    return m, block_layout(m, make_policy(m, load_policy(policy)), pool, engine)


@pytest.mark.parametrize("attn,gdn,size,attn_groups,gdn_groups,attn_pad,gdn_pad", [
    (10, 30, 10, 1, 3, 0, 0),   # Qwen3.5-35B-A3B without MTP
    (11, 30, 11, 1, 3, 0, 3),   # with its MTP layer: three padding layers
    (16, 45, 16, 1, 3, 0, 3),   # Qwen3.5-397B-A17B with MTP
    (12, 36, 12, 1, 3, 0, 0),   # Qwen3-Next without MTP (the real log: 4 groups of 12)
    (13, 12, 13, 1, 1, 0, 1),   # under 1.5x apart: the largest count is the group size (vLLM's gpt-oss example)
    (10, 15, 10, 1, 2, 0, 5),   # exactly 1.5x: the smallest
])
def test_grouping_with_padding_layers(attn, gdn, size, attn_groups, gdn_groups, attn_pad, gdn_pad):
    g = kv_cache_groups(attn, gdn)
    assert (g.group_size, g.attn_groups, g.gdn_groups, g.attn_padding_layers, g.gdn_padding_layers) == \
        (size, attn_groups, gdn_groups, attn_pad, gdn_pad)


def test_mtp_layer_is_an_attention_layer_of_the_pool():
    m, lay = layout()
    assert (m.attn_layers, m.pool_attn_layers, lay.group_layers, lay.gdn_padding_layers) == (10, 11, 11, 3)
    m0, lay0 = layout(mtp_depth=0)
    assert (m0.pool_attn_layers, lay0.group_layers, lay0.gdn_padding_layers) == (10, 10, 0)


@pytest.mark.parametrize("ssm_dtype,kv,page,tokens", [
    # SSM 32 x 128 x 128 x {4, 2} B + conv 8,192 x (3 + 3) x 2 B; attention 2 x 2 x 256 x {2, 1} B per token.
    ("float32", "bf16", 2_097_152 + 98_304, 1072),
    ("bfloat16", "bf16", 1_048_576 + 98_304, 560),
    ("float32", "fp8", 2_097_152 + 98_304, 2144),
])
def test_block_size_rule_and_page(ssm_dtype, kv, page, tokens):
    eng = EngineConfig(kv_cache_dtype=kv)
    _, lay = layout(engine=eng, mamba_ssm_dtype=ssm_dtype)
    assert lay.gdn_page_bytes == page
    assert lay.attn_block_tokens == tokens and lay.attn_block_tokens % 16 == 0
    assert lay.page_bytes == tokens * 2 * 2 * 256 * {"bf16": 2, "fp8": 1}[kv]
    assert lay.block_bytes == lay.page_bytes * 11


def test_page_padding_matches_the_real_log():
    # Qwen3-Next at TP 2, no MTP: 16 x 128 x 128 x 2 + 3 x 4,096 x 2 = 548,864 B, 1,024 B per token.
    _, lay = layout("qwen3-next-80b-a3b", engine=NONE, mtp_depth=0, tensor_parallel=2)
    assert (lay.gdn_page_bytes, lay.attn_block_tokens, lay.page_bytes) == (548_864, 544, 544 * 1024)
    assert f"{lay.mamba_page_padding_pct:.2f}" == "1.49"


@pytest.mark.parametrize("policy,blocks", [("store_all", 1 + 3), ("reconstruct", 1), ("replay", 1)])
def test_state_blocks_per_group_per_policy_and_mode(policy, blocks):
    """A request holds 1 + K state blocks per GDN group in either mode (vLLM's MambaManager: one for
    the running state, K speculative); align mode's block for a crossed boundary only counts where
    vLLM's memory check and concurrency report count it (max_memory_usage_bytes: 2 + K)."""
    _, off = layout(policy=policy, engine=NONE)
    _, on = layout(policy=policy, engine=ALIGN)
    assert (off.state_blocks_per_group, on.state_blocks_per_group) == (blocks, blocks)
    assert (off.boundary_blocks, on.boundary_blocks) == (0, 3)
    extra = 1 if policy == "replay" else 0  # replay's input cache fits one block
    assert off.state_blocks == on.state_blocks == 3 * blocks + extra
    tokens = 32768
    assert on.max_concurrency(tokens) == on.num_blocks / (on.attn_blocks(tokens) + 3 * (blocks + 1) + extra)
    assert off.max_concurrency(tokens) == off.num_blocks / (off.attn_blocks(tokens) + 3 * blocks + extra)


def test_no_speculation_keeps_one_state_block_whatever_the_policy():
    for policy in ("store_all", "reconstruct", "replay"):
        _, lay = layout(policy=policy, engine=NONE, mtp_depth=0)
        assert lay.state_blocks == 3


def test_paged_pool_keeps_the_null_block_out_of_usage():
    m, lay = layout(pool=100 * 11 * 2_195_456)
    assert lay.num_blocks == 100
    pool = make_pool("paged", m, make_policy(m, load_policy("store_all")), lay, 0)
    assert pool.capacity == 99
    pool.take(33)
    assert pool.usage == pytest.approx(1 / 3)


def test_ideal_pool_counts_align_mode_state():
    m, lay = layout(pool=1 << 34)
    ideal = make_pool("ideal", m, make_policy(m, load_policy("store_all")), lay, 1 << 34)
    assert ideal.state_units == 30 * 2_195_456 * (1 + 3)
    assert ideal.boundary_units == 30 * 2_195_456
    assert ideal.token_bytes == 11 * 2048


def test_served_model_takes_kv_dtype_and_max_model_len_from_the_engine():
    eng = EngineConfig(kv_cache_dtype="fp8", max_model_len=32768)
    m = served_model(load_model("qwen3.5-35b-a3b"), eng)
    assert (m.kv_dtype_bytes, m.max_model_len) == (1, 32768)
    with pytest.raises(ValueError, match="served_model"):
        block_layout(load_model("qwen3.5-35b-a3b"), make_policy(m, load_policy("store_all")), GiB, eng)


def test_sampler_estimate_reproduces_the_other_anchor():
    # docs/notes/2026-11-29-h200-reference-points.md: 8.5 GiB at vocabulary 248,320 and 5.2 GiB at 151,936, both 1,024 rows.
    m = load_model("qwen3-next-80b-a3b")
    own = estimated_sampler_bytes(m, 8192, 1024) - 8192 * m.hidden_size * 2 - 1024 * m.vocab_size * 2
    assert own / GiB == pytest.approx(5.2, abs=0.05)
    assert SAMPLER_ANCHOR_BYTES == 8.5 * GiB


def test_the_dummy_sampler_runs_one_row_per_dummy_request():
    # vLLM's _dummy_run (v1/worker/gpu_model_runner.py): min(num_tokens, max_num_seqs) requests, one sampled
    # row each; max_num_seqs above the token budget samples as many rows as tokens
    m = load_model("qwen3.5-35b-a3b")
    at_budget = estimated_sampler_bytes(m, 100, 100)
    assert estimated_sampler_bytes(m, 100, 1024) == at_budget > estimated_sampler_bytes(m, 100, 99)
    hidden = 100 * m.hidden_size * 2
    per_row = (estimated_sampler_bytes(m, 100, 100) - estimated_sampler_bytes(m, 100, 50)) / 50
    assert at_budget == pytest.approx(hidden + 100 * per_row, abs=1)


def test_profile_peak_is_the_larger_phase_and_a_measurement_wins(tmp_path):
    m, hw = load_model("qwen3.5-35b-a3b"), load_hardware("h200")
    # Without a profile_peak.json (an empty calibration folder) the peak is the estimate.
    b = memory_budget(m, hw.model_copy(update={"calibration_dir": str(tmp_path)}), EngineConfig(gmu=0.9))
    assert b.activation_bytes == max(b.forward_peak_bytes, b.sampler_peak_bytes)
    assert b.activation_source.startswith("estimate")
    assert b.pool_bytes == b.requested_bytes - b.weight_bytes - b.activation_bytes - b.non_torch_bytes - b.cudagraph_bytes
    # The committed results/calibration/h200/qwen3.5-35b-a3b/profile_peak.json (H200, 2026-12-01) wins:
    # its 8192-token / 1024-seq / speculative point's profile_peak_bytes (the sampler's sort).
    committed = memory_budget(m, hw, EngineConfig(gmu=0.9))
    assert (committed.activation_bytes, committed.activation_source) == (9_663_701_504, "measured")
    mdir = tmp_path / m.name
    mdir.mkdir()
    point = {"status": "ok", "max_num_batched_tokens": 8192, "max_num_seqs": 1024, "speculative": True,
             "forward_peak_bytes": 1, "sampler_peak_bytes": 3 * GiB, "profile_peak_bytes": 3 * GiB}
    (mdir / "profile_peak.json").write_text(json.dumps({"points": [point]}))
    measured = memory_budget(m, hw.model_copy(update={"calibration_dir": str(tmp_path)}), EngineConfig(gmu=0.9))
    assert (measured.activation_bytes, measured.activation_source) == (3 * GiB, "measured")


def test_given_kv_memory_replaces_the_profiled_budget():
    m, hw = load_model("qwen3.5-35b-a3b"), load_hardware("h200")
    b = memory_budget(m, hw, EngineConfig(gmu=0.9), kv_cache_memory_bytes=5 * GiB)
    assert (b.pool_bytes, b.pool_source) == (5 * GiB, "given")


@pytest.mark.parametrize("data,msg", [
    ({"mamba_cache_mode": "align", "enable_prefix_caching": False}, "needs enable_prefix_caching: true"),
    ({"mamba_cache_mode": "none"}, "needs enable_prefix_caching: false"),
])
def test_cache_mode_must_agree_with_prefix_caching(data, msg):
    from core.config import validate
    with pytest.raises(ConfigError, match=msg):
        validate(EngineConfig, data, "engine")


def test_cache_mode_defaults_follow_prefix_caching():
    assert EngineConfig().resolved_mamba_cache_mode == "align"
    assert EngineConfig(enable_prefix_caching=False).resolved_mamba_cache_mode == "none"
