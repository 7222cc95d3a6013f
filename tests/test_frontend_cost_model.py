"""The API-server cost file's parameters (calibrate.frontend.cost.model) come back from timings
made of known per-step, per-output, per-stream and per-request costs."""
import pytest

from calibrate.frontend import cost as FC

TRUE = {"step_s": 50e-6, "output_s": 8e-6, "stream": 10e-6, "event": 16e-6, "first_output_s": 30e-6,
        "first_output_s_per_prompt_token": 0.2e-6, "first_stream": 5e-6, "finish": 20e-6,
        "pre": (400e-6, 1e-8), "post": (70e-6, 4e-8), "request": 300e-6}


def _best(v):
    return {"best": v, "median": v, "reps": 1}


def _step_rows():
    t, rows = TRUE, []
    for p in (FC.PROMPTS[0] + 10, FC.PROMPTS[1] + 10):
        for n in FC.STREAMS:
            process = n * t["output_s"]
            first_process = process + n * (t["first_output_s"] + t["first_output_s_per_prompt_token"] * p)
            rows.append({"prompt_tokens": p, "streams": n,
                         "steady_process_s": _best(process),
                         "steady_total_s": _best(t["step_s"] + n * (t["output_s"] + t["stream"])),
                         "first_process_s": _best(first_process),
                         "first_total_s": _best(first_process + t["step_s"] + n * (t["stream"] + t["first_stream"])),
                         "last_total_s": _best(t["step_s"] + n * (t["output_s"] + t["stream"] + t["finish"]))})
    return {"rows": rows}


def test_the_model_recovers_the_costs_the_timings_were_made_of():
    t = TRUE
    intake = {"rows": [{"prompt_tokens": p, "pre_s": _best(t["pre"][0] + t["pre"][1] * p),
                        "post_s": _best(t["post"][0] + t["post"][1] * p)} for p in FC.INTAKE_PROMPTS]}
    got = FC.model(_step_rows(), {"per_stream_s_per_generated_token": 28e-9}, intake,
                   {"per_event_s": t["event"], "per_request_s": t["request"]})
    want = {"step_s": t["step_s"], "output_s": t["output_s"], "stream_s": t["stream"] + t["event"],
            "stream_s_per_token": 28e-9, "first_output_s": t["first_output_s"],
            "first_output_s_per_prompt_token": t["first_output_s_per_prompt_token"],
            "first_stream_s": t["first_stream"] + t["event"], "finish_s": t["finish"] + 2 * t["event"],
            "intake_s": t["pre"][0] + t["request"], "intake_s_per_prompt_token": t["pre"][1],
            "admit_s": t["post"][0], "admit_s_per_prompt_token": t["post"][1]}
    assert {k: got[k] for k in want} == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert got["output_chunk"] == 128
