"""vLLM 0.17.1's `--performance-mode` as `engine.performance_mode` (docs/vllm.md#performance-mode).

Each rule is pinned against the function it copies: `engine/arg_utils.py`
`EngineArgs._set_default_max_num_seqs_and_batched_tokens_args` (the limits) and `config/vllm.py`
`VllmConfig._set_cudagraph_sizes` (the capture sizes).
"""
import argparse
import json

import pytest

from core.batch_limits import batch_limits
from core.config import EngineConfig, RunConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.cli import main as cli
from sim.engine.budget import memory_budget, served_model
from sim.engine.step_trace import batch_of, read_steps
from sim.pricing.dispatch import capture_sizes
from sim.runs.run import simulate

H200 = load_hardware("h200")  # the OpenAI server's defaults on a >= 70 GiB GPU: 8192 tokens, 1024 sequences
LONG = 32768


def limits(max_model_len: int = LONG, **engine) -> tuple[int, int]:
    return tuple(batch_limits(EngineConfig(**engine), H200, max_model_len))


def test_throughput_mode_doubles_both_defaults_and_balanced_keeps_them():
    assert limits() == limits(performance_mode="balanced") == limits(performance_mode="interactivity") == (8192, 1024)
    assert limits(performance_mode="throughput") == (16384, 2048)


def test_a_limit_set_by_hand_is_never_doubled():
    # `if orig_max_num_batched_tokens is None: self.max_num_batched_tokens *= 2`: only a defaulted one.
    assert limits(performance_mode="throughput", max_num_batched_tokens=8192) == (8192, 2048)
    assert limits(performance_mode="throughput", max_num_seqs=256) == (16384, 256)
    assert limits(performance_mode="throughput", max_num_batched_tokens=4096, max_num_seqs=64) == (4096, 64)


def test_defaulted_limits_are_capped_by_each_other_after_doubling():
    # A defaulted budget at most max_num_seqs x max_model_len (with the doubled max_num_seqs)...
    assert limits(max_model_len=4, performance_mode="throughput") == (8192, 2048)
    assert limits(max_model_len=4, max_num_seqs=3, performance_mode="throughput") == (12, 3)
    # ...and a defaulted max_num_seqs at most the budget, a budget set by hand included.
    assert limits(max_num_batched_tokens=512) == (512, 512)
    assert limits(max_num_batched_tokens=512, performance_mode="throughput") == (512, 512)


@pytest.mark.parametrize("mode", ["balanced", "interactivity", "throughput"])
@pytest.mark.parametrize("engine", [{}, {"max_num_seqs": 64}, {"max_num_batched_tokens": 300}])
def test_resolved_limits_resolve_to_themselves(mode, engine):
    # What a traced run's steps.csv records (sim.runs.run.resolved) must give a replay the same limits.
    tokens, seqs = limits(performance_mode=mode, **engine)
    assert limits(performance_mode=mode, max_num_batched_tokens=tokens, max_num_seqs=seqs) == (tokens, seqs)


def test_interactivity_captures_every_size_up_to_32():
    balanced = capture_sizes(1024, 8192, 1)
    fine = capture_sizes(1024, 8192, 1, performance_mode="interactivity")
    assert fine[:33] == (*range(1, 33), 40) and balanced[:6] == (1, 2, 4, 8, 16, 24)
    assert fine[fine.index(40):] == balanced[balanced.index(40):] and fine[-1] == balanced[-1] == 512
    # `min(max_cudagraph_capture_size, 32)`: a smaller largest size bounds the fine-grained run.
    assert capture_sizes(8, 8192, 1, performance_mode="interactivity") == tuple(range(1, 17))
    # With k drafts every size is then rounded up to a multiple of 1 + k, as in balanced mode.
    assert capture_sizes(1024, 8192, 4, performance_mode="interactivity")[:9] == (4, 8, 12, 16, 20, 24, 28, 32, 40)
    assert capture_sizes(1024, 8192, 4, performance_mode="throughput") == capture_sizes(1024, 8192, 4)


def test_throughput_mode_profiles_the_doubled_limits_so_the_pool_is_smaller():
    model = served_model(load_model("qwen3.5-35b-a3b-fp8", {"mtp_depth": 0}), EngineConfig(max_model_len=LONG))
    balanced = memory_budget(model, H200, EngineConfig(max_model_len=LONG))
    throughput = memory_budget(model, H200, EngineConfig(max_model_len=LONG, performance_mode="throughput"))
    assert throughput.sampler_peak_bytes == 2 * balanced.sampler_peak_bytes  # 2,048 rows, not 1,024
    assert balanced.pool_bytes - throughput.pool_bytes == throughput.activation_bytes - balanced.activation_bytes > 0


def test_a_run_uses_and_records_the_modes_limits(tmp_path):
    base = {"model": "qwen3.5-35b-a3b-fp8", "policy": "none", "num_requests": 8, "trace_steps": True,
            "workload_overrides": {"prompt_tokens": 64, "output_tokens": 4}}
    out = tmp_path / "run"
    summary = simulate(RunConfig(**base, engine={"performance_mode": "throughput"}), out)
    sem = summary["engine_semantics"]
    assert (sem["performance_mode"], sem["max_num_batched_tokens"], sem["max_num_seqs"]) == ("throughput", 16384, 2048)
    # steps.csv's meta holds the limits as resolved, so a replay prices the steps with the same ones.
    meta, _ = read_steps(out / "steps.csv")
    assert (meta["engine"]["max_num_batched_tokens"], meta["engine"]["max_num_seqs"]) == (16384, 2048)
    fine = simulate(RunConfig(**base, engine={"performance_mode": "interactivity"}))["engine_semantics"]
    assert (fine["max_num_batched_tokens"], fine["max_num_seqs"], fine["cudagraph_max_size"]) == (8192, 1024, 512)


def test_cli_names_the_mode_and_refuses_another(tmp_path, capsys):
    assert cli(["run", "--num-requests", "5", "--set", "engine.performance_mode=fast"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "engine.performance_mode" in err, err
    assert "'balanced', 'interactivity' or 'throughput'" in err, err
    argv = ["memory", "--model", "qwen3.5-35b-a3b-fp8", "--hardware", "h200", "--num-speculative-tokens", "0",
            "--max-model-len", str(LONG), "--json"]
    assert cli(argv) == 0
    balanced = json.loads(capsys.readouterr().out)
    assert cli([*argv, "--performance-mode", "throughput"]) == 0
    throughput = json.loads(capsys.readouterr().out)
    assert throughput["budget_sampler_peak_bytes"] == 2 * balanced["budget_sampler_peak_bytes"]
    assert throughput["num_blocks"] < balanced["num_blocks"]


def test_plan_candidates_default_to_the_modes_limits():
    from sim.plan.cli import add_arguments, candidates_from, settings_from
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--workload", "synthetic-fixed", "--slo", "ttft_p99=2s", "--policy", "none",
                         "--set", "engine.performance_mode=throughput"])
    (cand,) = candidates_from(args, settings_from(args))
    assert (cand.max_num_batched_tokens, cand.max_num_seqs) == (16384, 2048)


def test_a_three_request_decode_pads_to_the_modes_capture_size(tmp_path):
    priced = {}
    for mode, padded in (("balanced", 4), ("interactivity", 3)):
        cfg = RunConfig(policy="none", num_requests=3, trace_steps=True, engine={"performance_mode": mode},
                        workload_overrides={"prompt_tokens": 64, "output_tokens": 6})
        simulate(cfg, tmp_path / mode)
        meta, steps = read_steps(tmp_path / mode / "steps.csv")
        decodes = [s for s in steps if s.kind == "uniform_decode"]
        assert decodes and all(len(s.requests) == 3 for s in decodes)
        # The replay's batch, from the file's meta, pads as vLLM would: 3 tokens to 4, or to 3.
        model = load_model(cfg.model, {"mtp_depth": 0})
        engine = EngineConfig(**meta["engine"])
        policy = make_policy(model, load_policy("none"))
        assert {batch_of(s, model, policy, engine).padded_tokens for s in decodes} == {padded}
        priced[mode] = {s.predicted_us for s in decodes}
    # and the simulator priced the graph it would replay: 3 tokens cost less than 4
    assert max(priced["interactivity"]) < min(priced["balanced"])
