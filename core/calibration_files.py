"""The calibration files the simulator reads: one list, for the loaders and for the code version.

A calibration folder (a hardware YAML's `calibration_dir`, e.g. `results/calibration/h200/`)
also holds what only people read: provenance, device logs, profiles, replay rows and
summaries, variant runs. A cached sweep point must be recomputed when a file the simulator
reads changes, and only then; so the loaders take their paths from `gpu_file` / `model_file`,
which refuse a name not listed here, and the code version hashes exactly `read_files`.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from core.tables import DECODE_CONV, TABLES

# Beside the model folders: the commit policies' verify and commit kernels per model.
GPU_FILES = ("kernels.csv", "sampler.csv")  # + what sampling costs beyond greedy argmax
# In `<calibration_dir>/<model>/`.
MODEL_FILES = (
    *(f"{name}.csv" for name in TABLES),  # the layer tables
    f"{DECODE_CONV}.csv",  # the GDN decode core around the policy's kernels
    "gdn_mixed.csv",  # a mixed step's decodes through vLLM's chunked GDN path
    "step_check.csv",  # the per-step host overhead
    "host.csv", "host_policies.csv", "host_fit.json",  # the host model
    "memory.json", "profile_peak.json",  # the profile run's peak in the memory budget
    "kernels.csv",  # the model's own kernel bench (calibrate measure's kernels job), before the GPU's
)


def gpu_file(root: Path, name: str) -> Path:
    if name not in GPU_FILES:
        raise ValueError(f"{name}: not a calibration file the simulator reads; add it to core.calibration_files.GPU_FILES")
    return root / name


def model_file(root: Path, model: str, name: str) -> Path:
    if name not in MODEL_FILES:
        raise ValueError(f"{name}: not a calibration file the simulator reads; add it to core.calibration_files.MODEL_FILES")
    return root / model / name


def read_files(root: Path, models: Iterable[str]) -> list[Path]:
    """The files of `root` the simulator reads for these models, those that exist, sorted."""
    paths = [gpu_file(root, n) for n in GPU_FILES]
    paths += [model_file(root, m, n) for m in models for n in MODEL_FILES]
    return sorted(p for p in set(paths) if p.is_file())
