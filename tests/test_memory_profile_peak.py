"""calibrate/benches/profile_peak.py: the sampler emulation against float64, and one point's phases on tiny CPU shapes."""
import pytest

torch = pytest.importorskip("torch")

from calibrate.model.shapes import LayerShapes  # noqa: E402
from calibrate.tables.grid import QUICK  # noqa: E402
from calibrate.tables.measure import Harness  # noqa: E402
from core.config import ModelConfig, load_hardware, validate  # noqa: E402
from tiny_model import TINY as TINY_BASE  # noqa: E402

TINY = {**TINY_BASE, "vocab_size": 301}  # a vocabulary that is not a power of two


def test_sampler_matches_float64_top_k_top_p():
    from calibrate.benches.profile_peak import check_sampler
    assert check_sampler(torch.device("cpu")) < 1e-5


def test_sampler_check_catches_a_wrong_top_p(monkeypatch):
    from calibrate.benches import profile_peak as P
    monkeypatch.setattr(P, "apply_top_k_top_p", lambda logits, k, p: logits)  # no top-k/top-p at all
    with pytest.raises(AssertionError, match="float64"):
        P.check_sampler(torch.device("cpu"))


@pytest.mark.parametrize("speculative", [False, True])
def test_one_point_runs_every_phase(speculative):
    from calibrate.benches.profile_peak import measure_point
    model = validate(ModelConfig, TINY, "tiny")
    hw = load_hardware("h200")
    h = Harness(LayerShapes.from_model(model), QUICK, torch.device("cpu"), ("eager",), hw.hbm_bandwidth_gbs,
                hw.bf16_tflops, log=lambda m: None, rotate_bytes=0, min_copies=1)
    with torch.inference_mode():
        p = measure_point(h, model, tokens=24, seqs=5, speculative=speculative)
    assert p["status"] == "ok" and p["rows"] == 5 and p["speculative"] == speculative
    for key in ("forward_peak_bytes", "sampler_peak_bytes", "profile_peak_bytes", "profile_peak_bytes_no_sort",
                "rejection_sampler_peak_bytes"):
        assert key in p
