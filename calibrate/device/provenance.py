"""Where a calibration came from: GPU, driver, library versions, date, commit, command."""
from __future__ import annotations

import datetime as dt
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

from core.files import atomic_write_text

REQUIRED = ("gpu", "driver", "torch", "triton", "date", "git_commit", "command")


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit() -> str | None:
    return _run(["git", "rev-parse", "HEAD"])


def environment(device: str) -> dict[str, Any]:
    """GPU-side facts; imports torch and triton (call on the measuring machine only)."""
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if cuda else None
    return {
        "gpu": torch.cuda.get_device_name() if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def write(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all (a temporary name, then a rename): a call cut off while it writes keeps the last one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def missing_fields(part: dict[str, Any]) -> list[str]:
    return [k for k in REQUIRED if not part.get(k)]
