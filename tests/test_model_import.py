"""`specsim model import`: Hugging Face configs of each supported model to our model YAML."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from core.config import ConfigError, EngineConfig, ModelConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.cli import main as cli
from sim.engine.memory import memory_facts, pool_facts
from sim.runs.model_import import generation_sampling, import_config, layer_pattern, param_counts

FIXTURES = Path(__file__).parent / "data" / "hf_configs"
# fixture folder -> the model YAML it must reproduce
MODELS = {
    "Qwen3-Next-80B-A3B-Instruct": "qwen3-next-80b-a3b",
    "Qwen3.5-35B-A3B": "qwen3.5-35b-a3b",
    "Qwen3.5-397B-A17B": "qwen3.5-397b-a17b",
    "Qwen3.5-27B": "qwen3.5-27b",
}


def _hf(folder: str) -> dict:
    return json.loads((FIXTURES / folder / "config.json").read_text())


# The fixtures hold each checkpoint's config.json only; its generation_config.json, which sets
# top_k and top_p, is what the YAMLs' generation_sampling says (docs/sampling.md).
TOP_K_TOP_P = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}


def _import(folder: str, **kw) -> ModelConfig:
    imp = import_config(_hf(folder), folder, MODELS[folder], **{"generation": TOP_K_TOP_P, **kw})
    return ModelConfig.model_validate(imp.data)


@pytest.mark.parametrize("folder", sorted(MODELS))
def test_import_reproduces_the_model_yaml_field_for_field(folder):
    assert _import(folder).model_dump() == load_model(MODELS[folder]).model_dump()
    # no generation_config.json: vLLM's own defaults, temperature 1 without top-k or top-p
    assert _import(folder, generation=None).generation_sampling == "random"


@pytest.mark.parametrize("gen, path", [
    (None, "random"), ({}, "random"), ({"temperature": 0.7}, "random"), ({"temperature": 0.0, "top_k": 20}, "greedy"),
    ({"top_k": 20}, "top_k_top_p"), ({"top_p": 0.8}, "top_k_top_p"), ({"top_k": 0, "top_p": 1.0}, "random"),
    ({"top_k": -1, "do_sample": False}, "random"),  # vLLM reads no do_sample
])
def test_generation_config_selects_vllms_sampling_path(gen, path):
    assert generation_sampling(gen)[0] == path


@pytest.mark.parametrize("folder", sorted(MODELS))
@pytest.mark.parametrize("policy", ["store_all", "reconstruct", "replay"])
def test_imported_memory_facts_are_identical(folder, policy):
    """`specsim memory`'s facts and the pool vLLM would build, from the import and from the YAML."""
    hw, engine = load_hardware("h200"), EngineConfig(gmu=0.9)

    def facts(model: ModelConfig) -> dict:
        pol = make_policy(model, load_policy(policy))
        return {**memory_facts(model, pol), **pool_facts(model, hw, engine, pol, None)[0]}
    assert facts(_import(folder)) == facts(load_model(MODELS[folder]))


def test_cli_writes_the_yaml_and_says_what_it_defaulted(tmp_path, capsys):
    out = tmp_path / "next.yaml"
    src = FIXTURES / "Qwen3-Next-80B-A3B-Instruct" / "config.json"
    assert cli(["model", "import", str(src), "--name", "qwen3-next-80b-a3b", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # Qwen3-Next's config has no mamba_ssm_dtype: the state stays in the model dtype, and it says so
    assert "mamba_ssm_dtype = bfloat16" in printed and "tensor_parallel = 2" in printed
    written = ModelConfig.model_validate(yaml.safe_load(out.read_text()))
    assert "generation_sampling = random (no generation_config.json" in printed
    assert written.model_dump() == load_model("qwen3-next-80b-a3b").model_dump() | {"generation_sampling": "random"}
    # with the checkpoint's generation_config.json beside it, its top_k and top_p
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(src.read_text())
    (folder / "generation_config.json").write_text(json.dumps(TOP_K_TOP_P))
    assert cli(["model", "import", str(folder / "config.json"), "--name", "x", "--out", str(tmp_path / "x.yaml")]) == 0
    assert "generation_sampling top_k_top_p (generation_config.json: top_k 20, top_p 0.95)" in capsys.readouterr().out
    assert yaml.safe_load((tmp_path / "x.yaml").read_text())["generation_sampling"] == "top_k_top_p"
    # an existing file is not overwritten without --force
    assert cli(["model", "import", str(src), "--name", "qwen3-next-80b-a3b", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


def test_unknown_architecture_is_one_line_naming_model_type_and_the_supported(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    assert cli(["model", "import", str(cfg), "--out", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'llama'" in err and "qwen3_next" in err and "qwen3_5" in err
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize("bad, field", [({"linear_num_value_heads": 30}, "num_v_heads"),
                                        ({"num_hidden_layers": 41}, "layer_types"),
                                        ({"mlp_only_layers": [0]}, "mlp_only_layers")])
def test_inconsistent_configs_name_the_field(bad, field):
    cfg = _hf("Qwen3.5-35B-A3B")
    cfg["text_config"].update(bad)
    with pytest.raises(ConfigError, match=field):
        import_config(cfg, "cfg", "x", tensor_parallel=1)


def test_missing_field_is_named():
    cfg = _hf("Qwen3-Next-80B-A3B-Instruct")
    del cfg["linear_key_head_dim"]
    with pytest.raises(ConfigError, match="linear_key_head_dim missing"):
        import_config(cfg, "cfg", "x", tensor_parallel=2)


def test_layer_types_and_full_attention_interval_agree():
    text = _hf("Qwen3.5-35B-A3B")["text_config"]
    by_interval = {k: v for k, v in text.items() if k != "layer_types"}
    assert layer_pattern(text, "t") == layer_pattern(by_interval, "t") == (["gdn", "gdn", "gdn", "attn"], 40)
    # a period other than four is kept as written
    odd = {**text, "num_hidden_layers": 6, "layer_types": ["linear_attention", "full_attention"] * 3}
    assert layer_pattern(odd, "t") == (["gdn", "attn"], 6)


def test_a_name_without_sizes_counts_parameters_from_the_shapes():
    imp = import_config(_hf("Qwen3.5-27B"), "cfg", "my-dense-hybrid", tensor_parallel=1)
    total, active = param_counts(imp.data)
    assert imp.data["total_params"] == total == active  # dense: every parameter is active
    assert 26e9 < total < 28.5e9  # the card's 27B; the vision encoder is not counted
    assert "total_params" in imp.defaults


def test_shared_expert_width_other_than_the_experts_is_kept():
    cfg = _hf("Qwen3.5-35B-A3B")
    cfg["text_config"]["shared_expert_intermediate_size"] = 768
    moe = ModelConfig.model_validate(import_config(cfg, "cfg", "x-35b-a3b", tensor_parallel=1).data).moe
    assert (moe.shared_experts, moe.shared_expert_width, moe.shared_width) == (1, 768, 768)


def test_quantization_config_is_reported_not_silently_dropped():
    cfg = copy.deepcopy(_hf("Qwen3.5-35B-A3B"))
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    imp = import_config(cfg, "cfg", "qwen3.5-35b-a3b-awq", tensor_parallel=1)
    assert any("awq" in n and "not modelled" in n for n in imp.notes) and "weights" not in imp.data


def test_a_block_fp8_checkpoint_imports_as_fp8_weights():
    cfg = copy.deepcopy(_hf("Qwen3.5-35B-A3B"))
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    imp = import_config(cfg, "cfg", "qwen3.5-35b-a3b-fp8", tensor_parallel=1)
    m = ModelConfig.model_validate(imp.data)
    assert m.weights == "fp8" and m.calibration_name == "qwen3.5-35b-a3b-fp8"
    assert m.weight_bytes_per_gpu < 0.55 * ModelConfig.model_validate({**imp.data, "weights": "bf16"}).weight_bytes_per_gpu


def _text(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


@pytest.mark.parametrize("key, value", [
    ("num_hidden_layers", 0), ("num_hidden_layers", -4), ("num_hidden_layers", 40.5), ("num_hidden_layers", "40"),
    ("hidden_size", 0), ("linear_num_value_heads", -32), ("num_attention_heads", True), ("num_experts", 0),
    ("moe_intermediate_size", 512.0), ("vocab_size", None), ("head_dim", 0), ("mtp_num_hidden_layers", -1),
])
def test_counts_and_widths_that_are_not_positive_integers_are_one_line(key, value, tmp_path, capsys):
    cfg = _hf("Qwen3.5-35B-A3B")
    _text(cfg)[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert cli(["model", "import", str(path), "--name", "m", "--out", str(tmp_path / "m.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    if value is None:
        assert f"{key} missing" in err
    else:
        least = 0 if key == "mtp_num_hidden_layers" else 1
        assert f"{key} {json.dumps(value)}: allowed: an integer >= {least}" in err, err
    assert not (tmp_path / "m.yaml").exists()


def test_a_shape_vllm_cannot_shard_is_one_line(tmp_path, capsys):
    cfg = _hf("Qwen3.5-35B-A3B")
    _text(cfg)["num_key_value_heads"] = 3  # does not divide the 16 query heads
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert cli(["model", "import", str(path), "--name", "m", "--out", str(tmp_path / "m.yaml")]) == 2
    assert "num_kv_heads 3 does not divide num_q_heads 16" in capsys.readouterr().err
    _text(cfg)["num_key_value_heads"] = 2
    path.write_text(json.dumps(cfg))
    assert cli(["model", "import", str(path), "--name", "m", "--tensor-parallel", "3", "--out",
                str(tmp_path / "m.yaml")]) == 2
    assert "tensor_parallel 3: vLLM cannot serve m on 3 GPUs" in capsys.readouterr().err
