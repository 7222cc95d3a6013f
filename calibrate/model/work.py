"""The minimum work of each timed call (pure Python): flops, and bytes with every weight the call touches
read once, GEMM inputs read and outputs written once, the KV cache read once. The layer tables'
`pct_bw` and `pct_flops` hold the measured times against these (calibrate/tables/measure.py)."""
from __future__ import annotations

from calibrate.model.shapes import LayerShapes


def gemm_work(n: int, k: int, m: int) -> tuple[float, float]:
    """flops and minimum bytes of [n, k] x [k, m] in bf16."""
    return gemms_work(n, ((k, m),), 2 * k * m)


def gemms_work(n: int, gemms: tuple[tuple[int, int], ...], weight_bytes: int) -> tuple[float, float]:
    """flops and minimum bytes of n tokens through GEMMs of (k, m): weight_bytes (the checkpoint's: bf16,
    or block-FP8 with its scales) read once, each GEMM's bf16 input read and output written once."""
    return sum(2.0 * n * k * m for k, m in gemms), weight_bytes + sum(2.0 * n * (k + m) for k, m in gemms)


def expected_experts(n: int, s: LayerShapes) -> float:
    """Distinct experts n tokens touch under uniform top-k routing."""
    return s.num_experts * (1.0 - (1.0 - s.top_k / s.num_experts) ** n)


def moe_work(s: LayerShapes, n: int) -> tuple[float, float]:
    """flops and minimum bytes of the MoE on n tokens: the experts they touch read once (the checkpoint's
    bytes: bf16, or block-FP8 with its scales), the other weights (shared expert, gates) once."""
    per_expert = 3 * s.hidden * s.expert_width
    flops = 2.0 * n * (s.top_k * per_expert + 3 * s.hidden * s.shared_width + s.hidden * s.num_experts)
    experts = s.expert_weight_bytes
    nbytes = (expected_experts(n, s) * experts + s.moe_weight_bytes - s.num_experts * experts
              + 2.0 * 2 * n * s.hidden)
    return flops, nbytes


def decode_work(s: LayerShapes, b: int, p: int, ctx: int) -> tuple[float, float]:
    """flops and minimum bytes of B x P queries over ctx + P keys each: the KV read once, q and out."""
    keys = ctx + p
    return (4.0 * b * p * keys * s.q_heads * s.head_dim,
            b * keys * s.kv_bytes_per_token + 2 * 2 * b * p * s.q_heads * s.head_dim)


def prefill_work(s: LayerShapes, n: int, ctx: int) -> tuple[float, float]:
    """flops (causal: half the chunk's own square) and minimum bytes of an n-token chunk after ctx."""
    return (4.0 * s.q_heads * s.head_dim * n * (ctx + n / 2),
            (ctx + n) * s.kv_bytes_per_token + 2 * 2 * n * s.q_heads * s.head_dim)
