"""One simulated run's schema: which model, GPU, policy and workload, the engine, the client's
load, which requests the statistics cover, the seed."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from core.config_base import Strict
from core.config_engine import EngineConfig
from core.config_frontend import FrontendCosts


class ClientConfig(Strict):
    max_concurrency: int | None = Field(None, gt=0)  # closed loop when set
    request_rate: float | None = Field(None, gt=0)  # requests/s; None with no trace: all at t=0
    burstiness: float = Field(1.0, gt=0)  # Gamma shape; 1 = Poisson
    # How request_rate spaces the sends: "gamma" = vLLM's serving benchmark (burstiness above),
    # "constant" = guidellm's constant profile, request i at i / rate (workloads/arrivals.py)
    arrival_process: Literal["gamma", "constant"] = "gamma"
    use_trace_arrivals: bool = False  # replay the workload's own timestamps
    time_scale: float = Field(1.0, gt=0)  # trace replay: multiply gaps by this
    # The API server outside the engine (sim/engine/client.py; docs/guidellm.md#outside-the-engine): seconds
    # per request for HTTP both ways and a token's detokenisation and stream, and seconds per prompt
    # token on its one tokeniser thread. 0 by default: the engine alone, as the sweeps compare policies
    round_trip_s: float = Field(0.0, ge=0)
    tokenize_s_per_token: float = Field(0.0, ge=0)
    # vLLM's API-server event loop as a server of its own (sim/engine/frontend.py, docs/frontend.md): its
    # costs, or the path of a measurement file; None: not modelled (the engine's clock is the client's)
    frontend: FrontendCosts | None = None

    @model_validator(mode="after")
    def _constant_needs_rate(self) -> "ClientConfig":
        if self.arrival_process == "constant" and self.request_rate is None:
            raise ValueError("arrival_process 'constant' spaces sends at 1 / request_rate: set client.request_rate")
        return self


MAX_EXCLUDED = 0.5  # warm-up and cool-down together: the steady state they frame is at least half the run


class MeasureConfig(Strict):
    """Which requests the latency statistics cover: a run starts empty and, in an open loop,
    ends as its last arrivals drain, so a steady-state measurement leaves out the first and
    last requests by arrival order (the whole run counts by default). A start-up or a drain
    longer than the rest of the run is not one: 0.99 would measure the last 1% alone."""
    warmup_fraction: float = Field(0.0, ge=0, lt=1)
    cooldown_fraction: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _leaves_requests(self) -> "MeasureConfig":
        if self.warmup_fraction + self.cooldown_fraction > MAX_EXCLUDED:
            raise ValueError(f"warmup_fraction {self.warmup_fraction:g} + cooldown_fraction {self.cooldown_fraction:g} "
                             f"would leave out more than half of the requests; allowed: 0 to {MAX_EXCLUDED:g} together")
        return self


class RunConfig(Strict):
    model: str = "qwen3.5-35b-a3b"
    hardware: str = "h200"
    policy: str = "store_all"
    workload: str = "synthetic-fixed"
    workload_overrides: dict[str, Any] = Field(default_factory=dict)
    policy_overrides: dict[str, Any] = Field(default_factory=dict)
    model_overrides: dict[str, Any] = Field(default_factory=dict)  # ModelConfig fields, e.g. mamba_ssm_dtype
    engine: EngineConfig = Field(default_factory=EngineConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    measure: MeasureConfig = Field(default_factory=MeasureConfig)
    num_requests: int = Field(1000, gt=0)
    seed: int = Field(0, ge=0, lt=2**63)  # numpy's SeedSequence takes non-negative integers
    trace_steps: bool = False  # write the per-step trace
    # vLLM's num_speculative_tokens: None keeps the model's mtp_depth and the policy's tree;
    # 0 is another spelling of policy "none"; K > 0 drafts a chain of K (sim.runs.speculation).
    num_speculative_tokens: int | None = Field(None, ge=0)
