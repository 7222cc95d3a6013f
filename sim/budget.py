"""How much HBM the KV/state pool gets, and how vLLM's hybrid allocator cuts it into blocks.

DESIGN.md section 5: requested = device memory x gmu; pool = requested - weights -
activation peak - non-torch memory - CUDA-graph memory. One block pool serves the
attention group and the GDN groups; one block holds one page per layer of its group,
and the attention block size is enlarged until an attention page equals a GDN page.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from core.config import REPO_ROOT, ConfigError, EngineConfig, GiB, HardwareConfig, MiB, ModelConfig
from policies import CommitPolicy

ATTN_BLOCK_ALIGN = 16  # tokens: vLLM rounds the enlarged attention block size to the kernel block


@dataclass(frozen=True)
class MemoryBudget:
    device_bytes: int
    gmu: float
    requested_bytes: int
    weight_bytes: int
    activation_bytes: int
    activation_source: str  # "calibrated" or "analytic"
    non_torch_bytes: int
    cudagraph_bytes: int
    pool_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


def analytic_activation_bytes(model: ModelConfig, max_tokens: int, max_seqs: int) -> int:
    """Peak of vLLM's profiling forward of max_tokens tokens, per GPU, from tensor sizes.

    Residual stream, norm output and projection outputs (about 8 hidden-sized bf16
    buffers), the MoE gate/up output and activation for top-k routed tokens, and the
    sampler's float32 logits and probabilities for max_seqs rows (vLLM profiles the
    sampler with max_num_seqs dummy rows).
    """
    tp = model.tensor_parallel
    hidden = max_tokens * model.hidden_size * 2 * 8
    moe = max_tokens * model.moe.top_k * model.moe.expert_width * 2 * 2 * 2 // tp
    sampler = max_seqs * model.vocab_size * 4 * 2 // tp
    return hidden + moe + sampler


def calibrated_activation_bytes(model: ModelConfig, hw: HardwareConfig, max_tokens: int) -> int | None:
    """The activation peak the calibrator measured for this model and token budget, if any."""
    if not hw.calibration_dir:
        return None
    path = REPO_ROOT / hw.calibration_dir / model.name / "memory.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    peaks = {int(k): int(v) for k, v in data.get("activation_peak_bytes", {}).items()}
    return peaks.get(max_tokens)


def memory_budget(model: ModelConfig, hw: HardwareConfig, engine: EngineConfig) -> MemoryBudget:
    max_tokens = engine.max_num_batched_tokens or hw.max_num_batched_tokens
    max_seqs = engine.max_num_seqs or hw.max_num_seqs
    device = hw.memory_bytes
    requested = int(device * engine.gmu)
    weights = model.weight_bytes_per_gpu
    if engine.activation_peak_mib is not None:
        act, act_src = int(engine.activation_peak_mib * MiB), "config"
    elif (cal := calibrated_activation_bytes(model, hw, max_tokens)) is not None:
        act, act_src = cal, "calibrated"
    else:
        act, act_src = analytic_activation_bytes(model, max_tokens, max_seqs), "analytic"
    non_torch = int(hw.non_torch_memory_mib * MiB)
    graphs = int(hw.cudagraph_memory_mib * MiB)
    pool = requested - weights - act - non_torch - graphs
    if pool <= 0:
        need = weights + act + non_torch + graphs
        raise ConfigError(
            f"model {model.name} does not fit on {hw.name} at gmu {engine.gmu}: it needs "
            f"{need / GiB:.2f} GiB per GPU (weights {weights / GiB:.2f} + activations {act / GiB:.2f} + "
            f"non-torch {non_torch / GiB:.2f} + CUDA graphs {graphs / GiB:.2f}) but gmu x "
            f"{device / GiB:.2f} GiB = {requested / GiB:.2f} GiB; {-pool / GiB:.2f} GiB missing "
            f"(raise gmu to at least {min(1.0, need / device + 0.005):.3f} or use more tensor parallelism)"
        )
    return MemoryBudget(device, engine.gmu, requested, weights, act, act_src, non_torch, graphs, pool)


@dataclass(frozen=True)
class BlockLayout:
    """Per-GPU block geometry of the hybrid allocator for one model and policy."""

    group_layers: int  # layers per KV-cache group
    attn_groups: int
    gdn_groups: int
    page_bytes: int  # one layer's page (the GDN page; attention pages padded up to it)
    attn_block_tokens: int
    state_blocks_per_group: int  # 1 + the policy's speculative blocks
    cache_blocks: int  # extra blocks for a policy's input cache (replay)
    num_blocks: int

    @property
    def block_bytes(self) -> int:
        return self.page_bytes * self.group_layers

    def attn_blocks(self, tokens: int) -> int:
        return self.attn_groups * -(-tokens // self.attn_block_tokens)

    @property
    def state_blocks(self) -> int:
        """Blocks a request takes at admission for its GDN state (all GDN groups)."""
        return self.gdn_groups * self.state_blocks_per_group + self.cache_blocks

    def blocks_for(self, tokens: int) -> int:
        return self.attn_blocks(tokens) + self.state_blocks


def block_layout(model: ModelConfig, policy: CommitPolicy, pool_bytes: int) -> BlockLayout:
    group = math.gcd(model.attn_layers, model.gdn_layers)
    gdn_page = model.gdn_page_bytes_per_gpu(model.mtp_depth)
    per_token = model.attn_page_bytes_per_token_per_gpu
    tokens = -(-gdn_page // per_token)
    tokens = -(-tokens // ATTN_BLOCK_ALIGN) * ATTN_BLOCK_ALIGN
    page = max(gdn_page, tokens * per_token)
    block_bytes = page * group
    cache = -(-policy.cache_bytes_per_seq_per_gpu() // block_bytes)
    return BlockLayout(
        group_layers=group,
        attn_groups=model.attn_layers // group,
        gdn_groups=model.gdn_layers // group,
        page_bytes=page,
        attn_block_tokens=tokens,
        state_blocks_per_group=policy.state_blocks_per_layer(),
        cache_blocks=cache,
        num_blocks=pool_bytes // block_bytes,
    )

