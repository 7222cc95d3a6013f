"""GPU bench of the block-FP8 kernels an FP8 checkpoint runs (docs/fp8.md), beside bf16:

- dense projections of the model (vLLM's fused shapes) at each token count: bf16 F.linear,
  torch's block-wise scaled_mm (cuBLASLt, 1 x 128 activation and 128 x 128 weight scales, M
  padded to a multiple of 4 as vLLM pads it for its CUTLASS kernel: the packaged stand-in for
  what vLLM runs on Hopper), our Triton `fp8_block_gemm` at our tiles and at vLLM's default, and
  the per-token-group quantisation that runs before each FP8 GEMM, at many groups per program
  (vLLM's structure) and at one;
- the MoE block: `fused_moe_fp8` at vLLM's block-FP8 default tiles, at 128-wide gate and up tiles
  and at the tiles it had before, and the bf16 `fused_moe`, against the copy rate on the bytes
  each call reads (the experts its tokens route to, the shared expert, the router).

Every output is first checked against its reference; times are CUDA-graph replays over rotated
copies (cold L2). A host probe runs before and after. Writes one CSV and its provenance JSON.

    python3 -m calibrate.benches.fp8 --model qwen3.5-35b-a3b-fp8 --out DIR [--budget-s 120]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from calibrate.device.provenance import environment
from calibrate.device.timing import copies_for, copy_bandwidth_gbs, matmul_tflops, time_calls
from calibrate.kernels import fp8_gemm as G
from calibrate.kernels import fused_moe as FM
from calibrate.kernels import fused_moe_fp8 as M
from calibrate.kernels import paged_attention as PA
from calibrate.model import fp8_linear
from calibrate.model.fp8_linear import torch_block_mm
from calibrate.tables.host import HostProbe
from core.config import load_model

DENSE_TOKENS = (1, 8, 64, 512, 4096)
MOE_TOKENS = (1, 8, 32, 128, 512, 1024, 4096)
COLUMNS = ("kernel", "op", "N", "K", "tokens", "us", "us_p10", "us_p90", "reps", "copies", "bytes", "flops",
           "pct_copy", "pct_matmul")


def dense_shapes(model) -> dict[str, tuple[int, int]]:
    """(N, K) of the model's block-FP8 dense projections as vLLM fuses them."""
    g, a, h = model.gdn, model.attention, model.hidden_size
    qkv = 2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim
    value = g.num_v_heads * g.head_v_dim
    q = a.num_q_heads * a.head_dim
    out = {"gdn_in_proj_qkvz": (qkv + value, h), "gdn_out_proj": (h, value),
           "attn_qkv": (2 * q + 2 * a.num_kv_heads * a.head_dim, h), "attn_o_proj": (h, q)}
    if model.moe is not None and model.moe.shared_width:
        out |= {"shared_gate_up": (2 * model.moe.shared_width, h), "shared_down": (h, model.moe.shared_width)}
    return out


class Bench:
    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.t0, self.budget_s = out, time.perf_counter(), budget_s
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self.probes: dict[str, float] = {}
        self.dev = torch.device("cuda")
        self.probe = HostProbe(self.dev)

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)

    def time(self, make: Callable[[], Callable[[], object]], nbytes: int) -> object:
        calls = [make() for _ in range(copies_for(nbytes))]
        return time_calls(calls, "graph", self.dev, budget_s=0.02, min_reps=5, max_reps=15)

    def row(self, kernel: str, op: str, n: int, k: int, tokens: int, t, nbytes: int, flops: int,
            bw: float, tf: float) -> None:
        self.rows.append({"kernel": kernel, "op": op, "N": n, "K": k, "tokens": tokens, "us": round(t.us, 3),
                          "us_p10": round(t.us_p10, 3), "us_p90": round(t.us_p90, 3), "reps": t.reps,
                          "copies": t.copies, "bytes": nbytes, "flops": flops,
                          "pct_copy": round(100 * nbytes / (t.us * 1e-6) / (bw * 1e9), 1),
                          "pct_matmul": round(100 * flops / (t.us * 1e-6) / (tf * 1e12), 1)})


def check_torch_block_mm(b: Bench) -> bool:
    why = fp8_linear.check_torch_block_mm(b.dev)
    b.notes.append(f"torch block-wise scaled_mm: weight scales as {fp8_linear.B_LAYOUT[0]}" if why is None
                   else f"torch block-wise scaled_mm unusable: {why}")
    return why is None


# Variants timed side by side, so that one run says whether vLLM's rules beat what came before:
# the quantisation at vLLM's many groups per program and at one (the previous kernel's structure);
# the Triton GEMM at our tiles and at vLLM's default tile for the same kernel.
QUANT_VARIANTS = {"group_quant": G.GROUPS_PER_PROGRAM, "group_quant_one_group": 1}
GEMM_VARIANTS = {"triton_fp8_block": None, "triton_fp8_block_vllm_default": G.VLLM_DEFAULT_GEMM}


def bf16_tiles(tokens: int) -> FM.MoEConfig:
    """The FP8 MoE's tiles before vLLM's block-FP8 rule: the bf16 default's, capped at one scale group."""
    c = FM.default_config(tokens)
    return replace(c, block_k=min(c.block_k, G.GROUP), block_n=min(c.block_n, G.GROUP),
                   down_block_n=min(c.down_block_n or c.block_n, G.GROUP))


# fused_moe_fp8: vLLM's block-FP8 default (128 columns of [gate | up] a program); _n128: 128 gate and
# 128 up columns a program (intermediate scale groups of 128, as vLLM's); _bf16_tiles: before.
MOE_VARIANTS: dict[str, Callable[[int], FM.MoEConfig]] = {
    "fused_moe_fp8": M.default_config, "fused_moe_fp8_n128": lambda t: replace(M.default_config(t), block_n=G.GROUP),
    "fused_moe_fp8_bf16_tiles": bf16_tiles}


def checked(b: Bench, what: str, out: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    """Times only a kernel whose output matches its reference; a miss goes to the notes."""
    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    if err > tol:
        b.notes.append(f"{what}: relative error {err:.3g} over {tol}, not timed")
    return err <= tol


def bench_dense(b: Bench, model, bw: float, tf: float, with_torch: bool) -> None:
    for op, (n, k) in dense_shapes(model).items():
        w = torch.randn(n, k, device=b.dev) * 0.02
        wb = w.bfloat16()
        wq, ws = G.quantize_weight_blocks(w)
        for t in DENSE_TOKENS:
            if b.left() < 0:
                b.notes.append(f"budget spent before dense {op} at {t} tokens")
                return
            x = torch.randn(t, k, device=b.dev).bfloat16()
            aq, a_s = G.group_quant_ref(x)
            fl = 2 * t * n * k
            # each copy owns its weights so the L2 starts cold
            b.row("bf16_linear", op, n, k, t, b.time(lambda: (lambda w2=wb.clone(): lambda: F.linear(x, w2))(), n * k * 2),
                  n * k * 2 + t * (k + n) * 2, fl, bw, tf)
            for name, per in QUANT_VARIANTS.items():
                q, sc = G.group_quant(x, groups_per_program=per)
                if checked(b, f"{name} {op} M={t}", q.float() * sc.repeat_interleave(G.GROUP, 1),
                           aq.float() * a_s.repeat_interleave(G.GROUP, 1), 0.0):
                    b.row(name, op, n, k, t, b.time(lambda per=per: lambda: G.group_quant(x, groups_per_program=per),
                                                    t * k * 3), t * k * 3 + t * k // 32, 0, bw, tf)
            fp8_bytes = n * k + n * k // 4096 + t * k + t * n * 2
            ref = G.fp8_block_gemm_ref(aq, a_s, wq, ws, torch.float64)
            for name, cfg in GEMM_VARIANTS.items():
                if checked(b, f"{name} {op} M={t}", G.fp8_block_gemm(aq, a_s, wq, ws, config=cfg), ref, 1e-2):
                    b.row(name, op, n, k, t, b.time(lambda cfg=cfg: (lambda w2=wq.clone(): lambda: G.fp8_block_gemm(
                        aq, a_s, w2, ws, config=cfg))(), n * k), fp8_bytes, fl, bw, tf)
            if with_torch and checked(b, f"torch_fp8_blockwise {op} M={t}", torch_block_mm(aq, a_s, wq, ws), ref, 1e-2):
                b.row("torch_fp8_blockwise", op, n, k, t,
                      b.time(lambda: (lambda w2=wq.clone(): lambda: torch_block_mm(aq, a_s, w2, ws))(), n * k),
                      fp8_bytes, fl, bw, tf)
        b.log(f"dense {op} ({n} x {k}) done")


def bench_moe(b: Bench, model, bw: float, tf: float) -> None:
    e, h = model.moe, model.hidden_size
    E, I = e.num_experts, e.expert_width
    gen = torch.Generator(device=b.dev).manual_seed(0)
    w13, w13s = G.quantize_weight_blocks(torch.randn(E, 2 * I, h, device=b.dev, generator=gen) * 0.02)
    w2, w2s = G.quantize_weight_blocks(torch.randn(E, h, I, device=b.dev, generator=gen) * 0.02)
    s13, s13s = G.quantize_weight_blocks(torch.randn(2 * I, h, device=b.dev, generator=gen) * 0.02)
    s2, s2s = G.quantize_weight_blocks(torch.randn(h, I, device=b.dev, generator=gen) * 0.02)
    router = (torch.randn(E, h, device=b.dev, generator=gen) * 0.05).bfloat16()
    gate = (torch.randn(1, h, device=b.dev, generator=gen) * 0.05).bfloat16()
    bf = {k: G.dequantize_weight_blocks(q, s).bfloat16() for k, (q, s) in
          {"w13": (w13, w13s), "w2": (w2, w2s), "s13": (s13, s13s), "s2": (s2, s2s)}.items()}
    fp8 = dict(router_w=router, w13=w13, w13_s=w13s, w2=w2, w2_s=w2s, top_k=e.top_k, shared_w13=s13,
               shared_w13_s=s13s, shared_w2=s2, shared_w2_s=s2s, shared_gate_w=gate)
    expert_bytes = 3 * I * h
    for t in MOE_TOKENS:
        if b.left() < 0:
            b.notes.append(f"budget spent before the MoE at {t} tokens")
            return
        # One token batch per rotated copy: each copy routes to its own experts (cold L2 for few tokens).
        n = copies_for(t * e.top_k * expert_bytes)
        xs = [torch.randn(t, h, device=b.dev, generator=gen).bfloat16() for _ in range(n)]
        touched = sum(int((x.float() @ router.float().T).topk(e.top_k, -1).indices.unique().numel()) + 1
                      for x in xs) / n  # + the shared expert
        fl = 2 * t * (e.top_k + 1) * expert_bytes
        act = t * h * 2 * 2 + E * h * 2  # tokens in and out, the router
        nb8 = int(touched * expert_bytes * (1 + 4 / G.GROUP ** 2)) + act
        checks = xs[0][:min(t, 256)]  # the float64 reference loops over experts: a slice of the batch
        for name, config_of in MOE_VARIANTS.items():
            cfg = config_of(t)
            if not checked(b, f"{name} at {t} tokens", M.fused_moe_fp8(x=checks, config=cfg, **fp8),
                           M.fused_moe_fp8_ref(x=checks, config=cfg, **fp8), 2e-2):
                continue
            t8 = time_calls([(lambda x=x: lambda: M.fused_moe_fp8(x=x, config=cfg, **fp8))() for x in xs], "graph",
                            b.dev, budget_s=0.02, min_reps=5, max_reps=15)
            b.row(name, "moe", 2 * I, h, t, t8, nb8, fl, bw, tf)
            b.log(f"moe {t} tokens: {name} {b.rows[-1]['us']} us ({b.rows[-1]['pct_copy']}% copy)")
        nb16 = int(touched * expert_bytes * 2) + act
        t16 = time_calls([(lambda x=x: lambda: FM.fused_moe(x, router, bf["w13"], bf["w2"], e.top_k, bf["s13"],
                                                            bf["s2"], gate))() for x in xs],
                         "graph", b.dev, budget_s=0.02, min_reps=5, max_reps=15)
        b.row("fused_moe_bf16", "moe", 2 * I, h, t, t16, nb16, fl, bw, tf)
        b.log(f"moe {t} tokens: {touched:.0f} experts, bf16 {b.rows[-1]['us']} us ({b.rows[-1]['pct_copy']}% copy)")


ATTN_CASES = ((1, 64, 4096), (4, 64, 4096), (1, 256, 2048), (4, 256, 2048))  # (queries per request, requests, ctx)


def bench_attention(b: Bench, model, bw: float, tf: float) -> None:
    """Paged decode/verify attention over a bf16 and an fp8 KV cache (--kv-cache-dtype fp8), at the
    attention block sizes vLLM picks for each at max_model_len 32,768 (1,072 and 2,144 tokens)."""
    a = model.attention
    hq, hkv, d = a.num_q_heads, a.num_kv_heads, a.head_dim
    for p, B, ctx in ATTN_CASES:
        for dtype, block in ((torch.bfloat16, 1072), (G.FP8, 2144)):
            if b.left() < 0:
                b.notes.append(f"budget spent before attention {p}x{B}@{ctx}")
                return
            per = -(-(ctx + p) // block)
            nb = B * per
            kc = torch.randn(nb, block, hkv, d, device=b.dev).to(dtype)
            vc = torch.randn(nb, block, hkv, d, device=b.dev).to(dtype)
            tables = torch.randperm(nb, device=b.dev, dtype=torch.int64).to(torch.int32).view(B, per)
            seq = torch.full((B,), ctx + p, dtype=torch.int32, device=b.dev)
            cu = torch.arange(0, B * p + 1, p, dtype=torch.int32, device=b.dev)
            q = torch.randn(B * p, hq, d, device=b.dev).bfloat16()
            el = 1 if dtype == G.FP8 else 2
            nbytes = B * (ctx + p) * 2 * hkv * d * el + 2 * q.numel() * 2
            t = time_calls([lambda: PA.paged_attention(q, kc, vc, tables, seq, cu, p, d ** -0.5)], "graph", b.dev,
                           budget_s=0.02, min_reps=5, max_reps=15)
            b.row(f"paged_attention_{'fp8' if el == 1 else 'bf16'}_kv", f"attn_B{B}_P{p}", hq, d, ctx, t, nbytes,
                  4 * B * p * hq * (ctx + p) * d, bw, tf)
        b.log(f"attention P={p} B={B} ctx={ctx}: bf16 {b.rows[-2]['us']} us, fp8 KV {b.rows[-1]['us']} us")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m calibrate.benches.fp8", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3.5-35b-a3b-fp8")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=120.0)
    a = ap.parse_args(argv)
    model = load_model(a.model)
    b = Bench(a.out, a.budget_s)
    b.probes["start_us"] = b.probe()
    bw, tf = copy_bandwidth_gbs(b.dev), matmul_tflops(b.dev)
    b.log(f"copy {bw:.0f} GB/s, bf16 matmul {tf:.0f} TFLOP/s, host probe {b.probes['start_us']} us")
    with_torch = check_torch_block_mm(b)
    b.log(f"torch block-wise scaled_mm: {'checked' if with_torch else b.notes[-1]}")
    for part in (lambda: bench_moe(b, model, bw, tf), lambda: bench_attention(b, model, bw, tf),
                 lambda: bench_dense(b, model, bw, tf, with_torch)):
        try:
            part()
        except Exception as e:  # noqa: BLE001 - recorded; the other part and the rows so far are still written
            b.notes.append(f"{type(e).__name__}: {str(e)[:300]}")
            b.log(f"part failed: {b.notes[-1]}")
    b.probes["end_us"] = b.probe()
    a.out.mkdir(parents=True, exist_ok=True)
    stem = f"fp8_kernels_{time.strftime('%Y-%m-%d', time.gmtime())}"
    tmp = a.out / f".{stem}.csv"
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(b.rows)
    tmp.replace(a.out / f"{stem}.csv")
    prov = {**environment("cuda"), "model": a.model, "commit": os.environ.get("GIT_COMMIT"),
            "command": " ".join([sys.executable.rsplit("/", 1)[-1], "-m", "calibrate.benches.fp8", *(argv or sys.argv[1:])]),
            "copy_bandwidth_gbs": round(bw, 1), "bf16_matmul_tflops": round(tf, 1), "host_probe_us": b.probes,
            "timing": "CUDA-graph replay of rotated copies (cold L2), median of up to 15 replays",
            "notes": b.notes, "elapsed_s": round(time.perf_counter() - b.t0, 1)}
    (a.out / f"{stem}_provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    b.log(f"wrote {stem}.csv ({len(b.rows)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
