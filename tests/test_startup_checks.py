"""One rule each: a value vLLM refuses at start-up, or one that cannot mean what was typed, is
refused by `run`, `memory`, `sweep`, `plan` and the YAML files alike (sim.runs.startup_checks), in
one line naming the field and what is allowed, exit 2, before anything is written; and each
allowed value at the edge of a rule is taken."""
import json

import pytest
import yaml

from core.config import CONFIG_DIR, ConfigError, RunConfig, load_model
from sim.cli import main as cli
from sim.runs.startup_checks import check_points, serve, tp_problem
from test_bad_input import fake_sweep, no_simulation, one_line_error  # noqa: F401 (fixtures)

SMALL = ["--num-requests", "4"]


def yaml_file(tmp_path, kind: str, name: str, **changes) -> str:
    """A copy of configs/<kind>/<name>.yaml with `changes` (nested dicts merged one level)."""
    data = yaml.safe_load((CONFIG_DIR / kind / f"{name}.yaml").read_text())
    for k, v in changes.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    path = tmp_path / f"{name}-changed.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def refused(cfg: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        serve(RunConfig.model_validate(cfg))


# ------------------------------------------------------------------ tensor parallelism
def test_tensor_parallel_that_does_not_divide_the_heads_is_refused_by_run_and_memory(capsys, no_simulation):
    allowed = "allowed: 1, 2, 4, 8, 16"
    err = one_line_error(["run", "--set", "model_overrides.tensor_parallel=3", *SMALL], capsys)
    assert "tensor_parallel 3: vLLM cannot serve qwen3.5-35b-a3b on 3 GPUs: its 16 attention heads" in err
    assert allowed in err
    err = one_line_error(["memory", "--model", "qwen3.5-35b-a3b", "--tensor-parallel", "3"], capsys)
    assert "tensor_parallel 3" in err and allowed in err


def test_tensor_parallel_rules_are_vllms():
    m = load_model("qwen3.5-35b-a3b")  # 16 q heads, 2 KV heads, GDN 16 key / 32 value heads, 256 experts
    assert tp_problem(m, 16) == ""  # 2 KV heads replicated 8 times
    kv3 = m.model_copy(update={"attention": m.attention.model_copy(update={"num_q_heads": 24, "num_kv_heads": 3})})
    assert "KV heads neither divide" in tp_problem(kv3, 2)  # 3 KV heads split over 2, nor replicated evenly
    assert tp_problem(kv3, 6) == "its GDN heads (16 key, 32 value) do not divide over 6 GPUs"
    few = m.model_copy(update={"moe": m.moe.model_copy(update={"num_experts": 8})})
    assert tp_problem(few, 16) == "it has 8 experts, fewer than 16 GPUs"


def test_kv_heads_must_divide_the_query_heads(tmp_path, capsys, no_simulation):
    path = yaml_file(tmp_path, "models", "qwen3.5-35b-a3b", attention={"num_kv_heads": 3})
    err = one_line_error(["run", "--model", path, *SMALL], capsys)
    assert "num_kv_heads 3 does not divide num_q_heads 16" in err and "allowed: a divisor of num_q_heads" in err


# ---------------------------------------------------------------------------- drafts
def test_no_speculation_with_a_tree_is_refused_everywhere(tmp_path, capsys, no_simulation):
    why = "drafts nothing, so draft_tree_widths [3, 3, 3] cannot apply"
    for argv in (["run", "--policy", "none", "--tree", "3,3,3", *SMALL],
                 ["run", "--num-speculative-tokens", "0", "--tree", "3,3,3", *SMALL],
                 ["memory", "--model", "qwen3.5-35b-a3b", "--policy", "none", "--tree", "3,3,3"]):
        assert why in one_line_error(argv, capsys)
    policy = yaml_file(tmp_path, "policies", "none", draft_tree_widths=[3, 3, 3])
    assert why in one_line_error(["run", "--policy", policy, *SMALL], capsys)


def test_a_grid_tree_is_the_speculating_policies_tree(tmp_path):
    from sim.runs.grid import load_grid

    grid = tmp_path / "g.yaml"
    grid.write_text("fixed: {policy_overrides.draft_tree_widths: [2, 2]}\naxes: {policy: [store_all, none]}\n")
    points = load_grid(grid, "synthetic-fixed").points("synthetic-fixed")
    assert [p.policy_overrides for p in points] == [{"draft_tree_widths": [2, 2]}, {}]


def test_vllm_runs_mtp_layers_whole(tmp_path):
    model = yaml_file(tmp_path, "models", "qwen3.5-35b-a3b", mtp_num_hidden_layers=2)
    refused({"model": model, "num_speculative_tokens": 3}, r"num_speculative_tokens 3: .* 2 MTP layers run whole, so "
            "vLLM needs a multiple of 2 above 2; allowed: 1 to 2 or a multiple of 2")
    assert serve(RunConfig(model=model, num_speculative_tokens=2)).model.mtp_depth == 2
    assert serve(RunConfig(model=model, num_speculative_tokens=4, workload="synthetic-fixed"), False).model.mtp_depth == 4


@pytest.mark.parametrize("policy, tree, verify, replayed", [
    ("reconstruct", [5, 5, 5], 156, 0),  # 156 tree positions
    ("reconstruct_deferred", [5, 5, 5], 156, 0),
    ("replay", [4, 5, 5], 125, 12),  # 125 + (flush_interval 4 - 1) x 4 cached tokens = 137
])
def test_treewy_kernels_take_128_positions(policy, tree, verify, replayed):
    extra = f" and {replayed} replayed tokens" if replayed else ""
    refused({"policy": policy, "policy_overrides": {"draft_tree_widths": tree}},
            rf"runs over {verify} tree positions{extra} per request, but its kernels \(TreeWY.*take at most 128; "
            rf"allowed: trees of at most {127 - replayed} draft nodes")


def test_the_kernel_limit_is_inclusive():
    # (4, 5, 5) has 124 nodes: 125 positions fit reconstruct; replay's 12 cached tokens push it over
    serve(RunConfig(policy="reconstruct", policy_overrides={"draft_tree_widths": [4, 5, 5]}))
    # a chain of 127 drafts is the most reconstruct verifies (the acceptance depth rule is the workload's)
    assert serve(RunConfig(policy="reconstruct", num_speculative_tokens=127)).policy.kernel_positions() == 128
    refused({"policy": "reconstruct", "num_speculative_tokens": 128}, "take at most 128")


def test_a_policy_yaml_with_a_million_node_tree_is_refused(tmp_path, capsys, no_simulation):
    policy = yaml_file(tmp_path, "policies", "reconstruct", draft_tree_widths=[100, 100, 100])
    err = one_line_error(["run", "--policy", policy, *SMALL], capsys)
    assert "1,010,101 tree positions per request" in err and "take at most 128" in err
    # specsim memory refuses what specsim run refuses, with a GPU (the token budget) or without
    for extra in ([], ["--hardware", "h200"]):
        err = one_line_error(["memory", "--model", "qwen3.5-35b-a3b", "--policy", "reconstruct", "--tree",
                              "100,100,100", *extra], capsys)
        assert "take at most 128" in err
    err = one_line_error(["memory", "--model", "qwen3.5-35b-a3b", "--hardware", "h200", "--tree", "100,100,100"], capsys)
    assert "more than engine.max_num_batched_tokens (h200's default) 8,192" in err  # store_all


def test_a_tree_larger_than_the_token_budget_is_refused_and_one_that_fits_runs():
    # store_all has no kernel limit; (8, 8) is 72 nodes, 73 verify positions
    base = {"policy": "store_all", "policy_overrides": {"draft_tree_widths": [8, 8]},
            "engine": {"max_num_seqs": 16, "enable_prefix_caching": False}}
    refused({**base, "engine": {**base["engine"], "max_num_batched_tokens": 72}},
            r"one verify needs 73 positions of one request \(1 \+ 72 draft nodes\), more than "
            r"engine.max_num_batched_tokens 72; allowed: trees of at most 71 draft nodes")
    serve(RunConfig.model_validate({**base, "engine": {**base["engine"], "max_num_batched_tokens": 73}}))


def test_more_sequences_than_tokens_is_refused(capsys, no_simulation):
    err = one_line_error(["run", "--set", "engine.max_num_batched_tokens=1100", "--set", "engine.max_num_seqs=1101",
                          *SMALL], capsys)
    assert "engine.max_num_seqs 1,101 is above engine.max_num_batched_tokens 1,100" in err
    refused({"engine": {"max_num_seqs": 2049, "max_num_batched_tokens": 2048}},
            r"engine.max_num_seqs 2,049 is above engine.max_num_batched_tokens 2,048: .*allowed: max_num_seqs 1 to 2,048")
    serve(RunConfig.model_validate({"engine": {"max_num_seqs": 2048, "max_num_batched_tokens": 2048}}))


def test_prefix_caching_needs_a_token_budget_of_one_block():
    # Qwen3.5-35B-A3B's attention block is 1,072 tokens (its GDN page)
    refused({"engine": {"max_num_batched_tokens": 1071, "max_num_seqs": 64}},
            r"engine.max_num_batched_tokens 1,071 is below qwen3.5-35b-a3b's attention block of 1,072 tokens.*"
            r"allowed: at least 1,072, or engine.enable_prefix_caching=false")
    serve(RunConfig.model_validate({"engine": {"max_num_batched_tokens": 1072, "max_num_seqs": 64}}))
    serve(RunConfig.model_validate({"engine": {"max_num_batched_tokens": 1071, "max_num_seqs": 64,
                                               "enable_prefix_caching": False}}))


# ------------------------------------------------------------------------ workloads
def test_drafts_deeper_than_the_acceptance_data_are_refused(capsys, no_simulation):
    err = one_line_error(["run", "--num-speculative-tokens", "50", *SMALL], capsys)
    assert "draft tree [1 x 50] (a chain) (num_speculative_tokens, draft_tree_widths) is 50 deep" in err
    assert "the built-in acceptance is fitted at depth 3" in err and "allowed: depth 1 to 3" in err


def test_drafts_as_deep_as_the_workloads_acceptance_rows_run(tmp_path):
    workload = yaml_file(tmp_path, "workloads", "synthetic-fixed", acceptance={"": [[0.5]] * 4},
                         prompt_tokens=64, output_tokens=16)
    assert cli(["run", "--workload", workload, "--num-speculative-tokens", "4", *SMALL, "--out",
                str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["acceptance_source"] == "workload"
    assert summary["expected_accepted_len"] == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)


def test_max_model_len_below_every_request_is_refused(capsys, no_simulation):
    # synthetic-fixed: every request is 512 + 256 = 768 tokens
    err = one_line_error(["run", "--set", "engine.max_model_len=767", *SMALL], capsys)
    assert ("engine.max_model_len 767: every request of workload synthetic-fixed is longer (prompt + output; the "
            "shortest is 768 tokens), so every one would be rejected; allowed: at least 768") in err
    serve_ok = serve(RunConfig.model_validate({"engine": {"max_model_len": 768}}))
    assert serve_ok.model.max_model_len == 768


def test_a_warm_up_that_leaves_less_than_half_the_run_is_refused(capsys, no_simulation):
    err = one_line_error(["run", "--set", "measure.warmup_fraction=0.99", *SMALL], capsys)
    assert "warmup_fraction 0.99 + cooldown_fraction 0 would leave out more than half" in err
    assert "allowed: 0 to 0.5 together" in err
    RunConfig.model_validate({"measure": {"warmup_fraction": 0.25, "cooldown_fraction": 0.25}})
    with pytest.raises(ValueError, match="0.3 \\+ cooldown_fraction 0.25"):
        RunConfig.model_validate({"measure": {"warmup_fraction": 0.3, "cooldown_fraction": 0.25}})


# ----------------------------------------------------------------------- every command
def test_memory_gmu_needs_hardware(capsys):
    err = one_line_error(["memory", "--model", "qwen3.5-35b-a3b", "--gmu", "0.5"], capsys)
    assert "--gmu 0.5 sizes the pool as a share of a GPU's memory: it needs --hardware (b200, h200)" in err


def test_a_sweep_with_one_refused_point_writes_nothing(tmp_path, capsys, fake_sweep):
    grid = tmp_path / "g.yaml"
    grid.write_text("fixed: {num_requests: 4, policy: reconstruct}\n"
                    "axes:\n  policy_overrides.draft_tree_widths: [[1, 1], [5, 5, 5]]\n")
    err = one_line_error(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--out",
                          str(tmp_path / "o")], capsys)
    assert err.startswith("specsim sweep: error: point policy_overrides.draft_tree_widths=[5, 5, 5]: ")
    assert "take at most 128" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml"]


def test_a_plan_with_a_refused_candidate_writes_nothing(tmp_path, capsys):
    err = one_line_error(["plan", "--workload", "synthetic-fixed", "--slo", "ttft_p99=2s", "--policy", "reconstruct",
                          "--tree", "1,1", "5,5,5", "--out", str(tmp_path / "o")], capsys)
    assert "plan candidate reconstruct (tree 5,5,5, gmu 0.9" in err and "take at most 128" in err
    assert list(tmp_path.iterdir()) == []


def test_a_plan_whose_rates_are_crossed_writes_nothing(tmp_path, capsys):
    err = one_line_error(["plan", "--workload", "synthetic-fixed", "--slo", "ttft_p99=2s", "--min-rate", "10",
                          "--max-rate", "1", "--out", str(tmp_path / "o")], capsys)
    assert "--min-rate 10 is above --max-rate 1" in err and "allowed: --min-rate <= --start-rate <= --max-rate" in err
    assert list(tmp_path.iterdir()) == []


def test_check_points_names_a_point_by_what_differs():
    good = RunConfig(policy="reconstruct")
    bad = RunConfig(policy="reconstruct", engine={"gmu": 0.75}, num_speculative_tokens=200)
    with pytest.raises(ConfigError, match=r"^point engine.gmu=0.75 num_speculative_tokens=200: "):
        check_points([good, bad])


@pytest.mark.parametrize("command", ["run", "sweep", "plan"])
def test_an_empty_out_is_refused(command, tmp_path, capsys, monkeypatch, fake_sweep, no_simulation):
    monkeypatch.chdir(tmp_path)
    extra = {"run": [], "sweep": ["--workload", "synthetic-fixed"],
             "plan": ["--workload", "synthetic-fixed", "--slo", "ttft_p99=2s"]}[command]
    err = one_line_error([command, *extra, "--out", ""], capsys)
    assert "--out '': an empty path; allowed: a path such as runs/x, or . for the current folder" in err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- the pricing
def test_a_missing_calibration_folder_is_refused_and_the_roofline_must_be_asked_for(tmp_path, capsys, no_simulation):
    missing = yaml_file(tmp_path, "hardware", "h200", calibration_dir="results/calibration/no-such-gpu")
    err = one_line_error(["run", "--hardware", missing, *SMALL], capsys)
    assert "calibration_dir results/calibration/no-such-gpu: no such folder" in err
    assert "allowed: a folder of calibration tables, or calibration_dir: null" in err
    roofline = yaml_file(tmp_path, "hardware", "h200", calibration_dir=None)
    assert serve(RunConfig(hardware=roofline)).hw.calibration_dir is None


def test_the_roofline_says_so_in_the_summary(tmp_path):
    from sim.runs.run import simulate

    roofline = yaml_file(tmp_path, "hardware", "h200", calibration_dir=None)
    summary = simulate(RunConfig(hardware=roofline, num_requests=2))
    assert summary["latency_source"] == "analytic" and set(summary["latency_terms"].values()) == {"analytic"}
