"""The API server's event loop (sim/engine/frontend.py): its rules against vLLM 0.17.1's code
(docs/frontend.md) and its place between the engine and the client."""
import json

import pytest
import simpy

from core.config import RunConfig, validate
from core.config_frontend import FrontendCosts
from sim.engine.client import Client
from sim.engine.frontend import FrontendLoop, StepEvent
from sim.engine.request import Request
from sim.runs.run import simulate
from sim.validate.cli import FRONTEND_FILE
from workloads.base import RequestSpec

C = FrontendCosts(step_s=1e-4, output_s=1e-5, stream_s=2e-5, stream_s_per_token=1e-8, first_output_s=3e-5,
                  first_output_s_per_prompt_token=2e-7, first_stream_s=4e-5, finish_s=5e-5, intake_s=1e-3,
                  intake_s_per_prompt_token=1e-7, admit_s=2e-4, admit_s_per_prompt_token=3e-8)


def test_a_lone_stream_waits_for_no_other():
    loop = FrontendLoop(C)
    (t,) = loop.step(2.0, 1, 0, [StepEvent(0, True, False, 1000)])
    assert t == pytest.approx(2.0 + C.step_s + C.output_s + C.first_output_s + 1000 * C.first_output_s_per_prompt_token
                              + C.stream_s + C.first_stream_s)
    assert loop.free_at == pytest.approx(t)  # nothing after it


def test_streams_of_a_step_share_the_loop_in_the_engines_order():
    # 300 outputs: slices of 128 are processed, then their streams write one after another
    loop = FrontendLoop(C)
    events = [StepEvent(k, False, True, 10) for k in (0, 127, 128, 299)]
    got = loop.step(0.0, 300, 3000, events)
    per_event = C.stream_s + C.stream_s_per_token * 3000 / 300
    start = C.step_s
    want = [start + C.output_s * min(300, (k // 128 + 1) * 128) + per_event * (k + 1) + C.finish_s * (i + 1)
            for i, k in enumerate((0, 127, 128, 299))]
    assert got == pytest.approx(want)
    assert got == sorted(got) and got[2] - got[1] == pytest.approx(128 * C.output_s + per_event + C.finish_s)
    assert loop.free_at == pytest.approx(got[-1])  # the last output's stream ends the step's work
    assert loop.busy_s == pytest.approx(C.step_s + 300 * (C.output_s + per_event) + 4 * C.finish_s)


def test_a_step_waits_for_the_loop_and_intake_waits_behind_a_step():
    loop = FrontendLoop(C)
    done = loop.intake(0.0, 1000)
    assert done == pytest.approx(C.intake_s + 1000 * C.intake_s_per_prompt_token)
    (t,) = loop.step(done / 2, 1, 0, [StepEvent(0, False, True, 1)])  # arrives while the intake runs
    assert t == pytest.approx(done + C.step_s + C.output_s + C.stream_s + C.finish_s)
    assert loop.admit(t / 2, 100) == pytest.approx(t + C.admit_s + 100 * C.admit_s_per_prompt_token)


def test_a_run_of_steps_queues_when_the_loop_is_slower_than_the_engine():
    slow = FrontendCosts(step_s=0.5)
    loop = FrontendLoop(slow)
    loop.run([1.0, 1.2, 1.4], 4, (0, 12))
    assert loop.free_at == pytest.approx(2.5) and loop.busy_s == pytest.approx(1.5)


def test_the_client_hands_a_request_over_after_the_loops_intake_and_admission():
    env = simpy.Environment()
    loop = FrontendLoop(C)
    reqs = [Request(RequestSpec(i, 1000, 4), 0.0) for i in range(2)]
    arrived = {}
    client = Client(env, reqs, None, lambda r: arrived.setdefault(r.rid, env.now) is not None, 0.0, 1e-4, loop)
    env.process(client.arrivals())
    env.run()
    intake, admit = C.intake_s + 1000 * C.intake_s_per_prompt_token, C.admit_s + 1000 * C.admit_s_per_prompt_token
    # both intakes, one tokeniser thread after them, each admission when its tokens are ready
    assert arrived[0] == pytest.approx(intake + 0.1 + admit)
    assert arrived[1] == pytest.approx(max(2 * intake, intake + 0.1) + 0.1 + admit)


def _run(tmp_path, name, frontend, **more):
    cfg = validate(RunConfig, {"workload": "sharegpt", "num_requests": 120, "policy": "none", "seed": 3,
                               "client": {"max_concurrency": 64, "frontend": frontend}, **more}, "test")
    summary = simulate(cfg, tmp_path / name)
    return summary, (tmp_path / name / "requests.csv").read_bytes()


def test_zero_costs_leave_the_run_as_it_is(tmp_path):
    off, off_rows = _run(tmp_path, "off", None)
    zero, zero_rows = _run(tmp_path, "zero", {})
    assert zero_rows == off_rows
    for s in (off, zero):
        s["engine_semantics"].pop("frontend")
        s["engine_semantics"].pop("frontend_busy_s")
    assert zero == off


def test_measured_costs_delay_what_the_client_sees_and_counts_add_up(tmp_path):
    off, _ = _run(tmp_path, "off", None)
    on, _ = _run(tmp_path, "on", str(FRONTEND_FILE))
    assert on["completed"] + on["rejected"] == on["num_requests"] == 120
    assert on["ttft_mean_s"] > off["ttft_mean_s"] and on["duration_s"] > off["duration_s"]
    busy = on["engine_semantics"]["frontend_busy_s"]
    costs = FrontendCosts.model_validate(str(FRONTEND_FILE))
    # the loop did at least each request's intake and admission and each output's processing
    assert busy > 120 * (costs.intake_s + costs.admit_s) + on["total_output_tokens"] * costs.output_s


def test_a_decode_run_charges_the_loop_as_its_steps_one_by_one(tmp_path):
    # a traced run plans every step on its own (no decode group, no runs)
    costs = FrontendCosts.model_validate(str(FRONTEND_FILE)).model_copy(update={"stream_s_per_token": 0.0})
    grouped, _ = _run(tmp_path, "grouped", costs.model_dump())
    single, _ = _run(tmp_path, "single", costs.model_dump(), trace_steps=True)
    assert grouped["num_steps"] == single["num_steps"]
    for key in ("ttft_mean_s", "e2e_mean_s", "duration_s"):
        assert grouped[key] == pytest.approx(single[key], rel=1e-9)
    assert grouped["engine_semantics"]["frontend_busy_s"] == pytest.approx(
        single["engine_semantics"]["frontend_busy_s"], rel=1e-9)


def test_the_cost_file_is_read_and_a_bad_one_named():
    data = json.loads(FRONTEND_FILE.read_text())
    assert FrontendCosts.model_validate(str(FRONTEND_FILE)) == FrontendCosts(**data["model"])
    assert {"command", "commit", "machine", "packages", "date"} <= set(data["provenance"])
    with pytest.raises(Exception, match="not a front-end cost file"):
        validate(RunConfig, {"client": {"frontend": "/no/such/file.json"}}, "run configuration")
