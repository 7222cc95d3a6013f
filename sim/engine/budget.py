"""How much HBM the KV/state pool gets, and how vLLM's hybrid allocator cuts it into blocks.

The rules are vLLM's (docs/vllm.md#gdn-state to #memory-profiling-and-defaults; docs/memory.md has each
number's source):
- budget: device memory x gmu - weights - the profile run's peak - non-torch memory -
  CUDA-graph memory (or the available KV memory given outright, `--kv-cache-memory`);
- the profile run's peak is that of a dummy forward of max_num_batched_tokens, then a
  dummy sampler over max_num_seqs rows of the whole vocabulary in fp32; the two run one
  after the other, so the peak is the larger of the two;
- layers are grouped into KV-cache groups of one size (padding layers fill the last
  group of a kind), the MTP drafter's attention layer among them;
- the attention block is enlarged to a multiple of 16 tokens until its page holds a GDN
  page, and the GDN page is padded up to it; one block id costs page x group size;
- a request holds ceil(tokens / block) blocks per attention group and, per GDN group,
  1 + k state blocks; in mamba cache mode "align" one more for a step after it crosses a
  block boundary, which vLLM's startup check and concurrency report count as always held.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from core.batch_limits import batch_limits
from core.calibration_files import model_file
from core.config import (CONFIG_DIR, REPO_ROOT, ConfigError, EngineConfig, GiB, HardwareConfig, MiB, ModelConfig,
                         load_model, validate)
from policies import CommitPolicy
from sim.engine.vllm_version import CURRENT, kv_cache_size_tokens

ATTN_BLOCK_ALIGN = 16  # tokens: the attention backends' kernel block alignment (MultipleOf(16))
GROUP_SIZE_SLACK = 1.5  # vLLM groups by the largest layer count when it is under 1.5x the smallest
# The profile run's sampler peak until profile_peak.json is measured: docs/notes/2026-11-29-h200-reference-points.md's
# emulation (fp32 logits, temperature, top-k/top-p by a full sort as vLLM's torch fallback
# does, softmax, exponential race) peaked 8.5 GiB above the weights at 1,024 rows of the
# 248,320-token vocabulary; its buffers are rows x vocab, so it scales with both (the
# same emulation gave 5.2 GiB at vocabulary 151,936: 8.5 x 151,936 / 248,320 = 5.20).
SAMPLER_ANCHOR_BYTES = 8.5 * GiB
SAMPLER_ANCHOR_ROWS = 1024
SAMPLER_ANCHOR_VOCAB = 248320
PROFILE_PEAK_FILE = "profile_peak.json"  # written by calibrate/benches/profile_peak.py
MEMORY_FILE = "memory.json"  # the forward peaks the calibrator measured


def served_model(model: ModelConfig, engine: EngineConfig) -> ModelConfig:
    """The model as this engine serves it: KV-cache dtype and max_model_len from the engine."""
    update = {"kv_dtype_bytes": engine.kv_dtype_bytes}
    if engine.max_model_len is not None:
        if engine.max_model_len > model.max_model_len and not engine.allow_long_max_model_len:
            # vLLM's ModelConfig refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (docs/vllm.md#startup-checks)
            raise ConfigError(f"engine.max_model_len {engine.max_model_len:,} is above {model.name}'s maximum of "
                              f"{model.max_model_len:,} tokens; allowed: 1 to {model.max_model_len:,} (vLLM refuses "
                              "it too unless told otherwise: set engine.allow_long_max_model_len=true to override)")
        update["max_model_len"] = engine.max_model_len
    return validate(ModelConfig, {**model.model_dump(), **update}, f"model {model.name} served with {update}")


@dataclass(frozen=True)
class MemoryBudget:
    device_bytes: int
    gmu: float
    requested_bytes: int
    weight_bytes: int
    forward_peak_bytes: int  # dummy forward of max_num_batched_tokens
    sampler_peak_bytes: int  # dummy sampler (and rejection sampler) over max_num_seqs rows
    activation_bytes: int  # the profile run's peak: what the budget subtracts
    activation_source: str  # "measured", "config", or "estimate: ..." naming each part's source
    non_torch_bytes: int
    cudagraph_bytes: int
    pool_bytes: int  # vLLM's "Available KV cache memory"
    pool_source: str  # "profiled" (from gmu) or "given" (--kv-cache-memory)

    def as_dict(self) -> dict:
        return asdict(self)


def analytic_forward_bytes(model: ModelConfig, max_tokens: int) -> int:
    """Peak of the dummy forward of max_tokens tokens, per GPU, from tensor sizes.

    Residual stream, norm output and projection outputs (about 8 hidden-sized bf16
    buffers), and the feed-forward gate/up output and activation: for the top-k routed
    tokens of an MoE, for every token of a dense MLP.
    """
    hidden = max_tokens * model.hidden_size * 2 * 8
    width = model.mlp.intermediate_size if model.mlp else model.moe.top_k * model.moe.expert_width
    return hidden + max_tokens * width * 2 * 2 * 2 // model.tensor_parallel


def estimated_sampler_bytes(model: ModelConfig, max_tokens: int, max_seqs: int) -> int:
    """The sampler phase's peak: the forward's output hidden states, the gathered bf16 logits
    (every TP rank holds the whole vocabulary), and the sampler's own buffers (docs/notes/2026-11-29-h200-reference-points.md)."""
    rows = min(max_seqs, max_tokens)  # one dummy request per row, at most one token each
    hidden = max_tokens * model.hidden_size * 2
    logits = rows * model.vocab_size * 2
    sampler = SAMPLER_ANCHOR_BYTES * rows / SAMPLER_ANCHOR_ROWS * model.vocab_size / SAMPLER_ANCHOR_VOCAB
    return hidden + logits + int(sampler)


def _calibration_file(model: ModelConfig, hw: HardwareConfig, name: str) -> Path | None:
    """One of the model's calibration files, if it exists and was measured at this tensor parallelism."""
    if not hw.calibration_dir:
        return None
    path = model_file(REPO_ROOT / hw.calibration_dir, model.calibration_name, name)
    yaml_path = CONFIG_DIR / "models" / f"{model.name}.yaml"
    if not path.is_file() or not yaml_path.exists():
        return None
    # The committed YAML's tensor parallelism is the one the calibrator measured at.
    return path if load_model(model.name).tensor_parallel == model.tensor_parallel else None


def calibrated_activation_bytes(model: ModelConfig, hw: HardwareConfig, max_tokens: int) -> int | None:
    """The forward peak the calibrator measured (memory.json) for this model and token budget, if any."""
    path = _calibration_file(model, hw, MEMORY_FILE)
    if path is None:
        return None
    data = json.loads(path.read_text())
    peaks = {int(k): int(v) for k, v in data.get("activation_peak_bytes", {}).items()}
    return peaks.get(max_tokens)


def measured_profile_peak(model: ModelConfig, hw: HardwareConfig, max_tokens: int, max_seqs: int) -> dict | None:
    """The profile run calibrate/benches/profile_peak.py measured at exactly these settings, if any."""
    path = _calibration_file(model, hw, PROFILE_PEAK_FILE)
    if path is None:
        return None
    spec = model.mtp_depth > 0
    for p in json.loads(path.read_text()).get("points", []):
        if (p.get("status") == "ok" and p["max_num_batched_tokens"] == max_tokens and p["max_num_seqs"] == max_seqs
                and p["speculative"] == spec):
            return p
    return None


def profile_peak(model: ModelConfig, hw: HardwareConfig, engine: EngineConfig) -> tuple[int, int, int, str]:
    """(forward peak, sampler peak, profile-run peak, source) per GPU."""
    max_tokens, max_seqs = batch_limits(engine, hw, model.max_model_len)
    if engine.activation_peak_mib is not None:
        act = int(engine.activation_peak_mib * MiB)
        return act, 0, act, "config"
    if (m := measured_profile_peak(model, hw, max_tokens, max_seqs)) is not None:
        return m["forward_peak_bytes"], m["sampler_peak_bytes"], m["profile_peak_bytes"], "measured"
    sampler = estimated_sampler_bytes(model, max_tokens, max_seqs)
    if (fwd := calibrated_activation_bytes(model, hw, max_tokens)) is not None:
        fwd_src = "forward measured (memory.json)"
    else:
        fwd, fwd_src = analytic_forward_bytes(model, max_tokens), "forward analytic"
    return fwd, sampler, max(fwd, sampler), f"estimate: {fwd_src}, sampler scaled from the H200 reference point"


def memory_budget(model: ModelConfig, hw: HardwareConfig, engine: EngineConfig,
                  kv_cache_memory_bytes: int | None = None) -> MemoryBudget:
    """vLLM's KV budget per GPU; `kv_cache_memory_bytes` replaces the profiled one (vLLM --kv-cache-memory)."""
    device = hw.memory_bytes
    requested = int(device * engine.gmu)
    weights = model.weight_bytes_per_gpu
    fwd, sampler, act, act_src = profile_peak(model, hw, engine)
    non_torch = int(hw.non_torch_memory_mib * MiB)
    graphs = int(hw.cudagraph_memory_mib * MiB)
    if kv_cache_memory_bytes is not None:
        return MemoryBudget(device, engine.gmu, requested, weights, fwd, sampler, act, act_src, non_torch, graphs,
                            kv_cache_memory_bytes, "given")
    pool = requested - weights - act - non_torch - graphs
    if pool <= 0:
        need = weights + act + non_torch + graphs
        raise ConfigError(
            f"model {model.name} does not fit on {hw.name} at gmu {engine.gmu}: it needs "
            f"{need / GiB:.2f} GiB per GPU (weights {weights / GiB:.2f} + profile-run peak {act / GiB:.2f} + "
            f"non-torch {non_torch / GiB:.2f} + CUDA graphs {graphs / GiB:.2f}) but gmu x "
            f"{device / GiB:.2f} GiB = {requested / GiB:.2f} GiB; {-pool / GiB:.2f} GiB missing "
            f"(raise gmu to at least {min(1.0, need / device + 0.005):.3f} or raise tensor_parallel in configs/models/{model.name}.yaml, now {model.tensor_parallel})"
        )
    return MemoryBudget(device, engine.gmu, requested, weights, fwd, sampler, act, act_src, non_torch, graphs,
                        pool, "profiled")


# ------------------------------------------------------------------------ the block pool
@dataclass(frozen=True)
class KVCacheGroups:
    """vLLM's split of the layers into groups of one size (`_get_kv_cache_groups_uniform_page_size`)."""

    group_size: int  # layers per group; one block id spans this many pages
    attn_groups: int
    gdn_groups: int
    attn_padding_layers: int
    gdn_padding_layers: int


def kv_cache_groups(attn_layers: int, gdn_layers: int) -> KVCacheGroups:
    if attn_layers <= 0 or gdn_layers <= 0:
        raise ConfigError(f"a hybrid needs attention and GDN layers in its pool, got {attn_layers} and {gdn_layers}")
    lo, hi = min(attn_layers, gdn_layers), max(attn_layers, gdn_layers)
    size = hi if hi < lo * GROUP_SIZE_SLACK else lo
    attn_groups, gdn_groups = -(-attn_layers // size), -(-gdn_layers // size)
    return KVCacheGroups(size, attn_groups, gdn_groups, attn_groups * size - attn_layers,
                         gdn_groups * size - gdn_layers)


@dataclass(frozen=True)
class BlockLayout:
    """Per-GPU block geometry of the hybrid allocator for one model, policy and engine."""

    group_layers: int  # layers per KV-cache group
    attn_groups: int
    gdn_groups: int
    attn_padding_layers: int
    gdn_padding_layers: int
    gdn_page_bytes: int  # one GDN layer's state for one sequence, before padding
    page_bytes: int  # one layer's page: the attention page, the GDN page padded up to it
    attn_block_tokens: int
    state_blocks_per_group: int  # held between block boundaries: 1 + the policy's speculative blocks
    # Align mode: 1 more per GDN group from a block crossing to the request's next schedule; vLLM's
    # memory check and "Maximum concurrency" count it as held throughout (MambaSpec.max_memory_usage_bytes).
    boundary_blocks_per_group: int
    cache_blocks: int  # extra blocks for a policy's input cache (replay)
    num_blocks: int  # includes vLLM's null block, which no request ever holds

    @property
    def block_bytes(self) -> int:
        return self.page_bytes * self.group_layers

    @property
    def num_groups(self) -> int:
        return self.attn_groups + self.gdn_groups

    @property
    def mamba_page_padding_pct(self) -> float:
        return 100.0 * (self.page_bytes - self.gdn_page_bytes) / self.gdn_page_bytes

    def attn_blocks(self, tokens: int) -> int:
        return self.attn_groups * -(-tokens // self.attn_block_tokens)

    @property
    def state_blocks(self) -> int:
        """Blocks a request takes at admission for its GDN state (all GDN groups)."""
        return self.gdn_groups * self.state_blocks_per_group + self.cache_blocks

    @property
    def boundary_blocks(self) -> int:
        """Blocks a request holds besides, in align mode, once it crosses a block boundary (all GDN groups)."""
        return self.gdn_groups * self.boundary_blocks_per_group

    def blocks_for(self, tokens: int) -> int:
        return self.attn_blocks(tokens) + self.state_blocks

    @property
    def kv_cache_tokens(self) -> int:
        """vLLM's "GPU KV cache size": blocks shared out evenly over the groups, in tokens."""
        return self.num_blocks // self.num_groups * self.attn_block_tokens

    def max_concurrency(self, max_model_len: int) -> float:
        """vLLM's "Maximum concurrency for L tokens per request" (`get_max_concurrency_for_kv_cache_config`:
        each group's `max_memory_usage_bytes`, the boundary block included)."""
        return self.num_blocks / (self.blocks_for(max_model_len) + self.boundary_blocks)


def block_layout(model: ModelConfig, policy: CommitPolicy, pool_bytes: int,
                 engine: EngineConfig | None = None) -> BlockLayout:
    """`model` as served by `engine` (see `served_model`); engine None: vLLM's defaults."""
    engine = engine or EngineConfig()
    if model.kv_dtype_bytes != engine.kv_dtype_bytes:
        raise ValueError(f"model {model.name} has {model.kv_dtype_bytes}-byte KV but the engine's kv_cache_dtype is "
                         f"{engine.kv_cache_dtype}: pass sim.engine.budget.served_model(model, engine)")
    groups = kv_cache_groups(model.pool_attn_layers, model.gdn_layers)
    gdn_page = model.gdn_page_bytes_per_gpu(model.mtp_depth)
    per_token = model.attn_page_bytes_per_token_per_gpu
    tokens = ATTN_BLOCK_ALIGN * -(-gdn_page // (ATTN_BLOCK_ALIGN * per_token))
    page = tokens * per_token
    align = engine.resolved_mamba_cache_mode == "align"
    if model.mtp_depth > 0:
        state_blocks = policy.state_blocks_per_group()
        cache = -(-policy.cache_bytes_per_seq_per_gpu() // (page * groups.group_size))
    else:  # no speculation: every policy keeps the one running state
        state_blocks, cache = 1, 0
    return BlockLayout(
        group_layers=groups.group_size,
        attn_groups=groups.attn_groups,
        gdn_groups=groups.gdn_groups,
        attn_padding_layers=groups.attn_padding_layers,
        gdn_padding_layers=groups.gdn_padding_layers,
        gdn_page_bytes=gdn_page,
        page_bytes=page,
        attn_block_tokens=tokens,
        state_blocks_per_group=state_blocks,
        boundary_blocks_per_group=1 if align else 0,
        cache_blocks=cache,
        num_blocks=pool_bytes // page // groups.group_size,
    )


def padding_layer_lines(layout: BlockLayout, model: ModelConfig) -> list[str]:
    """vLLM's warning for each layer kind whose last group is padded."""
    lines = []
    for pad, layers in ((layout.attn_padding_layers, model.pool_attn_layers), (layout.gdn_padding_layers, model.gdn_layers)):
        if pad:
            lines.append(f"Add {pad} padding layers, may waste at most {100 * pad / layers:.2f}% KV cache memory")
    return lines


def vllm_log_lines(layout: BlockLayout, model: ModelConfig, pool_bytes: int, vllm_version: str = CURRENT) -> list[str]:
    """The startup lines vLLM prints for this pool, in the format of `vllm_version` (sim.engine.vllm_version)."""
    concurrency = layout.max_concurrency(model.max_model_len)
    kv_tokens = kv_cache_size_tokens(layout.num_blocks, layout.num_groups, layout.attn_block_tokens, concurrency,
                                     model.max_model_len, vllm_version)
    lines = [f"Setting attention block size to {layout.attn_block_tokens} tokens to ensure that attention page "
             f"size is >= mamba page size."]
    if layout.page_bytes != layout.gdn_page_bytes:
        lines.append(f"Padding mamba page size by {layout.mamba_page_padding_pct:.2f}% to ensure that mamba page "
                     f"size and attention page size are exactly equal.")
    lines += padding_layer_lines(layout, model)
    lines += [f"Available KV cache memory: {pool_bytes / GiB:.2f} GiB",
              f"GPU KV cache size: {kv_tokens:,} tokens",
              f"Maximum concurrency for {model.max_model_len:,} tokens per request: {concurrency:.2f}x"]
    return lines

