"""Picks the latency model for a run: calibrated tables where they exist, else the analytic roofline."""
from __future__ import annotations

from core.config import EngineConfig, HardwareConfig, ModelConfig
from policies import CommitPolicy
from sim.latency import LatencyModel
from sim.latency_analytic import AnalyticLatencyModel
from sim.latency_calibrated import CalibratedLatencyModel


def make_latency_model(model: ModelConfig, hw: HardwareConfig, policy: CommitPolicy,
                       engine_cfg: EngineConfig) -> LatencyModel:
    """Calibrated tables where they exist (the analytic roofline fills missing terms), else analytic."""
    analytic = AnalyticLatencyModel(model, hw, policy, engine_cfg)
    calibrated = CalibratedLatencyModel.load(model, hw, policy, engine_cfg, fallback=analytic)
    return calibrated if calibrated is not None else analytic
