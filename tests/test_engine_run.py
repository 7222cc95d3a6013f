"""`sim.runs.run.simulate` and `specsim run`: outputs, determinism, common random numbers, bad inputs."""
import csv
import json
import re

import pytest

from core.config import RunConfig
from sim.cli import main as cli
from sim.runs.run import simulate

SUMMARY_KEYS = (
    "output_throughput_tok_s", "request_throughput", "ttft_mean_s", "ttft_median_s", "ttft_p90_s", "ttft_p99_s",
    "tpot_mean_s", "tpot_p99_s", "itl_mean_s", "itl_p99_s", "e2e_mean_s", "e2e_median_s", "e2e_p90_s", "e2e_p99_s",
    "peak_kv_usage", "mean_kv_usage", "preemptions", "completed", "rejected", "rejected_reasons",
    "waited_for_memory", "mean_waiting_s", "client_queue_mean_s", "mean_accepted_len", "duration_s", "num_steps",
    "latency_source", "latency_terms", "mean_step_time_by_term_s", "num_blocks", "block_size_tokens", "pool_bytes",
)


def config(**kw) -> RunConfig:
    data = {"num_requests": 200, "engine": {"gmu": 0.6}, "client": {"max_concurrency": 32}}
    for key, value in kw.items():
        section, _, field = key.partition("__")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[key] = value
    return RunConfig.model_validate(data)


def read_rows(path):
    with open(path, newline="") as f:
        return {int(r["request_id"]): r for r in csv.DictReader(f)}


def test_cli_run_writes_summary_requests_and_config(tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli(["run", "--model", "qwen3.5-35b-a3b", "--hardware", "h200", "--policy", "store_all",
              "--workload", "synthetic-fixed", "--gmu", "0.6", "--concurrency", "16", "--num-requests", "40",
              "--seed", "0", "--out", str(out), "--set", "engine.admission=first_chunk", "--trace-steps"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in SUMMARY_KEYS:
        assert key in summary, key
    assert summary["completed"] == 40 and summary["rejected"] == 0
    rows = read_rows(out / "requests.csv")
    assert len(rows) == 40 and all(r["status"] == "finished" for r in rows.values())
    assert "admission: first_chunk" in (out / "config.yaml").read_text()
    assert (out / "steps.csv").read_text().count("\n") == summary["num_steps"] + 2  # meta line + header
    assert "output_throughput_tok_s" in capsys.readouterr().out


def test_cli_config_file_and_set(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("policy: reconstruct\nnum_requests: 20\nclient: {max_concurrency: 4}\n")
    out = tmp_path / "o"
    assert cli(["run", "--config", str(cfg), "--set", "engine.gmu=0.75", "--set",
                "workload_overrides.output_tokens=32", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["policy"], summary["gmu"], summary["max_concurrency"]) == ("reconstruct", 0.75, 4)
    assert summary["total_output_tokens"] == 20 * 32


def test_same_seed_same_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    simulate(config(seed=3), a)
    simulate(config(seed=3), b)
    for name in ("summary.json", "requests.csv", "config.yaml"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    c = tmp_path / "c"
    simulate(config(seed=4), c)
    assert (a / "requests.csv").read_bytes() != (c / "requests.csv").read_bytes()


def test_common_random_numbers_across_policies(tmp_path):
    """Without preemption or budget-skipped trees, every request sees the same acceptance draws."""
    rows = {}
    for policy in ("store_all", "reconstruct", "replay"):
        simulate(config(policy=policy, engine__gmu=0.9, client__max_concurrency=16), tmp_path / policy)
        rows[policy] = read_rows(tmp_path / policy / "requests.csv")
    base = rows["store_all"]
    assert all(r["preemptions"] == "0" for r in base.values())
    for policy in ("reconstruct", "replay"):
        for rid, r in rows[policy].items():
            assert (r["spec_steps"], r["spec_tokens"]) == (base[rid]["spec_steps"], base[rid]["spec_tokens"])
    # ...while the timings differ, so the ratios between policies are not noise.
    assert rows["replay"][0]["finish_s"] != base[0]["finish_s"]


def test_open_loop_poisson(tmp_path):
    s = simulate(config(client__max_concurrency=None, client__request_rate=20.0, num_requests=100))
    assert s["completed"] == 100
    assert s["duration_s"] > 99 / 20 * 0.5  # arrivals are spread over about 5 s
    # No client queueing: each send is at its arrival (up to float rounding of the rescaled times).
    assert s["client_queue_mean_s"] == pytest.approx(0.0, abs=1e-9) and s["arrival"] == "poisson"


def test_memory_bound_store_all_vs_reconstruct():
    """DESIGN's mechanism: at gmu 0.6 and 128 concurrent requests, store_all exhausts the pool. With
    the study's 2-byte state and prefix caching off (vLLM's fp32 state and align mode shrink the pool
    so far that reconstruct fills it too)."""
    runs = {p: simulate(config(policy=p, num_requests=400, client__max_concurrency=128,
                               model_overrides={"mamba_ssm_dtype": "bfloat16"},
                               engine__enable_prefix_caching=False))
            for p in ("store_all", "reconstruct")}
    sa, rc = runs["store_all"], runs["reconstruct"]
    assert sa["peak_kv_usage"] == 1.0 and sa["waited_for_memory"] > 0 and sa["preemptions"] > 0
    assert rc["peak_kv_usage"] < 0.9 and rc["waited_for_memory"] == 0 and rc["preemptions"] == 0
    # Waiting for blocks is what lengthens store_all's TTFT (throughput also depends on kernel costs).
    assert rc["mean_waiting_s"] < sa["mean_waiting_s"] and rc["ttft_p99_s"] < sa["ttft_p99_s"]
    assert sa["mean_accepted_len"] == pytest.approx(rc["mean_accepted_len"], abs=0.05)


def test_ideal_allocator_uses_less_of_the_pool():
    paged = simulate(config(policy="reconstruct", client__max_concurrency=64))
    ideal = simulate(config(policy="reconstruct", client__max_concurrency=64, engine__allocator="ideal"))
    assert ideal["allocator"] == "ideal" and paged["allocator"] == "paged"
    assert ideal["mean_kv_usage"] < paged["mean_kv_usage"]  # 560-token blocks waste memory on short requests


# ------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize("args,match", [
    (["--gmu", "0"], "gmu must be in \\(0, 1\\]"),
    (["--gmu", "1.5"], "gmu must be in \\(0, 1\\]"),
    (["--model", "qwen-9000"], "unknown model 'qwen-9000'; valid: qwen3-next-80b-a3b, qwen3.5-27b, qwen3.5-35b-a3b, qwen3.5-35b-a3b-fp8, qwen3.5-397b-a17b, qwen3.5-397b-a17b-fp8"),
    (["--policy", "keep_some"], "unknown polic.* 'keep_some'; valid: none, reconstruct, reconstruct_deferred, replay, store_all"),
    (["--model", "qwen3.5-397b-a17b", "--gmu", "0.6"], r"GiB missing"),
    (["--set", "engine.bogus=1"], "engine.bogus"),
    (["--set", "engine.admission=eager"], "engine.admission.*full_prompt.*first_chunk"),
    (["--set", "nonsense"], "KEY=VALUE"),
    (["--tree", "1,1,1,1"], "mtp_depth = 3"),
    (["--tree", "1,x"], "--tree"),
])
def test_bad_inputs_are_clear_errors(args, match, capsys):
    assert cli(["run", "--num-requests", "5", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(match, err), err
