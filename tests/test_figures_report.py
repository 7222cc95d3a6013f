"""`specsim figures`: the four figures (PNG + PDF) and report.md from a sweep folder.

The sweep runs with the fake simulator of test_sweep_run (deterministic, with a pool
that fills with load x state blocks), so the tables' numbers are known here.
"""
import re
import subprocess
from pathlib import Path

import pytest

from core.config import ConfigError
import sim.runs.sweep as sweep
from sim import readme
from sim.cli import main as cli
from sim.figures.cli import make_figures
from sim.readme import BLOCK, fill
from sim.runs.code_version import code_version, package_version
from sim.runs.report import read_points_csv
from test_sweep_run import fake_simulate, no_prepare

REPO = Path(__file__).resolve().parent.parent

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
    assert f"code version: `{code_version('h200')}`" in report
    assert "Step latencies came from: **analytic** (27 points)" in report
    # The 397B model does not fit at gmu 0.6: one row naming the error and its 9 points.
    assert "| infeasible | 9 | qwen3.5-397b-a17b | h200 | 0.6 | store_all, reconstruct, replay |" in report
    assert "4.20 GiB missing" in report
    # fake: store_all demand = load x 4 / (100 gmu): memory-bound at 64 and 256 for both gmu -> n = 4; slack n = 2.
    assert "| qwen3.5-35b-a3b | reconstruct | throughput (higher is better) | memory-bound | 4 |" in report
    assert "| qwen3.5-35b-a3b | reconstruct | throughput (higher is better) | slack | 2 | 1 | 1 | 1 |" in report
    assert "![Peak KV + state pool usage against load](figures/fig2_peak_kv_usage.png)" in report
    # The infeasible 397B gmu 0.6 points are explained beside the figures, not left as empty legend entries.
    assert ("Not drawn: 397b-a17b at gmu 0.6: 9 points infeasible: the weights and fixed memory do not fit "
            "(4.20 GiB missing per GPU).") in report
    assert "A point is memory-bound when `store_all`" in report and "(higher is better)" in report
    # Figure 1 says why TPOT rises with throughput, figure 2 why a full-looking plateau is memory-bound.
    assert "every step carries a bigger batch" in report
    assert "can plateau below 100% and still be memory-bound (requests waited)" in report
    assert "| qwen3.5-35b-a3b | 0.6 | 1 | 6.667 | 1.667 | 1.667 |" in report  # peak KV usage, %
    assert "## Figure 4: Draft-tree shapes per policy" in report and "Not drawn" in report
    # Same sweep, same report (no timestamps in it).
    make_figures(out)
    assert (out / "report.md").read_text() == report


def test_tree_figure(tmp_path, monkeypatch):
    out = sweep_and_draw(tmp_path, monkeypatch, TREES)
    assert (out / "figures" / "fig4_trees.png").exists() and (out / "figures" / "fig4_trees.pdf").exists()
    report = (out / "report.md").read_text()
    # State blocks per GDN group: store_all keeps one state per verify position (4 for (1,1,1), 40 for
    # (3,3,3)), the others one; in mamba cache mode align (the default) one more only for a step
    # after a block crossing, which the column does not count.
    assert "| qwen3.5-35b-a3b | 0.9 | 8 | 3,3,3 | store_all | 3.24 | 40 |" in report
    assert "| qwen3.5-35b-a3b | 0.9 | 8 | 1,1,1 | store_all | 3.24 | 4 |" in report
    assert "| qwen3.5-35b-a3b | 0.9 | 8 | 3,3,3 | reconstruct | 3.24 | 1 |" in report


TREES5 = """\
fixed: {model: qwen3.5-35b-a3b, num_requests: 10}
axes:
  policy_overrides.draft_tree_widths: [[1], [1, 1], [1, 1, 1], [2, 2, 2], [3, 3, 3]]
  engine.gmu: [0.9]
  client.max_concurrency: [32, 128]
  policy: [store_all, reconstruct]
"""


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_tree_sweep_figures_fit_a_page(tmp_path, monkeypatch):
    """Five trees: figures 2-3 wrap into rows of at most four panels (they were one row of
    five, 3,200 px wide), figure 4 is a portrait grid of two panels a row."""
    out = sweep_and_draw(tmp_path, monkeypatch, TREES5)
    for stem in ("fig2_peak_kv_usage", "fig3_ttft_throughput"):
        width, _ = png_size(out / "figures" / f"{stem}.png")
        assert width <= 4 * 3.7 * 130 + 150, (stem, width)
    width, height = png_size(out / "figures" / "fig4_trees.png")
    assert width <= 2 * 5.0 * 130 + 150 and height < 3 * width
    report = (out / "report.md").read_text()
    assert "Top row: accepted length and state blocks per tree" in report


def test_log_axes_label_plain_numbers():
    import matplotlib.pyplot as plt
    from sim.figures.style import log_ticks

    fig, ax = plt.subplots()
    ax.plot([1, 2], [0.7, 3.0])
    ax.set_yscale("log")
    log_ticks(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    plt.close(fig)
    assert labels and all(re.fullmatch(r"[\d.]+", t) for t in labels), labels  # no "3 x 10^0"


# ------------------------------------------------------------------------ README
README = REPO / "README.md"


def test_readme_numbers_equal_the_committed_outputs():
    """The README's generated blocks say what docs/ says (`make docs` rewrites both)."""
    text = README.read_text()
    names = [m["name"] for m in BLOCK.finditer(text)]
    assert names == list(readme.BLOCKS), names
    assert fill(text, readme.render()) == text, "README.md differs from docs/: run `make docs`"


def test_validation_doc_numbers_equal_the_committed_outputs():
    """docs/validation.md's generated blocks say what docs/validation/ says (`make docs`)."""
    path = REPO / "docs" / "validation.md"
    text = path.read_text()
    assert [m["name"] for m in BLOCK.finditer(text)] == list(readme.DOC_BLOCKS)
    assert fill(text, readme.render()) == text, "docs/validation.md differs from docs/validation/: run `make docs`"


def test_readme_models_block_says_what_prices_each_model(tmp_path, monkeypatch):
    """Calibrated where the GPU's folder holds the model's tables, the roofline (and it says so) where not;
    a dense model's feed-forward block is its MLP."""
    from core.config import load_hardware

    rows = {r.split(" | ")[0].strip("| "): r for r in readme.models(readme.DOCS).splitlines()[2:]}
    assert "calibrated" in rows["qwen3.5-35b-a3b"] and "dense 17,408" in rows["qwen3.5-27b"]
    empty = load_hardware("h200").model_copy(update={"calibration_dir": str(tmp_path)})
    monkeypatch.setattr("core.config.load_hardware", lambda name: empty)
    assert all("| analytic |" in r for r in readme.models(readme.DOCS).splitlines()[2:])
    assert ": req/s" in rows["qwen3.5-35b-a3b"]  # the published runs of it, from docs/validation/
    assert rows["qwen3.5-27b"].endswith("| none |")


def test_readme_links_and_images_exist_in_a_clone():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"https?://", t)]
    assert local and not [t for t in local if t.startswith("..")]
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, missing
    tracked = subprocess.run(["git", "ls-files", *local], cwd=REPO, capture_output=True, text=True).stdout.split()
    assert sorted(set(tracked)) == sorted(set(local)), "README links to files git does not track"


def test_readme_quick_start_commands_exist():
    text = README.read_text()
    assert text.index("## Quick start") < text.index("## Reading the figures")
    assert "make venv" in text and ".venv/bin/specsim run --config configs/run.example.yaml --out runs/example" in text
    for section in ("## Results on ShareGPT", "## What it models", "## Memory pool", "## Engine semantics",
                    "## Step latency and how it was validated", "## Commands", "## Workloads", "## Grids and sweeps",
                    "## Installing", "## Make targets", "## Layout", "## Glossary"):
        assert f"\n{section}\n" in text, section
    models = text.split("## What it models")[1].split("\n## ")[0]
    for policy in ("store_all", "reconstruct", "reconstruct_deferred", "replay"):
        assert f"`{policy}`" in models, policy


def test_readme_is_a_manual_not_a_diary():
    """A user's manual of about 12 KB of prose and the generated tables; measurement history lives in docs/notes/."""
    text = README.read_text()
    assert len(text.encode()) <= 12_500, len(text.encode())  # about 12 KB: a manual; history goes to docs/notes
    assert not re.search(r"(?i)\bsession|\bissue [0-9]|\bcall [0-9]|\brun [0-9]|\bround [0-9]", text)


def test_figures_need_a_sweep(tmp_path):
    with pytest.raises(ConfigError, match="no points.csv and sweep.json"):
        make_figures(tmp_path)


@pytest.mark.slow
def test_full_sharegpt_paper_sweep(tmp_path):
    """What `make sweep WORKLOAD=sharegpt` runs: 180 points of the real engine, then the figures."""
    out = tmp_path / "sharegpt"
    grid = Path(__file__).resolve().parent.parent / "configs" / "grids" / "paper.yaml"
    assert cli(["sweep", "--workload", "sharegpt", "--grid", str(grid), "--hardware", "h200",
                "--out", str(out), "--no-progress"]) == 0
    assert cli(["figures", "--sweep", str(out)]) == 0
    df = read_points_csv(out / "points.csv")
    assert len(df) == 180
    # 397B-A17B (about 92 GiB of weights per GPU) fails vLLM's startup checks at gmu 0.6 and 0.75: infeasible, reported, not a crash.
    infeasible = df[df["status"] == "infeasible"]
    assert len(infeasible) == 60 and set(infeasible["model"]) == {"qwen3.5-397b-a17b"} and set(infeasible["engine.gmu"]) == {0.6, 0.75}
    assert (df.loc[df["status"] == "ok", "completed"] == 1000).all()
    small = df[(df["model"] == "qwen3.5-35b-a3b") & (df["status"] == "ok")]
    assert small["memory_bound"].any() and not small["memory_bound"].all()  # both classes occur
    assert len(list((out / "figures").glob("fig*.png"))) == 4 and "## Figure 1" in (out / "report.md").read_text()


def test_outside_a_checkout_the_report_names_the_package_and_every_figure_its_pricing(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "git_describe", lambda: "")  # a copy without .git
    out = sweep_and_draw(tmp_path, monkeypatch, GRID)
    report = (out / "report.md").read_text()
    assert f"made from `{package_version()}`, outside a git checkout" in report and "unknown" not in report
    assert package_version().startswith("gdn-specsim ")
    # each drawn figure's caption (its footnote) names the pricing of its points
    assert report.count("Step prices on h200: the analytic roofline (no tables) (27 points).") == 3  # figures 1-3


def test_the_speculation_figure_marks_each_winner_without_text_that_could_overlap():
    import pandas as pd

    from sim.figures import speculation as spec

    table = pd.DataFrame({"model": ["m"] * 4, "gmu": [0.6, 0.6, 0.9, 0.9], "load": [64, 128, 64, 128],
                          "speedup": [1.5, 1.51, 1.5, 1.52],
                          "best policy": ["reconstruct", "replay", "reconstruct", "reconstruct_deferred"]})
    fig, axes = spec.draw_speculation(table, "load")
    assert not any(ax.texts for ax in axes)  # close points once carried labels that covered each other
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert labels == ["gmu 0.6", "gmu 0.9", "reconstruct wins", "replay wins", "reconstruct_deferred wins"]
    shapes = [h.get_marker() for h in fig.legends[0].legend_handles[2:]]
    assert len(set(shapes)) == 3  # one marker shape per winning policy
