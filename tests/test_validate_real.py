"""`specsim validate`: the published runs as case files, their RunConfigs, the comparison and bad files."""
import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from sim.cli import main as cli
from sim.runs.run import simulate
from sim.validate.cases import load_case, load_cases
from sim.validate.metrics import GUIDELLM as COMPARED
from sim.validate.metrics import UNTIMED_REASONING, compared, left_out
from workloads import load_workload

REAL = Path(__file__).resolve().parent.parent / "validation" / "real"
BASELINE = REAL / "gpustack-h200-qwen3.5-35b-a3b-generation-heavy-bf16-baseline.yaml"


def test_committed_cases_load_and_all_but_the_interrupted_and_the_unservable_run_are_expressible():
    cases = {c.name: c for _, c in load_cases(REAL)}
    runnable = sorted(n for n, c in cases.items() if c.expressible)
    assert [n.split("a3b-")[1] for n in runnable] == [
        "generation-heavy-bf16-baseline", "generation-heavy-fp8-prefix-caching-throughput-mode",
        "long-context-bf16-baseline", "long-context-fp8-prefix-caching-throughput-mode",
        "sharegpt-bf16-baseline", "sharegpt-fp8", "sharegpt-fp8-prefix-caching",
        "sharegpt-fp8-prefix-caching-throughput-mode", "sharegpt-fp8-prefix-caching-throughput-mode-fp8-kv",
        "throughput-bf16-baseline", "throughput-fp8-prefix-caching-throughput-mode"]
    assert {cases[n].model for n in runnable if "fp8" in n} == {"qwen3.5-35b-a3b-fp8"}
    assert sorted(n for n in cases if n not in runnable) == ["gpustack-h200-qwen3.5-35b-a3b-sharegpt-fp8-mtp4",
                                                            "vllm-pr36795-h200-qwen3-next-80b-a3b-sharegpt-c16"]
    assert all(c.not_expressible for n, c in cases.items() if n not in runnable)
    # Each published --performance-mode=throughput run is that engine setting, nothing else.
    for n in runnable:
        flagged = "--performance-mode=throughput" in cases[n].source.backend_parameters
        assert (cases[n].run_config(n).engine.performance_mode == "throughput") == flagged, n
    # As published (GPUStack's h200.md), e.g. the numbers the project's issue quoted.
    gen = cases["gpustack-h200-qwen3.5-35b-a3b-generation-heavy-bf16-baseline"].reported
    assert (gen["duration_s"], gen["ttft_mean_ms"], gen["ttft_p99_ms"], gen["latency_mean_s"]) == (57.74, 1915.55, 3608.07, 57.43)
    thr = cases["gpustack-h200-qwen3.5-35b-a3b-throughput-bf16-baseline"].reported
    assert (thr["duration_s"], thr["ttft_mean_ms"], thr["tpot_mean_ms"]) == (40.37, 5809.82, 45.39)


@pytest.mark.parametrize("profile,output_tokens", [("throughput", 128), ("long-context", 100)])
def test_gpustack_tpot_rows_are_ttft_over_n_where_the_answer_never_started(profile, output_tokens):
    # GPUStack's "TPOT (excl. 1st token)" is guidellm's time_per_output_token, (last - start) / n, and
    # its ITL guidellm's inter_token_latency; with the thinking streamed in an untimed field every
    # timed stream of these profiles ended at its first chunk: ITL 0 throughout, TPOT = TTFT / n.
    rep = load_case(REAL / f"gpustack-h200-qwen3.5-35b-a3b-{profile}-bf16-baseline.yaml").reported
    for stat in ("mean", "median"):
        assert rep[f"tpot_{stat}_ms"] == pytest.approx(rep[f"ttft_{stat}_ms"] / output_tokens, abs=0.006)
    assert all(rep[f"itl_{s}_ms"] == 0 for s in ("mean", "median", "p95", "p99"))
    # Generation Heavy: the requests whose answer began by the end are timed to it (p95 = latency / n).
    gen = load_case(BASELINE).reported
    assert gen["tpot_p95_ms"] == pytest.approx(1e3 * gen["latency_p95_s"] / 2000, rel=0.01)


def test_per_token_rows_compared_only_where_every_token_was_timed():
    case = load_case(BASELINE)
    assert not case.client.reasoning_timed
    assert not {m for m in compared(case.client) if m.startswith(("tpot", "itl"))}
    skipped = left_out(case.client, case.reported)
    assert skipped["tpot_mean_ms"] == skipped["itl_p99_ms"] == UNTIMED_REASONING
    timed = case.client.model_copy(update={"reasoning_timed": True})
    # Timed in full, each row is compared with the guidellm metric of its own definition.
    assert compared(timed)["tpot_mean_ms"] == "tpot_incl_first_mean_ms" and compared(timed)["itl_p99_ms"] == "itl_p99_ms"
    assert "tpot_mean_ms" not in left_out(timed, case.reported)


def test_case_becomes_the_run_it_describes():
    cfg = load_case(BASELINE).run_config(str(BASELINE))
    assert cfg.policy == "none" or cfg.num_speculative_tokens == 0
    assert (cfg.client.request_rate, cfg.client.arrival_process, cfg.client.max_concurrency) == (1000, "constant", 512)
    assert cfg.workload == "guidellm-random" and cfg.workload_overrides == {"prompt_tokens": 1000, "output_tokens": 2000}
    assert cfg.engine.max_model_len == 32768 and cfg.engine.enable_prefix_caching is False
    assert cfg.num_requests == 200


def small_case(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load(BASELINE.read_text())
    data.update(name="tiny", client={**data["client"], "requests": 12},
                dataset={"kind": "random", "prompt_tokens": 64, "output_tokens": 8, "seed": 42})
    data.update(changes)
    folder = tmp_path / "real"
    folder.mkdir(exist_ok=True)
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


def test_validate_writes_csv_json_figure_and_runs(tmp_path, capsys):
    real = small_case(tmp_path)
    shutil.copy(REAL / "gpustack-h200-qwen3.5-35b-a3b-sharegpt-fp8-mtp4.yaml", real)  # not expressible: listed, not run
    out = tmp_path / "out"
    assert cli(["validate", "--real", str(real), "--out", str(out), "--no-progress"]) == 0
    rows = list(csv.DictReader(open(out / "validation.csv")))
    assert {r["case"] for r in rows} == {"tiny"}
    by = {r["metric"]: r for r in rows}
    assert set(by) <= set(COMPARED) and float(by["successful_requests"]["simulated"]) == 12
    assert float(by["duration_s"]["ratio"]) == pytest.approx(float(by["duration_s"]["simulated"]) / 57.74, rel=1e-3)
    report = json.loads((out / "validation.json").read_text())
    assert "gpustack-h200-qwen3.5-35b-a3b-sharegpt-fp8-mtp4" in report["not_expressible"]
    summary = Path(report["cases"]["tiny"]["summary"])
    assert summary.is_file() and json.loads(summary.read_text())["policy"] == "none"
    assert (out / "figures" / "validation.png").is_file() and (out / "figures" / "validation.pdf").is_file()
    # The input lengths are guidellm's: 64 + the chat template per request.
    assert float(by["total_input_tokens"]["simulated"]) == 12 * (64 + 10)


@pytest.mark.parametrize("change,field", [
    ({"client": {"tool": "lm-eval", "version": "1", "profile": "constant", "rate": 1, "requests": 1}}, "client.tool"),
    ({"reported": {"duration_s": "fast"}}, "reported.duration_s"),
    ({"reported": {"goodput": 1.0}}, "reported.goodput"),
    ({"dataset": {"kind": "random", "prompt_tokens": 0, "output_tokens": 8}}, "dataset.random.prompt_tokens"),
    ({"colour": "blue"}, "colour"),
    ({"set": {"engine.gmu": 3}}, "engine.gmu"),
])
def test_malformed_case_is_one_line_naming_file_and_field(tmp_path, capsys, change, field):
    real = small_case(tmp_path, **change)
    assert cli(["validate", "--real", str(real), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(real / "tiny.yaml") in err and field in err
    assert not (tmp_path / "o").exists()


def test_missing_field_and_missing_folder(tmp_path, capsys):
    real = small_case(tmp_path)
    data = yaml.safe_load((real / "tiny.yaml").read_text())
    del data["source"]
    (real / "tiny.yaml").write_text(yaml.safe_dump(data))
    assert cli(["validate", "--real", str(real), "--out", str(tmp_path / "o")]) == 2
    assert "tiny.yaml: source: Field required" in capsys.readouterr().err
    assert cli(["validate", "--real", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_the_mtp_runs_totals_are_not_a_prefix_of_the_sampling():
    # docs/validation.md#the-mtp-run: 516 "successful" requests whose prompts are not the first 516.
    case = load_case(REAL / "gpustack-h200-qwen3.5-35b-a3b-sharegpt-fp8-mtp4.yaml")
    rep = case.reported
    assert (rep["successful_requests"], rep["total_input_tokens"], rep["total_output_tokens"]) == (516, 54307, 112466)
    assert rep["latency_p99_s"] - rep["latency_mean_s"] < 0.4 and rep["ttft_median_ms"] == 0  # ended together
    first = load_workload("guidellm-sharegpt", 1000, 0).requests[:516]
    assert (sum(r.prompt_tokens for r in first), sum(r.output_tokens for r in first)) == (189_829, 144_480)
    assert "interrupted run" in case.not_expressible and "189,829" in case.not_expressible


def test_a_speculating_case_runs_as_specsim_run_and_names_its_acceptance(tmp_path):
    # depth 3: deeper drafts need the workload's acceptance rows (sim.runs.startup_checks)
    real = small_case(tmp_path, model="qwen3.5-35b-a3b-fp8", num_speculative_tokens=3)
    out = tmp_path / "out"
    assert cli(["validate", "--real", str(real), "--out", str(out), "--no-progress", "--client-overhead", "none",
                "--frontend", "none"]) == 0
    case = json.loads((out / "validation.json").read_text())["cases"]["tiny"]
    run = json.loads(Path(case["summary"]).read_text())
    alone = simulate(load_case(real / "tiny.yaml").run_config("tiny"))  # what `specsim run` of it gives
    assert (run["policy"], run["tree"]) == (alone["policy"], alone["tree"]) == ("store_all", "1,1,1")
    assert run["mean_accepted_len"] == alone["mean_accepted_len"] and run["duration_s"] == alone["duration_s"]
    assert case["acceptance_source"] == alone["acceptance_source"] == "built-in default"
