"""guidellm as GPUStack ran it: constant-rate sends under a concurrency cap, its datasets, its metrics."""
import json

import numpy as np
import pytest

from core.config import RunConfig
from sim.guidellm_metrics import guidellm_metrics, weighted_summary
from sim.run import simulate
from workloads import load_workload
from workloads.arrivals import constant_arrival_times
from workloads.base import WorkloadError
from workloads.guidellm import CHAT_TEMPLATE_TOKENS, count_qwen_tokens, first_turns, load_sharegpt


def test_constant_profile_sends_request_i_at_i_over_rate():
    assert constant_arrival_times(4, 1000.0).tolist() == [0.001, 0.002, 0.003, 0.004]
    with pytest.raises(WorkloadError, match="request_rate"):
        constant_arrival_times(3, float("inf"))


def test_constant_rate_under_a_concurrency_cap(tmp_path):
    cfg = RunConfig.model_validate({
        "workload": "guidellm-random", "workload_overrides": {"prompt_tokens": 64, "output_tokens": 16},
        "num_requests": 12, "policy": "none",
        "client": {"request_rate": 1000, "arrival_process": "constant", "max_concurrency": 4}})
    s = simulate(cfg, tmp_path / "run")
    assert s["arrival"] == "constant"
    import csv
    rows = list(csv.DictReader(open(tmp_path / "run" / "requests.csv")))
    arrival = [float(r["arrival_s"]) for r in rows]
    send = [float(r["send_s"]) for r in rows]
    finish = sorted(float(r["finish_s"]) for r in rows)
    assert arrival == pytest.approx([(i + 1) / 1000 for i in range(12)])
    assert send[:4] == pytest.approx(arrival[:4])  # four slots: sent when due
    # The fifth waits for the first response, and so on: never more than 4 in flight.
    for i in range(4, 12):
        assert send[i] == pytest.approx(max(arrival[i], finish[i - 4]))
    assert all(int(r["prompt_tokens"]) == 64 + CHAT_TEMPLATE_TOKENS for r in rows)


SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "Hi, how can I help?"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "I start"}, {"from": "human", "value": "no"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "only one turn"}]},
    {"id": "d", "conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "empty prompt"}]},
    {"id": "e", "conversations": [{"from": "user", "value": "Count to three."}, {"from": "assistant", "value": "1, 2, 3."},
                                  {"from": "human", "value": "later turns are ignored"}]},
    {"id": "f", "conversations": [{"from": "human", "value": "Third kept"}, {"from": "gpt", "value": "Yes."}]},
]


def test_sharegpt_first_turns_in_file_order(tmp_path):
    assert [p for p, _ in first_turns(SHAREGPT)] == ["Hello there", "Count to three.", "Third kept"]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    sample = load_sharegpt(path, 2)
    prompts = count_qwen_tokens(["Hello there", "Count to three."])
    outputs = count_qwen_tokens(["Hi, how can I help?", "1, 2, 3."])
    assert [r.prompt_tokens for r in sample.requests] == (prompts + CHAT_TEMPLATE_TOKENS).tolist()
    assert [r.output_tokens for r in sample.requests] == outputs.tolist()
    with pytest.raises(WorkloadError, match="only 3 conversations"):
        load_sharegpt(path, 4)


def test_qwen_tokens_and_chat_template():
    # "Hello there" is 2 tokens; the template around one user message adds 10.
    assert count_qwen_tokens(["Hello there"]).tolist() == [2]
    wrapped = "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert count_qwen_tokens([wrapped]).tolist() == [2 + CHAT_TEMPLATE_TOKENS]


def test_sharegpt_totals_are_the_published_ones():
    """GPUStack's ShareGPT runs report 342,058 input and 281,412 generated tokens for 1,000 requests."""
    w = load_workload("guidellm-sharegpt", 1000, 0)
    assert sum(r.prompt_tokens for r in w.requests) == 342_058
    assert sum(r.output_tokens for r in w.requests) == 281_412


LOG = [  # start, first token, last token, output tokens
    (0.0, 1.0, 5.0, 5),
    (0.5, 2.0, 2.0, 1),
    (1.0, 1.5, 11.5, 11),
]


def rows(log=LOG):
    return [{"status": "finished", "send_s": s, "first_token_s": f, "finish_s": e, "prompt_tokens": 10,
             "generated_tokens": n} for s, f, e, n in log] + [
        {"status": "rejected", "send_s": 0.0, "first_token_s": "", "finish_s": "", "prompt_tokens": 99,
         "generated_tokens": 0}]


def test_metric_definitions_on_a_hand_made_log():
    m = guidellm_metrics(rows(), duration_s=12.0)
    assert m["successful_requests"] == 3 and m["total_input_tokens"] == 30 and m["total_output_tokens"] == 17
    assert m["output_throughput_tok_s"] == pytest.approx(17 / 12)
    assert m["total_throughput_tok_s"] == pytest.approx(47 / 12)
    # TTFT per request: 1000, 1500, 500 ms; mean 1000, median the first value reaching half: 1000.
    assert m["ttft_mean_ms"] == pytest.approx(1000.0) and m["ttft_median_ms"] == 1000.0
    assert m["ttft_p99_ms"] == 1500.0
    # Latency 5, 1.5, 10.5 s.
    assert m["latency_mean_s"] == pytest.approx(17 / 3) and m["latency_median_s"] == 5.0
    # Inter-token latency excludes the first token and the 1-token request, weighted by n - 1:
    # (4 s over 4 gaps) and (10 s over 10 gaps) -> 1000 ms each, whatever the weights.
    assert m["itl_mean_ms"] == pytest.approx(1000.0) and m["itl_p95_ms"] == 1000.0
    # Time per output token with the first: 5/5, 1.5/1, 10.5/11 s, weighted by 5, 1, 11 tokens.
    tpot = np.array([1.0, 1.5, 10.5 / 11]) * 1e3
    assert m["tpot_incl_first_mean_ms"] == pytest.approx(float((tpot * [5, 1, 11]).sum() / 17))
    assert m["tpot_incl_first_median_ms"] == pytest.approx(10.5 / 11 * 1e3)  # 11 of 17 tokens at the smallest


def test_weighted_percentile_is_the_first_value_reaching_p():
    s = weighted_summary([3.0, 1.0, 2.0, 2.0], [1, 1, 1, 1])
    assert s["median"] == 2.0 and s["p95"] == 3.0 and s["mean"] == pytest.approx(2.0)
    assert weighted_summary([1.0, 2.0], [9, 1])["p95"] == 2.0 and weighted_summary([1.0, 2.0], [19, 1])["p95"] == 1.0
