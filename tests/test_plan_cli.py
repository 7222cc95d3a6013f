"""`specsim plan` end to end on the real simulator (a small workload), its outputs, the
measurement window, and its bad inputs (one line, exit 2)."""
import json

import pandas as pd
import pytest

from core.config import ConfigError, RunConfig
from sim.cli import main as cli
from sim.engine.metrics import measured
from sim.engine.request import Request
from sim.plan.candidates import candidates
from sim.plan.dense import dense_capacity, dense_rates, dense_sweep
from sim.plan.run import PlanSettings, run_plan
from sim.plan.slo import parse_slo, parse_slos
from sim.runs.sweep import run_sweep
from workloads.base import RequestSpec

SMALL = ["--workload", "synthetic-fixed", "--num-requests", "40", "--jobs", "2", "--no-progress"]


def one_line_error(capsys, argv, *fragments):
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err
    return err


@pytest.mark.parametrize("slo,expected", [
    ("ttft_p99=2s", ("ttft_p99", "ttft_p99_s", 2.0)),
    ("p99_ttft=2000ms", ("ttft_p99", "ttft_p99_s", 2.0)),
    ("tpot_mean=50ms", ("tpot_mean", "tpot_mean_s", 0.05)),
    ("e2el_median=1.5e1s", ("e2el_median", "e2e_median_s", 15.0)),
    ("mean_itl=300us", ("itl_mean", "itl_mean_s", 3e-4)),
])
def test_slo_names_in_either_order_and_units(slo, expected):
    s = parse_slo(slo)
    assert (s.name, s.key) == expected[:2] and s.bound_s == pytest.approx(expected[2])


@pytest.mark.parametrize("slo,fragment", [
    ("ttft_p95=2s", "unknown metric 'ttft_p95'; valid: ttft_mean"),
    ("latency=2s", "unknown metric 'latency'"),
    ("ttft_p99=2min", "unknown unit 'min'; valid: s, ms, us"),
    ("ttft_p99=2", "the bound needs a unit; valid: s, ms, us"),
    ("ttft_p99=fast", "positive number with a unit"),
    ("ttft_p99", "expects NAME=BOUND"),
])
def test_bad_slo_is_one_line_exit_2(capsys, tmp_path, slo, fragment):
    one_line_error(capsys, ["plan", *SMALL, "--slo", slo, "--out", str(tmp_path)], "--slo", fragment)
    assert not (tmp_path / "plan.csv").exists()


def test_repeated_slo_is_refused():
    with pytest.raises(ConfigError, match="ttft_p99 more than once"):
        parse_slos(["ttft_p99=2s", "p99_ttft=1s"])


@pytest.mark.parametrize("flags,fragment", [
    (["--tolerance", "0"], "--tolerance 0: the relative tolerance must be in [0.001, 0.5]"),
    (["--tolerance", "0.00001"], "--tolerance 1e-05"),
    (["--max-requests", "50"], "--max-requests 50 must be at least twice --num-requests 40"),
    (["--set", "engine.gmu=0.5"], "--set engine.gmu: the plan sets this field; use --gmu"),
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--start-rate", "2", "--min-rate", "4"], "--min-rate 4 is above --start-rate 2"),
    (["--min-rate", "10", "--max-rate", "1"], "allowed: --min-rate <= --start-rate <= --max-rate"),
    (["--arrivals", "trace"], "--arrivals trace: workload synthetic-fixed has no arrival timestamps"),
    (["--arrivals", "constant", "--burstiness", "0.5"], "--burstiness 0.5 shapes Poisson gaps"),
    (["--dask-scheduler", "tcp://127.0.0.1:9"], "--dask-scheduler 'tcp://127.0.0.1:9': cannot reach a Dask scheduler"),
    (["--rate", "0"], "--rate 0: the target load must be > 0"),
    (["--gmu", "1.5"], "engine.gmu: Value error, gmu must be in (0, 1], got 1.5"),
    (["--workload", "nope"], "unknown workload 'nope'; valid: "),
    (["--policy", "store_all", "--tree", "1,1,1,1"], "plan candidate store_all (tree 1,1,1,1, gmu 0.9"),
])
def test_bad_plan_options_are_one_line_exit_2(capsys, tmp_path, flags, fragment):
    one_line_error(capsys, ["plan", *SMALL, "--slo", "ttft_p99=2s", *flags, "--out", str(tmp_path)], fragment)


def test_an_slo_no_rate_meets_names_the_metric_at_the_lowest_rate(capsys, tmp_path):
    err = one_line_error(capsys, ["plan", *SMALL, "--policy", "store_all", "--slo", "ttft_p99=1ms",
                                  "--start-rate", "1", "--min-rate", "0.25", "--num-requests", "10", "--out", str(tmp_path)],
                         "no candidate meets the SLOs at any rate", "ttft_p99 <= 1 ms is not met at the lowest rate "
                         "tried, 0.25 req/s: ttft_p99 = ")
    assert float(err.rsplit("ttft_p99 = ", 1)[1].split(" s")[0]) > 1e-3
    assert not any((tmp_path / f).exists() for f in ("plan.csv", "plan.json", "plan.png", "report.md"))
    assert list((tmp_path / "points").glob("*.json"))  # its probes stay cached for a rerun with other SLOs


def test_plan_writes_its_outputs_and_reruns_from_the_store(capsys, tmp_path):
    argv = ["plan", *SMALL, "--policy", "store_all", "replay", "--slo", "ttft_p99=1s", "--slo", "tpot_mean=40ms",
            "--tolerance", "0.2", "--start-rate", "16", "--rate", "100", "--num-requests", "20", "--out", str(tmp_path)]
    assert cli(argv) == 0
    table = pd.read_csv(tmp_path / "plan.csv")
    assert list(table["policy"]) == ["store_all", "replay"] and (table["status"] == "found").all()
    assert (table["capacity_rps"] > 0).all() and set(table["binding_slo"]) <= {"ttft_p99", "tpot_mean"}
    assert (table["gpus_needed"] == (100 / table["capacity_rps"]).apply(lambda x: -int(-x // 1))).all()
    assert (table["ttft_p99_s"] <= 1).all() and (table["tpot_mean_s"] <= 0.04).all()
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["slos"][0] == {"name": "ttft_p99", "summary_field": "ttft_p99_s", "bound_s": 1.0}
    assert all(p["met"] == (p["rate_rps"] <= c["capacity_rps"]) for c in doc["candidates"] for p in c["probes"])
    report = (tmp_path / "report.md").read_text()
    assert "**store_all** needs" in report and "**replay** needs" in report and "Best overall" in report
    for ext in ("png", "pdf"):
        assert (tmp_path / f"plan.{ext}").stat().st_size > 1000
    stored = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "points").glob("*.json")}
    assert len(stored) >= 2 * sum(len(c["probes"]) for c in doc["candidates"])  # N and 2N per probe
    assert cli(argv) == 0 and pd.read_csv(tmp_path / "plan.csv").equals(table)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "points").glob("*.json")} == stored  # nothing reran


def test_capacity_agrees_with_a_dense_rate_sweep(tmp_path):
    """The planner's capacity for one configuration against every rate of a dense grid."""
    s = PlanSettings(workload="synthetic-fixed", base={"seed": 0, "measure.warmup_fraction": 0.1,
                                                       "measure.cooldown_fraction": 0.1},
                     slos=parse_slos(["ttft_p99=1s", "tpot_mean=40ms"]), tolerance=0.1, num_requests=40,
                     max_requests=160, stability=0.1, start_rate=16.0, min_rate=0.5, max_rate=512.0, arrivals="poisson")

    def evaluate(configs):
        return run_sweep(configs, tmp_path, jobs=2, progress=False).records

    cand = candidates(["store_all"], [], [0.9], [256], [8192])
    (plan,) = run_plan(cand, s, evaluate, log=lambda line: None)
    assert plan.status == "found"
    dense = dense_capacity(dense_sweep(cand[0], dense_rates(plan.capacity, s.tolerance), s, evaluate))
    assert abs(dense - plan.capacity) <= s.tolerance * max(dense, plan.capacity)


def test_measured_requests_leave_out_warmup_and_cooldown_by_arrival():
    reqs = [Request(RequestSpec(i, 10, 10), arrival_s=float(9 - i)) for i in range(10)]
    got = measured(reqs, 0.2, 0.3)
    assert [r.arrival_s for r in got] == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert len(measured(reqs)) == 10


def test_warmup_window_is_validated_and_reaches_the_summary():
    with pytest.raises(ValueError, match="would leave out more than half of the requests; allowed: 0 to 0.5"):
        RunConfig(measure={"warmup_fraction": 0.6, "cooldown_fraction": 0.4})
    from sim.runs.run import simulate

    cfg = RunConfig(num_requests=20, client={"request_rate": 50.0}, measure={"warmup_fraction": 0.25})
    full, window = simulate(RunConfig(num_requests=20, client={"request_rate": 50.0})), simulate(cfg)
    assert full["measured_requests"] == 20 and window["measured_requests"] == 15
    assert window["completed"] == full["completed"] and window["ttft_p99_s"] != full["ttft_p99_s"]
