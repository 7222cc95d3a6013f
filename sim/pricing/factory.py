"""Picks the latency model for a run: calibrated tables where they exist, else the analytic roofline.

A latency model's prices depend on the model, the hardware, the commit policy, three engine
fields (`ENGINE_FIELDS`) and the calibration files it reads, nothing else; the parts it prices
are kept with it. So a process keeps the last few models it built by exactly those, and a
sweep's points that differ only in memory budget, load or workload share one.
"""
from __future__ import annotations

import json
from collections import OrderedDict

from core.calibration_files import read_files
from core.config import REPO_ROOT, EngineConfig, HardwareConfig, ModelConfig
from policies import CommitPolicy
from sim.pricing.analytic import AnalyticLatencyModel
from sim.pricing.calibrated import CalibratedLatencyModel
from sim.pricing.latency import LatencyModel

ENGINE_FIELDS = ("latency_pricing", "async_scheduling", "step_overhead_us", "sampling")  # all a latency model reads of the engine
KEPT = 8  # latency models a process keeps
_kept: OrderedDict[str, LatencyModel] = OrderedDict()


def make_latency_model(model: ModelConfig, hw: HardwareConfig, policy: CommitPolicy,
                       engine_cfg: EngineConfig) -> LatencyModel:
    """Calibrated tables where they exist (the analytic roofline fills missing terms), else analytic."""
    engine = EngineConfig(**{f: getattr(engine_cfg, f) for f in ENGINE_FIELDS})
    key = _key(model, hw, policy, engine)
    latency = _kept.get(key)
    if latency is None:
        latency = _kept[key] = build_latency_model(model, hw, policy, engine)
        if len(_kept) > KEPT:
            _kept.popitem(last=False)
    _kept.move_to_end(key)
    return latency


def build_latency_model(model: ModelConfig, hw: HardwareConfig, policy: CommitPolicy,
                        engine_cfg: EngineConfig) -> LatencyModel:
    """A latency model of its own (not the process's kept one): calibrated tables where they
    exist, the analytic roofline filling missing terms, else analytic."""
    analytic = AnalyticLatencyModel(model, hw, policy, engine_cfg)
    calibrated = CalibratedLatencyModel.load(model, hw, policy, engine_cfg, fallback=analytic)
    return calibrated if calibrated is not None else analytic


def _key(model: ModelConfig, hw: HardwareConfig, policy: CommitPolicy, engine: EngineConfig) -> str:
    files = []
    if hw.calibration_dir:
        files = [(str(p), p.stat().st_size, p.stat().st_mtime_ns)
                 for p in read_files(REPO_ROOT / hw.calibration_dir, [model.calibration_name])]
    return json.dumps([model.model_dump(mode="json"), hw.model_dump(mode="json"), policy.cfg.model_dump(mode="json"),
                       engine.model_dump(mode="json"), files], sort_keys=True)
