"""The no-speculation baseline: policy `none` (alias `num_speculative_tokens: 0`) in run, sweep and memory."""
import json
from pathlib import Path

import pytest

from core.config import ConfigError, EngineConfig, RunConfig, load_hardware, load_model, load_policy
from policies import make_policy
from sim.cli import main as cli
from sim.engine.budget import block_layout, served_model
from sim.engine.step_trace import assemble_batch
from sim.pricing.analytic import AnalyticLatencyModel
from sim.pricing.calibrated import CalibratedLatencyModel
from sim.pricing.dispatch import capture_sizes
from sim.pricing.kernel_rows import load_kernels
from sim.runs.run import simulate
from sim.runs.speculation import resolve_speculation, speculating_model

FIXTURE = Path(__file__).parent / "data" / "kernels_none_fixture.csv"


def config(**kw) -> RunConfig:
    return RunConfig.model_validate({"num_requests": 40, "engine": {"gmu": 0.6}, "client": {"max_concurrency": 8},
                                     "workload": "sharegpt", **kw})


def test_none_runs_without_drafts_or_draft_state():
    s = simulate(config(policy="none"))
    assert s["completed"] == 40 and s["mean_accepted_len"] is None
    assert s["mean_step_time_by_term_s"]["drafter"] == 0.0
    assert s["tree"] == ""
    base = simulate(config(policy="store_all"))
    # One state block per GDN group held (align mode's boundary block only for a step), store_all adds K = 3.
    assert (base["state_blocks_per_group"], s["state_blocks_per_group"]) == (4, 1)
    # One token per decode step: every output token but the first costs a step of its own.
    assert s["num_steps"] > base["num_steps"]


def test_num_speculative_tokens_zero_is_policy_none():
    assert resolve_speculation(config(num_speculative_tokens=0)).policy == "none"
    a, b = simulate(config(policy="none")), simulate(config(num_speculative_tokens=0))
    assert a == b


def test_num_speculative_tokens_k_drafts_a_chain_of_k():
    cfg = resolve_speculation(config(num_speculative_tokens=2))
    assert cfg.model_overrides["mtp_depth"] == 2 and cfg.policy_overrides["draft_tree_widths"] == [1, 1]
    assert simulate(cfg)["tree"] == "1,1"


@pytest.mark.parametrize("kw", [{"num_speculative_tokens": 0, "policy": "reconstruct"},
                                {"num_speculative_tokens": 2, "policy": "none"}])
def test_contradicting_speculation_settings_are_refused(kw):
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        simulate(config(**kw))


def test_cli_flag_conflict_is_one_line_exit_2(capsys):
    assert cli(["run", "--num-speculative-tokens", "0", "--policy", "replay", "--num-requests", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "policy none" in err


@pytest.mark.parametrize("prefix_caching,boundary", [(True, 1), (False, 0)])
def test_memory_pool_has_no_mtp_layer_and_one_state_block(prefix_caching, boundary):
    engine = EngineConfig(enable_prefix_caching=prefix_caching)
    raw = load_model("qwen3.5-35b-a3b")
    model = served_model(speculating_model(raw, load_policy("none")), engine)
    assert model.mtp_depth == 0 and model.pool_attn_layers == raw.attn_layers
    layout = block_layout(model, make_policy(model, load_policy("none")), 40 << 30, engine)
    assert (layout.state_blocks_per_group, layout.boundary_blocks_per_group) == (1, boundary)
    assert model.gdn_page_bytes_per_gpu(0) < raw.gdn_page_bytes_per_gpu(raw.mtp_depth)  # no lookahead slots


def test_memory_cli_num_speculative_tokens_zero_is_none(capsys):
    assert cli(["memory", "--model", "qwen3.5-35b-a3b", "--hardware", "h200", "--num-speculative-tokens", "0",
                "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["policy"] == "none" and facts["state_blocks_per_group"] == 1
    assert facts["num_speculative_tokens"] == 0
    assert cli(["memory", "--model", "qwen3.5-35b-a3b", "--policy", "none", "--num-speculative-tokens", "2"]) == 2


def test_latency_model_reads_the_one_token_rows():
    model = load_model("qwen3.5-35b-a3b")
    model = model.model_copy(update={"mtp_depth": 0})
    policy = make_policy(model, load_policy("none"))
    kernels = load_kernels(FIXTURE, model, policy)
    assert "verify" in kernels  # commit_us = 0 rows give no curve: the state was updated in place
    assert kernels["verify"]["graph"].partial()(8) == pytest.approx(20.0)
    hw = load_hardware("h200")
    lm = CalibratedLatencyModel.load(model, hw, policy, EngineConfig(),
                                     fallback=AnalyticLatencyModel(model, hw, policy, EngineConfig()))
    lm.kernels = kernels
    b = assemble_batch([(1, 1000, True, False, 0, True)] * 8, verify_positions=1, draft_depth=0,
                       sizes=capture_sizes(1024, 8192, 1), full_graph_ok=True)
    verify, commit = lm.pricer.gdn_decode_us(b)
    conv = lm.decode_conv(b.decode_tokens) if lm.decode_conv is not None else 0.0
    assert verify == pytest.approx(20.0 + conv) and commit == 0.0


def test_sweep_with_none_reports_whether_speculation_pays(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("fixed: {num_requests: 30, model: qwen3.5-35b-a3b, policy_overrides.draft_tree_widths: [1, 1, 1]}\n"
                    "axes:\n  client.max_concurrency: [2, 16]\n  policy: [store_all, none]\n")
    out = tmp_path / "sweep"
    assert cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--hardware", "h200",
                "--out", str(out), "--no-progress"]) == 0
    assert cli(["figures", "--sweep", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "Does speculative decoding pay?" in report and "| none tok/s |" in report
    # The verdict per model and gmu, and the baseline beside the policies in figure 3's tables.
    assert "**per model and gmu**" in report and "| speculation pays at | loads where it pays |" in report
    assert "qwen3.5-35b-a3b, gmu 0.9: speculation pays at " in report
    fig3 = report.split("## Figure 3")[1].split("## Figure 4")[0]
    assert "| store_all | none |" in fig3 and "`none` dashed" in fig3
    assert (out / "figures" / "fig5_speculation.png").exists()
    import pandas as pd
    df = pd.read_csv(out / "points.csv")
    none = df[df["policy"] == "none"]
    assert len(none) == 2 and set(none["state_blocks_per_group"]) == {1}
    assert none["tree"].isna().all()
