"""vLLM 0.17.1's scheduler and KV-cache manager, built for a model of configs/models without a GPU.

The engine core builds them in `EngineCore._initialize_kv_caches` and `Scheduler.__init__`
(vllm/v1/engine/core.py, vllm/v1/core/sched/scheduler.py): the layers' KV-cache specs
(`Attention.get_kv_cache_spec`; `MambaBase.get_kv_cache_spec` for a GDN layer,
vllm/model_executor/layers/mamba/abstract.py) grouped by `get_kv_cache_groups`
(vllm/v1/core/kv_cache_utils.py) into a `KVCacheConfig` of the pool's block count. Here the
specs are made from the model's configuration as vLLM's would be: an attention layer's block of
`block_tokens` tokens, a GDN layer's state (conv and SSM) padded to the attention page, in
blocks of `max_model_len` tokens for mamba cache mode "none" and of the attention block with
prefix caching (mode "align"; `HybridAttentionMambaModelConfig`, vllm/model_executor/models/config.py).
With prefix caching every request gets vLLM's block hasher (`get_request_block_hasher`, sha256,
vLLM's default) over prompt ids of its own, so no two requests share a block, as the simulator
assumes (docs/validation.md: the published prompts share next to none). The configuration objects the scheduler reads are vLLM's
own where they build without a model checkpoint (`SchedulerConfig`, `CacheConfig`,
`ParallelConfig`, `ObservabilityConfig`); the model's is a namespace of the three fields the
scheduler reads. No multimodal input and no grammar is scheduled, so the registry says none is supported and the
structured-output manager is its first test.
"""
from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
from vllm.config import CacheConfig, ObservabilityConfig, ParallelConfig, SchedulerConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_kv_cache_groups, get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, MambaSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from core.config import EngineConfig, load_model
from sim.engine.budget import served_model

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SAMPLED_TOKEN = 0  # the token id every sampled position gets; only the counts matter here


class _NoMultimodal:
    def supports_multimodal_inputs(self, model_config) -> bool:
        return False


class _NoStructuredOutput:
    """`StructuredOutputManager.should_advance` for requests without a grammar: its first test."""

    def should_advance(self, request: Request) -> bool:
        return request.use_structured_output


def layer_specs(model, block_tokens: int, max_model_len: int, mamba_cache_mode: str) -> dict:
    """Every layer's KV-cache spec, by a layer name of vLLM's form."""
    tp = model.tensor_parallel
    att, gdn = model.attention, model.gdn
    kv_dtype = torch.float8_e4m3fn if model.kv_dtype_bytes == 1 else DTYPES[model.dtype]
    attn = FullAttentionSpec(block_size=block_tokens, num_kv_heads=max(att.num_kv_heads // tp, 1),
                             head_size=att.head_dim, dtype=kv_dtype)
    conv_dim = (2 * gdn.num_k_heads * gdn.head_k_dim + gdn.num_v_heads * gdn.head_v_dim) // tp
    state = MambaSpec(block_size=block_tokens if mamba_cache_mode == "align" else max_model_len, shapes=((conv_dim, gdn.conv_kernel - 1),
                                                        (gdn.num_v_heads // tp, gdn.head_v_dim, gdn.head_k_dim)),
                      dtypes=(DTYPES[model.dtype], DTYPES[model.mamba_ssm_dtype]),
                      page_size_padded=attn.page_size_bytes, mamba_type="gdn_attention",
                      mamba_cache_mode=mamba_cache_mode)
    if attn.page_size_bytes < _state_bytes(state):
        raise ValueError(f"{model.name}: an attention block of {block_tokens} tokens ({attn.page_size_bytes} B) is "
                         f"smaller than one GDN state ({_state_bytes(state)} B): not the run's block layout")
    pattern = model.layer_pattern
    return {f"model.layers.{i}.{'self_attn.attn' if pattern[i % len(pattern)] == 'attn' else 'linear_attn'}":
            (attn if pattern[i % len(pattern)] == "attn" else state) for i in range(model.num_layers)}


def _state_bytes(spec: MambaSpec) -> int:
    return sum(int(torch.Size(s).numel()) * torch.tensor([], dtype=d).element_size()
               for s, d in zip(spec.shapes, spec.dtypes))


def make_scheduler(*, model: str, model_overrides: dict, engine: dict, num_blocks: int, block_tokens: int,
                   max_num_seqs: int, max_num_batched_tokens: int, async_scheduling: bool,
                   mamba_cache_mode: str) -> tuple[Scheduler, Callable | None]:
    """vLLM's scheduler for a run, and the block hasher its requests carry (None without prefix
    caching): `engine` is the run's config.yaml engine section, the rest its summary's resolved
    values (block count and size, limits, async scheduling, mamba cache mode)."""
    cfg_model = served_model(load_model(model, model_overrides), EngineConfig(**engine))
    max_model_len = cfg_model.max_model_len
    caching = mamba_cache_mode == "align"
    sched_cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                max_model_len=max_model_len, is_encoder_decoder=False,
                                async_scheduling=async_scheduling)
    cache_cfg = CacheConfig(block_size=block_tokens, enable_prefix_caching=caching, mamba_cache_mode=mamba_cache_mode)
    cache_cfg.num_gpu_blocks = num_blocks
    vllm_config = SimpleNamespace(
        scheduler_config=sched_cfg, cache_config=cache_cfg, lora_config=None, kv_events_config=None,
        kv_transfer_config=None, ec_transfer_config=None, speculative_config=None,
        parallel_config=ParallelConfig(), observability_config=ObservabilityConfig(),
        model_config=SimpleNamespace(is_encoder_decoder=False, max_model_len=max_model_len,
                                     enable_return_routed_experts=False))
    groups = get_kv_cache_groups(vllm_config, layer_specs(cfg_model, block_tokens, max_model_len, mamba_cache_mode))
    kv_cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cls = AsyncScheduler if async_scheduling else Scheduler
    sched = cls(vllm_config=vllm_config, kv_cache_config=kv_cfg, structured_output_manager=_NoStructuredOutput(),
                block_size=block_tokens, mm_registry=_NoMultimodal())
    if not caching:
        return sched, None
    hash_fn = get_hash_fn_by_name(cache_cfg.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return sched, get_request_block_hasher(block_tokens, hash_fn)


def new_request(rid: int, prompt_tokens: int, output_tokens: int, arrival_s: float,
                block_hasher: Callable | None) -> Request:
    """A request as the engine core makes it (`Request.from_engine_core_request`): prompt ids of
    its own (no block in common with another request), `max_tokens` its output, EOS ignored."""
    params = SamplingParams(max_tokens=output_tokens, ignore_eos=True)
    return Request(str(rid), [rid + 1] * prompt_tokens, params, None, arrival_time=arrival_s,
                   block_hasher=block_hasher)


def model_output(scheduler_output, sampling: list[str]) -> ModelRunnerOutput:
    """What the model runner returns for a step: one sampled token for each request in `sampling`
    (its step reached the end of its known tokens), none for a prompt chunk short of its end."""
    ids = list(scheduler_output.num_scheduled_tokens)
    take = set(sampling)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[SAMPLED_TOKEN] if r in take else [] for r in ids])
