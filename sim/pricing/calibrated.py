"""Step latency from the GPU calibration tables (`results/calibration/<gpu>/<model>/`).

`CalibratedLatencyModel` loads a model's tables into the shared pieces
(sim.pricing.calibrated_parts) and prices a step by one of two pricings
(`engine.latency_pricing`): sim.pricing.pipeline (default: GPU times and host launch
costs as a two-resource pipeline) or sim.pricing.eager_sum (the old sum of the parts).
"""
from __future__ import annotations

import numpy as np

from core.calibration_files import gpu_file, model_file
from core.config import REPO_ROOT, EngineConfig, HardwareConfig, ModelConfig, PolicyConfig
from core.tables import TABLES
from policies import CommitPolicy, make_policy
from sim.pricing.calibrated_parts import CalibratedParts
from sim.pricing.calibration_tables import derived_scale, load_decode_conv, load_gdn_mixed, load_overhead, load_tables
from sim.pricing.eager_sum import EagerSumPricing
from sim.pricing.host_model import HostCosts
from sim.pricing.kernel_rows import load_kernels
from sim.pricing.latency import LatencyModel, StepBatch, StepTime, StepTimes
from sim.pricing.pipeline import PipelineParts, PipelinePricing
from sim.pricing.sampler_cost import load_sampler


class CalibratedLatencyModel(CalibratedParts):
    def __init__(self, *args, **kwargs) -> None:
        """CalibratedParts' arguments; the pricing is the engine config's `latency_pricing`."""
        super().__init__(*args, **kwargs)
        self.pricer = PipelinePricing(self) if self.pricing == "pipeline" else EagerSumPricing(self)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, model: ModelConfig, hw: HardwareConfig, policy: CommitPolicy | PolicyConfig,
             engine_cfg: EngineConfig, fallback: LatencyModel | None = None, *,
             extrapolate: bool = True, piecewise: bool = True) -> "CalibratedLatencyModel | None":
        """The model for these tables, or None when hw has no calibration for this model.

        piecewise=False prices an eager step as fully eager (every layer from the eager
        tables), as the harness's whole-step check runs it.
        """
        if not hw.calibration_dir:
            return None
        root = REPO_ROOT / hw.calibration_dir
        mdir = root / model.calibration_name
        if not any((mdir / f"{name}.csv").is_file() for name in TABLES):  # e.g. a folder of kernel benches only
            return None
        if isinstance(policy, PolicyConfig):
            policy = make_policy(model, policy)
        # The pipeline prices every layer from its graph rows; the eager sum reads both modes.
        modes = ("graph",) if engine_cfg.latency_pricing == "pipeline" else ("graph", "eager")
        tables = load_tables(mdir, extrapolate=extrapolate, modes=modes)
        # The model's own kernel bench (calibrate measure's kernels job) before the GPU's shared table.
        own = model_file(root, model.calibration_name, "kernels.csv")
        kernels = load_kernels(own if own.exists() else gpu_file(root, "kernels.csv"), model, policy,
                               extrapolate=extrapolate)
        overhead = load_overhead(mdir)
        host = None
        if engine_cfg.latency_pricing == "pipeline":
            step_us, step_source = ((engine_cfg.step_overhead_us, "config") if engine_cfg.step_overhead_us is not None
                                    else (overhead, "calibrated" if overhead is not None else "analytic"))
            host = HostCosts.load(model_file(root, model.calibration_name, "host.csv"), step_us, derived_scale(hw, "overhead"), step_source,
                                  extrapolate=extrapolate, policy=policy.name)
        decode_conv = load_decode_conv(mdir, policy.name, extrapolate=extrapolate)
        sampler = load_sampler(gpu_file(root, "sampler.csv"), engine_cfg.sampling_path(model.generation_sampling),
                               model.vocab_size, extrapolate=extrapolate)
        return cls(model, hw, policy, engine_cfg, tables, kernels, overhead, fallback, piecewise, host, decode_conv,
                   sampler, load_gdn_mixed(mdir, extrapolate=extrapolate))

    # ------------------------------------------------------------------ the step
    def step_time(self, b: StepBatch) -> StepTime:
        return self.pricer.step_time(b)

    def step_times(self, b: StepBatch, contexts: np.ndarray, replay_tokens: np.ndarray | None = None) -> StepTimes | None:
        """Decode steps that differ only in their context sums (and replayed tokens), priced at once
        (the pipeline pricing only; None: price them one by one)."""
        if not isinstance(self.pricer, PipelinePricing):
            return None
        return self.pricer.step_times(b, contexts, replay_tokens)

    def pipeline_parts(self, b: StepBatch) -> PipelineParts:
        """The pipeline pricing's parts of a step (calibrate.replay.host_fit re-prices them at other host scales)."""
        if not isinstance(self.pricer, PipelinePricing):
            raise ValueError("pipeline_parts needs engine.latency_pricing: pipeline")
        return self.pricer.parts(b)
