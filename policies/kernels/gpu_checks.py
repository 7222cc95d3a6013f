"""The GPU tests, run by every kernel measurement before it times anything and recorded in
its provenance: the interpreter the CPU suite runs kernels in ignores `tl.dot`'s input
precision, so only a GPU sees a kernel that lost float32 accuracy, and a table of kernels
that fail their checks would price the wrong kernels."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
GPU_TEST_FILES = ("tests/test_kernels_gpu.py", "tests/test_kernels_gpu_models.py")
TIMEOUT_S = 900


def _pytest(files: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", *files]


def _counts(text: str) -> dict[str, int]:
    """pytest's closing line ("2 failed, 5 passed, 1 skipped in 3.1s") as {"failed": 2, ...}."""
    out: dict[str, int] = {}
    for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)", text):
        what = "error" if what.startswith("error") else what
        out[what] = out.get(what, 0) + int(n)
    return out


def run_gpu_tests(root: Path = REPO, files: tuple[str, ...] = GPU_TEST_FILES, timeout_s: float = TIMEOUT_S,
                  jobs: int = 1) -> dict:
    """`pytest -m gpu` on `files`: {"passed", "summary" (pytest's last line), "returncode",
    "command", "wall_s"}. pytest exits 0 when all pass, 5 when none ran (no GPU: all skip).
    jobs > 1: the tests (most of their time is Triton compiling, on the CPU) split round-robin
    over that many pytest processes at once; passed only if every process passed, the summary
    adds their counts."""
    t0 = time.perf_counter()
    groups = [list(files)]
    if jobs > 1:
        listed = subprocess.run(_pytest([*files, "--collect-only"]), cwd=root, capture_output=True, text=True)
        ids = [ln.strip() for ln in listed.stdout.splitlines() if "::" in ln]
        if ids:
            groups = [g for g in (ids[i::jobs] for i in range(jobs)) if g]
    cmd = " ".join(_pytest(list(files))[1:]) + (f" (split over {len(groups)} processes)" if len(groups) > 1 else "")
    procs = [subprocess.Popen(_pytest(g), cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for g in groups]
    outs, codes = [], []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))[0])
            codes.append(p.returncode)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return {"passed": False, "summary": f"timed out after {timeout_s:.0f} s", "returncode": None,
                    "command": cmd, "wall_s": round(time.perf_counter() - t0, 1)}
    lasts = [([ln for ln in o.splitlines() if ln.strip()] or [""])[-1] for o in outs]
    if len(groups) == 1:
        summary = lasts[0]
    else:
        total: dict[str, int] = {}
        for line in lasts:
            for k, v in _counts(line).items():
                total[k] = total.get(k, 0) + v
        summary = ", ".join(f"{v} {k}" for k, v in sorted(total.items())) + f" ({len(groups)} processes)"
    failed = [o for o, c in zip(outs, codes) if c != 0]
    res = {"passed": all(c == 0 for c in codes), "summary": summary,
           "returncode": next((c for c in codes if c != 0), 0), "command": cmd,
           "wall_s": round(time.perf_counter() - t0, 1)}
    if failed:
        res["failures"] = [ln for o in failed for ln in o.splitlines() if ln.startswith(("FAILED", "ERROR"))][:20]
    return res
