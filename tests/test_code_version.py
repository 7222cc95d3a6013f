"""The code version keys cached sweep points: it must move with every file the simulator reads
and with nothing else (a committed log or profile must not invalidate every point)."""
import shutil
from pathlib import Path

import pytest

import sim.runs.code_version as cv
from core.calibration_files import GPU_FILES, MODEL_FILES, read_files
from core.config import REPO_ROOT, EngineConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.engine.budget import memory_budget
from sim.pricing.factory import make_latency_model

CAL = REPO_ROOT / load_hardware("h200").calibration_dir
MODEL = "qwen3.5-35b-a3b"


@pytest.fixture
def clone(tmp_path) -> Path:
    """The parts of the repository the code version reads, plus files it must ignore."""
    for folder in ("sim", "core", "policies", "workloads", "configs"):
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for path in read_files(CAL, [MODEL]):
        dest = tmp_path / path.relative_to(REPO_ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest)
    cal = tmp_path / CAL.relative_to(REPO_ROOT)
    (cal / MODEL / "replay_2026-12-01.log").write_text("a device log\n")
    (cal / "ncu" / "case").mkdir(parents=True)
    (cal / "ncu" / "case" / "summary.json").write_text("{}\n")
    return tmp_path


def _edit(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\n")


def version(root: Path) -> str:
    """The version as a fresh process computes it (code_version keeps one per process)."""
    cv._versions.clear()
    return cv.code_version("h200", root)


@pytest.mark.parametrize("table", ["kernels.csv", f"{MODEL}/moe.csv", f"{MODEL}/host_fit.json", f"{MODEL}/profile_peak.json"])
def test_a_read_table_changes_the_version(clone, table):
    before = version(clone)
    _edit(clone / CAL.relative_to(REPO_ROOT) / table)
    assert version(clone) != before


def test_contents_not_only_names(clone):
    """The same file names with one digit changed inside a table: another version."""
    before = version(clone)
    path = clone / CAL.relative_to(REPO_ROOT) / MODEL / "attn_decode.csv"
    path.write_text(path.read_text().replace("1", "2", 1))
    assert version(clone) != before


def test_unread_files_leave_the_version(clone):
    before = version(clone)
    cal = clone / CAL.relative_to(REPO_ROOT)
    _edit(cal / MODEL / "replay_2026-12-01.log")
    _edit(cal / "ncu" / "case" / "summary.json")
    (cal / MODEL / "provenance.json").write_text('{"note": "new"}\n')
    (cal / "kernels_variants_2026-12-03.csv").write_text("model\n")
    _edit(clone / "sim" / "figures" / "cli.py")  # post-processing only
    (clone / "configs" / "grids" / "new.yaml").write_text("fixed: {}\n")
    assert version(clone) == before
    _edit(clone / "sim" / "engine" / "budget.py")
    assert version(clone) != before


def test_sources_and_configs_listed():
    files = {p.relative_to(REPO_ROOT).as_posix() for p in cv.source_files("h200")}
    assert {"sim/engine/budget.py", "core/config.py", "policies/store_all.py", "workloads/registry.py",
            "configs/models/qwen3.5-35b-a3b.yaml", "configs/workloads/sharegpt.yaml",
            "results/calibration/h200/kernels.csv", f"results/calibration/h200/{MODEL}/host.csv"} <= files
    assert "sim/figures/cli.py" not in files and "sim/runs/sweep.py" not in files
    assert not any(f.startswith(("policies/kernels/", "configs/grids/")) for f in files)
    assert not any(f.endswith((".log", "provenance.json", "summary.json")) for f in files)


@pytest.mark.parametrize("policy", ["store_all", "reconstruct", "replay", "reconstruct_deferred"])
@pytest.mark.parametrize("model", ["qwen3.5-35b-a3b", "qwen3.5-397b-a17b", "qwen3-next-80b-a3b"])
def test_the_loaders_read_only_listed_files(model, policy, monkeypatch):
    """Whatever the latency model and the memory budget open under the calibration folder is in
    core.calibration_files' list, so the code version covers it (the list is shared, not copied)."""
    opened: set[Path] = set()
    real_open = Path.open

    def spy(self, *args, **kwargs):
        path = Path(self).resolve()
        if CAL in path.parents:
            opened.add(path)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", spy)
    hw, m, engine = load_hardware("h200"), load_model(model), EngineConfig()
    pol = make_policy(m, load_policy(policy))
    make_latency_model(m, hw, pol, engine)
    memory_budget(m, hw, engine)
    listed = {CAL / n for n in GPU_FILES} | {CAL / model / n for n in MODEL_FILES}
    assert opened, "the spy saw no calibration file: the loaders stopped using Path.open"
    assert opened <= listed, sorted(p.relative_to(CAL).as_posix() for p in opened - listed)
