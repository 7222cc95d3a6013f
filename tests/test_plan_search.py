"""`specsim plan`'s search on a stub simulation of known capacity: bracketing and bisection
to the tolerance, the steady-state probe, caching of probes as sweep points."""
import math
from pathlib import Path

import pytest

from core.config import ConfigError, RunConfig
from sim.plan.candidates import Candidate, candidates
from sim.plan.dense import dense_capacity, dense_rates
from sim.plan.run import PlanSettings, best, run_plan
from sim.plan.search import CapacitySearch, Probe, check_tolerance
from sim.plan.slo import parse_slo, parse_slos
from sim.runs.sweep import run_sweep

BASE_TTFT = 0.1  # s, an idle engine's p99 TTFT in the stub
SLOS = parse_slos(["ttft_p99=1s", "tpot_mean=50ms"])


def saturation(cfg: RunConfig) -> float:
    """The stub engine's service rate (req/s): replay serves 30% more, a larger gmu more."""
    return 20.0 * cfg.engine.gmu * (1.3 if cfg.policy == "replay" else 1.0)


def capacity_of(cfg: RunConfig) -> float:
    """Where the stub's p99 TTFT = BASE_TTFT / (1 - rate / saturation) reaches the 1 s SLO."""
    return 0.9 * saturation(cfg)


def stub_simulate(cfg: RunConfig) -> dict:
    """Below saturation TTFT settles (M/M/1-like); above it the queue grows with the run's length."""
    rate, mu = cfg.client.request_rate, saturation(cfg)
    if rate is None:  # closed loop at max_num_seqs: the saturated throughput
        assert cfg.client.max_concurrency == cfg.engine.max_num_seqs
        return {"request_throughput": mu, "ttft_p99_s": 100.0, "tpot_mean_s": 0.02}
    if rate < mu:
        ttft = BASE_TTFT / (1 - rate / mu)
    else:
        ttft = BASE_TTFT * 20 + (rate - mu) / rate * cfg.num_requests / mu
    return {"ttft_p99_s": ttft, "tpot_mean_s": 0.02, "request_throughput": min(rate, mu), "completed": cfg.num_requests}


def no_prepare(configs):
    return {}


def settings(**kw) -> PlanSettings:
    args = dict(workload="synthetic-fixed", base={"seed": 0}, slos=SLOS, tolerance=0.02, num_requests=100,
                max_requests=400, stability=0.1, start_rate=1.0, min_rate=1 / 64, max_rate=1024.0, arrivals="poisson")
    return PlanSettings(**{**args, **kw})


class Counter:
    """evaluate() over run_sweep with the stub; counts the runs that were not cached."""

    def __init__(self, out):
        self.out, self.ran, self.cached = out, 0, 0

    def __call__(self, configs):
        res = run_sweep(configs, self.out, jobs=2, simulate=stub_simulate, prepare=no_prepare, progress=False)
        self.ran += res.ran
        self.cached += res.cached
        return res.records


def cands(policies=("store_all", "replay"), gmus=(0.6, 0.9)):
    return candidates(list(policies), [], list(gmus), [256], [8192])


def test_search_finds_the_known_capacity_to_its_tolerance(tmp_path):
    s = settings()
    results = run_plan(cands(), s, Counter(tmp_path), log=lambda line: None)
    for r in results:
        cfg = RunConfig(policy=r.candidate.policy, engine={"gmu": r.candidate.gmu})
        true = capacity_of(cfg)
        assert r.status == "found"
        assert r.capacity <= true < r.search.failed  # passing below, failing above the true capacity
        assert (r.search.failed - r.capacity) / r.capacity <= s.tolerance
        assert r.binding == "ttft_p99"
    assert best(results).candidate == Candidate("replay", (1, 1, 1), 0.9, 256, 8192)


def test_without_a_start_rate_the_search_starts_at_the_saturated_throughput(tmp_path):
    results = run_plan(cands(gmus=(0.9,)), settings(start_rate=None, min_rate=None, max_rate=None),
                       Counter(tmp_path), log=lambda line: None)
    for r in results:
        cfg = RunConfig(policy=r.candidate.policy, engine={"gmu": 0.9})
        assert r.search.tried[0] == pytest.approx(saturation(cfg), rel=1e-4)
        assert r.search.tried[1] == pytest.approx(saturation(cfg) / 1.25, rel=1e-4)  # the first step: 1.25
        assert r.search.min_rate == pytest.approx(r.search.start / 1024)
        assert r.status == "found" and r.capacity <= capacity_of(cfg) < r.failing_rate


def test_results_do_not_depend_on_running_the_longer_runs_ahead(tmp_path):
    s = settings()
    one = run_plan(cands(), s, Counter(tmp_path / "a"), log=lambda line: None, slots=1)
    many = run_plan(cands(), s, Counter(tmp_path / "b"), log=lambda line: None, slots=64)
    assert [(r.capacity, r.search.tried) for r in one] == [(r.capacity, r.search.tried) for r in many]
    assert any(len(p.runs) == 2 and p.verdict.lengths == 1 for r in many for p in r.probes.values())  # ran ahead


def test_a_rerun_runs_nothing_and_a_new_candidate_only_its_own_probes(tmp_path):
    s = settings()
    first = Counter(tmp_path)
    done = run_plan(cands(gmus=(0.9,)), s, first, log=lambda line: None)
    assert all(r.status == "found" for r in done)
    assert first.ran == sum(len(p.runs) for r in done for p in r.probes.values())  # each probe run once
    again = Counter(tmp_path)
    before = run_plan(cands(gmus=(0.9,)), s, again, log=lambda line: None)
    assert again.ran == 0 and again.cached == first.ran
    more = Counter(tmp_path)
    after = run_plan(cands(gmus=(0.9, 0.75)), s, more, log=lambda line: None)
    assert more.cached == first.ran  # the old candidates' probes come from the store
    new = [r for r in after if r.candidate.gmu == 0.75]
    assert more.ran == sum(len(p.runs) for r in new for p in r.probes.values()) > 0
    assert [r.capacity for r in after if r.candidate.gmu == 0.9] == [r.capacity for r in before]


def test_search_brackets_downward_and_reports_no_rate_met():
    search = CapacitySearch(start=8.0, tolerance=0.05, min_rate=0.5, max_rate=64)
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(rate, met=False)
    assert rates == [8.0, 4.0, 1.0, 0.5] and search.outcome == "none_met"  # steps of 2, 4, 16 (clipped)


def test_search_stops_at_max_rate_when_every_rate_passes():
    search = CapacitySearch(start=1.0, tolerance=0.05, min_rate=0.5, max_rate=5.0)
    while (rate := search.next_rate()) is not None:
        search.record(rate, met=True)
    assert search.outcome == "above_max" and search.passed == 5.0 and search.tried == [1.0, 2.0, 5.0]


@pytest.mark.parametrize("tol", [0.0, 1e-4, 0.9, -0.1])
def test_unsatisfiable_tolerance_is_refused(tol):
    with pytest.raises(ConfigError, match="tolerance"):
        check_tolerance(tol)


# ------------------------------------------------------------------- steady state
def run_probe(metric_at, max_requests=800):
    """A probe fed by metric_at(num_requests) -> ttft_p99; returns it once decided."""
    probe = Probe(10.0, SLOS, 100, max_requests, stability=0.1)
    while pending := probe.pending():
        for n in pending:
            probe.add(n, {"ttft_p99_s": metric_at(n), "tpot_mean_s": 0.02})
    return probe


def test_stable_metrics_decide_after_two_lengths():
    probe = run_probe(lambda n: 0.5 + 0.01 * math.sin(n))
    assert sorted(probe.runs) == [100, 200]
    assert probe.verdict.met and probe.verdict.steady and probe.verdict.num_requests == 200


def test_a_moving_metric_doubles_the_run_until_it_settles():
    probe = run_probe(lambda n: 0.5 + 50 / n)  # warms up: 1.0, 0.75, 0.625, 0.5625, 0.53
    assert sorted(probe.runs) == [100, 200, 400, 800]
    assert probe.verdict.met and probe.verdict.num_requests == 800


def test_a_metric_still_growing_at_max_requests_fails_under_its_bound():
    probe = run_probe(lambda n: 0.2 + n / 800, max_requests=400)  # 0.325, 0.45, 0.7: under 1 s, but growing
    assert sorted(probe.runs) == [100, 200, 400]
    v = probe.verdict
    assert not v.met and not v.steady and v.violated == ("ttft_p99",) and "still growing" in v.note


def test_a_probe_run_ahead_decides_as_one_run_in_turn():
    for metric in (lambda n: 0.5 + 50 / n, lambda n: 1.2, lambda n: 0.2 + n / 800):
        turn, ahead = run_probe(metric), Probe(10.0, SLOS, 100, 800, stability=0.1)
        while pending := ahead.pending(ahead=True):
            for n in reversed(pending):  # the longer run's result first
                ahead.add(n, {"ttft_p99_s": metric(n), "tpot_mean_s": 0.02})
        assert ahead.verdict == turn.verdict


def test_a_longer_run_far_over_its_bound_fails_without_the_longest():
    probe = run_probe(lambda n: 0.2 if n == 100 else 1.5)  # fine at N, broken by 50% at 2N
    assert sorted(probe.runs) == [100, 200] and probe.verdict.lengths == 2 and probe.verdict.cut and not probe.verdict.met
    assert "at 200 requests" in probe.verdict.note


def test_a_missing_metric_breaks_the_slo():
    probe = Probe(10.0, SLOS, 100, 200, stability=0.1)
    probe.add(100, {"ttft_p99_s": 0.1, "tpot_mean_s": None})
    assert not probe.verdict.met and probe.verdict.violated == ("tpot_mean",) and not probe.pending()


def test_a_first_run_far_over_its_bound_fails_without_the_longer_run():
    probe = run_probe(lambda n: 1.2)  # 1.2 s > (1 + 0.1) x 1 s
    assert sorted(probe.runs) == [100] and probe.verdict.lengths == 1 and probe.verdict.cut
    assert not probe.verdict.met and probe.verdict.violated == ("ttft_p99",) and "at 100 requests" in probe.verdict.note
    near = run_probe(lambda n: 1.05)  # over the bound, inside the margin: the longer run decides
    assert sorted(near.runs) == [100, 200] and not near.verdict.met and near.verdict.steady


def test_dense_capacity_is_the_last_rate_before_the_first_failure():
    rates = dense_rates(10.0, 0.1, span=2.0)
    assert rates[0] == 5.0 and rates[-1] >= 20.0
    assert all(b / a <= 1.1 + 1e-4 for a, b in zip(rates, rates[1:]))  # steps of 1 + tolerance, rounded

    class V:
        def __init__(self, rate, met):
            self.rate, self.met = rate, met
    assert dense_capacity([V(1, True), V(2, True), V(3, False), V(4, True)]) == 2
    assert dense_capacity([V(1, False)]) == 0.0


def test_the_policy_that_does_not_speculate_takes_no_tree():
    got = candidates(["none", "store_all"], [(1, 1, 1), (2, 2)], [0.9], [128, 256], [8192])
    assert [(c.policy, c.tree, c.max_num_seqs) for c in got] == [
        ("none", None, 128), ("none", None, 256),
        ("store_all", (1, 1, 1), 128), ("store_all", (1, 1, 1), 256), ("store_all", (2, 2), 128), ("store_all", (2, 2), 256)]
    assert "policy_overrides.draft_tree_widths" not in got[0].assignment()
    assert got[0].label == "none (gmu 0.9, max_num_seqs 128, max_num_batched_tokens 8192)"


def test_each_policy_keeps_its_own_tree_without_trees():
    assert [c.tree for c in candidates(["none", "replay"], [], [0.9], [256], [8192])] == [None, (1, 1, 1)]


def test_trace_arrivals_are_time_scaled_to_the_probed_rate():
    from sim.plan.run import TraceRates, probe_config
    from workloads import load_workload
    from workloads.arrivals import trace_arrival_times

    data = Path(__file__).parent / "data" / "azure_llm_2023_conv_sample.csv"
    s = settings(workload="azure-conv", arrivals="trace", base={"seed": 0, "workload_overrides.path": str(data)})
    (cand,) = candidates(["store_all"], [], [0.9], [256], [8192])
    cfg = probe_config(s, cand, 7.5, 100, TraceRates(s))
    assert cfg.client.use_trace_arrivals and cfg.client.request_rate is None
    w = load_workload(cfg.workload, cfg.num_requests, cfg.seed, cfg.workload_overrides)
    t = trace_arrival_times(w.requests, cfg.client.time_scale)
    assert (len(t) - 1) / (t.max() - t.min()) == pytest.approx(7.5)


def test_a_plan_on_a_dask_cluster_finds_what_the_process_pool_finds(tmp_path):
    distributed = pytest.importorskip("distributed")
    s = settings(tolerance=0.1)
    local = run_plan(cands(gmus=(0.9,)), s, Counter(tmp_path / "a"), log=lambda line: None)
    # Loopback only, no dashboard: a test opens no port another machine can reach
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                                  dashboard_address=None, worker_dashboard_address=None) as cluster:
        def on_dask(configs):
            return run_sweep(configs, tmp_path / "b", dask_scheduler=cluster.scheduler_address,
                             simulate=stub_simulate, prepare=no_prepare, progress=False).records
        remote = run_plan(cands(gmus=(0.9,)), s, on_dask, log=lambda line: None, slots=2)
    assert [(r.capacity, r.search.tried) for r in remote] == [(r.capacity, r.search.tried) for r in local]


def test_a_metric_at_its_bound_meets_it():
    slo = parse_slo("ttft_p99=2s")
    assert slo.met({"ttft_p99_s": 2.0}) and not slo.met({"ttft_p99_s": 2.0 + 1e-9}) and not slo.met({})


def test_the_verdict_is_the_longer_runs():
    """The shorter run only decides a probe it breaks by more than the stability margin; within it,
    the longer (confirming) run's values are the verdict."""
    slo = parse_slo("ttft_p99=1s")
    over_then_under = Probe(4.0, [slo], 100, 400, stability=0.1)
    over_then_under.add(100, {"ttft_p99_s": 1.05})  # over the bound, within the margin: run 200 too
    over_then_under.add(200, {"ttft_p99_s": 0.99})
    v = over_then_under.verdict
    assert v.met and v.num_requests == 200 and v.summary == {"ttft_p99_s": 0.99} and v.violated == ()
    under_then_over = Probe(4.0, [slo], 100, 400, stability=0.1)
    under_then_over.add(100, {"ttft_p99_s": 0.99})
    under_then_over.add(200, {"ttft_p99_s": 1.05})
    v = under_then_over.verdict
    assert not v.met and v.num_requests == 200 and v.violated == ("ttft_p99",) and v.steady
