"""docs/design.md#the-commit-policies' memory facts, exactly, for both models, all policies, both trees.

docs/design.md states them for the study's 2-byte state; vLLM's default (fp32, the HF
config's mamba_ssm_dtype) doubles the state bytes."""
import json

import pytest

from core.config import ConfigError, EngineConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.cli import main as cli
from sim.engine.budget import block_layout, memory_budget
from sim.engine.memory import memory_facts

MiB, GiB = 1 << 20, 1 << 30
MODELS = {"qwen3.5-35b-a3b": (30, 10, 30 * MiB, 0.625 * GiB), "qwen3.5-397b-a17b": (45, 15, 90 * MiB, 0.9375 * GiB)}
STATE_BYTES = {"bfloat16": 1, "float32": 2}  # multiple of docs/design.md's 2-byte state


def facts(model, policy, widths, ssm_dtype="bfloat16"):
    m = load_model(model, {"mamba_ssm_dtype": ssm_dtype})
    return memory_facts(m, make_policy(m, load_policy(policy, {"draft_tree_widths": widths})))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("policy", ["store_all", "reconstruct", "replay"])
@pytest.mark.parametrize("widths", [[1, 1, 1], [3, 3, 3]])
@pytest.mark.parametrize("ssm_dtype", STATE_BYTES)
def test_memory_facts(model, policy, widths, ssm_dtype):
    gdn, attn, state, kv32k = MODELS[model]
    state *= STATE_BYTES[ssm_dtype]
    f = facts(model, policy, widths, ssm_dtype)
    assert (f["gdn_layers"], f["attn_layers"]) == (gdn, attn)
    assert f["gdn_state_bytes_per_seq"] == state
    assert f["kv_bytes_per_seq_32k"] == kv32k
    blocks = {"store_all": 4 if widths == [1, 1, 1] else 40}.get(policy, 1)
    assert f["state_blocks_per_group"] == blocks  # mamba cache mode none: the facts as stated
    assert f["spec_state_bytes_per_seq"] == blocks * state


def test_store_all_chain_copies():
    assert facts("qwen3.5-35b-a3b", "store_all", [1, 1, 1])["spec_state_bytes_per_seq"] == 120 * MiB
    assert facts("qwen3.5-397b-a17b", "store_all", [1, 1, 1])["spec_state_bytes_per_seq"] == 360 * MiB


def test_qwen35_is_served_with_fp32_state_by_default():
    # vLLM takes the HF config's mamba_ssm_dtype (float32): 60 MiB per sequence for 35B-A3B.
    m = load_model("qwen3.5-35b-a3b")
    assert m.mamba_ssm_dtype == "float32" and m.state_dtype_bytes == 4
    assert m.gdn_layers * m.gdn_state_bytes_per_layer == 60 * MiB
    assert load_model("qwen3-next-80b-a3b").state_dtype_bytes == 2  # no such HF field: the model dtype


@pytest.mark.parametrize("ssm_dtype,block_tokens", [("bfloat16", 560), ("float32", 1072)])
def test_attention_block_enlarged_to_gdn_page(ssm_dtype, block_tokens):
    m = load_model("qwen3.5-35b-a3b", {"mamba_ssm_dtype": ssm_dtype})
    layout = block_layout(m, make_policy(m, load_policy("store_all")), 10 * GiB)
    assert layout.attn_block_tokens == block_tokens  # DESIGN: about 560 (2-byte) and 1,070 (fp32)
    assert layout.page_bytes >= m.gdn_page_bytes_per_gpu(m.mtp_depth)
    # 30 GDN + 10 attention + the MTP layer: groups of 11, three padding layers among the GDN groups.
    assert (layout.attn_groups, layout.gdn_groups, layout.group_layers) == (1, 3, 11)


def test_memory_cli_json(capsys):
    assert cli(["memory", "--model", "qwen3.5-35b-a3b", "--policy", "store_all", "--tree", "1,1,1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("gdn_state_bytes_per_seq", "conv_state_bytes_per_seq", "spec_state_bytes_per_seq",
                "kv_bytes_per_token", "state_blocks_per_group"):
        assert key in out
    assert out["conv_state_bytes_per_seq"] == 30 * (2 * 16 * 128 + 32 * 128) * (3 + 3) * 2


def test_model_that_does_not_fit_says_how_much_is_missing():
    m, hw = load_model("qwen3.5-397b-a17b"), load_hardware("h200")
    with pytest.raises(ConfigError, match=r"GiB missing"):
        memory_budget(m, hw, EngineConfig(gmu=0.6))


@pytest.mark.parametrize("gmu", [0, 1.5, -0.1])
def test_bad_gmu(gmu):
    with pytest.raises(Exception, match=r"gmu must be in \(0, 1\]"):
        EngineConfig(gmu=gmu)


def test_unknown_names_list_valid_ones(capsys):
    assert cli(["memory", "--model", "qwen9", "--policy", "store_all"]) == 2
    assert "valid: qwen3-next-80b-a3b, qwen3.5-27b, qwen3.5-35b-a3b, qwen3.5-35b-a3b-fp8, qwen3.5-397b-a17b, qwen3.5-397b-a17b-fp8" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"valid: none, reconstruct, .*replay, store_all"):
        load_policy("greedy")


def test_bad_policy_field_names_file_and_field(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\nmamba_state_commit: keep_all\n")
    with pytest.raises(ConfigError) as e:
        load_policy(str(bad))
    msg = str(e.value)
    assert str(bad) in msg and "mamba_state_commit" in msg and "'store_all', 'reconstruct', 'replay', 'reconstruct_deferred' or 'none'" in msg
