"""The GPU tests, run by every kernel measurement before it times anything and recorded in
its provenance: the interpreter the CPU suite runs kernels in ignores `tl.dot`'s input
precision, so only a GPU sees a kernel that lost float32 accuracy, and a table of kernels
that fail their checks would price the wrong kernels."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
GPU_TEST_FILES = ("tests/test_kernels_gpu.py",)
TIMEOUT_S = 900


def run_gpu_tests(root: Path = REPO, files: tuple[str, ...] = GPU_TEST_FILES, timeout_s: float = TIMEOUT_S) -> dict:
    """`pytest -m gpu` on `files`: {"passed", "summary" (pytest's last line), "returncode",
    "command", "wall_s"}. pytest exits 0 when all pass, 5 when none ran (no GPU: all skip)."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", *files]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"passed": False, "summary": f"timed out after {timeout_s:.0f} s", "returncode": None,
                "command": " ".join(cmd[1:]), "wall_s": round(time.perf_counter() - t0, 1)}
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return {"passed": proc.returncode == 0, "summary": lines[-1] if lines else "", "returncode": proc.returncode,
            "command": " ".join(cmd[1:]), "wall_s": round(time.perf_counter() - t0, 1)}
