"""policies.kernels.profile: the profiler's driver runs every policy at a bench shape and refuses bad input."""
import os
import subprocess
import sys

import pytest

from policies.kernels import profile


@pytest.mark.parametrize("argv, message", [
    (["--tree", "2,2"], "--tree must be one of"),
    (["--tree", "chain:0"], "--tree must be one of"),
    (["--B", "0"], "--B and --iters must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert profile.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("policy, tree", [("reconstruct", "3,3,3"), ("reconstruct_deferred", "chain:5"),
                                          ("replay", "1,1,1"), ("store_all", "2,2,2")])
def test_rehearsal_runs_each_policy(policy, tree):
    env = {**os.environ, "GDN_BENCH_REHEARSAL": "1", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-m", "policies.kernels.profile", "--policy", policy, "--B", "2",
                          "--tree", tree, "--iters", "1"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"profiled {policy} qwen3.5-35b-a3b B=2" in out.stdout and "2 verify + commit calls" in out.stdout
