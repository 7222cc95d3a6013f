"""`vllm bench serve` as a validation client: its case fields, the run they become, its metric
rules on a hand-made request log, its ShareGPT sampling with a fixed output length, and a whole
tiny case through `specsim validate`."""
import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from core.config import ConfigError
from sim.cli import main as cli
from sim.engine.metrics import StepLog, measured, request_rows, summarize
from sim.engine.request import Request, Status
from sim.runs.run import simulate
from sim.validate.cases import load_case
from sim.validate.vllm_bench_metrics import vllm_bench_metrics
from workloads import load_workload
from workloads.base import RequestSpec
from workloads.guidellm import count_qwen_tokens
from workloads.sharegpt import Lengths, Limits, sample_indices

CASE = {
    "name": "tiny-vllm",
    "source": {"repository": "vllm-project/vllm", "path": "pull/0", "section": "Benchmarking", "engine": "vllm main"},
    "model": "qwen3.5-35b-a3b", "hardware": "h200", "num_speculative_tokens": 0,
    "set": {"engine.max_num_seqs": 4, "engine.enable_prefix_caching": False},
    "client": {"tool": "vllm-bench", "version": "main", "max_concurrency": 2, "requests": 6, "num_warmups": 3,
               "ignore_eos": True},
    "dataset": {"kind": "random", "prompt_tokens": 64, "output_tokens": 8, "seed": 0},
    "reported": {"successful_requests": 6, "duration_s": 1.0, "tpot_mean_ms": 10.0, "itl_p99_ms": 11.0,
                 "ttft_median_ms": 50.0, "peak_concurrent_requests": 4.0},
}


def write_case(tmp_path: Path, **changes) -> Path:
    data = {**CASE, **changes}
    folder = tmp_path / "real"
    folder.mkdir(exist_ok=True)
    (folder / "tiny-vllm.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


def test_case_becomes_vllm_bench_run(tmp_path):
    cfg = load_case(write_case(tmp_path) / "tiny-vllm.yaml").run_config("case")
    # --request-rate inf (the default): every request ready at t = 0, paced by the semaphore alone.
    assert cfg.client.request_rate is None and cfg.client.max_concurrency == 2
    # vLLM's random dataset through /v1/completions: the lengths as given, no chat template.
    assert cfg.workload == "synthetic-fixed" and cfg.workload_overrides == {"prompt_tokens": 64, "output_tokens": 8}
    rated = load_case(write_case(tmp_path, client={**CASE["client"], "request_rate": 4.0, "burstiness": 0.5})
                      / "tiny-vllm.yaml").run_config("case")
    assert (rated.client.request_rate, rated.client.burstiness, rated.client.arrival_process) == (4.0, 0.5, "gamma")
    share = load_case(write_case(tmp_path, dataset={"kind": "sharegpt", "output_len": 300, "seed": 0,
                                                    "tokenizer": "qwen3.5-35b-a3b"}) / "tiny-vllm.yaml").run_config("case")
    assert share.workload == "sharegpt" and share.seed == 0
    assert share.workload_overrides == {"output_len": 300, "tokenizer": "qwen3.5-35b-a3b"}


@pytest.mark.parametrize("change,field", [
    ({"client": {**CASE["client"], "ignore_eos": False}}, "client.ignore_eos"),
    ({"client": {**CASE["client"], "backend": "openai-chat"}}, "client.vllm-bench.backend"),
    ({"reported": {"latency_p95_s": 1.0}}, "reported.latency_p95_s"),
])
def test_bad_vllm_bench_case_is_one_line(tmp_path, capsys, change, field):
    real = write_case(tmp_path, **change)
    assert cli(["validate", "--real", str(real), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tiny-vllm.yaml" in err and field in err, err


@pytest.mark.parametrize("field,value", [("output_len", 300), ("tokenizer", "qwen3.5-35b-a3b")])
def test_guidellm_sharegpt_takes_no_vllm_bench_fields(tmp_path, capsys, field, value):
    real = Path(__file__).resolve().parent.parent / "validation" / "real"
    data = yaml.safe_load((real / "gpustack-h200-qwen3.5-35b-a3b-sharegpt-bf16-baseline.yaml").read_text())
    data["dataset"][field] = value
    folder = tmp_path / "g"
    folder.mkdir()
    (folder / "g.yaml").write_text(yaml.safe_dump(data))
    assert cli(["validate", "--real", str(folder), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"dataset.{field}" in err and len(err.strip().splitlines()) == 1


def _request(rid: int, send: float, token_times: list[float], prompt: int = 10) -> Request:
    r = Request(RequestSpec(rid, prompt, len(token_times)), 0.0)
    r.send_s, r.token_times, r.generated = send, token_times, len(token_times)
    r.first_token_s, r.finish_s, r.status = token_times[0], token_times[-1], Status.FINISHED
    return r


def test_metric_rules_on_a_hand_made_log():
    # Two requests, one token per chunk: a short slow one and a long fast one.
    slow = _request(0, 0.0, [0.5, 0.7, 0.9])  # TTFT 0.5, TPOT (0.9 - 0.5) / 2 = 0.2
    fast = _request(1, 0.1, [0.3 + 0.01 * i for i in range(11)])  # TTFT 0.2, TPOT 0.01
    reqs = [slow, fast]
    summary = {**summarize(reqs, StepLog(trace=False, capacity=1), duration_s=0.9), "num_requests": 2,
               "measured_requests": len(measured(reqs))}
    m = vllm_bench_metrics(request_rows(reqs), summary)
    # TPOT is per request (excluding the first token), then averaged over requests: not per token.
    assert m["tpot_mean_ms"] == pytest.approx(1e3 * (0.2 + 0.01) / 2)
    assert m["tpot_mean_ms"] != pytest.approx(1e3 * (0.4 + 0.1) / (2 + 10))
    # ITL pools every gap of every request: 2 of 200 ms, 10 of 10 ms; percentiles interpolate linearly.
    gaps = [0.2, 0.2] + [0.01] * 10
    assert m["itl_mean_ms"] == pytest.approx(1e3 * np.mean(gaps))
    assert m["itl_p99_ms"] == pytest.approx(1e3 * np.percentile(gaps, 99))
    assert m["ttft_median_ms"] == pytest.approx(1e3 * (0.5 + 0.2) / 2)  # TTFT from the send, not arrival
    assert m["e2el_mean_ms"] == pytest.approx(1e3 * (0.9 + 0.3) / 2)
    assert (m["duration_s"], m["total_input_tokens"], m["total_output_tokens"]) == (0.9, 20, 14)
    assert m["output_throughput_tok_s"] == pytest.approx(14 / 0.9) and m["failed_requests"] == 0
    with pytest.raises(ValueError, match="measure them all"):
        vllm_bench_metrics(request_rows(reqs), {**summary, "measured_requests": 1})


def test_sharegpt_fixed_output_len_filters_as_vllm_does():
    # vLLM's is_valid_sequence with --sharegpt-output-len: the reply's own length is not checked,
    # the fixed length counts against the 2048 total.
    lengths = Lengths(np.array([10, 10, 1000, 3]), np.array([2, 50, 10, 50]), "test")
    keep = sorted(set(sample_indices(lengths, 4, seed=0, output_len=1100)))
    assert keep == [0, 1]  # a reply of 2 tokens kept; 1000 + 1100 > 2048 and a 3-token prompt dropped
    assert sorted(set(sample_indices(lengths, 4, seed=0))) == [1, 2]  # the reply's length: 2 < 4 dropped
    assert Limits().keep(10, 2, check_output=False) and not Limits().keep(10, 2)


def test_sharegpt_counted_with_the_served_models_tokenizer(tmp_path):
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"Question number {i}, in a few words?"},
                                              {"from": "gpt", "value": "An answer " * (i + 2)}]} for i in range(5)]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    w = load_workload("sharegpt", 5, 0, {"path": str(path), "tokenizer": "qwen2.5-72b-instruct", "output_len": 7})
    expect = count_qwen_tokens([c["conversations"][0]["value"] for c in convs], "qwen2.5-72b-instruct")
    assert sorted(r.prompt_tokens for r in w.requests) == sorted(expect.tolist())
    assert {r.output_tokens for r in w.requests} == {7} and "qwen2.5-72b-instruct" in w.source
    cl100k = load_workload("sharegpt", 5, 0, {"path": str(path)})
    assert "cl100k_base" in cl100k.source


def test_tiny_vllm_bench_case_through_validate(tmp_path):
    out = tmp_path / "out"
    assert cli(["validate", "--real", str(write_case(tmp_path)), "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "validation.json").read_text())
    case = report["cases"]["tiny-vllm"]
    assert case["client"] == "vllm-bench"
    assert case["not_compared"] == {"peak_concurrent_requests": "a configured input or a per-second peak, "
                                                                "not compared"}
    rows = list(csv.DictReader(open(Path(case["summary"]).parent / "requests.csv")))
    send = [float(r["send_s"]) for r in rows]
    finish = [float(r["finish_s"]) for r in rows]
    # Two slots: the third request is sent when the first response ends, and its clock starts then.
    assert send[:2] == [0.0, 0.0] and send[2] == pytest.approx(min(finish[:2]))
    tpot = [(float(r["finish_s"]) - float(r["first_token_s"])) / 7 for r in rows]
    got = case["metrics"]
    assert got["tpot_mean_ms"]["simulated"] == pytest.approx(1e3 * np.mean(tpot), rel=1e-6)
    assert got["ttft_median_ms"]["simulated"] == pytest.approx(
        1e3 * np.median([float(r["first_token_s"]) - float(r["send_s"]) for r in rows]), rel=1e-6)
    assert got["duration_s"]["simulated"] == pytest.approx(max(finish), rel=1e-6)  # from the first send at t = 0
    assert got["successful_requests"]["simulated"] == 6 and math.isfinite(got["itl_p99_ms"]["ratio"])


def test_published_qwen3_next_run_cannot_start_as_written():
    path = Path(__file__).resolve().parent.parent / "validation" / "real" / \
        "vllm-pr36795-h200-qwen3-next-80b-a3b-sharegpt-c16.yaml"
    case = load_case(path)
    assert not case.expressible and case.client.tool == "vllm-bench" and case.dataset.output_len == 300
    assert (case.reported["duration_s"], case.reported["tpot_mean_ms"], case.reported["total_output_tokens"]) == \
        (191.31, 9.87, 960 * 300)
    # The reason it is kept as data: its server, as published, does not fit one H200.
    with pytest.raises(ConfigError, match="does not fit on h200"):
        simulate(case.run_config(str(path)))
