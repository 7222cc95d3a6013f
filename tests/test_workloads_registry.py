"""Workloads by name, overrides, synthetic mixes, acceptance tables and `specsim workload stats`."""
import json

import numpy as np
import pytest

from sim.cli import main as cli
from workloads import load_workload, parse_set, workload_names
from workloads.base import WorkloadError

STUDY = ["sharegpt", "spec-bench", "burstgpt", "azure-conv", "azure-code",
         "balanced-chat", "generation-heavy", "summarize-heavy", "synthetic-fixed"]


def test_every_workload_of_the_issue_is_named():
    assert set(STUDY) <= set(workload_names())


def test_unknown_workload_lists_valid_ones(capsys):
    with pytest.raises(WorkloadError, match=r"unknown workload 'sharegtp'; valid: .*balanced-chat.*sharegpt"):
        load_workload("sharegtp", 10, 0)
    assert cli(["workload", "stats", "sharegtp"]) == 2
    assert "valid: azure-code, azure-conv" in capsys.readouterr().err


def test_synthetic_fixed_defaults_and_overrides():
    w = load_workload("synthetic-fixed", 3, 0)
    assert [(r.prompt_tokens, r.output_tokens) for r in w.requests] == [(512, 256)] * 3
    w = load_workload("synthetic-fixed", 2, 0, {"prompt_tokens": 100, "output_tokens": 7})
    assert {(r.prompt_tokens, r.output_tokens) for r in w.requests} == {(100, 7)}
    assert w.arrival == "closed" and w.acceptance == {}
    # a quoted number is a string: refused, not read as the number it spells
    with pytest.raises(WorkloadError, match=r"output_tokens: Input should be a valid integer, got '7'"):
        load_workload("synthetic-fixed", 2, 0, {"output_tokens": "7"})


@pytest.mark.parametrize("name", ["balanced-chat", "generation-heavy", "summarize-heavy"])
def test_synthetic_mixes_follow_their_yaml(name):
    from workloads.registry import load_spec

    spec = load_spec(name)
    w = load_workload(name, 4000, 0)
    for dist, values in ((spec.prompt, [r.prompt_tokens for r in w.requests]),
                         (spec.output, [r.output_tokens for r in w.requests])):
        v = np.array(values)
        assert v.min() >= dist.min and v.max() <= dist.max
        assert np.median(v) == pytest.approx(dist.median, rel=0.06)
        assert dist.why, "every synthetic parameter set says why it was chosen"
    assert w.requests == load_workload(name, 4000, 0).requests  # same seed, same requests
    assert w.requests != load_workload(name, 4000, 1).requests


def test_mix_shapes():
    med = {n: (np.median([r.prompt_tokens for r in load_workload(n, 2000, 0).requests]),
               np.median([r.output_tokens for r in load_workload(n, 2000, 0).requests]))
           for n in ("generation-heavy", "summarize-heavy")}
    assert med["generation-heavy"][1] > 5 * med["generation-heavy"][0]  # short prompts, long outputs
    assert med["summarize-heavy"][0] > 5 * med["summarize-heavy"][1]  # long prompts, short outputs


def test_overrides_dotted_and_bad_fields():
    w = load_workload("balanced-chat", 500, 0, {"prompt.median": 64, "prompt.sigma": 0})
    assert {r.prompt_tokens for r in w.requests} == {64}
    nested = load_workload("balanced-chat", 500, 0, {"prompt": {"median": 64, "sigma": 0}})  # as run's --set gives it
    assert nested.requests == w.requests
    with pytest.raises(WorkloadError, match=r"output_budgt: unknown field; valid: .*output_budget"):
        load_workload("spec-bench", 1, 0, {"output_budgt": 5})
    with pytest.raises(WorkloadError, match=r"prompt_tokens: Input should be greater than 0"):
        load_workload("synthetic-fixed", 1, 0, {"prompt_tokens": 0})
    with pytest.raises(WorkloadError, match=r"arrival: Input should be 'closed', 'poisson', 'gamma' or 'trace'"):
        load_workload("synthetic-fixed", 1, 0, {"arrival": "bursty"})
    with pytest.raises(WorkloadError, match=r"need min <= median <= max"):
        load_workload("balanced-chat", 1, 0, {"prompt.median": 100000})
    with pytest.raises(WorkloadError, match="'prompt_tokens' is not a mapping"):
        load_workload("synthetic-fixed", 1, 0, {"prompt_tokens.x": 1})
    with pytest.raises(WorkloadError, match="num_requests must be a positive integer"):
        load_workload("synthetic-fixed", 0, 0)


def test_workload_from_a_yaml_path(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("kind: fixed\nprompt_tokens: 33\n")
    w = load_workload(str(f), 2, 0)
    assert w.name == "mine" and w.requests[0].prompt_tokens == 33 and w.requests[0].output_tokens == 256
    f.write_text("kind: zipf\n")
    with pytest.raises(WorkloadError, match=r"kind 'zipf' is not a workload kind; valid: fixed, synthetic"):
        load_workload(str(f), 2, 0)


@pytest.mark.parametrize("table,match", [
    ({"": [[0.9, 0.2]]}, r"row 0 \(depth 1\): probabilities sum to 1.1 > 1"),
    ({"": [[0.5], [-0.1]]}, r"row 1 \(depth 2\): probabilities must be finite and >= 0"),
    ({"": []}, "needs at least one row"),
    ({"chat": [[0.5]]}, r"unknown category; valid: ''"),
])
def test_acceptance_validation(table, match):
    with pytest.raises(WorkloadError, match=match):
        load_workload("synthetic-fixed", 1, 0, {"acceptance": table})


def test_acceptance_default_row_kept():
    rows = [[0.86, 0.04, 0.03], [0.86, 0.04, 0.03], [0.86, 0.04, 0.03]]
    assert load_workload("synthetic-fixed", 1, 0, {"acceptance": {"": rows}}).acceptance == {"": rows}


def test_parse_set():
    assert parse_set(["path=/x/y.csv", "output_budget=512", "model_filter=null", "categories=[qa, rag]"]) == {
        "path": "/x/y.csv", "output_budget": 512, "model_filter": None, "categories": ["qa", "rag"]}
    with pytest.raises(WorkloadError, match="expected key=value"):
        parse_set(["path"])


def test_stats_cli_text_json_and_histogram(tmp_path, capsys):
    png = tmp_path / "h.png"
    assert cli(["workload", "stats", "summarize-heavy", "--num-requests", "300", "--hist", str(png)]) == 0
    out = capsys.readouterr().out
    assert "requests  300" in out and "p99" in out and "prompt" in out and "closed by default" in out
    assert png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"
    assert cli(["workload", "stats", "synthetic-fixed", "--num-requests", "5", "--set", "prompt_tokens=9", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["count"] == 5 and s["prompt_tokens"]["p50"] == 9 and s["prompt_tokens"]["max"] == 9
    assert s["arrival_rate_per_s"] is None


def test_stats_cli_trace_rate_and_errors(tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
        f"{0.5 * i},{100 + i},{10 + i}\n" for i in range(11)))
    assert cli(["workload", "stats", "azure-conv", "--num-requests", "11", "--set", f"path={f}", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["arrival_rate_per_s"] == pytest.approx(2.0) and s["trace_duration_s"] == pytest.approx(5.0)
    assert s["prompt_tokens"]["p50"] == 105 and s["output_tokens"]["max"] == 20
    assert cli(["workload", "stats", "burstgpt", "--set", f"path={tmp_path / 'none.csv'}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "none.csv" in err and "HPMLL/BurstGPT" in err
