"""The sweep runner: parallel points, atomic resumable point files, failures, Ctrl-C, Dask.

The simulator is replaced by `fake_simulate`, a deterministic function of the config
with a pool that fills with load x state blocks, so these tests check the sweep's
own logic (keys, resume, baseline, memory-bound split) and not the engine's numbers.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from core.config import ConfigError, RunConfig
from core.files import atomic_write_text
import sim.runs.sweep as sweep
import sim.runs.sweep_executors as sweep_executors
from sim.cli import main as cli
from sim.runs.grid import load_grid
from sim.runs.report import write_points_csv
from sim.runs.report import build_table

REPO = Path(__file__).resolve().parent.parent
BLOCKS = {"store_all": 4, "reconstruct": 1, "replay": 1}


def timeless(records: list[dict]) -> list[dict]:
    """Records without their wall time (elapsed_s, rounded to the ms: a loaded machine moves it) and
    without the digest that covers it; each digest must still match its own record."""
    assert all(r["digest"] == sweep.record_digest(r) for r in records)
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "digest")} for r in records]


def fake_simulate(cfg: RunConfig) -> dict:
    """Pool use grows with load x state blocks / gmu; 397B does not fit at gmu 0.6."""
    if cfg.model == "qwen3.5-397b-a17b" and cfg.engine.gmu < 0.7:
        raise ConfigError("model qwen3.5-397b-a17b does not fit on h200 at gmu 0.6: 4.20 GiB missing")
    if cfg.seed == 13:
        raise RuntimeError("boom at seed 13")
    load = cfg.client.max_concurrency or cfg.client.request_rate
    demand = load * BLOCKS[cfg.policy] / (100 * cfg.engine.gmu)
    served = load / max(1.0, demand)
    return {
        "output_throughput_tok_s": 100.0 * served,
        "request_throughput": served / 10,
        "ttft_p99_s": 0.05 * max(1.0, demand) ** 2,
        "ttft_mean_s": 0.03,
        "e2e_mean_s": 2.0 * max(1.0, demand),
        "tpot_mean_s": 0.01 * (1 + 0.1 * (cfg.policy == "replay")),
        "peak_kv_usage": min(1.0, demand),
        "mean_kv_usage": min(1.0, demand) / 2,
        "preemptions": 0,
        "waited_for_memory": 3 if demand > 1 else 0,
        "completed": cfg.num_requests,
        "rejected": 0,
        "mean_accepted_len": 3.24,
        "pool_bytes": int(cfg.engine.gmu * 100 * (1 << 30)),
        "latency_source": "analytic",
        "latency_terms": {"gdn": "analytic", "moe": "analytic"},
    }


def no_prepare(configs):
    return {}


GRID = """\
fixed:
  num_requests: 10
axes:
  model: [qwen3.5-35b-a3b, qwen3.5-397b-a17b]
  engine.gmu: [0.6, 0.9]
  client.max_concurrency: [1, 64, 256]
  policy: [store_all, reconstruct, replay]
"""


@pytest.fixture
def grid_file(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    return path


def configs(grid_file, text=None):
    if text:
        grid_file.write_text(text)
    return load_grid(grid_file, "synthetic-fixed").points("synthetic-fixed")


def test_sweep_runs_records_and_resumes(grid_file, tmp_path):
    points = configs(grid_file)
    out = tmp_path / "out"
    res = sweep.run_sweep(points, out, jobs=2, simulate=fake_simulate, prepare=no_prepare, progress=False)
    assert (res.ran, res.cached) == (36, 0)
    files = sorted((out / "points").iterdir())
    assert len(files) == 36 and all(f.suffix == ".json" for f in files)
    status = pd.Series([r["status"] for r in res.records]).value_counts().to_dict()
    assert status == {"ok": 27, "infeasible": 9}
    bad = next(r for r in res.records if r["status"] == "infeasible")
    assert "GiB missing" in bad["error"] and bad["summary"] is None
    # Resume: every point is found, nothing is simulated again.
    again = sweep.run_sweep(points, out, jobs=2, simulate=fake_simulate, prepare=no_prepare, progress=False)
    assert (again.ran, again.cached) == (0, 36)
    assert again.records == res.records
    # points.csv is the same file whether its points were just run or read back from disk.
    fresh = write_points_csv(res.records, tmp_path / "fresh.csv")
    cached = write_points_csv(again.records, tmp_path / "cached.csv")
    assert list(fresh.columns) == list(cached.columns)
    assert (tmp_path / "fresh.csv").read_bytes() == (tmp_path / "cached.csv").read_bytes()


def test_corrupt_points_are_recomputed(grid_file, tmp_path):
    points = configs(grid_file)
    out = tmp_path / "out"
    res = sweep.run_sweep(points, out, jobs=1, simulate=fake_simulate, prepare=no_prepare, progress=False)
    keys = [r["key"] for r in res.records]
    (out / "points" / f"{keys[0]}.json").write_text('{"key": "' + keys[0] + '", "status": "o')  # torn write
    other = json.loads((out / "points" / f"{keys[1]}.json").read_text())
    other["key"] = "0" * 20  # a file that claims another point
    (out / "points" / f"{keys[1]}.json").write_text(json.dumps(other))
    edited = json.loads((out / "points" / f"{keys[2]}.json").read_text())
    edited["config"]["seed"] = 99  # hand-edited config: no longer hashes to its key
    (out / "points" / f"{keys[2]}.json").write_text(json.dumps(edited))
    again = sweep.run_sweep(points, out, jobs=1, simulate=fake_simulate, prepare=no_prepare, progress=False)
    assert (again.ran, again.cached) == (3, 33)
    assert timeless(again.records) == timeless(res.records)  # a recomputed point's run time may differ


def test_failed_point_does_not_stop_the_sweep(grid_file, tmp_path):
    points = configs(grid_file, GRID + "  seed: [0, 13]\n")
    res = sweep.run_sweep(points, tmp_path / "out", jobs=2, simulate=fake_simulate, prepare=no_prepare, progress=False)
    failed = [r for r in res.records if r["status"] == "failed"]
    assert len(failed) == 27 and len(res.records) == 72  # seed 13 fails wherever the model fits
    assert failed[0]["error"] == "RuntimeError: boom at seed 13" and "fake_simulate" in failed[0]["traceback"]
    # Failed points are finished: a rerun keeps them unless asked to retry.
    again = sweep.run_sweep(points, tmp_path / "out", jobs=2, simulate=fake_simulate, prepare=no_prepare, progress=False)
    assert again.ran == 0
    retry = sweep.run_sweep(points, tmp_path / "out", jobs=2, simulate=fake_simulate, prepare=no_prepare, progress=False, retry_failed=True)
    assert retry.ran == 27


def test_memory_bound_and_ratios(grid_file, tmp_path):
    res = sweep.run_sweep(configs(grid_file), tmp_path / "out", jobs=2, simulate=fake_simulate, prepare=no_prepare, progress=False)
    df = build_table(res.records).set_index(["model", "engine.gmu", "client.max_concurrency", "policy"])
    m = "qwen3.5-35b-a3b"
    # store_all at gmu 0.6, 64 requests: 64 x 4 / 60 > 1, the pool is exhausted -> memory-bound for all.
    for policy in BLOCKS:
        assert bool(df.loc[(m, 0.6, 64, policy), "memory_bound"]) is True
        assert bool(df.loc[(m, 0.6, 1, policy), "memory_bound"]) is False
    assert df.loc[(m, 0.6, 64, "store_all"), "ratio_output_throughput_tok_s"] == 1.0
    expect = fake_simulate(RunConfig(model=m, policy="reconstruct", engine={"gmu": 0.6}, client={"max_concurrency": 64}))
    base = fake_simulate(RunConfig(model=m, policy="store_all", engine={"gmu": 0.6}, client={"max_concurrency": 64}))
    assert df.loc[(m, 0.6, 64, "reconstruct"), "ratio_ttft_p99_s"] == pytest.approx(expect["ttft_p99_s"] / base["ttft_p99_s"])
    assert df.loc[(m, 0.6, 64, "reconstruct"), "state_blocks_per_group"] == 1
    assert df.loc[(m, 0.6, 64, "store_all"), "state_blocks_per_group"] == 4
    # No baseline where the model does not fit: no class, no ratio.
    row = df.loc[("qwen3.5-397b-a17b", 0.6, 64, "replay")]
    assert row["status"] == "infeasible" and pd.isna(row["memory_bound"]) and pd.isna(row["ratio_e2e_mean_s"])


def test_point_key_covers_config_and_version():
    cfg = RunConfig()
    assert sweep.point_key(cfg, "a") != sweep.point_key(cfg, "b")
    assert sweep.point_key(cfg, "a") != sweep.point_key(RunConfig(seed=1), "a")


def test_atomic_write_interrupted_keeps_old_file(tmp_path, monkeypatch):
    target = tmp_path / "p.json"
    atomic_write_text(target, '{"v": 1}')

    def interrupted(fd):
        raise KeyboardInterrupt  # Ctrl-C after the bytes were written, before the rename

    monkeypatch.setattr(sweep.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, '{"v": 2}')
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"] and target.read_text() == '{"v": 1}'


def test_jobs_zero_fails_fast(grid_file, tmp_path, capsys):
    rc = cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid_file), "--jobs", "0", "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_bad_dask_address_fails_fast(grid_file, tmp_path):
    pytest.importorskip("distributed")
    # It gives up after the connect timeout it names (no speed assert: a loaded machine is slow)
    with pytest.raises(ConfigError, match=rf"cannot reach a Dask scheduler.*timeout {sweep_executors.DASK_CONNECT_TIMEOUT_S} s"):
        sweep.run_sweep(configs(grid_file), tmp_path / "o", dask_scheduler="tcp://127.0.0.1:9", simulate=fake_simulate, prepare=no_prepare)
    assert not (tmp_path / "o").exists()


def test_dask_local_cluster_matches_process_pool(grid_file, tmp_path):
    distributed = pytest.importorskip("distributed")
    points = configs(grid_file)[:12]
    local = sweep.run_sweep(points, tmp_path / "a", jobs=2, simulate=fake_simulate, prepare=no_prepare, progress=False)
    # Loopback only, no dashboard: a test opens no port another machine can reach
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                                  dashboard_address=None, worker_dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        remote = sweep.run_sweep(points, tmp_path / "b", dask_scheduler=cluster.scheduler_address,
                                 simulate=fake_simulate, prepare=no_prepare, progress=False)
    assert remote.ran == 12 and timeless(remote.records) == timeless(local.records)


CTRL_C_SCRIPT = """\
import sys
sys.path[:0] = [{repo!r}, {tests!r}]  # this checkout's code, wherever the script lies
import sim.runs.sweep
import test_sweep_run
sim.runs.sweep.default_simulate = getattr(test_sweep_run, sys.argv[1])
sim.runs.sweep.warm_workloads = test_sweep_run.no_prepare
from sim.cli import main
sys.exit(main(["sweep", "--workload", "synthetic-fixed", "--grid", {grid!r}, "--jobs", "2", "--out", {out!r}, "--no-progress"]))
"""


def waits_at_256(cfg: RunConfig) -> dict:
    """`fake_simulate`, except that a point at concurrency 256 waits until it is interrupted:
    with two workers the sweep finishes exactly the six points before the first two of those
    and then can only end by the signal, however slow or loaded the machine is."""
    while cfg.client.max_concurrency == 256:
        time.sleep(3600)
    return fake_simulate(cfg)


def test_ctrl_c_leaves_whole_files_and_rerun_resumes(grid_file, tmp_path):
    out = tmp_path / "out"
    script = tmp_path / "run.py"
    script.write_text(CTRL_C_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), grid=str(grid_file), out=str(out)))
    proc = subprocess.Popen([sys.executable, str(script), "waits_at_256"], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 300  # a hang guard, not a speed requirement
        while len(list((out / "points").glob("*.json"))) < 6:
            assert proc.poll() is None and time.time() < deadline, "the sweep ended or hung before its sixth point"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    files = list((out / "points").iterdir())
    assert all(f.suffix == ".json" and not f.name.startswith(".") for f in files)
    assert len({json.loads(f.read_text())["key"] for f in files}) == 6  # every file is whole JSON
    assert not (out / "points.csv").exists()
    rerun = subprocess.run([sys.executable, str(script), "fake_simulate"], cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "(30 run, 6 cached)" in rerun.stderr
    assert len(pd.read_csv(out / "points.csv")) == 36


def test_cli_sweep_writes_table_and_manifest(grid_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep, "default_simulate", fake_simulate)
    monkeypatch.setattr(sweep, "warm_workloads", no_prepare)
    out = tmp_path / "s"
    assert cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid_file), "--model", "qwen3.5-35b-a3b",
                "--jobs", "2", "--out", str(out), "--no-progress"]) == 0
    df = pd.read_csv(out / "points.csv")
    assert len(df) == 18 and set(df["model"]) == {"qwen3.5-35b-a3b"}
    for col in ("engine.gmu", "client.max_concurrency", "policy", "tree", "ttft_p99_s", "memory_bound",
                "ratio_output_throughput_tok_s", "latency_terms.gdn", "status", "error"):
        assert col in df
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["load_axis"] == "client.max_concurrency" and manifest["ran"] == 18
    assert manifest["command"].startswith("specsim sweep --workload synthetic-fixed --grid ")
    assert "--model qwen3.5-35b-a3b" in manifest["command"]
    assert "18 points (18 run, 0 cached)" in capsys.readouterr().err


def test_unknown_workload_names_valid_ones(grid_file, tmp_path, capsys):
    rc = cli(["sweep", "--workload", "sharegtp", "--grid", str(grid_file), "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown workload 'sharegtp'; valid: " in err and "sharegpt" in err
    assert not (tmp_path / "o").exists()


def test_real_simulator_small_sweep(tmp_path):
    """The real engine behind the sweep: 2 policies x 2 loads, 12 requests each."""
    path = tmp_path / "grid.yaml"
    path.write_text("fixed: {model: qwen3.5-35b-a3b, num_requests: 12, engine.gmu: 0.9}\n"
                    "axes: {client.max_concurrency: [1, 8], policy: [store_all, reconstruct]}\n")
    points = load_grid(path, "synthetic-fixed").points("synthetic-fixed")
    res = sweep.run_sweep(points, tmp_path / "out", jobs=2, progress=False)
    assert [r["status"] for r in res.records] == ["ok"] * 4, [r["error"] for r in res.records]
    df = build_table(res.records)
    assert (df["completed"] == 12).all() and df["memory_bound"].notna().all()
    assert (df.loc[df["policy"] == "store_all", "ratio_e2e_mean_s"] == 1.0).all()
    again = sweep.run_sweep(points, tmp_path / "out", jobs=2, progress=False)
    assert again.ran == 0 and again.records == res.records


def test_changed_workload_data_changes_the_keys(tmp_path):
    """Same config, same path, other file content: the points must not be reused."""
    trace = tmp_path / "burst.csv"
    lines = (REPO / "tests" / "data" / "burstgpt_sample.csv").read_text().splitlines()
    trace.write_text("\n".join(lines) + "\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"fixed: {{num_requests: 5, workload_overrides.path: {trace}, client.request_rate: 2}}\n"
                    "axes: {policy: [store_all, replay]}\n")
    points = load_grid(grid, "burstgpt").points("burstgpt")
    first = sweep.run_sweep(points, tmp_path / "out", jobs=1, simulate=fake_simulate, progress=False)
    assert first.ran == 2 and sweep.run_sweep(points, tmp_path / "out", jobs=1, simulate=fake_simulate, progress=False).ran == 0
    trace.write_text("\n".join(lines[:-3]) + "\n")  # fewer rows: other requests are drawn
    again = sweep.run_sweep(points, tmp_path / "out", jobs=1, simulate=fake_simulate, progress=False)
    assert again.ran == 2 and {r["data_version"] for r in again.records}.isdisjoint({r["data_version"] for r in first.records})


def test_git_describe_counts_source_edits_not_generated_docs(tmp_path, monkeypatch):
    """make docs rewrites docs/ and README.md while its sweeps run: those edits must not mark the sweeps dirty."""
    import sim.runs.sweep as sweep_mod
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
    for name in ("docs/a.md", "README.md", "sim.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("v1\n")
    subprocess.run(git + ["add", "."], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "c"], cwd=tmp_path, check=True)
    monkeypatch.setattr(sweep_mod, "REPO_ROOT", tmp_path)
    clean = sweep_mod.git_describe()
    assert clean and not clean.endswith("+dirty")
    (tmp_path / "docs/a.md").write_text("v2\n")
    (tmp_path / "README.md").write_text("v2\n")
    assert sweep_mod.git_describe() == clean
    (tmp_path / "sim.py").write_text("v2\n")
    assert sweep_mod.git_describe() == clean + "+dirty"
