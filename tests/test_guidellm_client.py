"""guidellm as GPUStack ran it: constant-rate sends under a concurrency cap, its datasets, its metrics."""
import json
from pathlib import Path

import numpy as np
import pytest
import simpy

from core.config import RunConfig
from sim.engine.client import Client
from sim.engine.request import Request
from sim.runs.run import simulate
from sim.validate.cases import load_case
from sim.validate.guidellm_metrics import guidellm_metrics, weighted_summary
from sim.validate.metrics import UNTIMED_TOKEN_RATE, compared, left_out
from workloads import load_workload
from workloads.arrivals import constant_arrival_times
from workloads.base import RequestSpec, WorkloadError
from workloads.guidellm import CHAT_TEMPLATE_TOKENS, count_qwen_tokens, first_turns, load_sharegpt

REAL = Path(__file__).resolve().parent.parent / "validation" / "real"


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


LOG = [  # start, first chunk, last chunk (= the end of the stream), output tokens
    (0.2, 1.0, 5.0, 5),
    (0.5, 2.0, 2.0, 1),
    (1.0, 1.5, 11.5, 11),
]


def rows(log=LOG):
    return [{"status": "finished", "send_s": s, "first_token_s": f, "finish_s": e, "prompt_tokens": 10,
             "generated_tokens": n} for s, f, e, n in log] + [
        {"status": "rejected", "send_s": 0.3, "first_token_s": "", "finish_s": "", "prompt_tokens": 99,
         "generated_tokens": 0}]


def test_metric_definitions_on_a_hand_made_log():
    m = guidellm_metrics(rows())
    assert m["successful_requests"] == 3 and m["total_input_tokens"] == 30 and m["total_output_tokens"] == 17
    # TTFT per request: 800, 1500, 500 ms; mean 933.3, median the first value reaching half: 800.
    assert m["ttft_mean_ms"] == pytest.approx(2800 / 3) and m["ttft_median_ms"] == 800.0
    assert m["ttft_p99_ms"] == 1500.0
    # Latency 4.8, 1.5, 10.5 s.
    assert m["latency_mean_s"] == pytest.approx(16.8 / 3) and m["latency_median_s"] == 4.8
    # Inter-token latency excludes the first token and the 1-token request, weighted by n - 1:
    # (4 s over 4 gaps) and (10 s over 10 gaps) -> 1000 ms each, whatever the weights.
    assert m["itl_mean_ms"] == pytest.approx(1000.0) and m["itl_p95_ms"] == 1000.0
    # Time per output token with the first: 4.8/5, 1.5/1, 10.5/11 s, weighted by 5, 1, 11 tokens.
    tpot = np.array([4.8 / 5, 1.5, 10.5 / 11]) * 1e3
    assert m["tpot_incl_first_mean_ms"] == pytest.approx(float((tpot * [5, 1, 11]).sum() / 17))
    assert m["tpot_incl_first_median_ms"] == pytest.approx(10.5 / 11 * 1e3)  # 11 of 17 tokens at the smallest


def test_duration_and_rates_are_guidellms_windows():
    m = guidellm_metrics(rows())
    # GenerativeBenchmark.duration: the first send (0.2 s; the rejected request's at 0.3 counts
    # too) to the end of the last request (11.5 s), not the run's t = 0.
    assert m["duration_s"] == pytest.approx(11.3)
    assert m["request_throughput"] == pytest.approx(3 / 11.3)
    # Token rates: totals over the span of their events, from the earliest first chunk (1.0 s) to
    # the latest last chunk (11.5 s); the prompt tokens sit at each first chunk: the same span.
    assert m["output_throughput_tok_s"] == pytest.approx(17 / 10.5)
    assert m["total_throughput_tok_s"] == pytest.approx(47 / 10.5)
    # Counted at their first chunks only, the tokens span 1.0 s to the latest first chunk, 2.0 s.
    assert m["output_throughput_first_chunk_tok_s"] == pytest.approx(17 / 1.0)
    assert m["total_throughput_first_chunk_tok_s"] == pytest.approx(47 / 1.0)


def test_mean_rate_is_the_total_over_the_events_span():
    """guidellm's rate distribution gives each event its tokens over half the gaps to its neighbours
    and weights that local rate by it; the weighted mean is then the total over the span. By hand:
    a one-token request with its one chunk at 0 s and a 3-token one chunked at 1, 2 and 3 s
    (`iter_tokens_timings` spaces its chunks evenly) are events of 1 token at 0, 1, 2, 3 s with
    local durations 0.5, 1, 1, 0.5 s: rates 2, 1, 1, 2 tok/s, mean (1 + 1 + 1 + 1) / 3 = 4/3."""
    log = [(0.0, 0.0, 0.0, 1), (0.0, 1.0, 3.0, 3)]
    m = guidellm_metrics(rows(log)[:2])
    assert m["output_throughput_tok_s"] == pytest.approx(4 / 3)
    # Events within 0.1 ms of each other are merged into one: no span, no rate.
    m = guidellm_metrics(rows([(0.0, 1.0, 1.00005, 2), (0.0, 1.0, 1.0, 1)])[:2])
    assert m["output_throughput_tok_s"] == 0.0 and m["total_throughput_tok_s"] == 0.0


def test_published_rates_share_one_window_shorter_than_the_duration():
    """In GPUStack's Throughput baseline no request's answer was counted (ITL 0 at every percentile),
    so its tokens sit at the first chunks: output and total tokens over their rates give the same
    span, 30.63 s, and requests over the request rate the duration, 40.37 s."""
    rep = load_case(REAL / "gpustack-h200-qwen3.5-35b-a3b-throughput-bf16-baseline.yaml").reported
    output_span = rep["total_output_tokens"] / rep["output_throughput_tok_s"]
    total_span = (rep["total_input_tokens"] + rep["total_output_tokens"]) / rep["total_throughput_tok_s"]
    assert output_span == pytest.approx(total_span, abs=0.01) == pytest.approx(30.63, abs=0.01)
    assert rep["successful_requests"] / rep["request_throughput"] == pytest.approx(rep["duration_s"], abs=0.02)


def test_weighted_percentile_is_the_first_value_reaching_p():
    s = weighted_summary([3.0, 1.0, 2.0, 2.0], [1, 1, 1, 1])
    assert s["median"] == 2.0 and s["p95"] == 3.0 and s["mean"] == pytest.approx(2.0)
    assert weighted_summary([1.0, 2.0], [9, 1])["p95"] == 2.0 and weighted_summary([1.0, 2.0], [19, 1])["p95"] == 1.0


def guidellm_send_times(rate: float, service_s: list[float], worker_limits: list[int]) -> list[float]:
    """guidellm 0.5.3's split cap, modelled from `WorkerProcess._process_requests_loop`: each worker
    takes one of its own slots first, then the next index of the counter all workers share
    (`next_request_index`), waits for that index's due time (`AsyncConstantStrategy`: i / rate)
    and sends; the slot is freed when the request ends."""
    env = simpy.Environment()
    sent = [0.0] * len(service_s)
    counter = iter(range(len(service_s)))

    def serve(i, slots, slot):
        yield env.timeout(service_s[i])
        slots.release(slot)

    def worker(slots):
        while True:
            slot = slots.request()
            yield slot
            i = next(counter, None)
            if i is None:
                return
            yield env.timeout(max(0.0, (i + 1) / rate - env.now))
            sent[i] = env.now
            env.process(serve(i, slots, slot))

    for limit in worker_limits:
        env.process(worker(simpy.Resource(env, capacity=limit)))
    env.run()
    return sent


def client_send_times(rate: float, service_s: list[float], cap: int) -> list[float]:
    env = simpy.Environment()
    reqs = [Request(RequestSpec(i, 1, 1), (i + 1) / rate) for i in range(len(service_s))]

    def finish(req):
        yield env.timeout(service_s[req.rid])
        client.on_done(req)

    client = Client(env, reqs, cap, lambda req: bool(env.process(finish(req))))
    env.process(client.arrivals())
    env.run()
    return [r.send_s for r in reqs]


@pytest.mark.parametrize("rate", [1000.0, 40.0])
def test_one_cap_sends_when_guidellms_per_worker_caps_would(rate):
    """512 over guidellm's default 10 workers is 52, 52 and 51 x 8 slots (`create_processes`); a
    worker whose slots are full draws no index, so a due request goes to whichever worker frees a
    slot first: one cap of the sum sends every request at the same moment (here 7 = 3 + 2 + 2)."""
    service = np.random.default_rng(3).uniform(0.001, 0.4, 80).tolist()
    guidellm = guidellm_send_times(rate, service, [3, 2, 2])
    assert client_send_times(rate, service, 7) == pytest.approx(guidellm, abs=1e-12)
    assert max(np.subtract(guidellm, np.arange(1, 81) / rate)) > 0.1  # the cap did hold requests back


def test_token_rates_compared_only_where_every_token_was_timed():
    case = load_case(REAL / "gpustack-h200-qwen3.5-35b-a3b-throughput-bf16-baseline.yaml")
    assert not case.client.reasoning_timed
    # Duration, request rate, TTFT and latency do not depend on which chunks were counted.
    assert {"duration_s", "request_throughput", "ttft_median_ms", "latency_mean_s"} <= set(compared(case.client))
    skipped = left_out(case.client, case.reported)
    assert skipped["output_throughput_tok_s"] == skipped["total_throughput_tok_s"] == UNTIMED_TOKEN_RATE
    timed = case.client.model_copy(update={"reasoning_timed": True})
    assert compared(timed)["output_throughput_tok_s"] == "output_throughput_tok_s"
    assert "total_throughput_tok_s" not in left_out(timed, case.reported)
