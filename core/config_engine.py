"""The serving engine's schema: vLLM's memory, batching, caching and scheduling settings."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from core.config_base import DTYPE_BYTES, SamplingPath, Strict


PerformanceMode = Literal["balanced", "interactivity", "throughput"]  # vLLM 0.17.1 config/vllm.py


class EngineConfig(Strict):
    gmu: float = Field(0.9)
    max_num_batched_tokens: int | None = Field(None, gt=0)  # None: the hardware's default
    max_num_seqs: int | None = Field(None, gt=0)
    # vLLM's --performance-mode (0.17.1; docs/vllm.md#performance-mode): "throughput" doubles the
    # two defaults above (core.batch_limits), "interactivity" captures a CUDA graph at every batch
    # size up to 32 tokens (sim.pricing.dispatch.capture_sizes)
    performance_mode: PerformanceMode = "balanced"
    admission: Literal["full_prompt", "first_chunk"] = "full_prompt"  # vLLM 0.33 / older
    allocator: Literal["paged", "ideal"] = "paged"
    step_overhead_us: float | None = Field(None, ge=0)  # None: calibrated or the analytic default
    # Step time: "pipeline" = GPU-time tables + host launch costs as a two-resource pipeline
    # (sim.pricing.host_model); "eager_sum" = the old sum of eager table rows (kept to compare).
    latency_pricing: Literal["pipeline", "eager_sum"] = "pipeline"
    activation_peak_mib: float | None = Field(None, ge=0)  # None: calibrated or analytic
    # vLLM engine semantics (the memory and engine-semantics issues set the defaults to current vLLM's).
    kv_cache_dtype: Literal["bf16", "fp8"] = "bf16"
    enable_prefix_caching: bool = True  # vLLM v1's default
    mamba_cache_mode: Literal["none", "align"] | None = None  # None: "align" with prefix caching, else "none"
    language_model_only: bool = False  # vLLM --language-model-only: no multimodal encoder dummy batch
    max_model_len: int | None = Field(None, gt=0)  # None: the model's max_model_len
    # vLLM refuses a max_model_len above the model's own unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (docs/vllm.md#startup-checks)
    allow_long_max_model_len: bool = False
    # vLLM's default with MTP (config/vllm.py): the next step is planned while one runs (docs/engine.md)
    async_scheduling: bool = True
    # vLLM v1 schedules spec_token_ids[:budget - 1] when the budget is short; false: 1 token (chains only)
    truncate_drafts: bool = True
    # What the requests' sampling asks of the sampler (docs/sampling.md): "model" = the checkpoint's
    # generation config, as for clients that send no sampling parameters (the model's generation_sampling)
    sampling: Literal["model"] | SamplingPath = "model"

    @field_validator("gmu")
    @classmethod
    def _gmu(cls, v: float) -> float:
        if not (0.0 < v <= 1.0):
            raise ValueError(f"gmu must be in (0, 1], got {v}")
        return v

    @model_validator(mode="after")
    def _cache_mode(self) -> "EngineConfig":
        # vLLM sets "align" for GDN hybrids whenever prefix caching is on; "none" is what it
        # runs with prefix caching off, and "align" has nothing to align to without it.
        if self.mamba_cache_mode == "align" and not self.enable_prefix_caching:
            raise ValueError("mamba_cache_mode 'align' needs enable_prefix_caching: true")
        if self.mamba_cache_mode == "none" and self.enable_prefix_caching:
            raise ValueError("mamba_cache_mode 'none' needs enable_prefix_caching: false "
                             "(vLLM turns a GDN hybrid's prefix caching into 'align')")
        return self

    @property
    def resolved_mamba_cache_mode(self) -> Literal["none", "align"]:
        return self.mamba_cache_mode or ("align" if self.enable_prefix_caching else "none")

    def sampling_path(self, model_default: SamplingPath) -> SamplingPath:
        """The sampler path the steps run, given the model's `generation_sampling`."""
        return model_default if self.sampling == "model" else self.sampling

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_cache_dtype]
