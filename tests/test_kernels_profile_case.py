"""policies.kernels.profile_case: its child step runs every policy at a bench shape; bad input is one line, exit 2."""
import json
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


def test_the_profiled_child_gets_every_required_option(tmp_path, monkeypatch):
    # The child is parsed by the same parser: a required option the parent did not pass made every
    # profile fail before ncu saw a kernel (every profile before the fix).
    ncu = tmp_path / "ncu"
    ncu.write_text("")
    monkeypatch.setattr(profile_case.shutil, "which", lambda _: str(ncu))
    seen = []

    def run(cmd, **_):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)
    monkeypatch.setattr(profile_case.subprocess, "run", run)
    assert profile_case.main(["--out", str(tmp_path / "p"), "--tree", "chain5", "--B", "3"]) == 1
    child = seen[0][seen[0].index(sys.executable):]
    assert child[2:4] == ["policies.kernels.profile_case", "--child"]
    assert "--out" in child and child[child.index("--out") + 1] == str(tmp_path / "p")


SUMMARY_RAW = (
    '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum",'
    '"smsp__inst_issued.sum","smsp__issue_active.avg.pct_of_peak_sustained_active","launch__registers_per_thread",'
    '"launch__shared_mem_per_block_dynamic","launch__occupancy_limit_registers","launch__occupancy_limit_shared_mem",'
    '"sm__warps_active.avg.pct_of_peak_sustained_active","sass__inst_executed_register_spilling",'
    '"l1tex__t_sectors_pipe_lsu_mem_local_op_st_lookup_miss.sum","smsp__cycles_elapsed.avg.per_second",'
    '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"\n'
    '"","","us","Mbyte","Mbyte","inst","%","register/thread","Kbyte/block","block","block","%","inst","sector",'
    '"Ghz","inst","inst"\n'
    '"0","_fused_kernel","200.0","300.0","100.0","8,000,000","50.0","128","32.0","4","4","24.0","0","0","1.8",'
    '"1.5","0.5"\n')


def test_summary_says_what_bounds_each_kernel(tmp_path):
    (tmp_path / "raw.csv").write_text(SUMMARY_RAW)
    k, = profile_case.summarize_raw(tmp_path / "raw.csv", state_values=1 << 20)
    assert k["kernel"] == "_fused_kernel" and k["dram_tbs"] == 2.0  # 400 MB in 200 us
    assert k["instructions_per_32_values"] == round(8e6 * 32 / (1 << 20), 1)
    assert k["us_at_full_issue"] == 100.0 and k["registers"] == 128
    assert list(k["stalls_cycles_per_instruction"]) == ["wait", "long_scoreboard"]
    # from-raw: no GPU, summary.json written beside raw.csv
    assert profile_case.main(["--out", str(tmp_path), "--tree", "1,1,1", "--B", "2", "--from-raw"]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["case"]["state_values"] == 2 * 32 * 128 * 128


def test_summary_refuses_a_metric_in_another_unit(tmp_path):
    (tmp_path / "raw.csv").write_text(SUMMARY_RAW.replace('"us","Mbyte"', '"ms","Mbyte"', 1))
    with pytest.raises(ValueError, match="gpu__time_duration.sum in 'ms', expected 'us'"):
        profile_case.summarize_raw(tmp_path / "raw.csv", 1)
    assert profile_case.main(["--out", str(tmp_path), "--from-raw"]) == 2
