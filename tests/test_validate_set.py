"""`specsim validate --set`: a what-if applied to every published case after its own `set`."""
import json
from pathlib import Path

import pytest
import yaml

from sim.cli import main as cli
from tests.test_validate_real import small_case


def _run(real: Path, out: Path, *sets: str) -> int:
    args = ["validate", "--real", str(real), "--out", str(out), "--no-progress", "--client-overhead", "none",
            "--frontend", "none"]
    for item in sets:
        args += ["--set", item]
    return cli(args)


def _summary(out: Path) -> dict:
    report = json.loads((out / "validation.json").read_text())
    return json.loads(Path(report["cases"]["tiny"]["summary"]).read_text())


def test_set_replaces_the_cases_own_values_and_is_named_in_the_report(tmp_path, capsys):
    real = small_case(tmp_path)  # the case sets engine.max_model_len: 32768 itself
    assert _run(real, tmp_path / "plain") == 0
    assert _run(real, tmp_path / "capped", "engine.max_num_seqs=1", "engine.max_model_len=4096") == 0
    assert "every case with --set engine.max_num_seqs=1, --set engine.max_model_len=4096" in capsys.readouterr().out
    report = json.loads((tmp_path / "capped" / "validation.json").read_text())
    assert report["overrides"] == {"engine.max_num_seqs": 1, "engine.max_model_len": 4096}
    assert json.loads((tmp_path / "plain" / "validation.json").read_text())["overrides"] == {}
    ran = yaml.safe_load((tmp_path / "capped" / "runs" / "tiny" / "config.yaml").read_text())
    assert (ran["engine"]["max_num_seqs"], ran["engine"]["max_model_len"]) == (1, 4096)
    plain, capped = _summary(tmp_path / "plain"), _summary(tmp_path / "capped")
    assert capped["engine_semantics"]["max_num_seqs"] == 1 and plain["engine_semantics"]["max_num_seqs"] > 1
    # one request at a time: the twelve run one after another, far longer than all at once
    assert capped["duration_s"] > 5 * plain["duration_s"]
    assert capped["mean_waiting_s"] > plain["mean_waiting_s"]


@pytest.mark.parametrize("item,says", [
    ("engine.max_num_sqs=4", "--set engine.max_num_sqs: invalid configuration: engine.max_num_sqs: unknown field; valid:"),
    ("engine.max_num_seqs=many", "engine.max_num_seqs: Input should be a valid integer"),
    ("engine.max_num_seqs", "--set expects KEY=VALUE (e.g. engine.max_num_seqs=400)"),
    ("model.name=x", "--set model.name: 'model' is not a section"),
])
def test_a_bad_set_stops_before_any_run_with_one_line(tmp_path, capsys, item, says):
    real = small_case(tmp_path)
    out = tmp_path / "out"
    assert _run(real, out, item) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()  # nothing written, not even a partial folder


def test_the_published_throughput_run_had_about_350_decoding_and_144_waiting():
    """docs/validation.md#the-ttft-under-load-what-it-is-not-and-what-it-looks-like: from the published
    means alone (Little's law), the run held far fewer than its 512 streams in decode."""
    from tests.test_validate_real import REAL
    from sim.validate.cases import load_case

    rep = load_case(REAL / "gpustack-h200-qwen3.5-35b-a3b-throughput-bf16-baseline.yaml").reported
    step_s = (rep["latency_mean_s"] - rep["ttft_mean_ms"] / 1e3) / 127
    decoding = rep["request_throughput"] * 128 * step_s
    waiting = rep["ttft_mean_ms"] / 1e3 * rep["request_throughput"]
    assert round(step_s * 1e3) == 111 and 345 < decoding < 355 and round(waiting) == 144
    assert decoding + waiting < 512
