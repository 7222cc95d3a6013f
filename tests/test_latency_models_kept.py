"""A process keeps the latency models it built (sim.pricing.factory): points that share one price
every step as they would alone, and a model is built again when anything it reads changes."""
import json
import shutil

import pytest

from core.config import REPO_ROOT, EngineConfig, RunConfig, load_hardware, load_model, load_policy
from core.tables import TableError, read_rows
from policies import make_policy
from sim.pricing import factory as latency_factory
from sim.pricing.analytic import AnalyticLatencyModel
from sim.pricing.calibrated import CalibratedLatencyModel
from sim.pricing.factory import ENGINE_FIELDS, make_latency_model
from sim.pricing.latency import StepBatch
from sim.runs.run import simulate


def point(policy: str, gmu: float, concurrency: int) -> RunConfig:
    return RunConfig.model_validate({"workload": "sharegpt", "policy": policy, "num_requests": 150,
                                     "engine": {"gmu": gmu}, "client": {"max_concurrency": concurrency}})


@pytest.mark.parametrize("policy", ["replay", "reconstruct"])
def test_a_point_after_others_gives_what_it_gives_alone(policy, monkeypatch):
    monkeypatch.setattr(latency_factory, "_kept", type(latency_factory._kept)())
    alone = simulate(point(policy, 0.9, 64))
    latency_factory._kept.clear()
    for gmu, concurrency in ((0.6, 32), (0.75, 128), (0.9, 8)):
        simulate(point(policy, gmu, concurrency))
    assert len(latency_factory._kept) == 1  # they shared one model
    assert json.dumps(simulate(point(policy, 0.9, 64)), sort_keys=True) == json.dumps(alone, sort_keys=True)


def test_a_model_is_built_again_when_its_tables_change(tmp_path, monkeypatch):
    monkeypatch.setattr(latency_factory, "_kept", type(latency_factory._kept)())
    hw = load_hardware("h200")
    cal = tmp_path / "cal"
    shutil.copytree(latency_factory.REPO_ROOT / hw.calibration_dir, cal)
    hw = hw.model_copy(update={"calibration_dir": str(cal)})
    model = load_model("qwen3.5-35b-a3b")
    policy = make_policy(model, load_policy("store_all"))
    first = make_latency_model(model, hw, policy, EngineConfig())
    assert make_latency_model(model, hw, policy, EngineConfig(gmu=0.6, max_num_seqs=7)) is first
    table = cal / model.calibration_name / "moe.csv"
    table.write_text(table.read_text() + "\n")
    assert make_latency_model(model, hw, policy, EngineConfig()) is not first
    assert make_latency_model(model, hw, policy, EngineConfig(async_scheduling=False)) is not first


OTHER_ENGINES = [EngineConfig(gmu=0.5, max_num_batched_tokens=512, max_num_seqs=8, admission="first_chunk",
                              allocator="ideal", activation_peak_mib=100.0, kv_cache_dtype="fp8",
                              enable_prefix_caching=False, language_model_only=True, max_model_len=4096,
                              allow_long_max_model_len=True, truncate_drafts=False),
                 EngineConfig(latency_pricing="eager_sum", async_scheduling=False, step_overhead_us=123.0)]


@pytest.mark.parametrize("engine", OTHER_ENGINES)
@pytest.mark.parametrize("model_name", ["qwen3.5-35b-a3b", "qwen3.5-27b"])
def test_latency_models_read_no_engine_field_but_those_kept_by(engine, model_name):
    # Built from the whole engine config or from ENGINE_FIELDS alone, every price is the same: a
    # model that read another field would be shared by points it should not be.
    model = load_model(model_name)
    policy = make_policy(model, load_policy("replay"))
    hw = load_hardware("h200")
    fields = EngineConfig(**{f: getattr(engine, f) for f in ENGINE_FIELDS})
    batches = [StepBatch(num_seqs=b, prefill_tokens=p, prefill_seqs=1 if p else 0, decode_seqs=b - (1 if p else 0),
                         spec_seqs=b - (1 if p else 0), verify_positions=4, context_tokens=b * 900, max_context=1500,
                         eager=bool(p), replay_tokens=3 * b, flush_seqs=b // 2, draft_depth=3)
               for b, p in ((1, 0), (8, 0), (64, 700), (200, 3000))]
    graph_only = not any(r["mode"] == "eager" for r in read_rows(REPO_ROOT / hw.calibration_dir / model.calibration_name / "gdn.csv"))
    if engine.latency_pricing == "eager_sum" and graph_only:  # measured with --modes graph: nothing to sum
        with pytest.raises(TableError, match="no rows with mode='eager'"):
            CalibratedLatencyModel.load(model, hw, policy, engine)
        return
    for build in (AnalyticLatencyModel, CalibratedLatencyModel.load):
        whole, kept = build(model, hw, policy, engine), build(model, hw, policy, fields)
        if whole is None:
            continue
        assert [whole.step_time(b) for b in batches] == [kept.step_time(b) for b in batches]
