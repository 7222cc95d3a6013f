"""The code version: a hash of everything a simulated point depends on besides its config.

A sweep keys each cached point by its resolved config, its workload data and this version
(`sim/runs/sweep.py`), so a change to the simulator's sources, the configs it reads or the
calibration tables it reads recomputes the point, and nothing else does: post-processing
modules, grids, example configs, and every calibration file the simulator does not read
(provenance, logs, profiles; `core.calibration_files`) leave it as it was.
"""
from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

from core.calibration_files import read_files
from core.config import CONFIG_DIR, REPO_ROOT, load_hardware

# Modules that only run or post-process a sweep: editing them cannot change a point.
NOT_SIMULATOR = {"sim/runs/sweep.py", "sim/runs/sweep_executors.py", "sim/runs/grid.py", "sim/runs/report.py",
                 "sim/runs/code_version.py", "sim/readme.py", "sim/cli.py"}
SOURCE_PACKAGES = ("sim", "core", "policies", "workloads")
# The Triton kernels: the simulator reads their timings, never runs them. A sweep's figures, and
# specsim plan, whose probes are RunConfigs that sim.runs.run simulates.
NOT_SIMULATOR_DIRS = ("policies/kernels", "sim/figures", "sim/plan")


def source_files(hardware: str, root: Path = REPO_ROOT) -> list[Path]:
    """Sources, configs and calibration tables a point of this hardware depends on."""
    files = [p for pkg in SOURCE_PACKAGES for p in (root / pkg).rglob("*.py")
             if "__pycache__" not in p.parts and p.relative_to(root).as_posix() not in NOT_SIMULATOR
             and not p.relative_to(root).as_posix().startswith(tuple(d + "/" for d in NOT_SIMULATOR_DIRS))]
    # Grids only choose points, and every chosen value is in the point's own key; files at the
    # top of configs/ are examples (run.example.yaml) that no point reads.
    configs = root / CONFIG_DIR.relative_to(REPO_ROOT)
    files += [p for p in configs.rglob("*")
              if p.is_file() and p.parent != configs and "grids" not in p.relative_to(configs).parts]
    hw = load_hardware(hardware)
    if hw.calibration_dir:
        models = sorted(p.stem for p in (configs / "models").glob("*.yaml"))
        files += read_files(root / hw.calibration_dir, models)
    return sorted(set(files))


_versions: dict[tuple[str, Path], str] = {}


def code_version(hardware: str, root: Path = REPO_ROOT) -> str:
    """16 hex digits over each file's path and contents (computed once per process)."""
    if (hardware, root) not in _versions:
        h = hashlib.sha256()
        for path in source_files(hardware, root):
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
        _versions[(hardware, root)] = h.hexdigest()[:16]
    return _versions[(hardware, root)]


def package_version() -> str:
    """The installed package and its version: what outputs made outside a git checkout come from."""
    try:
        return f"gdn-specsim {metadata.version('gdn-specsim')}"
    except metadata.PackageNotFoundError:
        return "gdn-specsim (not installed)"
