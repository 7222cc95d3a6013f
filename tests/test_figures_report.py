"""`specsim figures`: the four figures (PNG + PDF) and report.md from a sweep folder.

The sweep runs with the fake simulator of test_sweep_run (deterministic, with a pool
that fills with load x state blocks), so the tables' numbers are known here.
"""
from pathlib import Path

import pytest

from core.config import ConfigError
import sim.sweep as sweep
from sim.cli import main as cli
from sim.figures import make_figures
from sim.report import read_points_csv
from test_sweep_run import fake_simulate, no_prepare

GRID = """\
fixed: {num_requests: 10}
axes:
  model: [qwen3.5-35b-a3b, qwen3.5-397b-a17b]
  engine.gmu: [0.6, 0.9]
  client.max_concurrency: [1, 64, 256]
  policy: [store_all, reconstruct, replay]
"""
TREES = """\
fixed: {model: qwen3.5-35b-a3b, num_requests: 10}
axes:
  policy_overrides.draft_tree_widths: [[1, 1, 1], [3, 3, 3]]
  engine.gmu: [0.9]
  client.max_concurrency: [8, 64]
  policy: [store_all, reconstruct]
"""


def sweep_and_draw(tmp_path: Path, monkeypatch, grid_text: str) -> Path:
    monkeypatch.setattr(sweep, "default_simulate", fake_simulate)
    monkeypatch.setattr(sweep, "warm_workloads", no_prepare)
    grid, out = tmp_path / "grid.yaml", tmp_path / "sweep"
    grid.write_text(grid_text)
    assert cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--jobs", "2", "--out", str(out), "--no-progress"]) == 0
    assert cli(["figures", "--sweep", str(out)]) == 0
    return out


def test_paper_figures_and_report(tmp_path, monkeypatch):
    out = sweep_and_draw(tmp_path, monkeypatch, GRID)
    figures = sorted(p.name for p in (out / "figures").iterdir())
    assert figures == [f"{stem}.{ext}" for stem in ("fig1_breakdown", "fig2_peak_kv_usage", "fig3_ttft_throughput") for ext in ("pdf", "png")]
    assert all((out / "figures" / f).read_bytes()[:4] in (b"\x89PNG", b"%PDF") for f in figures)
    report = (out / "report.md").read_text()
    assert "command: `specsim sweep --workload synthetic-fixed --grid " in report
    assert f"code version: `{sweep.code_version('h200')}`" in report
    assert "Step latencies came from: **analytic** (27 points)" in report
    # The 397B model does not fit at gmu 0.6: one row naming the error and its 9 points.
    assert "| infeasible | 9 | qwen3.5-397b-a17b | h200 | 0.6 | store_all, reconstruct, replay |" in report
    assert "4.20 GiB missing" in report
    # fake: store_all demand = load x 4 / (100 gmu): memory-bound at 64 and 256 for both gmu -> n = 4; slack n = 2.
    assert "| qwen3.5-35b-a3b | reconstruct | throughput (higher is better) | memory-bound | 4 |" in report
    assert "| qwen3.5-35b-a3b | reconstruct | throughput (higher is better) | slack | 2 | 1 | 1 | 1 |" in report
    assert "![Peak KV-cache usage against load](figures/fig2_peak_kv_usage.png)" in report
    assert "| qwen3.5-35b-a3b | 0.6 | 1 | 6.667 | 1.667 | 1.667 |" in report  # peak KV usage, %
    assert "## Figure 4: Draft-tree shapes per policy" in report and "Not drawn" in report
    # Same sweep, same report (no timestamps in it).
    make_figures(out)
    assert (out / "report.md").read_text() == report


def test_tree_figure(tmp_path, monkeypatch):
    out = sweep_and_draw(tmp_path, monkeypatch, TREES)
    assert (out / "figures" / "fig4_trees.png").exists() and (out / "figures" / "fig4_trees.pdf").exists()
    report = (out / "report.md").read_text()
    # store_all keeps one state per verify position: 4 blocks for (1,1,1), 40 for (3,3,3).
    assert "| qwen3.5-35b-a3b | 0.9 | 8 | 3,3,3 | store_all | 3.24 | 40 |" in report
    assert "| qwen3.5-35b-a3b | 0.9 | 8 | 1,1,1 | store_all | 3.24 | 4 |" in report
    assert "| qwen3.5-35b-a3b | 0.9 | 8 | 3,3,3 | reconstruct | 3.24 | 1 |" in report


def test_figures_need_a_sweep(tmp_path):
    with pytest.raises(ConfigError, match="no points.csv and sweep.json"):
        make_figures(tmp_path)


@pytest.mark.slow
def test_full_sharegpt_paper_sweep(tmp_path):
    """What `make sweep WORKLOAD=sharegpt` runs: 108 points of the real engine, then the figures."""
    out = tmp_path / "sharegpt"
    grid = Path(__file__).resolve().parent.parent / "configs" / "grids" / "paper.yaml"
    assert cli(["sweep", "--workload", "sharegpt", "--grid", str(grid), "--hardware", "h200",
                "--out", str(out), "--no-progress"]) == 0
    assert cli(["figures", "--sweep", str(out)]) == 0
    df = read_points_csv(out / "points.csv")
    assert len(df) == 108
    # 397B-A17B's weights (about 92 GiB per GPU) do not fit 0.6 x 140 GiB: infeasible, reported, not a crash.
    infeasible = df[df["status"] == "infeasible"]
    assert len(infeasible) == 18 and set(infeasible["model"]) == {"qwen3.5-397b-a17b"} and set(infeasible["engine.gmu"]) == {0.6}
    assert (df.loc[df["status"] == "ok", "completed"] == 1000).all()
    small = df[(df["model"] == "qwen3.5-35b-a3b") & (df["status"] == "ok")]
    assert small["memory_bound"].any() and not small["memory_bound"].all()  # both classes occur
    assert len(list((out / "figures").glob("fig*.png"))) == 3 and "## Figure 1" in (out / "report.md").read_text()
