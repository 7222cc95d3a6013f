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
