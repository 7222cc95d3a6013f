"""Every YAML the project reads refuses a key given twice and a value of another type
(`true` or "5" where a number belongs, 1 for a boolean), with one line naming the field."""
import pytest

from core.config import CONFIG_DIR, ConfigError, load_hardware, load_model, load_policy, read_yaml
from core.yaml_text import load_yaml
from test_bad_input import fake_sweep, no_simulation, one_line_error  # noqa: F401 (fixtures)
from workloads import load_workload
from workloads.base import WorkloadError


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("engine:\n  gmu: 0.6\n  max_num_seqs: 8\n  gmu: 0.9\n")
    with pytest.raises(ConfigError, match=r"line 4, column 3: key 'gmu' given twice \(first on line 2\); keep one"):
        read_yaml(path)


def test_the_same_key_in_two_mappings_is_no_duplicate():
    assert load_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}


def test_exponent_numbers_are_numbers_as_in_yaml_1_2():
    assert load_yaml("[1e3, 1.5e3, -2E-4, .5e1, 1.0e+3, '1e3', x1e3]") == [1000.0, 1500.0, -2e-4, 5.0, 1000.0,
                                                                           "1e3", "x1e3"]


@pytest.mark.parametrize("kind, text", [
    ("models", "num_layers: 40\nnum_layers: 48\n"),
    ("hardware", "name: h\nname: g\n"),
    ("policies", "name: p\nmamba_state_commit: replay\nflush_interval: 4\nflush_interval: 2\n"),
])
def test_config_files_refuse_duplicate_keys(kind, text, tmp_path):
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    loader = {"models": load_model, "policies": load_policy, "hardware": load_hardware}[kind]
    with pytest.raises(ConfigError, match="given twice"):
        loader(str(path))


def test_workload_yaml_refuses_duplicate_keys_and_strings_for_numbers(tmp_path):
    base = (CONFIG_DIR / "workloads" / "synthetic-fixed.yaml").read_text()
    path = tmp_path / "w.yaml"
    path.write_text(base + "output_cap: 10\noutput_cap: 20\n")
    with pytest.raises(ConfigError, match="key 'output_cap' given twice"):
        load_workload(str(path), 2, 0)
    path.write_text(base + "output_cap: '10'\n")
    with pytest.raises(WorkloadError, match=r"output_cap: Input should be a valid integer, got '10'"):
        load_workload(str(path), 2, 0)


@pytest.mark.parametrize("text, field, shown", [
    ("num_requests: true\n", "num_requests", "got True"),  # YAML's true is no count of requests
    ("engine:\n  gmu: '0.6'\n", "engine.gmu", "got '0.6'"),
    ("engine:\n  enable_prefix_caching: 1\n", "engine.enable_prefix_caching", "got 1"),
    ("num_requests: 10.0\n", "num_requests", "got 10.0"),
    ("client:\n  max_concurrency: [8]\n", "client.max_concurrency", "got [8]"),
])
def test_run_config_takes_each_value_only_as_its_type(text, field, shown, tmp_path, capsys, no_simulation):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    err = one_line_error(["run", "--config", str(path)], capsys)
    assert f"{field}: Input should be a valid" in err and shown in err


def test_set_values_are_typed_strictly(capsys, no_simulation):
    err = one_line_error(["run", "--set", "num_requests=yes", "--out", "x"], capsys)
    assert "num_requests: Input should be a valid integer, got True" in err


@pytest.mark.parametrize("text, message", [
    ("axes:\n  policy: [store_all]\n  policy: [replay]\n", "key 'policy' given twice"),
    ("fixed: {num_requests: '4'}\naxes:\n  policy: [store_all]\n",
     "num_requests: Input should be a valid integer, got '4'"),
])
def test_a_bad_grid_is_refused_before_anything_is_written(text, message, tmp_path, capsys, fake_sweep):
    grid = tmp_path / "g.yaml"
    grid.write_text(text)
    err = one_line_error(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid),
                          "--out", str(tmp_path / "o")], capsys)
    assert message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml"]
