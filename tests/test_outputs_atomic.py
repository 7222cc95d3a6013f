"""Outputs are whole or absent: `run`, `sweep` and `figures` leave the previous output
untouched when they fail or are interrupted, never mix two runs' files, check point
files against their digest, lock a sweep folder against a second writer, and exit 1
naming the points that failed."""
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

import sim.figures.cli as figures
import sim.runs.run as run_mod
import sim.runs.sweep as sweep
from core.folder_lock import FolderLock
from sim.cli import main as cli
from test_bad_input import one_line_error
from test_sweep_run import fake_simulate, no_prepare

GRID = """\
fixed: {num_requests: 10, model: qwen3.5-35b-a3b}
axes:
  client.max_concurrency: [1, 64]
  policy: [store_all, reconstruct]
"""
RUN = ["run", "--num-requests", "4", "--concurrency", "2"]


def listing(folder):
    """Every file under `folder` with its bytes (hidden staging folders included)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(parent):
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


@pytest.fixture
def fake_sweep(monkeypatch, tmp_path):
    monkeypatch.setattr(sweep, "default_simulate", fake_simulate)
    monkeypatch.setattr(sweep, "warm_workloads", no_prepare)
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    return ["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--jobs", "1", "--no-progress"]


# ------------------------------------------------------------------------ run
def test_rerun_without_trace_removes_the_traced_files(tmp_path, capsys):
    out = tmp_path / "r"
    assert cli([*RUN, "--trace-steps", "--out", str(out)]) == 0
    assert {"steps.csv", "events.csv", "step_state.csv"} <= set(os.listdir(out))
    (out / "notes.txt").write_text("mine\n")
    assert cli([*RUN, "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["config.yaml", "notes.txt", "requests.csv", "summary.json"]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("fault", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_run_that_fails_while_writing_leaves_the_previous_output(fault, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r"
    assert cli([*RUN, "--trace-steps", "--out", str(out)]) == 0
    before = listing(out)
    real_csv = run_mod._write_csv

    def fail_on_events(path, header, rows):
        if path.name == "events.csv":  # summary.json, config.yaml and requests.csv are written by now
            raise fault
        real_csv(path, header, rows)

    monkeypatch.setattr(run_mod, "_write_csv", fail_on_events)
    rc = cli([*RUN, "--seed", "7", "--trace-steps", "--out", str(out)])
    assert rc == (130 if isinstance(fault, KeyboardInterrupt) else 2)
    assert "Traceback" not in capsys.readouterr().err
    assert listing(out) == before
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------------- sweep
def test_hand_edited_point_is_run_again(tmp_path, fake_sweep, capsys):
    out = tmp_path / "s"
    assert cli([*fake_sweep, "--out", str(out)]) == 0
    table = pd.read_csv(out / "points.csv")
    path = next((out / "points").iterdir())
    rec = json.loads(path.read_text())
    true_value = rec["summary"]["output_throughput_tok_s"]
    rec["summary"]["output_throughput_tok_s"] = 1e9  # the key still matches the config: only the digest sees it
    path.write_text(json.dumps(rec, indent=1, sort_keys=True))
    capsys.readouterr()
    assert cli([*fake_sweep, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "1 stored point file(s)" in err and path.name in err and "(1 run, 3 cached)" in err
    assert json.loads(path.read_text())["summary"]["output_throughput_tok_s"] == true_value
    assert pd.read_csv(out / "points.csv").equals(table)


def test_second_sweep_into_a_locked_folder_names_the_holder(tmp_path, fake_sweep, capsys):
    out = tmp_path / "s"
    with FolderLock(out):
        rc = cli([*fake_sweep, "--out", str(out)])
        err = capsys.readouterr().err
    assert rc == 2 and f"--out {out}: in use by process {os.getpid()} (started " in err
    assert not (out / "points").exists()  # it ran nothing
    assert cli([*fake_sweep, "--out", str(out)]) == 0  # released: the next one runs
    assert leftovers(tmp_path) == []


def test_sweep_with_failed_points_exits_1_and_names_them(tmp_path, fake_sweep, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID + "  seed: [0, 13]\n")  # fake_simulate raises at seed 13
    rc = cli([*fake_sweep, "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert rc == 1
    failed = [line for line in err.splitlines() if line.startswith("failed: ")]
    assert len(failed) == 4 and all("seed=13" in line and "RuntimeError: boom at seed 13" in line for line in failed)
    assert "client.max_concurrency=64 policy=reconstruct seed=13" in err
    assert "4 point(s) failed" in err and "--retry-failed" in err
    assert (tmp_path / "s" / "points.csv").exists()  # the table is still written, failures included


def test_a_sweep_of_another_grid_into_a_sweeps_folder_is_refused(tmp_path, fake_sweep, capsys):
    out = tmp_path / "s"
    assert cli([*fake_sweep, "--out", str(out)]) == 0
    capsys.readouterr()
    before = listing(out)
    command = json.loads((out / "sweep.json").read_text())["command"]
    for other in (["--model", "qwen3.5-397b-a17b"], ["--set", "engine.gmu=0.75"]):
        err = one_line_error([*fake_sweep, *other, "--out", str(out)], capsys)
        assert f"--out {out}: holds another sweep (its sweep.json differs in grid_fixed)" in err
        assert f"allowed: that sweep's own command, `{command}`, or another --out" in err
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID.replace("[1, 64]", "[1, 8, 64]"))
    err = one_line_error([*fake_sweep, "--out", str(out)], capsys)
    assert "differs in grid_axes" in err
    assert listing(out) == before and leftovers(tmp_path) == []
    grid.write_text(GRID)
    assert cli([*fake_sweep, "--out", str(out)]) == 0  # the same sweep resumes
    assert "(0 run, 4 cached)" in capsys.readouterr().err


# -------------------------------------------------------------------- figures
@pytest.fixture(scope="module")
def drawn_once(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drawn")
    grid = tmp / "grid.yaml"
    grid.write_text(GRID)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweep, "default_simulate", fake_simulate)
        mp.setattr(sweep, "warm_workloads", no_prepare)
        assert cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--jobs", "1", "--no-progress",
                    "--out", str(tmp / "s")]) == 0
    assert cli(["figures", "--sweep", str(tmp / "s")]) == 0
    return tmp / "s"


@pytest.fixture
def drawn(drawn_once, tmp_path):
    """A sweep folder with its figures and report.md, drawn once per module."""
    return Path(shutil.copytree(drawn_once, tmp_path / "s"))


def test_figures_that_fail_midway_keep_the_previous_ones(drawn, monkeypatch, capsys):
    before = listing(drawn)

    def broken(df, manifest, fig_dir):
        raise ValueError("Data has no positive values, and therefore cannot be log-scaled.")

    monkeypatch.setattr(figures, "FIGURES", (figures.FIGURES[0], broken))
    with pytest.raises(ValueError):
        figures.make_figures(drawn)
    assert listing(drawn) == before
    assert leftovers(drawn.parent) == []


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "points.csv").write_bytes(bytes(range(128, 256))), "points.csv: not a UTF-8 text file"),
    (lambda d: (d / "points.csv").write_text((d / "points.csv").read_text()[:-40]), "the file is truncated"),
    (lambda d: (d / "sweep.json").write_text('{"workload": '), "sweep.json: not valid JSON"),
    (lambda d: (d / "sweep.json").write_text("[1, 2]"), "sweep.json: expected a JSON object"),
])
def test_damaged_sweep_files_are_one_line(damage, message, drawn, capsys):
    report = (drawn / "report.md").read_bytes()
    damage(drawn)
    capsys.readouterr()
    assert cli(["figures", "--sweep", str(drawn)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert (drawn / "report.md").read_bytes() == report
