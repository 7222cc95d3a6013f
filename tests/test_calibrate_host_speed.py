"""Host-bound replayed steps priced at their own measured host speed (calibrate.replay.host_speed)."""
import json
import math

import pytest

from calibrate.replay import host_speed as HS
from calibrate.replay.summary import summarize


def _row(kind, probe, pred=1000.0, overhead=400.0, measured=1000.0, step=0, p=0):
    return {"run": "store_all-g0.9-c1", "step": step, "kind": kind, "pass": p, "host_probe_us": probe,
            "predicted_us": pred, "pred_overhead": overhead, "pred_moe": pred - overhead, "measured_us": measured}


def test_only_the_exposed_host_time_of_host_bound_kinds_scales():
    assert HS.at_host_speed(_row("mixed_eager", 9.0), 6.0) == pytest.approx(1000 + 400 * 0.5)
    assert HS.at_host_speed(_row("prefill_only", 6.0), 6.0) == 1000.0
    assert HS.at_host_speed(_row("uniform_decode", 12.0), 6.0) == 1000.0  # graph replay: no host term
    assert HS.at_host_speed(_row("mixed_graph", math.nan), 6.0) == 1000.0  # an unprobed step: unchanged


def test_tables_probe_is_the_fastest_around_the_host_passes(tmp_path):
    assert HS.tables_probe_us({"host": [7.2, 6.1, 9.0], "host_policies": [5.0]}) == 6.1
    assert HS.tables_probe_us({}) is None and HS.tables_probe_us(None) is None
    (tmp_path / "provenance.json").write_text(json.dumps({"parts": [
        {"host_probe_us": {"host": [8.0, 7.0]}}, {"host_probe_us": {"host": [6.5, 6.9]}}, {"job": "moe"}]}))
    assert HS.tables_probe_from(tmp_path) == 6.5
    assert HS.tables_probe_from(tmp_path / "none") is None


def test_a_bad_reference_is_refused():
    with pytest.raises(ValueError, match="probe"):
        HS.with_host_speed([_row("mixed_eager", 7.0)], 0.0)


def test_a_slow_regime_step_is_scored_at_its_speed_not_as_an_error():
    # The host ran 1.5x slower for the second pass; the measurement followed (1000 -> 1200 us).
    rows = [_row("mixed_eager", 6.0, measured=1000.0, step=1), _row("mixed_eager", 9.0, measured=1200.0, step=2)]
    s = summarize(rows, tables_probe_us=6.0)
    assert s["mixed_eager"]["median_ape"] == pytest.approx(8.333, abs=1e-3)  # unscaled: 1000 vs 1200 -> 16.7% at p90
    assert s["at_host_speed"]["mixed_eager"]["median_ape"] == 0.0
    assert s["at_host_speed"]["tables_probe_us"] == 6.0
    assert "at_host_speed" not in summarize(rows)
