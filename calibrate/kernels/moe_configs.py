"""The fused MoE's launch configurations: a table per (experts, width, GPU), tuned on the GPU.

vLLM's structure (vllm/model_executor/layers/fused_moe/fused_moe.py, `get_config_file_name`,
`get_moe_configs`, `try_get_optimal_moe_config`; the tables in its `fused_moe/configs/`,
e.g. `E=256,N=512,device_name=NVIDIA_H100_80GB_HBM3.json`): one JSON file per number of
experts E, expert width N (per GPU) and device name, keyed by token count; a call takes
the entry whose token count is nearest its own. Our files have the same names and keys,
plus `sorted` (whether the pairs are grouped by expert: the small-batch path skips the
sort) and `down_block_n`; our gate+up GEMM carries gate and up as two [BLOCK_K, BLOCK_N]
tiles, so our BLOCK_N is half of vLLM's over its single [gate | up] N dimension.
`python3 -m calibrate.benches.moe_tune` writes them from timings; without a file for the
shapes and GPU, `default_config` (a heuristic by token count) is used.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

TABLE_DIR = Path(__file__).with_name("moe_configs")
_KEYS = {"sorted", "block_m", "block_n", "block_k", "num_warps", "num_stages", "group_m", "down_block_n"}


@dataclass(frozen=True)
class MoEConfig:
    sorted: bool  # group pairs by expert (large batches) or one pair per M-block
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8  # M-blocks sharing an N-column in launch order (L2 reuse of weights)
    down_block_n: int | None = None  # the down GEMM's N tile (hidden), default block_n


def default_config(tokens: int) -> MoEConfig:
    """Block sizes by token count, for shapes and GPUs without a tuned table."""
    if tokens <= 16:
        return MoEConfig(sorted=False, block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=4)
    if tokens <= 256:
        return MoEConfig(sorted=True, block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4)
    if tokens <= 2048:
        return MoEConfig(sorted=True, block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4)
    return MoEConfig(sorted=True, block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)


def shared_memory_bytes(cfg: MoEConfig, element_bytes: int = 2) -> int:
    """Shared memory a launch of `cfg` asks for: Triton's software pipeline keeps num_stages copies
    of each loop's tiles, the gate+up GEMM an A tile and two B tiles (gate and up), the down GEMM
    an A tile and one B tile; the launch needs the larger. (128, 256, 64) at 3 stages: 245,760 B,
    the figure Triton's OutOfResources gave on the H200.)"""
    a = cfg.block_m * cfg.block_k
    gate_up = a + 2 * cfg.block_k * cfg.block_n
    down = a + cfg.block_k * (cfg.down_block_n or cfg.block_n)
    return cfg.num_stages * max(gate_up, down) * element_bytes


def fitting(configs: list[MoEConfig], limit_bytes: int | None) -> list[MoEConfig]:
    """The configs whose launch fits `limit_bytes` of shared memory per block (None: all)."""
    return [c for c in configs if limit_bytes is None or shared_memory_bytes(c) <= limit_bytes]


def file_name(num_experts: int, width: int, device_name: str) -> str:
    """vLLM's naming: E experts (ours count the shared expert apart), N = each expert's width per GPU."""
    return f"E={num_experts},N={width},device_name={device_name.replace(' ', '_')}.json"


def parse_table(text: str, where: str) -> dict[int, MoEConfig]:
    raw = json.loads(text)
    table = {}
    for key, entry in raw.items():
        if not key.isdigit() or not isinstance(entry, dict) or set(entry) - _KEYS or "block_m" not in entry:
            raise ValueError(f"{where}: entry {key!r} must be a token count -> {{{', '.join(sorted(_KEYS))}}}")
        table[int(key)] = MoEConfig(**entry)
    if not table:
        raise ValueError(f"{where}: no entries")
    return table


def write_table(path: Path, table: dict[int, MoEConfig]) -> None:
    """Atomically: a half-written table would be read by the next call."""
    body = {str(t): asdict(c) for t, c in sorted(table.items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)


@functools.lru_cache(maxsize=None)
def load_table(num_experts: int, width: int, device_name: str,
               table_dir: Path = TABLE_DIR) -> dict[int, MoEConfig] | None:
    path = table_dir / file_name(num_experts, width, device_name)
    return parse_table(path.read_text(), str(path)) if path.is_file() else None


def nearest(table: dict[int, MoEConfig], tokens: int) -> MoEConfig:
    """vLLM's rule (`try_get_optimal_moe_config`): the entry at the nearest token count (ties: the smaller)."""
    return table[min(table, key=lambda t: (abs(t - tokens), t))]


def config_for(tokens: int, num_experts: int, width: int, device_name: str | None,
               table_dir: Path = TABLE_DIR) -> MoEConfig:
    table = load_table(num_experts, width, device_name, table_dir) if device_name else None
    return nearest(table, tokens) if table else default_config(tokens)
