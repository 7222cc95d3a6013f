"""calibrate.replay.host_fit: the coordinate descent finds known scales and checks them out of sample."""
import pytest

from calibrate.replay import host_fit as HF
from calibrate.replay.summary import summarize
from sim.pricing.host_model import HOST_GROUPS

TRUE = {"prefill": 0.6, "eager": 1.65}  # made with these: eager off the joint search's coarse grid, above 1.3


def rows() -> list[dict]:
    """Host-bound steps: measured = true scales x the unscaled host cost of their ops."""
    out = []
    for run in ("store_all-g0.6-c32", "store_all-g0.9-c32"):
        for i in range(12):
            prefill, eager = 1000.0 * (1 + i % 4), 500.0 * (1 + i % 3)
            kind = ("mixed_graph", "mixed_eager", "prefill_only")[i % 3]
            out.append({"run": run, "kind": kind, "prefill": prefill, "eager": eager,
                        "measured_us": TRUE["prefill"] * prefill + TRUE["eager"] * eager})
    return out


def evaluate(scales: dict, sel: list) -> dict:
    priced = [{**r, "predicted_us": scales.get("prefill", 1) * r["prefill"] + scales.get("eager", 1) * r["eager"],
               "old_predicted_us": float("nan")} for r in sel]
    return summarize(priced)


def test_fit_recovers_the_scales_and_scores_them_out_of_sample():
    scales, best = HF.fit_scales(evaluate, rows())
    assert scales["prefill"] == TRUE["prefill"] and scales["eager"] == TRUE["eager"] and best == pytest.approx(0)
    fit = HF.fit_host(evaluate, rows(), log=lambda _: None)
    assert set(fit["scales"]) == set(HOST_GROUPS) and fit["scales"]["step"] == 1.0
    assert set(fit["held_out"]) == {"fit_g0.6_test_g0.9", "fit_g0.9_test_g0.6"}
    assert fit["held_out"]["fit_g0.6_test_g0.9"]["test"]["mixed_graph"]["median_ape"] == pytest.approx(0)
    assert fit["unscaled"]["mixed_graph"]["bias"] > 0 and fit["fit_on_all"]["all"]["median_ape"] == pytest.approx(0)


def test_a_group_the_steps_barely_depend_on_keeps_its_measured_cost():
    # graph replays add a few us to a step: lowering their scale trims the error by a sliver
    # that must not move it (the medians' noise would pick any value)
    def slight(scales: dict, sel: list) -> dict:
        priced = [{**r, "predicted_us": scales.get("prefill", 1) * r["prefill"] + scales.get("eager", 1) * r["eager"]
                   + 0.5 * scales.get("graph", 1), "old_predicted_us": float("nan")} for r in sel]
        return summarize(priced)
    scales, _ = HF.fit_scales(slight, rows())
    assert scales["graph"] == 1.0 and scales["prefill"] == TRUE["prefill"] and scales["eager"] == TRUE["eager"]


def test_fit_uses_the_rows_measured_at_nominal_host_speed():
    # Steps measured while the host probe read a slower regime took 1.5x as long: they must not
    # pull the scales (the simulator prices the nominal host, as the host tables measured it).
    nominal = [{**r, "host_probe_us": 6.0} for r in rows()]
    slow = [{**r, "host_probe_us": 9.0, "measured_us": 1.5 * r["measured_us"]} for r in rows()]
    fit = HF.fit_host(evaluate, nominal + slow, log=lambda _: None)
    assert fit["rows"] == len(nominal)
    assert (fit["scales"]["prefill"], fit["scales"]["eager"]) == (TRUE["prefill"], TRUE["eager"])


def test_objective_ignores_missing_kinds():
    s = evaluate({}, [r for r in rows() if r["kind"] == "mixed_eager"])
    assert HF.objective(s) == s["mixed_eager"]["median_ape"] > 0
