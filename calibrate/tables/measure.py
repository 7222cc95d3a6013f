"""Time the layer tables on the GPU (or tiny shapes on the CPU, for tests).

One function per table; each returns rows in TABLE_COLUMNS (core.tables.COLUMNS plus
`host_us`, the host's wall time to issue one call). Attention cores are our paged
Triton kernel, or flash-attn-4's (`--attn-backend`), over a vLLM-style block pool (the model's
enlarged block size, shuffled block tables); the MoE is the fused Triton MoE. Work counts (flops,
bytes) are the minimum each call must do: every weight it touches read once, GEMM
inputs read and outputs written once, the KV cache read once. `pct_bw` and
`pct_flops` hold the measured time against the copy bandwidth and matrix rate
measured in the same run. A block-FP8 checkpoint's tables time its block-FP8 projections
(calibrate/model/layers_fp8.py, on the Harness's `fp8_gemm`) and count their weights at one byte plus the
block scales.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from calibrate.device.timing import ROTATE_BYTES, Timing, copies_for, time_calls
from calibrate.kernels.paged_attention import AttnConfig, paged_attention
from calibrate.model import layers as L
from calibrate.model.attention_backends import fa4_paged
from calibrate.model.fp8_linear import Fp8Gemm
from calibrate.model.layers_fp8 import fp8_weights
from calibrate.model.shapes import LayerShapes
from calibrate.model.work import decode_work, gemm_work, gemms_work, moe_work, prefill_work
from calibrate.tables.grid import Grid
from core.config import load_model, load_policy, model_names
from core.tables import COLUMNS
from policies import make_policy

ATTN_MAX_COPIES = 96  # tiny attention calls: many distinct KV regions per graph keep the L2 cold
TABLE_COLUMNS = COLUMNS + ("host_us",)  # TABLE_JOBS' rows also carry the host's launch time per call


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
    fa4: Callable[..., object] | None = None  # flash-attn-4's varlen forward: the attention cores' kernel when set
    fp8_gemm: Fp8Gemm | None = None  # the block-FP8 projections' GEMM, for a block-FP8 checkpoint

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

    def weights(self, build: Callable[[LayerShapes, torch.device], object]) -> object:
        """One random copy of a layer's weights, in the checkpoint's form (bf16 or block-FP8)."""
        w = build(self.shapes, self.device)
        return w if self.fp8_gemm is None or not self.shapes.fp8 else fp8_weights(w, self.shapes, self.fp8_gemm)


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
        rows += _timed_rows(h, fns, list(h.modes), B=n, P=1, ctx=0, tokens=n, flops=flops, nbytes=nbytes)
        h.log(f"  {name} tokens={n}: " + ", ".join(f"{r['mode']} {r['us']:.1f} us" for r in rows[-len(h.modes):]))
        del fns
    return rows


def gdn_table(h: Harness) -> list[dict]:
    s = h.shapes

    z = slice(s.gdn_conv_channels, s.gdn_conv_channels + s.gdn_v_channels)

    def call(w: L.GDNWeights, n: int) -> Callable[[], object]:
        # The dense halves as the executor (and vLLM) runs them around the core; the core's output
        # stands in random (its conv and gating are gdn_decode_conv's and gdn_prefill_varlen's).
        # (A block-FP8 in_proj returns vLLM's two projections: z is in the first, at the same columns.)
        x, o = h.randn(n, s.hidden), h.randn(n, s.gdn_v_channels)
        first = (lambda p: p) if isinstance(w.in_proj, torch.Tensor) else (lambda p: p[0])
        return lambda: x + L.gdn_out(o, first(L.gdn_in(x, w, s))[:, z], w, s)

    gemms = ((s.hidden, s.gdn_in_features), (s.gdn_v_channels, s.hidden))
    return _token_table(h, "gdn", s.gdn_weight_bytes, lambda: h.weights(L.gdn_weights), call,
                        lambda n: gemms_work(n, gemms, s.weight_bytes(s.gdn_projections)))


def attn_proj_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.AttnWeights, n: int) -> Callable[[], object]:
        x = h.randn(n, s.hidden)
        cos, sin = L.rope_tables(torch.arange(n, device=h.device) + 1000, s.rotary_dim)
        kc, vc = h.randn(n, s.kv_heads, s.head_dim), h.randn(n, s.kv_heads, s.head_dim)
        slots = torch.randperm(n, device=h.device)
        return lambda: L.attn_forward(x, w, s, cos, sin, slots, kc, vc)

    gemms = ((s.hidden, s.qkv_features), (s.q_heads * s.head_dim, s.hidden))
    return _token_table(h, "attn_proj", s.attn_weight_bytes, lambda: h.weights(L.attn_weights), call,
                        lambda n: gemms_work(n, gemms, s.attn_weight_bytes))


def moe_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.MoEWeights, n: int) -> Callable[[], object]:
        x = h.randn(n, s.hidden)
        return lambda: L.moe_forward(x, w, s)

    return _token_table(h, "moe", s.moe_weight_bytes, lambda: h.weights(L.moe_weights), call,
                        lambda n: moe_work(s, n))


def mlp_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.MLPWeights, n: int) -> Callable[[], object]:
        x = h.randn(n, s.hidden)
        return lambda: L.mlp_forward(x, w, s)

    return _token_table(h, "mlp", s.mlp_weight_bytes, lambda: h.weights(L.mlp_weights), call, lambda n: gemms_work(
        n, ((s.hidden, 2 * s.mlp_width), (s.mlp_width, s.hidden)), s.mlp_weight_bytes))


def lm_head_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.HeadWeights, n: int) -> Callable[[], object]:
        x = h.randn(n, s.hidden)
        return lambda: L.lm_head_forward(x, w, s)

    def work(n: int) -> tuple[float, float]:
        flops, nbytes = gemm_work(n, s.hidden, s.vocab)
        return flops, nbytes + 2.0 * 4 * n * s.vocab  # float32 logits written and read by argmax

    return _token_table(h, "lm_head", s.lm_head_weight_bytes, lambda: L.head_weights(s, h.device), call, work)


def mtp_fc_table(h: Harness) -> list[dict]:
    s = h.shapes

    def call(w: L.MTPWeights, n: int) -> Callable[[], object]:
        e, x = h.randn(n, s.hidden), h.randn(n, s.hidden)
        return lambda: L.mtp_fc_forward(e, x, w, s)

    return _token_table(h, "mtp_fc", s.mtp_fc_weight_bytes, lambda: h.weights(L.mtp_weights), call,
                        lambda n: gemm_work(n, 2 * s.hidden, s.hidden // s.tp))


def kv_block_tokens(s: LayerShapes) -> int:
    """vLLM's attention block for the model: enlarged to the GDN page (sim/budget.block_layout).

    Models without a config file (the tests' tiny ones) get vLLM's default 16 tokens."""
    from sim.engine.budget import block_layout  # the simulator's geometry; calibrate sits above sim

    if s.model not in model_names():
        return 16
    model = load_model(s.model)
    return block_layout(model, make_policy(model, load_policy("store_all")), 1 << 40).attn_block_tokens


class PagedKV:
    """One random bf16 paged pool per table; each call's requests get fresh blocks, taken in turn
    (so back-to-back calls in a graph touch disjoint blocks and the L2 stays cold) and shuffled
    into the block tables, as a long-running pool scatters a request's blocks."""

    def __init__(self, h: Harness, batches: list[tuple[int, int]]) -> None:
        """batches: (requests, keys per request) of every call the pool must hold at once."""
        s = h.shapes
        self.block = kv_block_tokens(s)
        block_bytes = self.block * s.kv_bytes_per_token
        largest = max(b * -(-keys // self.block) for b, keys in batches)
        self.num_blocks = max(largest, -(-h.rotate_bytes // block_bytes))
        shape = (self.num_blocks, self.block, s.kv_heads, s.head_dim)
        self.k = torch.empty(shape, dtype=L.BF16, device=h.device).normal_()
        self.v = torch.empty(shape, dtype=L.BF16, device=h.device).normal_()
        self.next = 0
        self.device = h.device

    def batch(self, q_len: int, seq_lens: list[int]) -> L.PagedBatch:
        """B requests of q_len queries each, request b with seq_lens[b] keys (the queries' included)."""
        need = [-(-n // self.block) for n in seq_lens]
        if sum(need) > self.num_blocks:
            raise ValueError(f"PagedKV: {sum(need)} blocks asked of a pool of {self.num_blocks}")
        if self.next + sum(need) > self.num_blocks:
            self.next = 0
        ids = self.next + torch.randperm(sum(need), dtype=torch.int32)
        self.next += sum(need)
        table = torch.zeros(len(seq_lens), max(need), dtype=torch.int32)
        for b, row in enumerate(ids.split(need)):
            table[b, :need[b]] = row
        B = len(seq_lens)
        return L.PagedBatch(
            k_cache=self.k, v_cache=self.v, slot_mapping=torch.empty(0, dtype=torch.int64, device=self.device),
            block_tables=table.to(self.device), seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=self.device),
            cu_seqlens_q=torch.arange(B + 1, dtype=torch.int32, device=self.device) * q_len, max_seqlen_q=q_len)


def core_call(q: torch.Tensor, kv: L.PagedBatch, config: AttnConfig | None = None,
              fa4: Callable[..., object] | None = None) -> Callable[[], object]:
    """One attention-core call over the paged pool: flash-attn-4's (vLLM runs FlashAttention 3, which takes
    the same layout) when given, else our Triton kernel."""
    scale = q.shape[-1] ** -0.5
    if fa4 is not None:
        return fa4_paged(fa4, q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, kv.cu_seqlens_q,
                         kv.max_seqlen_q, scale)
    return lambda: paged_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, kv.cu_seqlens_q,
                                   kv.max_seqlen_q, scale, config=config)


def kv_copies(h: Harness, nbytes: int) -> int:
    return max(1, min(ATTN_MAX_COPIES, -(-h.rotate_bytes // max(1, nbytes))))


def host_us(calls: list[Callable[[], object]], device: torch.device) -> float:
    """Host wall time to issue one call (Python + launches), GPU idle at the start so nothing blocks:
    the launch cost a CUDA graph removes, reported beside the graph time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for c in calls:
        c()
    dt = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return round(dt * 1e6 / len(calls), 3)


def _timed_rows(h: Harness, fns: list[Callable[[], object]], modes: list[str], **row: float) -> list[dict]:
    fns[0]()  # compile / warm before the host clock
    launch = host_us(fns, h.device)
    return [{**h.row(mode, h.time(fns, mode), **row), "host_us": launch} for mode in modes]


def attn_decode_table(h: Harness) -> list[dict]:
    """Paged attention of B requests x P verify queries over ctx cached tokens (+ the P new ones)."""
    s, g = h.shapes, h.grid
    pool = PagedKV(h, [(b, c + p) for b in set(g.decode_b) | set(g.decode_b_eager or ()) for p in g.decode_p
                       for c in g.decode_ctx])
    h.log(f"  paged pool: {pool.num_blocks} blocks of {pool.block} tokens")
    rows = []
    for b in sorted(set(g.decode_b) | set(g.decode_b_eager or ())):
        modes = [m for m in h.modes if b in g.first_axis(g.decode_b, g.decode_b_eager, m)]
        for p in g.decode_p:
            q = h.randn(b * p, s.q_heads, s.head_dim)
            for c in g.decode_ctx:
                flops, nbytes = decode_work(s, b, p, c)
                fns = [core_call(q, pool.batch(p, [c + p] * b), fa4=h.fa4) for _ in range(kv_copies(h, nbytes))]
                rows += _timed_rows(h, fns, modes, B=b, P=p, ctx=c, tokens=b * p, flops=flops, nbytes=nbytes)
            h.log(f"  attn_decode B={b} P={p}: " + ", ".join(f"ctx {r['ctx']} {r['mode']} {r['us']:.1f}" for r in rows[-len(modes) * len(g.decode_ctx):]))
    del pool
    return rows


def attn_prefill_table(h: Harness) -> list[dict]:
    """Paged attention of one prefill chunk of n tokens after ctx cached ones (causal over prefix + chunk)."""
    s, g = h.shapes, h.grid
    pool = PagedKV(h, [(1, c + n) for n in set(g.prefill_chunk) | set(g.prefill_chunk_eager or ())
                       for c in g.prefill_ctx])
    rows = []
    for n in sorted(set(g.prefill_chunk) | set(g.prefill_chunk_eager or ())):
        modes = [m for m in h.modes if n in g.first_axis(g.prefill_chunk, g.prefill_chunk_eager, m)]
        q = h.randn(n, s.q_heads, s.head_dim)
        for c in g.prefill_ctx:
            flops, nbytes = prefill_work(s, n, c)
            fns = [core_call(q, pool.batch(n, [c + n]), fa4=h.fa4) for _ in range(kv_copies(h, nbytes))]
            rows += _timed_rows(h, fns, modes, B=1, P=n, ctx=c, tokens=n, flops=flops, nbytes=nbytes)
        h.log(f"  attn_prefill chunk={n}: " + ", ".join(f"ctx {r['ctx']} {r['mode']} {r['us']:.1f}" for r in rows[-len(modes) * len(g.prefill_ctx):]))
    del pool
    return rows


TABLE_JOBS: dict[str, Callable[[Harness], list[dict]]] = {
    "gdn": gdn_table,
    "attn_proj": attn_proj_table,
    "attn_decode": attn_decode_table,
    "attn_prefill": attn_prefill_table,
    "moe": moe_table,
    "mlp": mlp_table,
    "lm_head": lm_head_table,
    "mtp_fc": mtp_fc_table,
}


def gdn_prefill_table(h: Harness, chunk_fn: Callable[..., object], deadline_s: float | None = None) -> list[dict]:
    """The GDN recurrence of one prefill chunk of n tokens, as vLLM runs it.

    vLLM's Qwen3.5 layer calls its GDN prefill kernel (`chunk_fn`: FlashInfer's on SM90 and
    up, else fla's `chunk_gated_delta_rule`; calibrate.model.gdn_prefill_kernel picks) on the conv's
    q, k, v with the q/k L2 norms asked of the kernel, from the cached state (fla's
    `state_v_first` layout, FlashInfer's own), writing the final state back; the same call is
    timed here. fla autotunes and FlashInfer compiles per shape, so chunks run in increasing
    size until `deadline_s` (seconds of this job): the table is then shorter, and longer
    chunks are extrapolated in proportion.
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
            q = h.randn(1, n, s.gdn_k_heads, s.head_k_dim)
            k = h.randn(1, n, s.gdn_k_heads, s.head_k_dim)
            v = h.randn(1, n, s.gdn_v_heads, s.head_v_dim)
            g = torch.nn.functional.logsigmoid(torch.randn(1, n, s.gdn_v_heads, device=h.device))
            beta = torch.rand(1, n, s.gdn_v_heads, device=h.device).to(L.BF16)
            state = torch.randn(1, s.gdn_v_heads, s.head_k_dim, s.head_v_dim, device=h.device) * 0.1
            sets.append((q, k, v, g, beta, state))

        def call(x: tuple) -> Callable[[], object]:
            q, k, v, g, beta, state = x

            def run() -> object:
                o, final = chunk_fn(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                    use_qk_l2norm_in_kernel=True, state_v_first=True)
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

