"""Time the layer tables on the GPU (or tiny shapes on the CPU, for tests).

One function per table; each returns rows in tables.COLUMNS. Work counts (flops,
bytes) are the minimum each call must do: every weight it touches read once, GEMM
inputs read and outputs written once, the KV cache read once. `pct_bw` and
`pct_flops` hold the measured time against the copy bandwidth and matrix rate
measured in the same run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from calibrate import layers as L
from calibrate.grid import Grid
from calibrate.shapes import LayerShapes
from calibrate.timing import ROTATE_BYTES, Timing, copies_for, time_calls

ATTN_MAX_COPIES = 96  # tiny attention calls: many distinct KV regions per graph keep the L2 cold


@dataclass
class Harness:
    shapes: LayerShapes
    grid: Grid
    device: torch.device
    modes: tuple[str, ...]
    bw_gbs: float  # measured copy bandwidth (read + write), this run
    tflops: float  # measured dense bf16 matrix rate, this run
    log: Callable[[str], None] = print
    rotate_bytes: int = ROTATE_BYTES
    min_copies: int = 3
    budget_s: float = 0.06  # seconds of replays per measurement

    def time(self, calls: list[Callable[[], object]], mode: str) -> Timing:
        return time_calls(calls, mode, self.device, budget_s=self.budget_s)

    def row(self, mode: str, t: Timing, *, B: int, P: int, ctx: int, tokens: int, flops: float, nbytes: float) -> dict:
        s = t.us * 1e-6
        return {"mode": mode, "B": B, "P": P, "ctx": ctx, "tokens": tokens, "us": round(t.us, 3),
                "us_p10": round(t.us_p10, 3), "us_p90": round(t.us_p90, 3), "reps": t.reps, "copies": t.copies,
                "flops": int(flops), "bytes": int(nbytes),
                "pct_bw": round(100 * nbytes / s / (self.bw_gbs * 1e9), 2),
                "pct_flops": round(100 * flops / s / (self.tflops * 1e12), 2)}

    def randn(self, *shape: int, dtype: torch.dtype = L.BF16) -> torch.Tensor:
        return torch.randn(*shape, device=self.device).to(dtype)


def _token_table(h: Harness, name: str, weight_bytes: int, make: Callable[[], object],
                 call: Callable[[object, int], Callable[[], object]],
                 work: Callable[[int], tuple[float, float]]) -> list[dict]:
    """A layer whose cost depends on the token count only, on rotated weight copies."""
    copies = copies_for(weight_bytes, h.rotate_bytes, h.min_copies)
    ws = [make() for _ in range(copies)]
    rows = []
    for n in h.grid.tokens:
        fns = [call(w, n) for w in ws]
        flops, nbytes = work(n)
        for mode in h.modes:
            rows.append(h.row(mode, h.time(fns, mode), B=n, P=1, ctx=0, tokens=n, flops=flops, nbytes=nbytes))
        h.log(f"  {name} tokens={n}: " + ", ".join(f"{r['mode']} {r['us']:.1f} us" for r in rows[-len(h.modes):]))
        del fns
    return rows


def _gemm_work(n: int, k: int, m: int) -> tuple[float, float]:
    """flops and minimum bytes of [n, k] x [k, m] in bf16."""
    return 2.0 * n * k * m, 2.0 * (k * m + n * k + n * m)


def gdn_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.GDNWeights, n: int) -> Callable[[], object]:
        x, state = h.randn(n, s.hidden), h.randn(s.conv_kernel - 1, s.gdn_conv_channels)
        return lambda: L.gdn_forward(x, w, s, state)

    def work(n: int) -> tuple[float, float]:
        a, b = _gemm_work(n, s.hidden, s.gdn_in_features), _gemm_work(n, s.gdn_v_channels, s.hidden)
        return a[0] + b[0], a[1] + b[1]

    return _token_table(h, "gdn", s.gdn_weight_bytes, lambda: L.gdn_weights(s, h.device), call, work)


def attn_proj_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.AttnWeights, n: int) -> Callable[[], object]:
        x = h.randn(n, s.hidden)
        cos, sin = L.rope_tables(torch.arange(n, device=h.device) + 1000, s.rotary_dim)
        kc, vc = h.randn(n, s.kv_heads, s.head_dim), h.randn(n, s.kv_heads, s.head_dim)
        slots = torch.randperm(n, device=h.device)
        return lambda: L.attn_forward(x, w, s, cos, sin, slots, kc, vc)

    def work(n: int) -> tuple[float, float]:
        a, b = _gemm_work(n, s.hidden, s.qkv_features), _gemm_work(n, s.q_heads * s.head_dim, s.hidden)
        return a[0] + b[0], a[1] + b[1]

    return _token_table(h, "attn_proj", s.attn_weight_bytes, lambda: L.attn_weights(s, h.device), call, work)


def expected_experts(n: int, s: LayerShapes) -> float:
    """Distinct experts n tokens touch under uniform top-k routing."""
    return s.num_experts * (1.0 - (1.0 - s.top_k / s.num_experts) ** n)


def moe_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.MoEWeights, n: int) -> Callable[[], object]:
        x = h.randn(n, s.hidden)
        return lambda: L.moe_forward(x, w, s)

    def work(n: int) -> tuple[float, float]:
        per_expert = 3 * s.hidden * s.expert_width
        flops = 2.0 * n * (s.top_k * per_expert + 3 * s.hidden * s.shared_width + s.hidden * s.num_experts)
        nbytes = 2.0 * (expected_experts(n, s) * per_expert + 3 * s.hidden * s.shared_width
                        + s.hidden * s.num_experts + 2 * n * s.hidden)
        return flops, nbytes

    return _token_table(h, "moe", s.moe_weight_bytes, lambda: L.moe_weights(s, h.device), call, work)


def lm_head_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.HeadWeights, n: int) -> Callable[[], object]:
        x = h.randn(n, s.hidden)
        return lambda: L.lm_head_forward(x, w, s)

    def work(n: int) -> tuple[float, float]:
        flops, nbytes = _gemm_work(n, s.hidden, s.vocab)
        return flops, nbytes + 2.0 * 4 * n * s.vocab  # float32 logits written and read by argmax

    return _token_table(h, "lm_head", s.lm_head_weight_bytes, lambda: L.head_weights(s, h.device), call, work)


def mtp_fc_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.MTPWeights, n: int) -> Callable[[], object]:
        e, x = h.randn(n, s.hidden), h.randn(n, s.hidden)
        return lambda: L.mtp_fc_forward(e, x, w, s)

    return _token_table(h, "mtp_fc", s.mtp_fc_weight_bytes, lambda: L.mtp_weights(s, h.device), call,
                        lambda n: _gemm_work(n, 2 * s.hidden, s.hidden // s.tp))


class KVPool:
    """One flat random bf16 buffer carved into per-call K/V views (so big caches are allocated once)."""

    def __init__(self, h: Harness, elements: int) -> None:
        self.buf = torch.empty(elements, dtype=L.BF16, device=h.device).normal_()
        self.next = 0

    def take(self, *shape: int) -> torch.Tensor:
        n = 1
        for d in shape:
            n *= d
        if self.next + n > self.buf.numel():
            self.next = 0
        t = self.buf[self.next:self.next + n].view(*shape)
        self.next += n
        return t

    def kv(self, seqs: int, tokens: int, heads: int, dim: int) -> torch.Tensor:
        """A cache in vLLM's token-major layout, seen as SDPA's [seqs, heads, tokens, dim]."""
        return self.take(seqs, tokens, heads, dim).transpose(1, 2)


def _kv_copies(h: Harness, nbytes: int) -> int:
    return max(1, min(ATTN_MAX_COPIES, -(-h.rotate_bytes // max(1, nbytes))))


def _attn_pool_elements(h: Harness) -> int:
    s, g = h.shapes, h.grid
    per_tok = s.kv_heads * s.head_dim * 2  # K and V elements per token
    sizes = [b * (c + p) * per_tok for b in g.decode_b for p in g.decode_p for c in g.decode_ctx]
    sizes += [(c + k) * per_tok for k in g.prefill_chunk for c in g.prefill_ctx]
    return max(max(sizes), h.rotate_bytes // 2 * 2)


def attn_decode_table(h: Harness) -> list[dict]:
    s, g = h.shapes, h.grid
    pool = KVPool(h, _attn_pool_elements(h))
    rows = []
    for b in sorted(set(g.decode_b) | set(g.decode_b_eager or ())):
        modes = [m for m in h.modes if b in g.first_axis(g.decode_b, g.decode_b_eager, m)]
        for p in g.decode_p:
            q = h.randn(b, s.q_heads, p, s.head_dim)
            for c in g.decode_ctx:
                keys = c + p
                nbytes = b * keys * s.kv_bytes_per_token + 2 * 2 * b * p * s.q_heads * s.head_dim
                flops = 4.0 * b * p * keys * s.q_heads * s.head_dim
                fns = []
                for _ in range(_kv_copies(h, nbytes)):
                    k, v = pool.kv(b, keys, s.kv_heads, s.head_dim), pool.kv(b, keys, s.kv_heads, s.head_dim)
                    fns.append(lambda k=k, v=v: L.decode_core(q, k, v))
                if not rows and h.device.type == "cuda":
                    h.log(f"  SDPA backend chosen: {torch._fused_sdp_choice(q, k, v, enable_gqa=True)} "
                          f"(0 math, 1 flash, 2 efficient, 3 cuDNN)")
                for mode in modes:
                    rows.append(h.row(mode, h.time(fns, mode), B=b, P=p, ctx=c, tokens=b * p, flops=flops, nbytes=nbytes))
            h.log(f"  attn_decode B={b} P={p}: " + ", ".join(f"ctx {r['ctx']} {r['mode']} {r['us']:.1f}" for r in rows[-len(modes) * len(g.decode_ctx):]))
    del pool
    return rows


def attn_prefill_table(h: Harness) -> list[dict]:
    s, g = h.shapes, h.grid
    pool = KVPool(h, _attn_pool_elements(h))
    rows = []
    for n in sorted(set(g.prefill_chunk) | set(g.prefill_chunk_eager or ())):
        modes = [m for m in h.modes if n in g.first_axis(g.prefill_chunk, g.prefill_chunk_eager, m)]
        q = h.randn(1, s.q_heads, n, s.head_dim)
        for c in g.prefill_ctx:
            nbytes = (c + n) * s.kv_bytes_per_token + 2 * 2 * n * s.q_heads * s.head_dim
            flops = 4.0 * s.q_heads * s.head_dim * n * (c + n / 2)
            fns = []
            for _ in range(_kv_copies(h, nbytes)):
                kc, vc = pool.kv(1, n, s.kv_heads, s.head_dim), pool.kv(1, n, s.kv_heads, s.head_dim)
                kp = pool.kv(1, c, s.kv_heads, s.head_dim) if c else None
                vp = pool.kv(1, c, s.kv_heads, s.head_dim) if c else None
                fns.append(lambda kc=kc, vc=vc, kp=kp, vp=vp: L.prefill_core(q, kp, vp, kc, vc))
            for mode in modes:
                rows.append(h.row(mode, h.time(fns, mode), B=1, P=n, ctx=c, tokens=n, flops=flops, nbytes=nbytes))
        h.log(f"  attn_prefill chunk={n}: " + ", ".join(f"ctx {r['ctx']} {r['mode']} {r['us']:.1f}" for r in rows[-len(modes) * len(g.prefill_ctx):]))
    del pool
    return rows


TABLE_JOBS: dict[str, Callable[[Harness], list[dict]]] = {
    "gdn": gdn_table,
    "attn_proj": attn_proj_table,
    "attn_decode": attn_decode_table,
    "attn_prefill": attn_prefill_table,
    "moe": moe_table,
    "lm_head": lm_head_table,
    "mtp_fc": mtp_fc_table,
}


def gdn_prefill_table(h: Harness, chunk_fn: Callable[..., object], deadline_s: float | None = None) -> list[dict]:
    """The GDN recurrence of one prefill chunk of n tokens, as vLLM runs it.

    vLLM's Qwen3.5 layer calls flash-linear-attention's chunked kernel
    (`chunk_gated_delta_rule`, grouped value heads) from the cached state, writing the
    final state back; the same call is timed here. fla autotunes
    per shape, so chunks run in increasing size until `deadline_s` (seconds of this
    job): the table is then shorter, and longer chunks are extrapolated in proportion.
    """
    s = h.shapes
    rows = []
    modes = list(h.modes)
    t0 = time.perf_counter()
    for n in sorted(h.grid.prefill_chunk):
        if deadline_s is not None and len(rows) >= 2 * len(h.modes) and time.perf_counter() - t0 > deadline_s:
            h.log(f"  gdn_prefill: stopping before {n} tokens ({deadline_s:.0f} s spent)")
            break
        qk_bytes = 2 * n * s.gdn_k_heads * s.head_k_dim * 2
        io_bytes = qk_bytes + 2 * n * s.gdn_v_channels * 2 + 2 * n * s.gdn_v_heads * 4
        state_bytes = s.gdn_v_heads * s.head_v_dim * s.head_k_dim * 4
        sets = []
        for _ in range(copies_for(io_bytes + state_bytes, h.rotate_bytes, h.min_copies)):
            q = _l2(h.randn(1, n, s.gdn_k_heads, s.head_k_dim))
            k = _l2(h.randn(1, n, s.gdn_k_heads, s.head_k_dim))
            v = h.randn(1, n, s.gdn_v_heads, s.head_v_dim)
            g = torch.nn.functional.logsigmoid(torch.randn(1, n, s.gdn_v_heads, device=h.device))
            beta = torch.rand(1, n, s.gdn_v_heads, device=h.device).to(L.BF16)
            state = torch.randn(1, s.gdn_v_heads, s.head_k_dim, s.head_v_dim, device=h.device) * 0.1
            sets.append((q, k, v, g, beta, state))

        def call(x: tuple) -> Callable[[], object]:
            q, k, v, g, beta, state = x

            def run() -> object:
                o, final = chunk_fn(q, k, v, g, beta, initial_state=state, output_final_state=True)
                state.copy_(final)
                return o
            return run
        fns = [call(x) for x in sets]
        flops = 2.0 * n * s.gdn_v_heads * (GDN_CHUNK * (s.head_k_dim + s.head_v_dim) + 4 * s.head_k_dim * s.head_v_dim)
        for mode in list(modes):
            try:
                t = h.time(fns, mode)
            except Exception as e:  # e.g. a kernel that syncs cannot be captured: keep the other mode
                if rows or len(modes) == 1:
                    raise
                h.log(f"  gdn_prefill: {mode} mode failed ({type(e).__name__}: {e}); timing {modes[1:]} only")
                modes.remove(mode)
                continue
            rows.append(h.row(mode, t, B=1, P=n, ctx=0, tokens=n, flops=flops, nbytes=io_bytes + 2 * state_bytes))
        h.log(f"  gdn_prefill tokens={n}: " + ", ".join(f"{r['mode']} {r['us']:.1f} us" for r in rows[-len(modes):]))
        del fns, sets
    return rows


GDN_CHUNK = 64  # tokens per chunk of fla's chunked form (for the flop count)


def _l2(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.float(), dim=-1).to(L.BF16)
