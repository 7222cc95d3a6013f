"""The measurement grid: which shapes each table is timed at, in full and --quick form.

The base grid (B 1..512, verify positions 1..64, contexts 1K..32K, prefill chunks
128..8192) plus what the simulator also reaches: 1.5x steps between powers of two
on the first axis of every graph-mode table (for interpolation and the held-out
check), 16384-token steps (the derived B200 profile schedules 16K tokens), and a
256-token context (short chats). Eager mode, where small shapes time Python's
launches, keeps the base grid's 2x steps on the attention tables.
"""
from __future__ import annotations

from dataclasses import dataclass

TOKENS_FULL = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
               1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
TOKENS_QUICK = (1, 4, 16, 64, 256, 1024, 4096, 16384)
DECODE_B_FULL = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
DECODE_B_EAGER = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DECODE_B_QUICK = (1, 8, 64, 512)
DECODE_B_EAGER_QUICK = (1, 64, 512)
DECODE_P_FULL = (1, 2, 4, 8, 16, 40, 64)
DECODE_P_QUICK = (1, 4, 64)
DECODE_CTX_FULL = (256, 1024, 4096, 16384, 32768)
DECODE_CTX_QUICK = (256, 4096, 32768)
PREFILL_CHUNK_FULL = (128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
PREFILL_CHUNK_EAGER = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREFILL_CHUNK_QUICK = (128, 1024, 16384)
PREFILL_CHUNK_EAGER_QUICK = (128, 16384)
PREFILL_CTX_FULL = (0, 1024, 4096, 16384, 32768)
PREFILL_CTX_QUICK = (0, 32768)
# --grid coarse: every axis in 2x steps (about half the full grid's shapes), for a model measured
# within a short GPU run; interpolation is log-log along these axes, so 2x steps cost accuracy
# only where a curve bends between them (calibrate validate's held-out check says how much).
TOKENS_COARSE = tuple(1 << i for i in range(15))  # 1 .. 16384
DECODE_P_COARSE = (1, 2, 4, 16, 64)  # 1: no speculation and the drafter's passes; 4: a chain of 3
# Whole-step check shapes: (B, verify positions, context) of pure speculative decode.
STEP_SHAPES_FULL = ((1, 4, 4096), (16, 4, 4096), (64, 4, 4096), (128, 4, 1024), (32, 40, 4096))
STEP_SHAPES_QUICK = ((4, 4, 1024),)
STEP_SHAPES_COARSE = ((1, 4, 4096), (64, 4, 4096), (128, 4, 1024))
ACTIVATION_TOKENS = (2048, 4096, 8192, 16384)  # max_num_batched_tokens values to profile

# --part N: each part fits one GPU run of a few minutes per model.
PARTS: dict[int, tuple[str, ...]] = {
    1: ("gdn", "attn_proj", "moe", "mlp", "lm_head", "mtp_fc"),
    2: ("attn_decode", "attn_prefill"),
    3: ("memory", "step_check", "gdn_prefill", "gdn_decode_conv", "kernels"),
}
ALL_JOBS: tuple[str, ...] = tuple(j for part in PARTS.values() for j in part)
FFN_JOBS = {False: "moe", True: "mlp"}  # the feed-forward table of an MoE model / a dense one


def model_jobs(jobs: tuple[str, ...], dense: bool) -> tuple[str, ...]:
    """The jobs that apply to a model: a dense model has no MoE table, an MoE model no MLP table."""
    return tuple(j for j in jobs if j != FFN_JOBS[not dense])


@dataclass(frozen=True)
class Grid:
    tokens: tuple[int, ...]
    decode_b: tuple[int, ...]
    decode_p: tuple[int, ...]
    decode_ctx: tuple[int, ...]
    prefill_chunk: tuple[int, ...]
    prefill_ctx: tuple[int, ...]
    step_shapes: tuple[tuple[int, int, int], ...]
    activation_tokens: tuple[int, ...]
    decode_b_eager: tuple[int, ...] | None = None  # None: same as decode_b
    prefill_chunk_eager: tuple[int, ...] | None = None
    name: str = "full"  # what the provenance records

    def first_axis(self, values: tuple[int, ...], eager: tuple[int, ...] | None, mode: str) -> tuple[int, ...]:
        return eager if mode == "eager" and eager is not None else values


FULL = Grid(TOKENS_FULL, DECODE_B_FULL, DECODE_P_FULL, DECODE_CTX_FULL, PREFILL_CHUNK_FULL,
            PREFILL_CTX_FULL, STEP_SHAPES_FULL, ACTIVATION_TOKENS, DECODE_B_EAGER, PREFILL_CHUNK_EAGER)
QUICK = Grid(TOKENS_QUICK, DECODE_B_QUICK, DECODE_P_QUICK, DECODE_CTX_QUICK, PREFILL_CHUNK_QUICK,
             PREFILL_CTX_QUICK, STEP_SHAPES_QUICK, ACTIVATION_TOKENS, DECODE_B_EAGER_QUICK,
             PREFILL_CHUNK_EAGER_QUICK, "quick")
COARSE = Grid(TOKENS_COARSE, DECODE_B_EAGER, DECODE_P_COARSE, DECODE_CTX_FULL, PREFILL_CHUNK_EAGER,
              PREFILL_CTX_FULL, STEP_SHAPES_COARSE, ACTIVATION_TOKENS, DECODE_B_EAGER, PREFILL_CHUNK_EAGER, "coarse")
GRIDS = {g.name: g for g in (FULL, COARSE, QUICK)}


def jobs_for_part(part: int | None) -> tuple[str, ...]:
    if part is None:
        return ALL_JOBS
    if part not in PARTS:
        raise ValueError(f"--part must be one of {', '.join(map(str, PARTS))} (or omitted for all), got {part}")
    return PARTS[part]
