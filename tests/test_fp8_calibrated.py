"""A block-FP8 checkpoint's measured tables price its run: the simulator reads them from the FP8
calibration folder (ModelConfig.calibration_name), with no change for FP8, and says so."""
import pytest

from core.config import RunConfig, load_hardware
from latency_tables import make_tables  # pytest puts tests/ on the path


@pytest.mark.parametrize("model,override", [("qwen3.5-35b-a3b-fp8", {}), ("qwen3.5-35b-a3b", {"weights": "fp8"})])
def test_fp8_tables_make_an_fp8_run_calibrated(tmp_path, monkeypatch, model, override):
    from sim.runs import run, startup_checks

    hw = load_hardware("h200").model_copy(update={"calibration_dir": str(tmp_path)})
    monkeypatch.setattr(startup_checks, "load_hardware", lambda name: hw)
    cfg = RunConfig(model=model, model_overrides=override, num_requests=12, client={"max_concurrency": 4})
    assert run.simulate(cfg)["latency_source"] == "analytic"  # no FP8 folder yet
    make_tables(tmp_path, model="qwen3.5-35b-a3b")  # the bf16 checkpoint's tables never price the FP8 one
    assert run.simulate(cfg)["latency_source"] == "analytic"
    make_tables(tmp_path, model="qwen3.5-35b-a3b-fp8", kernels=False)
    s = run.simulate(cfg)
    assert s["weights"] == "fp8" and s["completed"] == 12
    terms = s["latency_terms"]
    assert all(terms[t] == "calibrated" for t in ("gdn", "attention", "moe", "lm_head", "drafter")), terms
