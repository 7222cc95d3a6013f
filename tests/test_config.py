"""Config errors name the file, the field path and what is allowed."""
import pytest

from core.config import ConfigError, EngineConfig, RunConfig, load_hardware, validate


def test_unknown_nested_field_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        validate(RunConfig, {"engine": {"gmu": 0.5, "gmuu": 0.6}}, "run.yaml")
    msg = str(e.value)
    assert msg.startswith("run.yaml: invalid configuration")
    assert "engine.gmuu: unknown field; valid: gmu, max_num_batched_tokens" in msg


def test_wrong_literal_lists_allowed_values():
    with pytest.raises(ConfigError, match=r"engine.admission: Input should be 'full_prompt' or 'first_chunk'"):
        validate(RunConfig, {"engine": {"admission": "eager"}}, "run.yaml")


def test_derived_hardware_must_say_where_it_comes_from():
    b200 = load_hardware("b200")
    assert b200.derived and b200.derived_from == "h200" and b200.scaling_notes
    data = b200.model_dump() | {"scaling_notes": None}
    with pytest.raises(ConfigError, match="derived hardware profile must name derived_from and scaling_notes"):
        validate(type(b200), data, "b200.yaml")


def test_gmu_bounds_are_inclusive_at_one():
    assert EngineConfig(gmu=1.0).gmu == 1.0


def test_state_dtype_is_the_models_field_and_bytes_follow():
    from core.config import ModelConfig, load_model
    m = load_model("qwen3.5-35b-a3b")
    assert (m.mamba_ssm_dtype, m.state_dtype_bytes, m.conv_dtype_bytes) == ("float32", 4, 2)
    assert load_model("qwen3.5-35b-a3b", {"mamba_ssm_dtype": "bfloat16"}).state_dtype_bytes == 2
    with pytest.raises(ConfigError, match=r"mamba_ssm_dtype: Input should be 'float32', 'bfloat16' or 'float16'"):
        validate(ModelConfig, m.model_dump() | {"mamba_ssm_dtype": "fp32"}, "m.yaml")


def test_old_state_bytes_field_points_at_the_new_one():
    from core.config import ModelConfig, load_model
    data = load_model("qwen3.5-35b-a3b").model_dump() | {"state_dtype_bytes": 2}
    with pytest.raises(ConfigError, match=r"state_dtype_bytes: unknown field; valid: .*mamba_ssm_dtype"):
        validate(ModelConfig, data, "m.yaml")


def test_engine_defaults_are_current_vllms():
    e = EngineConfig()
    assert (e.kv_cache_dtype, e.enable_prefix_caching, e.resolved_mamba_cache_mode, e.language_model_only,
            e.max_model_len) == ("bf16", True, "align", False, None)
    assert load_hardware("h200").max_num_batched_tokens == load_hardware("b200").max_num_batched_tokens == 8192


def test_run_config_takes_model_overrides():
    cfg = validate(RunConfig, {"model_overrides": {"mamba_ssm_dtype": "bfloat16"}}, "run.yaml")
    assert cfg.model_overrides == {"mamba_ssm_dtype": "bfloat16"}
