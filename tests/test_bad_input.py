"""Every class of bad input a hostile user tries ends in one line on stderr, exit 2, no
traceback and no simulation: decode errors, paths, YAML in --set, numeric ranges,
trees, lengths above the model's maximum, and a configuration no request can fit."""
import pytest

import sim.runs.run as run_mod
import sim.runs.startup_checks as startup_checks
import sim.runs.sweep as sweep
from core.files import read_text
from sim.cli import main as cli
from test_sweep_run import fake_simulate, no_prepare

BINARY = bytes(range(128, 256)) * 4  # no UTF-8 text starts like this
GRID = "fixed: {num_requests: 4}\naxes:\n  policy: [store_all, replay]\n"


def one_line_error(args: list[str], capsys) -> str:
    rc = cli(args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.fixture
def no_simulation(monkeypatch):
    """Fails the test if an input error is found only after the engine ran."""
    def engine(*a, **k):
        raise AssertionError("the engine ran before the input was checked")
    monkeypatch.setattr(run_mod, "run_engine", engine)


@pytest.fixture
def binary(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(BINARY)
    return path


@pytest.fixture
def grid(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    return path


@pytest.fixture
def fake_sweep(monkeypatch):
    monkeypatch.setattr(sweep, "default_simulate", fake_simulate)
    monkeypatch.setattr(sweep, "warm_workloads", no_prepare)


# ------------------------------------------------------------------ decode errors
@pytest.mark.parametrize("option", ["--config", "--workload"])
def test_binary_yaml_file_is_named(option, binary, capsys, no_simulation):
    err = one_line_error(["run", option, str(binary)] if option == "--config"
                         else ["run", option, str(binary.rename(binary.with_suffix(".yaml")))], capsys)
    assert "not a UTF-8 text file" in err and "expected a YAML file" in err


@pytest.mark.parametrize("workload, what", [("sharegpt", "a ShareGPT JSON file"),
                                            ("spec-bench", "a Spec-Bench question.jsonl")])
def test_binary_dataset_file_is_named(workload, what, binary, capsys, no_simulation):
    err = one_line_error(["run", "--workload", workload, "--set", f"workload_overrides.path={binary}",
                          "--num-requests", "4"], capsys)
    assert f"{binary}: not a UTF-8 text file" in err and what in err


def test_binary_grid_is_named(binary, tmp_path, capsys, fake_sweep):
    err = one_line_error(["sweep", "--workload", "synthetic-fixed", "--grid", str(binary),
                          "--out", str(tmp_path / "o")], capsys)
    assert "not a UTF-8 text file" in err
    assert not (tmp_path / "o").exists()


def test_read_text_names_what_a_folder_was_meant_to_be(tmp_path):
    with pytest.raises(ValueError, match="cannot read a grid YAML"):
        read_text(tmp_path, "a grid YAML")


# ------------------------------------------------------------------------- paths
def test_out_that_is_a_file_or_under_one(tmp_path, capsys, no_simulation):
    f = tmp_path / "file"
    f.write_text("mine\n")
    assert "exists and is not a folder" in one_line_error(["run", "--num-requests", "4", "--out", str(f)], capsys)
    err = one_line_error(["run", "--num-requests", "4", "--out", str(f / "sub")], capsys)
    assert f"{f} is a file, not a folder" in err
    assert f.read_text() == "mine\n"


def test_out_where_nothing_can_be_written(capsys, no_simulation):
    # /proc refuses new entries, as a read-only filesystem does (root ignores chmod)
    assert "cannot write in /proc" in one_line_error(["run", "--num-requests", "4", "--out", "/proc/x"], capsys)


def test_out_whose_output_name_is_a_folder(tmp_path, capsys, no_simulation):
    (tmp_path / "requests.csv").mkdir()
    err = one_line_error(["run", "--num-requests", "4", "--out", str(tmp_path)], capsys)
    assert "requests.csv is a folder where this command writes a file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.csv"]  # nothing half-written


def test_sweep_out_that_is_a_file(tmp_path, grid, capsys, fake_sweep):
    f = tmp_path / "file"
    f.write_text("")
    err = one_line_error(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--out", str(f)], capsys)
    assert "exists and is not a folder" in err


# ------------------------------------------------------------------ YAML in --set
def test_set_value_that_is_not_yaml(capsys, tmp_path, grid, fake_sweep):
    err = one_line_error(["run", "--set", "engine.gmu=[1,"], capsys)
    assert "--set engine.gmu=[1,: the value is not valid YAML (line 1, column 4" in err
    err = one_line_error(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--set", "engine.gmu={a",
                          "--out", str(tmp_path / "o")], capsys)
    assert "--set engine.gmu={a: the value is not valid YAML" in err


def test_config_file_that_is_not_yaml_is_one_line(tmp_path, capsys):
    f = tmp_path / "run.yaml"
    f.write_text("engine: [0.6,\n")
    assert "not valid YAML: line 2, column 1" in one_line_error(["run", "--config", str(f)], capsys)


# ---------------------------------------------------------------- numeric ranges
def test_negative_seed_names_the_field(capsys, tmp_path, grid, fake_sweep, no_simulation):
    err = one_line_error(["run", "--seed", "-1"], capsys)
    assert "seed: Input should be greater than or equal to 0" in err
    grid.write_text(GRID + "  seed: [-1]\n")
    err = one_line_error(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--out", str(tmp_path / "o")],
                         capsys)
    assert "seed" in err and "greater than or equal to 0" in err


@pytest.mark.parametrize("flag, value, field", [("--gmu", "1.5", "gmu must be in (0, 1]"),
                                               ("--num-requests", "0", "num_requests"),
                                               ("--concurrency", "-3", "max_concurrency")])
def test_out_of_range_number_names_its_field(flag, value, field, capsys, no_simulation):
    assert field in one_line_error(["run", flag, value], capsys)


# ------------------------------------------------------------------------- trees
@pytest.mark.parametrize("tree", ["3,,3", "3,3,", "0,1", "a,b", ""])
def test_malformed_tree(tree, capsys, no_simulation):
    err = one_line_error(["run", "--tree", tree], capsys)
    assert "--tree: tree must be comma-separated positive widths" in err


def test_tree_no_request_can_fit_is_an_error_before_simulating(capsys, no_simulation):
    # 3,616 verify positions fit the token budget; store_all's 3,616 states a GDN group do not fit the pool
    err = one_line_error(["run", "--tree", "15,15,15", "--num-requests", "4"], capsys)
    assert "state 10,851 with tree 15,15,15" in err and "vLLM refuses to start here" in err
    assert "draft a smaller tree" in err


# ------------------------------------------------- lengths above the model's max
def test_max_model_len_above_the_models_is_refused_unless_allowed(capsys, no_simulation):
    err = one_line_error(["run", "--set", "engine.max_model_len=1000000000", "--num-requests", "4"], capsys)
    assert "above qwen3.5-35b-a3b's maximum of 262,144 tokens" in err
    assert "engine.allow_long_max_model_len=true" in err
    # Allowed, it is priced as vLLM would, and a pool that cannot hold one such request is refused
    err = one_line_error(["run", "--set", "engine.max_model_len=1000000000", "--set",
                          "engine.allow_long_max_model_len=true", "--num-requests", "4"], capsys)
    assert "one request of max_model_len 1,000,000,000 tokens needs" in err
    assert "the longest request that fits is" in err


def test_longest_fit_is_the_boundary():
    """The length the error proposes fits, one more token's blocks do not (counting align mode's
    block for a crossed boundary as held, as vLLM's check does)."""
    from core.config import load_model, load_hardware, load_policy, EngineConfig
    from policies import make_policy
    from sim.engine.budget import block_layout, memory_budget, served_model
    from sim.engine.pool import check_one_request_fits, make_pool

    eng = EngineConfig(max_model_len=10**9, allow_long_max_model_len=True)
    model = served_model(load_model("qwen3.5-35b-a3b"), eng)
    policy = make_policy(model, load_policy("store_all"))
    budget = memory_budget(model, load_hardware("h200"), eng)
    pool = make_pool("paged", model, policy, block_layout(model, policy, budget.pool_bytes, eng), budget.pool_bytes)
    with pytest.raises(ValueError, match="the longest request that fits is") as e:
        check_one_request_fits(pool, model.max_model_len, "1,1,1")
    longest = int(str(e.value).split("fits is ")[1].split(" tokens")[0].replace(",", ""))
    assert pool.boundary_units == 3
    assert pool.units_for(longest) + 3 <= pool.capacity < pool.units_for(longest + 1) + 3
    check_one_request_fits(pool, longest, "1,1,1")


def test_a_calibration_folder_missing_a_required_table_is_one_line(tmp_path, monkeypatch, capsys, no_simulation):
    """A model folder holding some tables and not the attention ones (a measurement cut short, merged):
    one line naming the missing file, exit 2, rather than a traceback or a silent roofline."""
    from core.config import load_hardware

    mdir = tmp_path / "qwen3.5-35b-a3b"
    mdir.mkdir()
    from core.tables import COLUMNS
    row = {c: 1 for c in COLUMNS} | {"mode": "graph", "ctx": 0, "us": 20.0}
    (mdir / "gdn.csv").write_text(",".join(COLUMNS) + "\n" + ",".join(str(row[c]) for c in COLUMNS) + "\n")
    h200 = load_hardware("h200").model_copy(update={"calibration_dir": str(tmp_path)})
    monkeypatch.setattr(startup_checks, "load_hardware", lambda name: h200)
    err = one_line_error(["run", "--model", "qwen3.5-35b-a3b", "--hardware", "h200", "--num-requests", "2",
                          "--out", str(tmp_path / "out")], capsys)
    assert "no such calibration table" in err and ".csv" in err
