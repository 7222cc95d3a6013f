"""policies.kernels.profile_case: its child step runs every policy at a bench shape; bad input is one line, exit 2."""
import os
import subprocess
import sys

import pytest

from policies.kernels import profile_case


@pytest.mark.parametrize("argv, message", [
    (["--tree", "2,2"], "--tree must be one of"),
    (["--tree", "chain0"], "--tree must be one of"),
    (["--B", "0"], "--B must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        profile_case.main(["--out", str(tmp_path)] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and message in err[-1]


@pytest.mark.parametrize("policy, tree", [("reconstruct", "3,3,3"), ("reconstruct_deferred", "chain5"),
                                          ("replay", "1,1,1"), ("store_all", "2,2,2")])
def test_rehearsal_child_runs_each_policy(tmp_path, policy, tree):
    # The child is what ncu profiles; GDN_BENCH_REHEARSAL runs it through Triton's interpreter.
    env = {**os.environ, "GDN_BENCH_REHEARSAL": "1", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-m", "policies.kernels.profile_case", "--out", str(tmp_path), "--child",
                          "--policy", policy, "--tree", tree, "--B", "2"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"ran {policy} B=2" in out.stdout and "2 verify + commit steps" in out.stdout
