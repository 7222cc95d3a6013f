"""`specsim calibrate replay` on the CPU: summaries, step sampling, the output files of a tiny replay, bad input."""
import gc
import json
import math
import time

import pytest

from calibrate.replay import run as RP, group as RG, pick as PK, summary as RS
from calibrate.replay import timing as RT
from calibrate.replay.check import synthetic_steps
from calibrate.replay.outputs import read_replay_rows
from calibrate.replay.runs import Run, load_run, reprice, shape_columns
from calibrate.tables import host
from core.config import ConfigError, EngineConfig, RunConfig
from core.tables import HOST_COLUMNS, HOST_OPS
from sim.cli import main
from sim.engine.step_trace import TracedRequest as R, TracedStep, write_steps
from test_calibrate_executor import TINY  # pytest puts tests/ on the path

CHAIN = (1, 1, 1)


def _row(kind: str, measured: float, predicted: float, run: str = "a", old: float = math.nan) -> dict:
    # measured_sync_us: another timing of the step, which the summary must not compare against by default
    return {"run": run, "kind": kind, "measured_us": measured, "measured_async_us": measured, "measured_sync_us": 1.0,
            "predicted_us": predicted, "old_predicted_us": old}


def test_summary_errors_per_kind_and_sums():
    rows = [_row("uniform_decode", 100, 110), _row("uniform_decode", 100, 95), _row("uniform_decode", 200, 200),
            _row("mixed_eager", 1000, 500, run="b", old=2000)]
    s = RS.summarize(rows)
    assert s["compared_against"] == "measured_us" and "async" in s["compared_against_note"]
    assert s["uniform_decode"] == {"n": 3, "median_ape": 5.0, "p90_ape": 10.0, "bias": round(100 * 0.05 / 3, 3)}
    assert s["mixed_eager"]["median_ape"] == 50.0 and s["mixed_eager"]["bias"] == -50.0
    assert s["mixed_graph"] == {"n": 0, "median_ape": None, "p90_ape": None, "bias": None}
    assert s["all"]["n"] == 4 and s["sum_measured_s"] == 0.0014 and s["sum_predicted_s"] == pytest.approx(0.000905)
    assert s["old_eager_sum"]["mixed_eager"]["median_ape"] == 100.0 and s["old_eager_sum"]["uniform_decode"]["n"] == 0
    assert s["runs"]["b"]["sum_error_pct"] == -50.0 and s["runs"]["a"]["kinds"]["uniform_decode"] == 3


def test_summary_errors_per_policy():
    rows = [_row("mixed_graph", 100, 110, run="store_all-g0.6-c32"), _row("mixed_graph", 100, 70, run="replay-g0.6-c32"),
            _row("mixed_graph", 100, 60, run="replay-g0.9-c32")]
    s = RS.summarize(rows)
    assert set(s["policies"]) == {"replay", "store_all"}
    assert s["policies"]["store_all"]["mixed_graph"]["bias"] == 10.0
    assert s["policies"]["replay"]["mixed_graph"] == {"n": 2, "median_ape": 35.0, "p90_ape": 40.0, "bias": -35.0}
    assert s["policies"]["replay"]["uniform_decode"]["n"] == 0 and s["mixed_graph"]["n"] == 3


def test_repeatability_pairs_the_same_step_of_runs_that_differ_only_in_gmu():
    def row(run, step, us, kind="mixed_graph", tokens=100):
        return {**_row(kind, us, us, run=run), "step": step, "tokens": tokens}
    rows = [row("store_all-g0.6-c32", 5, 100.0), row("store_all-g0.9-c32", 5, 150.0),
            row("store_all-g0.6-c32", 6, 100.0), row("store_all-g0.9-c32", 6, 100.0, tokens=99),  # not the same step
            row("replay-g0.9-c32", 5, 80.0), row("store_all-g0.6-c1", 5, 10.0, "uniform_decode"),
            row("store_all-g0.9-c1", 5, 10.1, "uniform_decode")]
    rep = RS.summarize(rows)["repeatability"]
    assert rep["mixed_graph"] == {"pairs": 1, "median_pct": 40.0, "p90_pct": 40.0}
    assert rep["uniform_decode"]["pairs"] == 1 and rep["uniform_decode"]["median_pct"] == pytest.approx(0.995, abs=1e-3)


def test_host_speed_scores_the_nominal_regime_apart():
    # The device's host drifts between speed regimes: a step measured while the probe reads slow
    # is scored apart, and the nominal regime is the fastest probes' (10th percentile, +10%).
    def row(run, step, us, probe, kind="mixed_graph"):
        return {**_row(kind, us, 100.0, run=run), "step": step, "tokens": 50, "host_probe_us": probe}
    fast = [row("store_all-g0.6-c32", i, 101.0 + i % 3, 5.0 + 0.1 * (i % 4)) for i in range(20)]
    slow = [row("store_all-g0.9-c32", i, 170.0, 8.5) for i in range(10)]
    twin = [row("store_all-g0.9-c32", 100 + i, 103.0, 5.2) for i in range(4)]  # steps 100..103 measured twice
    twin += [row("store_all-g0.6-c32", 100 + i, 101.0, 5.0) for i in range(4)]
    unprobed = [{**row("store_all-g0.6-c1", 0, 500.0, 0.0), "host_probe_us": math.nan}]
    s = RS.summarize(fast + slow + twin + unprobed)
    hs = s["host_speed"]
    assert hs["rows_probed"] == 38 and hs["ref_us"] == 5.0 and hs["nominal_rows"] == 28
    assert hs["nominal"]["mixed_graph"]["n"] == 28 and hs["nominal"]["mixed_graph"]["bias"] < -0.9
    assert hs["slower"]["mixed_graph"] == {"n": 10, "median_ape": 41.176, "p90_ape": 41.176, "bias": -41.176}
    assert hs["nominal_repeatability"]["mixed_graph"]["pairs"] == 4
    assert hs["nominal_runs"]["store_all-g0.9-c32"]["n"] == 4 and hs["nominal_sum"]["n"] == 28
    assert s["mixed_graph"]["n"] == 39  # the pooled kinds keep every row
    assert RS.nominal_rows(slow) == slow and RS.nominal_rows(unprobed) == unprobed  # one regime; never probed
    assert RS.summarize(unprobed)["host_speed"] == {"rows_probed": 0}


def test_runs_take_turns():
    assert RG.take_turns({"a": 5, "b": 2, "c": 0}, 2) == [("a", 0, 2), ("b", 0, 2), ("a", 2, 4), ("a", 4, 5)]
    assert RG.take_turns({"a": 3}, 8) == [("a", 0, 3)] and RG.take_turns({}, 8) == []


def test_host_tables_keep_each_point_from_its_lowest_pass():
    from calibrate.tables.host import lowest_pass

    def row(op, n, us, policy=None):
        return {**({"policy": policy} if policy else {}), "op": op, "n": n, "us": us, "us_p10": us * 0.9,
                "us_p90": us * 2, "reps": 10}
    # pass 2 switched to a slow regime halfway (n=64); pass 1 was slow at its start
    one = [row("gdn_verify", 16, 510.0, "replay"), row("gdn_verify", 64, 300.0, "replay"),
           row("gdn_verify", 16, 250.0, "store_all")]
    two = [row("gdn_verify", 16, 297.0, "replay"), row("gdn_verify", 64, 560.0, "replay"),
           row("gdn_verify", 16, 260.0, "store_all"), row("gdn_commit", 16, 60.0, "store_all")]
    got = {(r["policy"], r["op"], r["n"]): r for r in lowest_pass([one, two])}
    assert {k: r["us"] for k, r in got.items()} == {
        ("replay", "gdn_verify", 16): 297.0, ("replay", "gdn_verify", 64): 300.0,
        ("store_all", "gdn_verify", 16): 250.0, ("store_all", "gdn_commit", 16): 60.0}
    assert got[("replay", "gdn_verify", 64)]["us_p90"] == 600.0  # the whole row of that pass
    assert lowest_pass([]) == []


def test_host_probe_times_one_launch():
    probe = host.HostProbe("cpu")
    us = [probe() for _ in range(3)]
    assert all(0 < u < 1e4 for u in us) and probe.x[0].item() == 3 * host.PROBE_BLOCKS * host.PROBE_LAUNCHES


def test_summary_can_compare_against_another_measurement():
    s = RS.summarize([_row("uniform_decode", 100, 110)], measured="measured_sync_us")
    assert s["compared_against"] == "measured_sync_us" and s["uniform_decode"]["median_ape"] == 10900.0


class Clock:
    """Virtual time for the replay's timers: `sleep` advances it, nothing else does, so the
    timing logic is checked exactly however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += max(0.0, s)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(RT, "time", c)  # the module's `time`: perf_counter and sleep
    return c


class FakeGPU:
    """An executor whose launches queue `gpu_s` of work on a simulated GPU (one stream) after
    `host_s` of host prep; finish waits until the step's work is done, as Event.synchronize."""

    def __init__(self, clock: Clock, host_s: float, gpu_s: float) -> None:
        self.clock, self.host_s, self.gpu_s, self.free, self.launched, self.finished = clock, host_s, gpu_s, 0.0, 0, 0

    def prepare(self, reqs, flush):
        self.clock.sleep(self.host_s)
        return {}

    def launch(self, st):
        self.free = max(self.clock.now, self.free) + self.gpu_s
        st["done"] = self.free
        self.launched += 1

    def finish(self, st):
        self.clock.sleep(st["done"] - self.clock.now)
        self.finished += 1

    def run(self, reqs, flush):
        st = self.prepare(reqs, flush)
        self.launch(st)
        self.finish(st)
        return st


@pytest.mark.parametrize("host_s, gpu_s", [(0.001, 0.03), (0.03, 0.005)])
def test_async_timing_is_the_steady_state_period_gpu_time_included(host_s, gpu_s, clock, monkeypatch):
    # A bug once seen: a collection (here 50 ms) between the first launch and the timer let the GPU
    # finish, and the step launched inside the timer was never waited for: ~host time only.
    monkeypatch.setattr(RT.gc, "collect", lambda *a: clock.sleep(0.05))
    ex = FakeGPU(clock, host_s, gpu_s)
    us = RT.time_step_async(ex, [], False, steps=4)
    assert us == pytest.approx(max(host_s, gpu_s) * 1e6, rel=1e-9)  # the steady-state period, exactly
    assert ex.launched == ex.finished == 4 + 1  # every launched step waited for


def test_long_steps_get_fewer_pipelined_steps():
    assert RT.async_steps(10_000) == RT.ASYNC_STEPS and RT.async_steps(50_000) == 3
    assert RT.async_steps(150_000) == RT.async_steps(1e7) == 2


def test_the_budget_is_checked_inside_a_step(clock):
    ex = FakeGPU(clock, 0.001, 0.001)
    with pytest.raises(RT.BudgetSpent):
        RT.time_step(ex, [], False, reps=3, warmup=1, end=clock.now - 1)
    with pytest.raises(RT.BudgetSpent):
        RT.time_step_async(ex, [], False, steps=3, end=clock.now + 0.0025)  # 4 steps need 4 ms
    ts, _ = RT.time_step(ex, [], False, reps=2, warmup=0, end=clock.now + 10)
    assert ts == pytest.approx([2000.0, 2000.0])  # host 1 ms, then the GPU's 1 ms


def test_alarm_interrupts_past_the_budget(monkeypatch):
    monkeypatch.setattr(RT, "ALARM_GRACE_S", 0.0)
    disarm = RT.arm_alarm(0.05)
    try:
        with pytest.raises(KeyboardInterrupt):
            time.sleep(2)
    finally:
        disarm()
    assert RT.arm_alarm(None)() is None


def test_freeze_heap_makes_collections_cheap():
    junk = [[i] for i in range(200_000)]  # noqa: F841  (kept alive: the traced steps' stand-in)
    RT.freeze_heap()
    try:  # frozen objects are what a collection no longer walks
        assert gc.get_freeze_count() >= len(junk)
    finally:
        gc.unfreeze()


def test_sample_spreads_over_the_run():
    assert PK.sample(10, None) == list(range(10))
    assert PK.sample(10, 4) == [0, 3, 6, 9]
    assert PK.sample(3, 10) == [0, 1, 2]


def test_pick_shares_the_quota_among_kinds_and_interleaves_them():
    kinds = ["p"] + ["d"] * 80 + ["m"] * 15 + ["d"] * 100 + ["e"] * 4
    order = PK.pick(kinds, 40)
    got = [kinds[i] for i in order]
    # equal shares, smallest kind first: p 1, e 4, then m 15 and d the other 20
    assert len(order) == len(set(order)) == 40
    assert {k: got.count(k) for k in "pedm"} == {"p": 1, "e": 4, "d": 20, "m": 15}
    # any prefix holds each kind in proportion: the first 10 already have d, m and e
    assert {"d", "m", "e"} <= set(got[:10])
    d = sorted(i for i in order if kinds[i] == "d")
    assert d[0] == 1 and d[-1] == 195  # the decodes span the run
    assert sorted(PK.pick(kinds, None)) == list(range(len(kinds)))
    assert PK.pick(["d"] * 5, 3) and sorted(PK.pick(["d"] * 5, 3)) == [0, 2, 4]


def test_chosen_steps_keep_the_kinds_asked_for_and_skip_resumed_ones():
    kinds = ["prefill_only", "mixed_graph", "uniform_decode", "mixed_eager", "uniform_decode", "mixed_graph"]
    run = Run("r", {}, [TracedStep(i, 0.0, k, (), 1.0, {}) for i, k in enumerate(kinds)], None, None, None)
    assert sorted(s.step for s in PK.chosen_steps(run, None, set())) == list(range(6))
    mixed = PK.chosen_steps(run, None, {("r", 5), ("other", 1)}, ["mixed_graph", "mixed_eager"])
    assert sorted(s.step for s in mixed) == [1, 3]
    # the quota is shared among the kinds kept, not the run's
    assert sorted(s.kind for s in PK.chosen_steps(run, 2, set(), ["mixed_graph", "mixed_eager"])) == \
        ["mixed_eager", "mixed_graph"]


def test_a_step_measured_in_several_passes_counts_once_at_its_fastest():
    def row(step, us, p, kind="mixed_graph", probe=6.0):
        return {**_row(kind, us, 100.0, run="store_all-g0.6-c32"), "step": step, "pass": p, "host_probe_us": probe}
    rows = [row(1, 110.0, 1), row(1, 100.0, 2, probe=6.5), row(1, 125.0, 3), row(2, 200.0, 1),
            row(3, 50.0, 1, "uniform_decode"), row(3, 50.5, 2, "uniform_decode")]
    best = {r["step"]: r for r in RS.fastest_passes(rows)}
    assert len(best) == 3 and best[1]["measured_us"] == 100.0 and best[1]["passes"] == 3
    assert best[1]["host_probe_us"] == 6.5  # the fastest pass's own probe
    assert best[1]["pass_spread_pct"] == pytest.approx(25.0) and "passes" not in best[2]
    s = RS.summarize(rows)
    assert s["mixed_graph"]["n"] == 2 and s["mixed_graph"]["bias"] == pytest.approx(-25.0)  # 0% and -50%
    assert s["sum_measured_s"] == pytest.approx(350e-6) and s["runs"]["store_all-g0.6-c32"]["n"] == 3
    assert s["pass_spread"] == {"mixed_graph": {"steps": 1, "median_pct": 25.0, "p90_pct": 25.0},
                                "uniform_decode": {"steps": 1, "median_pct": 1.0, "p90_pct": 1.0}}
    assert "fastest" in s["compared_against_note"]
    assert "fastest" not in RS.summarize(rows[3:5])["compared_against_note"]


def test_spread_order_covers_the_run_from_any_prefix():
    for n in (1, 2, 7, 100):
        order = PK.spread_order(n)
        assert sorted(order) == list(range(n))
    first = PK.spread_order(100)[:4]
    assert first == [0, 50, 25, 75]  # a budget cut after 4 steps still saw each quarter


def test_replay_policy_flushes_when_most_speculating_requests_do():
    def step(*flags):
        return TracedStep(0, 0.0, "uniform_decode", tuple(R(i, 0, 9, CHAIN, 2, 0, f) for i, f in enumerate(flags)),
                          1.0, {})
    assert PK.flushes(step(True, True, False)) and not PK.flushes(step(True, False, False))


def test_host_ops_are_the_simulators():
    assert set(host.OPS) == set(HOST_OPS) and host.COLUMNS == HOST_COLUMNS


@pytest.mark.slow  # whole replays in the Triton interpreter: minutes
def test_tiny_replay_writes_steps_summary_and_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(RT, "ASYNC_STEPS", 2)  # interpreted Triton on the CPU: seconds a step
    monkeypatch.setattr(RG, "INTERLEAVE_STEPS", 1)
    run, other = tmp_path / "c1", tmp_path / "c1b"
    run.mkdir()
    other.mkdir()
    meta = RunConfig(policy="replay", engine=EngineConfig(max_num_seqs=8, max_num_batched_tokens=64)).model_dump(
        mode="json")
    steps = [TracedStep(0, 0.0, "prefill_only", (R(1, 9, 0, (), 0),), 100.0, {"gdn": 60.0, "moe": 40.0}),
             TracedStep(1, 0.1, "uniform_decode", (R(1, 0, 10, CHAIN, 4, 0, False),), 80.0, {"gdn": 40.0, "moe": 40.0})]
    write_steps(run / "steps.csv", meta, steps)
    write_steps(other / "steps.csv", meta, steps[1:])
    paths = [run / "steps.csv", other / "steps.csv"]
    import torch
    threads, probe = [], host.HostProbe.__call__
    monkeypatch.setattr(host.HostProbe, "__call__", lambda self: threads.append(torch.get_num_threads()) or probe(self))
    before = torch.get_num_threads()
    rc = RP.replay(paths, "h200", tmp_path / "out", reps=1, warmup=0, device="cpu", shapes=TINY,
                   kinds=["gdn", "attn"], passes=2, log=lambda _: None)
    assert rc == 0
    # steps run with vLLM's one torch CPU thread; the caller's setting is back afterwards
    assert threads and set(threads) == {RP.TORCH_THREADS} and torch.get_num_threads() == before
    mdir = tmp_path / "out" / "qwen3.5-35b-a3b"
    rows = read_replay_rows(mdir / "replay_steps.csv")
    # the two runs of one executor take turns (INTERLEAVE_STEPS steps each), in each of the passes
    assert [(r["run"], r["step"], r["pass"]) for r in rows] == [("c1", 0, 1), ("c1b", 1, 1), ("c1", 1, 1),
                                                               ("c1", 0, 2), ("c1b", 1, 2), ("c1", 1, 2)]
    assert [r["kind"] for r in rows[:3]] == ["prefill_only", "uniform_decode", "uniform_decode"]
    assert all(r["measured_us"] > 0 and r["mode"] == "eager" for r in rows)
    assert all(r["measured_us"] == r["measured_async_us"] for r in rows)  # the run simulated async scheduling
    assert all(r["host_probe_us"] > 0 for r in rows)
    assert rows[1]["pred_gdn"] == 40.0 and rows[1]["predicted_us"] == 80.0 and rows[1]["tokens"] == 4
    summary = json.loads((mdir / "replay_summary.json").read_text())
    assert set(RS.SUMMARY_KINDS) <= set(summary) and summary["runs"]["c1"]["n"] == 2 and summary["runs"]["c1b"]["n"] == 1
    part = json.loads((mdir / "provenance.json").read_text())["parts"][-1]
    assert part["job"] == "replay" and part["steps_replayed"] == 6 and part["passes"] == 2
    assert part["kernels"]["replay"]["verify"].endswith("replay")
    # --resume: the rows are kept, their steps not replayed again, the provenance parts carried over
    rc = RP.replay(paths, "h200", tmp_path / "again", reps=1, warmup=0, device="cpu", shapes=TINY,
                   kinds=["gdn", "attn"], resume=mdir, log=lambda _: None)
    again = tmp_path / "again" / "qwen3.5-35b-a3b"
    assert rc == 0 and read_replay_rows(again / "replay_steps.csv") == rows
    parts = json.loads((again / "provenance.json").read_text())["parts"]
    assert len(parts) == 2 and parts[0] == part and (parts[1]["steps_replayed"], parts[1]["steps_resumed"]) == (0, 6)


def test_repricing_refuses_a_steps_file_whose_step_is_not_the_one_replayed(tmp_path):
    run = tmp_path / "c1"
    run.mkdir()
    meta = RunConfig(policy="store_all", engine=EngineConfig(max_num_seqs=8, max_num_batched_tokens=64)).model_dump(
        mode="json")
    write_steps(run / "steps.csv", meta, [TracedStep(1, 0.1, "uniform_decode", (R(1, 0, 10, CHAIN, 4, 0, False),),
                                                     80.0, {"gdn": 40.0, "moe": 40.0})])
    runs = {"c1": load_run(run / "steps.csv")}
    shape = shape_columns(runs["c1"].steps[0])
    assert shape == {"tokens": 4, "requests": 1, "decodes": 1, "prefills": 0, "context_tokens": 10}
    good = {"run": "c1", "step": "1", **{k: str(v) for k, v in shape.items()}}
    reprice([good], runs, "h200", lambda _: None)
    assert good["predicted_us"] > 0
    bad = {**good, "context_tokens": "11"}  # the same step number, another step
    with pytest.raises(ConfigError, match="step 1 is not the step replay_steps.csv timed"):
        reprice([bad], runs, "h200", lambda _: None)


@pytest.mark.parametrize("args, message", [
    (["--mode", "fast"], "--mode must be one of vllm, eager, graph"),
    (["--reps", "0"], "--reps must be >= 1"),
    ([], "--steps RUN/steps.csv is required"),
    (["--steps", "nowhere/steps.csv"], "no such steps file"),
    (["--host-only", "--no-host"], "--host-only measures the host tables: drop --no-host"),
    (["--host-policies", "store_all,nope"], "nope"),
    (["--host-only", "--device", "cpu"], "--device must be a CUDA device"),
    (["--pin-cpu", "100000"], "--pin-cpu must be one of this process's CPUs"),
    (["--passes", "0"], "--passes must be >= 1"),
    (["--step-kinds", "mixed_graph,decode"], "--step-kinds: unknown ['decode']; valid: uniform_decode, mixed_graph"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    extra = [] if args == [] or "--steps" in args else ["--smoke"]
    assert main(["calibrate", "replay", "--gpu", "h200", *extra, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_kv_pool_fits_the_check_batches():
    # A run of single short requests (concurrency 1) once sized a 2-block pool: the check's batches
    # then shared blocks and its eager and graph runs disagreed. The check's own batches count too.
    run = Run("c1", {}, [TracedStep(0, 0.0, "uniform_decode", (R(1, 0, 40, (1, 1, 1), 2),), 0.0, {})], None, None, None)
    checks = [reqs for _, reqs in synthetic_steps(4, 3, (8, 16, 512))]
    alone = RP.kv_pool_bytes_for([run], 1072, 1, 3, 1 << 40)
    both = RP.kv_pool_bytes_for([run], 1072, 1, 3, 1 << 40, checks)
    widest = max(1 + sum(-(-(r.context + (r.prefill or 4) + 3) // 1072) for r in reqs) for reqs in checks)
    assert alone == 2 and both == widest > 100


@pytest.mark.slow  # every policy's host ops at 1,000-token contexts in the interpreter: minutes
def test_policy_host_rows_are_measured_under_each_policy(monkeypatch):
    import torch

    from calibrate.executor.runner import Executor
    from core.config import load_model, load_policy
    from core.tables import HOST_POLICY_OPS

    def issue_once(fn, reps, cpu):  # the op really runs (under the policy's kernels), once
        fn()
        return [float(len(used))] * reps
    used = []
    monkeypatch.setattr(host, "cycles_per_us", lambda: 1.0)
    monkeypatch.setattr(host, "issue_times", issue_once)
    # host.csv's decode batches sit at 1,000-token contexts
    ex = Executor(load_model("qwen3.5-35b-a3b"), load_policy("store_all"), device=torch.device("cpu"), max_requests=8,
                  max_context=1100, max_num_seqs=8, max_num_batched_tokens=64, block_size=16, kv_pool_bytes=1 << 20,
                  kinds=["gdn", "attn"], shapes=TINY)
    monkeypatch.setattr(type(ex), "use_policy", lambda self, p, f=type(ex).use_policy: (used.append(p.name), f(self, p)))
    log: list[str] = []
    pols = [load_policy(p) for p in ("store_all", "replay", "reconstruct_deferred")]
    rows = host.measure_policy_host(ex, pols + [load_policy("store_all", {"draft_tree_widths": [2, 2]})], log.append,
                                    quick=True)
    batches = host.decode_batches(ex, quick=True)
    assert [(r["policy"], r["op"], r["n"]) for r in rows] == [
        (p, op, b) for p in ("store_all", "replay", "reconstruct_deferred") for b in batches for op in HOST_POLICY_OPS]
    assert [r["us"] for r in rows if r["op"] == "gdn_verify"] == [float(k) for k in (1, 2, 3) for _ in batches]
    assert any("skipped" in line and "differ from this executor" in line for line in log)
