"""What a user reads: every error, hint and help text, worded for someone who has not read the code.

Each test runs the CLI as a user would (or the function behind it) and pins the line
they get: the field it names, the command it suggests, the allowed values. A bad input
exits with status 2 and no traceback.
"""
import json
import re
import subprocess
from pathlib import Path

import pytest

import sim.runs.sweep as sweep
from core.config import ConfigError, RunConfig, read_yaml
from core.files import atomic_write_text
from sim.cli import main as cli
from sim.figures.cli import make_figures
from test_sweep_run import fake_simulate, no_prepare
from workloads import load_workload
from workloads.base import WorkloadError
from workloads.sharegpt import parse_records

REPO = Path(__file__).resolve().parent.parent
TINY_GRID = """\
fixed: {num_requests: 10, model: qwen3.5-35b-a3b}
axes:
  client.max_concurrency: [1, 8]
  policy: [store_all, reconstruct]
"""


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    rc = cli(args)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return rc, cap.out, cap.err


@pytest.fixture
def fake_sweep(monkeypatch):
    """`specsim sweep` with the fake simulator and no workload loading (fast, no data)."""
    monkeypatch.setattr(sweep, "default_simulate", fake_simulate)
    monkeypatch.setattr(sweep, "warm_workloads", no_prepare)


@pytest.fixture
def grid(tmp_path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(TINY_GRID)
    return path


# ------------------------------------------------------------------ specsim run
def test_missing_config_file_is_one_line(tmp_path, capsys):
    rc, _, err = run_cli(["run", "--config", str(tmp_path / "run.yaml")], capsys)
    assert rc == 2
    assert f"--config {tmp_path / 'run.yaml'}: no such file (configs/run.example.yaml is an example to copy)" in err


def test_empty_config_file_says_empty(tmp_path, capsys):
    empty = tmp_path / "run.yaml"
    empty.write_text("")
    rc, _, err = run_cli(["run", "--config", str(empty)], capsys)
    assert rc == 2 and "expected a mapping of field: value at the top level, got an empty file" in err
    empty.write_text("- a list\n")
    assert run_cli(["run", "--config", str(empty)], capsys)[2].count("got a list") == 1


def test_shipped_example_config_is_valid():
    from sim.runs.run import add_arguments, build_config
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = build_config(p.parse_args(["--config", str(REPO / "configs" / "run.example.yaml")]))
    assert (cfg.policy, cfg.workload, cfg.engine.gmu, cfg.client.max_concurrency) == ("reconstruct", "sharegpt", 0.6, 128)
    assert set(read_yaml(REPO / "configs" / "run.example.yaml")) <= set(RunConfig.model_fields)


def test_unknown_workload_override_lists_valid_keys(capsys):
    rc, _, err = run_cli(["run", "--num-requests", "5", "--set", "workload_overrides.nosuch=1"], capsys)
    assert rc == 2
    assert "nosuch: unknown field; valid: name, kind, description" in err and "prompt_tokens, output_tokens" in err
    assert "fixed.nosuch" not in err and "Extra inputs" not in err


def test_unknown_workload_kind_lists_kinds(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("kind: zipf\n")
    with pytest.raises(WorkloadError, match="kind 'zipf' is not a workload kind; valid: fixed, synthetic, sharegpt, "
                                            "spec-bench, burstgpt, azure"):
        load_workload(str(f), 1, 0)


def test_model_that_does_not_fit_names_the_fields(capsys):
    rc, _, err = run_cli(["run", "--num-requests", "5", "--model", "qwen3.5-397b-a17b", "--gmu", "0.6"], capsys)
    assert rc == 2 and "raise gmu to at least" in err
    assert "raise tensor_parallel in configs/models/qwen3.5-397b-a17b.yaml, now 8" in err


def test_run_without_out_says_nothing_was_written(capsys):
    rc, out, err = run_cli(["run", "--num-requests", "5", "--concurrency", "2"], capsys)
    assert rc == 0 and "output_throughput_tok_s" in out
    assert "no files written: add --out DIR to keep summary.json, requests.csv and config.yaml" in err


def test_run_help_explains_every_option_and_default(capsys):
    with pytest.raises(SystemExit):
        cli(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for flag, words in {
        "--num-requests NUM_REQUESTS": "requests to sample from the workload (default 1000)",
        "--seed SEED": "(default 0)",
        "--allocator {paged,ideal}": "paged: vLLM's hybrid block pool; ideal: byte-exact",
        "--out OUT": "without --out nothing is written",
        "--gmu GMU": "(engine.gmu; default 0.9)",
        "--config CONFIG": "configs/run.example.yaml",
    }.items():
        assert flag in text and words in text, (flag, words)


def test_memory_help_shows_gmu_and_its_default(capsys):
    with pytest.raises(SystemExit):
        cli(["memory", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert re.search(r"--gmu GMU GPU memory utilisation .{0,60}\(default: 0\.9\)", text), text


def test_report_is_a_listed_command(capsys):
    with pytest.raises(SystemExit):
        cli(["--help"])
    assert "print the README's numbers from the committed outputs in docs/" in capsys.readouterr().out


# ------------------------------------------------------------------- workload data
def test_missing_data_file_names_every_way_to_give_it(monkeypatch):
    monkeypatch.delenv("SPEC_BENCH_PATH", raising=False)
    with pytest.raises(WorkloadError) as e:
        load_workload("spec-bench", 5, 0)
    msg = str(e.value)
    assert "`specsim run --workload spec-bench --set workload_overrides.path=FILE`" in msg
    assert "`make sweep WORKLOAD=spec-bench ARGS='--set workload_overrides.path=FILE'`" in msg
    assert "`specsim workload stats spec-bench --set path=FILE`" in msg
    assert "set the environment variable SPEC_BENCH_PATH=FILE" in msg and "hemingkx/Spec-Bench" in msg


def test_broken_jsonl_line_keeps_its_position(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"category": "qa", "turns": ["hi"]}\n{"category": "qa", turns: ["x"]}\n')
    with pytest.raises(WorkloadError, match=r"q.jsonl: line 2, column 20: not valid JSON: Expecting property name"):
        load_workload("spec-bench", 1, 0, {"path": str(f)})


def test_broken_sharegpt_json_keeps_its_position():
    text = '[\n {"id": "a", "conversations": []}\n {"id": "b"}\n]'
    with pytest.raises(WorkloadError, match=r"x.json: invalid JSON at line 3 column 2, after conversation 1: "
                                            "expected ',' or '\\]'"):
        parse_records(text, "x.json")
    records, note = parse_records('[\n {"id": "a"},\n {"id": "b", "conv', "x.json")
    assert len(records) == 1 and note.startswith("file truncated at line 3: 1 complete conversations read")


# ------------------------------------------------------------------------- sweeps
def test_sweep_records_the_data_file_and_reruns_with_it(tmp_path, grid, fake_sweep, capsys, monkeypatch):
    monkeypatch.delenv("SPEC_BENCH_PATH", raising=False)
    data = tmp_path / "question.jsonl"
    data.write_text('{"category": "qa", "turns": ["hi"]}\n')
    out = tmp_path / "sb"
    rc, _, _ = run_cli(["sweep", "--workload", "spec-bench", "--grid", str(grid), "--jobs", "1", "--no-progress",
                        "--set", f"workload_overrides.path={data}", "--out", str(out)], capsys)
    assert rc == 0
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["data_file"] == {"path": str(data.resolve()), "from": "workload_overrides.path"}
    assert f"--set workload_overrides.path={data}" in manifest["command"]
    assert cli(["figures", "--sweep", str(out)]) == 0
    assert f"- workload data: `{data.resolve()}` (from workload_overrides.path)" in (out / "report.md").read_text()
    # Given through the environment instead: the command sets the variable in front.
    monkeypatch.setenv("SPEC_BENCH_PATH", str(data))
    out2 = tmp_path / "sb-env"
    assert cli(["sweep", "--workload", "spec-bench", "--grid", str(grid), "--jobs", "1", "--no-progress",
                "--out", str(out2)]) == 0
    command = json.loads((out2 / "sweep.json").read_text())["command"]
    assert command.startswith(f"SPEC_BENCH_PATH={data.resolve()} specsim sweep --workload spec-bench")


def test_sweep_set_replaces_an_axis_and_rejects_unknown_fields(tmp_path, grid, fake_sweep, capsys):
    out = tmp_path / "s"
    assert cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--jobs", "1", "--no-progress",
                "--set", "client.max_concurrency=4", "--out", str(out)]) == 0
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["points"] == 2 and manifest["grid_fixed"]["client.max_concurrency"] == 4
    rc, _, err = run_cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--set", "engine.gmuu=0.5"], capsys)
    assert rc == 2 and "--set: unknown grid field 'engine.gmuu'; valid: " in err and "engine.gmu," in err
    rc, _, err = run_cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--set", "gmu"], capsys)
    assert rc == 2 and "--set expects KEY=VALUE (e.g. workload_overrides.path=FILE), got 'gmu'" in err


def test_missing_grid_lists_the_shipped_ones(tmp_path, capsys):
    rc, _, err = run_cli(["sweep", "--workload", "sharegpt", "--grid", str(tmp_path / "nope.yaml")], capsys)
    shipped = ", ".join(f"configs/grids/{p.name}" for p in sorted((REPO / "configs" / "grids").glob("*.yaml")))
    assert rc == 2 and f"grid file does not exist; the shipped grids: {shipped}" in err and "paper.yaml" in shipped


def test_corrupt_point_file_is_reported_and_rerun(tmp_path, grid, fake_sweep, capsys):
    out = tmp_path / "s"
    args = ["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--jobs", "1", "--no-progress", "--out", str(out)]
    assert cli(args) == 0
    victim = sorted((out / "points").glob("*.json"))[0]
    victim.write_text('{"key": "half a fi')
    capsys.readouterr()
    rc, _, err = run_cli(args, capsys)
    assert rc == 0
    assert (f"1 stored point file(s) in {out / 'points'} are corrupt or do not match their key; running those "
            f"points again: {victim.name}") in err
    assert "4 points (1 run, 3 cached)" in err and json.loads(victim.read_text())["status"] == "ok"


def test_piped_progress_is_a_few_lines(tmp_path, grid, fake_sweep, capsys):
    """Under pytest stderr is not a terminal, as in `make sweep | tee log`."""
    points = sweep.load_grid(grid, "synthetic-fixed").points("synthetic-fixed")
    sweep.run_sweep(points, tmp_path / "s", jobs=1, simulate=fake_simulate, prepare=no_prepare, progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 4 and all(re.fullmatch(r"sweep: \d/4 points run \(0 cached; 0 failed, 0 infeasible\) in \d+ s", x)
                                   for x in lines), lines
    assert "\r" not in "".join(lines)


def test_figures_on_an_interrupted_sweep_gives_a_complete_command(tmp_path, grid, fake_sweep):
    out = tmp_path / "s"
    assert cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--jobs", "1", "--no-progress",
                "--out", str(out)]) == 0
    (out / "points.csv").unlink()  # as if interrupted before the table was written
    with pytest.raises(ConfigError, match=re.escape(
            f"the sweep was interrupted; rerun it to finish (finished points are kept): `specsim sweep --workload "
            f"synthetic-fixed --grid GRID --out {out}`")):
        make_figures(out)
    with pytest.raises(ConfigError, match=re.escape(f"run a sweep first: `specsim sweep --workload NAME --out {tmp_path / 'x'}`")):
        make_figures(tmp_path / "x")


# ------------------------------------------------------------------------ Makefile
def make_dry_run(*args: str) -> str:
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout


def test_make_sweep_passes_args_and_progress():
    text = make_dry_run("sweep", "PROGRESS=0", "ARGS=--set workload_overrides.path=q.jsonl", "-o", ".venv/.base-stamp")
    assert "--no-progress" in text and "--set workload_overrides.path=q.jsonl" in text
    assert "--no-progress" not in make_dry_run("sweep", "-o", ".venv/.base-stamp")


def test_make_venv_says_what_it_does(tmp_path):
    text = make_dry_run("venv", f"VENV={tmp_path / 'v'}")
    assert "installing the simulator's dependencies" in text and "-q" not in text.split()
    assert f"run the simulator as {tmp_path / 'v'}/bin/specsim" in text
    dev = make_dry_run("dev", f"VENV={tmp_path / 'v'}", "TORCH_INDEX=https://download.pytorch.org/whl/cpu")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in dev
