"""The host model: host.csv reading and the two-resource pipeline arithmetic on hand-checked examples."""
import csv

import pytest

from core.tables import HOST_COLUMNS, TableError
from sim.pricing.host_model import ANALYTIC_US, HostCosts, pipeline


def ops(*pairs):
    """(host, GPU) pairs as pipeline ops that add no attention core."""
    return [(h, g, 0, 0) for h, g in pairs]


def test_gpu_bound_step():
    # prepare 7; op 1 issued at 17, runs 17-117; ops 2 and 3 issued at 27 and 77 wait for the GPU:
    # 117-122, 122-127; then finish 3.
    assert pipeline(ops((10, 100), (10, 5), (50, 5)), prepare_us=7, finish_us=3) == pytest.approx(130)


def test_host_bound_step():
    # each op issued 100 us after the last and done 10 us later: the GPU idles between them
    assert pipeline(ops((100, 10), (100, 10)), prepare_us=0, finish_us=0) == pytest.approx(210)
    assert pipeline(ops((100, 10), (100, 10)), prepare_us=5, finish_us=2) == pytest.approx(217)


def test_launches_hide_behind_queued_gpu_work():
    # the same three launches: alone 90 us of host time; behind a 1 ms op they cost nothing
    alone = pipeline(ops((30, 1), (30, 1), (30, 1)), 0, 0)
    behind = pipeline(ops((1, 1000), (30, 1), (30, 1), (30, 1)), 0, 0)
    assert alone == pytest.approx(91) and behind == pytest.approx(1 + 1000 + 3)


def test_async_scheduling_hides_prepare_and_finish():
    # sync: 50 prepare + 10 issue + 100 GPU + 30 finish
    assert pipeline(ops((10, 100)), 50, 30) == pytest.approx(190)
    # async: the GPU chain (10 + 100) is longer than the step's host work (50 + 10 + 30)
    assert pipeline(ops((10, 100)), 50, 30, async_scheduling=True) == pytest.approx(110)
    # ...unless the host work is longer: then it sets the period
    assert pipeline(ops((10, 20)), 50, 30, async_scheduling=True) == pytest.approx(90)


def test_attention_cores_join_their_ops():
    # op 2 carries 3 attention cores of 20 us (a full graph's), op 3 one core of 5 us (a drafter pass)
    steps = [(10, 100, 0, 0), (0, 0, 0, 3), (10, 1, 1, 1)]
    assert pipeline(steps, 0, 0, cores=(20.0, 5.0)) == pytest.approx(10 + 100 + 60 + 1 + 5)
    # async scheduling compares the GPU chain with the host's work: the ops' host costs and prepare
    assert pipeline(steps, 500, 0, async_scheduling=True, cores=(20.0, 5.0)) == pytest.approx(520)


def _write(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HOST_COLUMNS)
        w.writeheader()
        w.writerows({"us_p10": 0, "us_p90": 0, "reps": 3} | r for r in rows)


def test_host_csv_interpolates_and_labels_sources(tmp_path):
    path = tmp_path / "host.csv"
    _write(path, [{"op": "attn_core", "n": 1, "us": 20.0}, {"op": "attn_core", "n": 100, "us": 200.0}])
    host = HostCosts.load(path, step_overhead_us=100.0, step_source="calibrated")
    assert host.us("attn_core", 10) == pytest.approx(20.0 * 10 ** 0.5)  # log-log between the rows
    assert host.us("gdn_prefill", 3) == ANALYTIC_US["gdn_prefill"]
    assert host.us("step_prepare", 8) == host.us("step_finish", 8) == pytest.approx(50.0)
    assert host.sources["attn_core"] == "calibrated" and host.sources["gdn_prefill"] == "analytic"
    assert host.sources["step_prepare"] == "calibrated" and host.source == "mixed"


def test_no_host_csv_is_all_analytic(tmp_path):
    host = HostCosts.load(tmp_path / "host.csv")
    assert host.source == "analytic" and host.us("piece_graph", 256) == ANALYTIC_US["piece_graph"]


def test_derived_hardware_scales_host_costs(tmp_path):
    host = HostCosts.load(tmp_path / "host.csv", scale=0.5)
    assert host.us("attn_core", 4) == pytest.approx(0.5 * ANALYTIC_US["attn_core"])


def test_bad_host_csv(tmp_path):
    path = tmp_path / "host.csv"
    path.write_text("op,n,us\nattn_core,1,3\n")
    with pytest.raises(TableError, match="missing columns"):
        HostCosts.load(path)
    _write(path, [{"op": "attn_core", "n": 1, "us": 3.0}, {"op": "attn_core", "n": 1, "us": 4.0}])
    with pytest.raises(TableError, match="op attn_core: .*duplicate"):
        HostCosts.load(path)


def test_host_groups_cover_every_op_once():
    from core.tables import HOST_OPS
    from sim.pricing.host_model import HOST_GROUPS

    ops_ = [op for group in HOST_GROUPS.values() for op in group]
    assert sorted(ops_) == sorted(HOST_OPS)


def test_host_fit_scales_measured_ops_by_group(tmp_path):
    import json

    path = tmp_path / "host.csv"
    _write(path, [{"op": "gdn_prefill", "n": 1, "us": 2000.0}, {"op": "gdn_prefill", "n": 8, "us": 2000.0},
                  {"op": "attn_core", "n": 1, "us": 200.0}, {"op": "attn_core", "n": 8, "us": 200.0}])
    (tmp_path / "host_fit.json").write_text(json.dumps({"scales": {"prefill": 0.6, "core": 0.5, "eager": 2.0}}))
    host = HostCosts.load(path)
    assert host.us("gdn_prefill", 4) == pytest.approx(1200.0) and host.us("attn_core", 4) == pytest.approx(100.0)
    # analytic ops (not measured) are not scaled: the fit only knows the measured curves
    assert host.us("eager_moe", 64) == ANALYTIC_US["eager_moe"]
    assert host.with_group_scales({}).us("gdn_prefill", 4) == pytest.approx(2000.0)
    (tmp_path / "host_fit.json").write_text(json.dumps({"scales": {"prefil": 0.6}}))
    with pytest.raises(TableError, match="unknown groups \\['prefil'\\]"):
        HostCosts.load(path)
    (tmp_path / "host_fit.json").write_text("[1, 2]")
    with pytest.raises(TableError, match="host_fit.json"):
        HostCosts.load(path)


def test_host_policies_replace_the_policy_ops(tmp_path):
    # host.csv is measured under one policy; a run's own rows of host_policies.csv price its
    # verify and commit launches (replay issues about twice store_all's), the other ops stay.
    from core.tables import HOST_POLICY_COLUMNS

    path = tmp_path / "host.csv"
    _write(path, [{"op": op, "n": n, "us": us} for op, us in (("gdn_verify", 400.0), ("gdn_commit", 100.0),
                                                                ("attn_core", 50.0)) for n in (1, 64)])
    with (tmp_path / "host_policies.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HOST_POLICY_COLUMNS)
        w.writeheader()
        w.writerows({"us_p10": 0, "us_p90": 0, "reps": 3, "policy": "replay", "op": op, "n": n, "us": us}
                    for op, us in (("gdn_verify", 900.0), ("gdn_commit", 250.0)) for n in (1, 64))
    replay = HostCosts.load(path, policy="replay")
    assert (replay.us("gdn_verify", 8), replay.us("gdn_commit", 8)) == (pytest.approx(900.0), pytest.approx(250.0))
    assert replay.us("attn_core", 8) == pytest.approx(50.0)
    for other in (HostCosts.load(path, policy="store_all"), HostCosts.load(path)):
        assert (other.us("gdn_verify", 8), other.us("gdn_commit", 8)) == (pytest.approx(400.0), pytest.approx(100.0))
    with (tmp_path / "host_policies.csv").open("a", newline="") as f:
        csv.writer(f).writerow(["replay", "attn_core", 1, 9.0, 0, 0, 3])
    with pytest.raises(TableError, match="not priced per policy"):
        HostCosts.load(path, policy="replay")
