"""What differs between vLLM releases in what the simulator prints: the "GPU KV cache size" log line.

Up to 0.19 vLLM printed `num_blocks // len(kv_cache_groups) x block_size` tokens, which for a
hybrid shares the one block pool out evenly over the groups and counts attention blocks only:
for Qwen3.5 it disagrees with the "Maximum concurrency" line printed under it (vLLM issue 40691,
reported on 0.19.0). Newer releases print `int(max_concurrency x max_model_len)`, derived from
the concurrency line (`_report_kv_cache_config` in `vllm/v1/core/kv_cache_utils.py`, PR 38364;
PR 40694 proposed the same fix): a 0.24.0 log of Qwen3.6-35B-A3B shows it. docs/memory.md has
the formulas; `specsim memory --vllm-version` picks one.
"""
from __future__ import annotations

import re

from core.config import ConfigError

# The first release that prints the concurrency-derived size. The cited evidence brackets it
# between 0.19.0 (old form) and 0.24.0 (new form); releases in between are taken as new.
NEW_KV_SIZE_LOG = (0, 20)
CURRENT = "current"


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version such as 0.17.1, v0.19.0 or 0.24.0rc1; 'current' = the newest."""
    if text == CURRENT:
        return (10**6, 0)
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[.+\-]?\w+)*", text.strip())
    if not m:
        raise ConfigError(f"--vllm-version {text!r}: expected a release such as 0.17.1 or 0.24.0, or '{CURRENT}'")
    return int(m.group(1)), int(m.group(2))


def kv_cache_size_tokens(num_blocks: int, num_groups: int, block_tokens: int, max_concurrency: float,
                         max_model_len: int, version: str = CURRENT) -> int:
    """The number vLLM `version` prints as "GPU KV cache size: N tokens"."""
    if parse_version(version) >= NEW_KV_SIZE_LOG:
        return int(max_concurrency * max_model_len)
    return num_blocks // num_groups * block_tokens
