"""The served model's schema: its layer pattern, GDN and attention shapes, feed-forward block,
and the state and KV sizes derived from them."""
from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from core.config_base import DTYPE_BYTES, DType, SamplingPath, Strict
from core.weight_bytes import FP8_BYTES, fp8_weight_bytes


class GDNConfig(Strict):
    num_k_heads: int = Field(gt=0)  # q/k heads
    num_v_heads: int = Field(gt=0)
    head_k_dim: int = Field(gt=0)
    head_v_dim: int = Field(gt=0)
    conv_kernel: int = Field(4, gt=0)

    @model_validator(mode="after")
    def _grouped(self) -> "GDNConfig":
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"num_v_heads ({self.num_v_heads}) must be a multiple of num_k_heads ({self.num_k_heads})")
        return self


class AttentionConfig(Strict):
    num_q_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    gated: bool = True
    # HF partial_rotary_factor: RoPE turns this fraction of each head's channels (Qwen3.5 / Qwen3-Next: 64 of 256)
    partial_rotary_factor: float = Field(0.25, gt=0, le=1)

    @model_validator(mode="after")
    def _grouped(self) -> "AttentionConfig":
        # vLLM's Attention layer asserts num_heads % num_kv_heads == 0 (layers/attention/attention.py)
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} does not divide num_q_heads {self.num_q_heads}: each "
                             "KV head serves a whole group of query heads; allowed: a divisor of num_q_heads")
        return self

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)


class MoEConfig(Strict):
    num_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    shared_experts: int = Field(1, ge=0)
    expert_width: int = Field(gt=0)  # intermediate size of one expert
    # HF shared_expert_intermediate_size / shared_experts when it differs from expert_width
    shared_expert_width: int | None = Field(None, gt=0)

    @property
    def shared_width(self) -> int:
        """Intermediate width of all shared experts together."""
        return self.shared_experts * (self.shared_expert_width or self.expert_width)


class MLPConfig(Strict):
    """A dense SwiGLU MLP after every layer (gate and up projections, then down), where MoE models have experts."""
    intermediate_size: int = Field(gt=0)


class ModelConfig(Strict):
    name: str
    hidden_size: int = Field(gt=0)
    # One period of the layer pattern, repeated num_layers / len(pattern) times.
    layer_pattern: list[Literal["gdn", "attn"]]
    num_layers: int = Field(gt=0)
    gdn: GDNConfig
    attention: AttentionConfig
    # The feed-forward block after every layer: exactly one of the two.
    moe: MoEConfig | None = None
    mlp: MLPConfig | None = None
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False  # HF tie_word_embeddings: the LM head is the embedding matrix
    total_params: float = Field(gt=0)  # parameters incl. embeddings, MTP layer
    active_params: float = Field(gt=0)
    tensor_parallel: int = Field(1, gt=0)
    mtp_depth: int = Field(3, ge=0)  # K: drafter passes per step (vLLM's num_speculative_tokens); 0: no MTP
    mtp_num_hidden_layers: int = Field(1, ge=0)  # MTP drafter layers: full-attention layers in the KV pool
    max_model_len: int = Field(262144, gt=0)
    weight_dtype_bytes: int = Field(2, gt=0)  # the checkpoint's unquantised tensors
    # The checkpoint: bf16, or block-FP8 (its quantization_config: docs/fp8.md), whose
    # weight bytes come from its tensor list and whose calibration is its own folder.
    weights: Literal["bf16", "fp8"] = "bf16"
    dtype: DType = "bfloat16"  # HF torch_dtype: activations and the conv state
    # HF config's mamba_ssm_dtype, which vLLM's mamba_ssm_cache_dtype=auto takes (Qwen3.5:
    # float32); a model without the field (Qwen3-Next) keeps its SSM state in `dtype`.
    mamba_ssm_dtype: DType = "bfloat16"
    kv_dtype_bytes: int = Field(2, gt=0)  # set from engine.kv_cache_dtype by sim.engine.budget.served_model
    # The sampling path of a request that sends no sampling parameters: vLLM applies the checkpoint's
    # generation_config.json (--generation-config auto): "top_k_top_p" when it sets top_k or top_p,
    # "greedy" at temperature 0, else "random" (vLLM's own default, temperature 1). docs/sampling.md.
    generation_sampling: SamplingPath = "random"

    @property
    def state_dtype_bytes(self) -> int:
        """Bytes per SSM-state element (kernel and latency tables are keyed by it too)."""
        return DTYPE_BYTES[self.mamba_ssm_dtype]

    @property
    def conv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @model_validator(mode="after")
    def _pattern(self) -> "ModelConfig":
        if self.num_layers % len(self.layer_pattern):
            raise ValueError(f"num_layers ({self.num_layers}) is not a multiple of the layer_pattern length ({len(self.layer_pattern)})")
        if (self.moe is None) == (self.mlp is None):
            raise ValueError("give exactly one feed-forward block: moe (experts) or mlp (dense, intermediate_size)")
        return self

    @property
    def dense(self) -> bool:
        """A dense MLP, not experts, after every layer."""
        return self.mlp is not None

    # Derived quantities, model-wide (all TP ranks together) unless named _per_gpu.
    @property
    def gdn_layers(self) -> int:
        return self.num_layers // len(self.layer_pattern) * self.layer_pattern.count("gdn")

    @property
    def attn_layers(self) -> int:
        return self.num_layers - self.gdn_layers

    @property
    def pool_attn_layers(self) -> int:
        """Full-attention layers holding KV in the pool: the target's, plus the MTP drafter's when it drafts."""
        return self.attn_layers + (self.mtp_num_hidden_layers if self.mtp_depth > 0 else 0)

    @property
    def gdn_state_bytes_per_layer(self) -> int:
        g = self.gdn
        return g.num_v_heads * g.head_v_dim * g.head_k_dim * self.state_dtype_bytes

    def conv_state_bytes_per_layer(self) -> int:
        """Conv rolling window: kernel - 1 past inputs plus K lookahead slots (vLLM)."""
        g = self.gdn
        channels = 2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim
        return channels * (g.conv_kernel - 1 + self.mtp_depth) * self.conv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        a = self.attention
        return self.attn_layers * 2 * a.num_kv_heads * a.head_dim * self.kv_dtype_bytes

    # Per-GPU shards under tensor parallelism (vLLM replicates KV heads when TP > heads).
    @property
    def kv_heads_per_gpu(self) -> int:
        return max(1, self.attention.num_kv_heads // self.tensor_parallel)

    def gdn_page_bytes_per_gpu(self, spec_tokens: int) -> int:
        """One GDN layer's page for one sequence on one GPU: SSM state + conv state."""
        g = self.gdn
        tp = self.tensor_parallel
        ssm = g.num_v_heads // tp * g.head_v_dim * g.head_k_dim * self.state_dtype_bytes
        channels = (2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim) // tp
        conv = channels * (g.conv_kernel - 1 + spec_tokens) * self.conv_dtype_bytes
        return ssm + conv

    @property
    def attn_page_bytes_per_token_per_gpu(self) -> int:
        a = self.attention
        return 2 * self.kv_heads_per_gpu * a.head_dim * self.kv_dtype_bytes

    @property
    def weight_bytes_per_gpu(self) -> int:
        if self.weights == "fp8":
            return math.ceil(fp8_weight_bytes(self) / self.tensor_parallel)
        return math.ceil(self.total_params * self.weight_dtype_bytes / self.tensor_parallel)

    @property
    def projection_weight_bytes(self) -> int:
        """Bytes per element of the dense projections and experts a step reads."""
        return FP8_BYTES if self.weights == "fp8" else self.weight_dtype_bytes

    @property
    def calibration_name(self) -> str:
        """The calibration folder of this checkpoint: an FP8 checkpoint never reads bf16 tables."""
        if self.weights == "fp8" and not self.name.endswith("-fp8"):
            return f"{self.name}-fp8"
        return self.name
