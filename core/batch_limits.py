"""The step limits as vLLM resolves them at start-up: `max_num_batched_tokens` and `max_num_seqs`.

vLLM 0.17.1, `engine/arg_utils.py` `EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`
(docs/vllm.md#performance-mode): a limit the user leaves unset takes the GPU's default for the
OpenAI server (`get_batch_defaults`: the hardware YAML's values), doubled under
`--performance-mode throughput`; a defaulted token budget is then capped at `max_num_seqs x
max_model_len` (chunked prefill is always on for these models, so the rule that raises it to
`max_model_len` without chunking does not apply), and a defaulted `max_num_seqs` at the token
budget. A value the user sets is taken as given, in every mode.
"""
from __future__ import annotations

from typing import NamedTuple

from core.config_engine import EngineConfig
from core.config_hardware import HardwareConfig

THROUGHPUT_SCALE = 2  # `performance_mode == "throughput"` doubles both defaults


class BatchLimits(NamedTuple):
    max_num_batched_tokens: int
    max_num_seqs: int


def batch_limits(engine: EngineConfig, hw: HardwareConfig, max_model_len: int) -> BatchLimits:
    """The token budget and sequence cap the engine runs with; `max_model_len` as served."""
    scale = THROUGHPUT_SCALE if engine.performance_mode == "throughput" else 1
    seqs = engine.max_num_seqs if engine.max_num_seqs is not None else hw.max_num_seqs * scale
    tokens = engine.max_num_batched_tokens
    if tokens is None:
        tokens = min(seqs * max_model_len, hw.max_num_batched_tokens * scale)
    if engine.max_num_seqs is None:
        seqs = min(seqs, tokens)
    return BatchLimits(tokens, seqs)
