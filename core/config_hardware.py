"""The GPU's schema: memory, achievable rates, vLLM's size defaults, where its calibration lives."""
from __future__ import annotations

from pydantic import Field, model_validator

from core.config_base import MiB, Strict


class HardwareConfig(Strict):
    name: str
    gpu_name: str
    memory_mib: int = Field(gt=0)  # total device memory as the device reports it
    hbm_bandwidth_gbs: float = Field(gt=0)  # achievable copy bandwidth (read + write), GB/s
    bf16_tflops: float = Field(gt=0)  # achievable dense bf16 matrix rate
    calibration_dir: str | None = None  # relative to the repo root
    derived: bool = False  # true: numbers scaled from another GPU, not measured on this one
    derived_from: str | None = None
    scaling: dict[str, float] = Field(default_factory=dict)  # factor per latency term kind
    scaling_notes: str | None = None
    max_num_batched_tokens: int = Field(gt=0)  # vLLM default for this GPU size
    max_num_seqs: int = Field(gt=0)
    non_torch_memory_mib: float = Field(ge=0)
    cudagraph_memory_mib: float = Field(ge=0)
    nvlink_bandwidth_gbs: float = Field(gt=0)  # per-GPU unidirectional NVLink bandwidth
    nvlink_latency_us: float = Field(ge=0)  # per all-reduce hop latency
    sources: dict[str, str] = Field(default_factory=dict)  # where each stated figure comes from

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB

    @model_validator(mode="after")
    def _derived_has_source(self) -> "HardwareConfig":
        if self.derived and not (self.derived_from and self.scaling_notes):
            raise ValueError("a derived hardware profile must name derived_from and scaling_notes")
        return self
