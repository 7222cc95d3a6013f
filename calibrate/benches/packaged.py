"""GPU: the packaged kernels vLLM runs against ours, GPU time and host issue time in one run.

    python3 -m calibrate.benches.packaged --out DIR [--parts attn,gdn,moe] [--time-budget-s 240]

attn  Qwen3.5-35B-A3B's attention core (16 query / 2 KV heads, head dim 256, bf16): prefill
      chunks of 2,048, 8,192 and 32,768 tokens and a 2,048-token chunk after 16,384 cached,
      decode batches; our paged Triton kernel, flash-attn-4 over the same paged pool (and
      dense for prefill), torch SDPA's cuDNN and flash backends over contiguous K/V.
gdn   the GDN prefill recurrence (16 key / 32 value heads of 128): fla's chunk kernel and
      FlashInfer's, each as vLLM calls it (q/k L2 norms included), one sequence of 64 to
      32,768 tokens and 16 sequences of 512.
moe   the fused MoE: whole-call GPU time by token count, and each launch's GPU time at
      1, 4 and 32 tokens (torch.profiler's kernel records).
GPU time: CUDA events around each of back-to-back calls queued behind a busy GPU (launch
gaps hidden, as in a graph), calls rotating over input copies where one call's data fits
the L2. Host time: each call issued behind a busy GPU (calibrate.tables.host.issue_times).
`HostProbe` runs before and after every part. Outputs are checked against a reference
backend on the same data (rel_err). Writes DIR/kernels.csv, DIR/moe_launches.csv,
DIR/summary.json, DIR/log.txt; a failing case is logged and skipped.
"""
from __future__ import annotations

import argparse
import csv
import json
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

import torch

from calibrate.device import provenance
from calibrate.device.timing import copy_bandwidth_gbs, matmul_tflops, spread
from calibrate.kernels import fused_moe as FM
from calibrate.kernels.inputs import moe_inputs, paged_inputs
from calibrate.kernels.paged_attention import paged_attention
from calibrate.model import attention_backends as AB
from calibrate.model.fla import load_fla_chunk
from calibrate.model.flashinfer_gdn import load_flashinfer_chunk
from calibrate.model.shapes import LayerShapes
from calibrate.tables.host import HostProbe, cycles_per_us, gpu_times, issue_times
from core.config import load_model
from policies.kernels.inputs import rel_err

MODEL = "qwen3.5-35b-a3b"
BLOCK = 1072  # the model's enlarged attention block (calibrate.tables.measure.kv_block_tokens)
L2_BYTES = 256 << 20  # a call's data below this is rotated over copies
PACKAGES = ("torch", "triton", "flash-linear-attention", "fla-core", "flashinfer-python", "flash-attn-4",
            "nvidia-cutlass-dsl-libs-base", "apache-tvm-ffi", "quack-kernels")
FIELDS = ("op", "case", "backend", "gpu_us", "gpu_p10", "gpu_p90", "host_us", "host_p10", "host_p90",
          "flops", "bytes", "pct_bw", "pct_flops", "ref", "rel_err")


@dataclass
class Run:
    out: Path
    budget_s: float
    bw: float = 0.0
    tflops: float = 0.0
    cycles: float = 0.0
    rows: list[dict] = field(default_factory=list)
    launches: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    probes: list[dict] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)

    def log(self, msg: str) -> None:
        line = f"[{time.perf_counter() - self.t0:7.1f} s] {msg}"
        print(line, flush=True)
        with (self.out / "log.txt").open("a") as f:
            f.write(line + "\n")

    def spent(self) -> bool:
        return time.perf_counter() - self.t0 > self.budget_s

    def probe(self, where: str, p: HostProbe) -> None:
        self.probes.append({"where": where, "us": p()})
        self.log(f"host probe {where}: {self.probes[-1]['us']} us per launch")

    def guard(self, what: str, fn: Callable[[], object]) -> object:
        try:
            return fn()
        except Exception as e:  # one backend failing must not cost the call
            self.errors.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")
            self.log(f"FAILED {what}: {traceback.format_exc()[-2000:]}")
            return None

    def time(self, op: str, case: str, backend: str, calls: list[Callable[[], object]], flops: float,
             nbytes: float, reps: int = 20, ref: str = "", err: float | None = None) -> dict:
        """One row: GPU and host time of the calls (rotated), against the same run's rates."""
        i = [0]

        def one() -> object:
            i[0] += 1
            return calls[i[0] % len(calls)]()
        one()
        torch.cuda.synchronize()
        gpu = gpu_times(one, reps, self.cycles) or [float("nan")]
        host = issue_times(one, min(reps, 10), self.cycles) or [float("nan")]
        g, h = spread(gpu), spread(host)
        row = {"op": op, "case": case, "backend": backend, "gpu_us": round(g[0], 2), "gpu_p10": round(g[1], 2),
               "gpu_p90": round(g[2], 2), "host_us": round(h[0], 2), "host_p10": round(h[1], 2),
               "host_p90": round(h[2], 2), "flops": int(flops), "bytes": int(nbytes),
               "pct_bw": round(100 * nbytes / (g[0] * 1e-6) / (self.bw * 1e9), 1),
               "pct_flops": round(100 * flops / (g[0] * 1e-6) / (self.tflops * 1e12), 1),
               "ref": ref, "rel_err": "" if err is None else f"{err:.2e}"}
        self.rows.append(row)
        self.log(f"{op} {case} {backend}: GPU {row['gpu_us']} us ({row['pct_bw']}% copy, {row['pct_flops']}% "
                 f"matrix), host {row['host_us']} us" + (f", rel err {err:.1e} vs {ref}" if ref else ""))
        return row


def _first(x: object) -> torch.Tensor:
    return x[0] if isinstance(x, tuple) else x


def _copies(nbytes: float, most: int = 8) -> int:
    return max(1, min(most, int(L2_BYTES // max(nbytes, 1))))


# ------------------------------------------------------------------------------ attention
PREFILL = ((2048, 0), (8192, 0), (32768, 0), (2048, 16384))
DECODE = ((1, 1, 4096), (128, 4, 4096), (64, 1, 16384), (256, 1, 1024))


def _dense_kv(x: dict, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request b's keys and values gathered from the paged pool: [1, Hkv, L, D] each."""
    n = int(x["seq_lens"][b])
    rows = x["block_tables"][b, :-(-n // BLOCK)].long()
    k = x["k_cache"][rows].flatten(0, 1)[:n]
    v = x["v_cache"][rows].flatten(0, 1)[:n]
    return k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous()


def bench_attention(r: Run, s: LayerShapes, fa4: Callable | None) -> None:
    for n, ctx in PREFILL:
        if r.spent():
            return
        r.guard(f"prefill n={n} ctx={ctx}", lambda: _prefill_case(r, s, fa4, n, ctx))
    for b, p, ctx in DECODE:
        if r.spent():
            return
        r.guard(f"decode B={b} P={p} ctx={ctx}", lambda: _decode_case(r, s, fa4, b, p, ctx))


def _prefill_case(r: Run, s: LayerShapes, fa4: Callable | None, n: int, ctx: int) -> None:
    hq, hkv, d = s.q_heads, s.kv_heads, s.head_dim
    group = hq // hkv
    case = f"prefill n={n} ctx={ctx}"
    x = paged_inputs([n], [ctx], BLOCK, hkv, group, d, "cuda", seed=n + ctx)
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["seq_lens"], x["cu_seqlens_q"],
            x["max_seqlen_q"], x["scale"])
    flops = 4.0 * hq * d * n * (ctx + (n + 1) / 2)
    nbytes = 2 * (2 * n * hq * d + 2 * (ctx + n) * hkv * d)
    ref = paged_attention(*args)
    r.guard(f"{case} triton", lambda: r.time("attn_prefill", case, "triton_paged", [lambda: paged_attention(*args)],
                                              flops, nbytes, reps=5))
    if fa4 is not None:
        call = AB.fa4_paged(fa4, *args)
        r.guard(f"{case} fa4 paged", lambda: r.time("attn_prefill", case, "fa4_paged", [call], flops, nbytes,
                                                    reps=5, ref="triton_paged", err=rel_err(_first(call()), ref)))
    k, v = _dense_kv(x, 0)
    q4 = x["q"].transpose(0, 1)[None]
    if ctx == 0 and fa4 is not None:
        kd, vd = k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous()
        call = AB.fa4_dense(fa4, x["q"], kd, vd, x["cu_seqlens_q"], n, x["scale"])
        r.guard(f"{case} fa4 dense", lambda: r.time("attn_prefill", case, "fa4_dense", [call], flops, nbytes,
                                                    reps=5, ref="triton_paged", err=rel_err(_first(call()), ref)))
    for backend in AB.SDPA_BACKENDS:
        def sdpa() -> None:
            kp, vp = (k[:, :, :ctx], v[:, :, :ctx]) if ctx else (None, None)
            call = AB.sdpa_prefill(backend, q4, k[:, :, ctx:], v[:, :, ctx:], kp, vp)
            err = rel_err(call()[0].transpose(0, 1), ref) if not ctx else None  # two partial sums with a prefix
            r.time("attn_prefill", case, f"sdpa_{backend}", [call], flops, nbytes, reps=5,
                   ref="triton_paged" if not ctx else "", err=err)
        r.guard(f"{case} sdpa {backend}", sdpa)


def _decode_case(r: Run, s: LayerShapes, fa4: Callable | None, b: int, p: int, ctx: int) -> None:
    hq, hkv, d = s.q_heads, s.kv_heads, s.head_dim
    group = hq // hkv
    case = f"decode B={b} P={p} ctx={ctx}"
    nbytes = 2 * b * (ctx + p) * hkv * d * 2 + 2 * 2 * b * p * hq * d
    flops = 4.0 * b * p * hq * d * (ctx + p)
    xs = [paged_inputs([p] * b, [ctx] * b, BLOCK, hkv, group, d, "cuda", seed=17 * i + b, spare_blocks=0)
          for i in range(_copies(nbytes))]
    argss = [(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["seq_lens"], x["cu_seqlens_q"],
              x["max_seqlen_q"], x["scale"]) for x in xs]
    ref = paged_attention(*argss[0])
    r.guard(f"{case} triton", lambda: r.time("attn_decode", case, "triton_paged",
                                              [lambda a=a: paged_attention(*a) for a in argss], flops, nbytes))
    if fa4 is not None:
        calls = [AB.fa4_paged(fa4, *a) for a in argss]
        r.guard(f"{case} fa4", lambda: r.time("attn_decode", case, "fa4_paged", calls, flops, nbytes,
                                              ref="triton_paged", err=rel_err(_first(calls[0]()), ref)))
    if b * (ctx + p) <= 64 * 16384:
        def sdpa() -> None:
            calls = []
            for x in xs:
                kv = [_dense_kv(x, i) for i in range(b)]
                k, v = torch.cat([t[0] for t in kv]), torch.cat([t[1] for t in kv])
                calls.append(AB.sdpa_decode("cudnn", x["q"].view(b, p, hq, d).transpose(1, 2), k, v))
            # No mask over the P verify queries: checked against ours only at P = 1.
            err = rel_err(calls[0]().transpose(1, 2).reshape(b * p, hq, d), ref) if p == 1 else None
            r.time("attn_decode", case, "sdpa_cudnn", calls, flops, nbytes,
                   ref="triton_paged" if p == 1 else "", err=err)
        r.guard(f"{case} sdpa", sdpa)


# ------------------------------------------------------------------------------ GDN prefill
GDN_SEQS = ((64, 1), (256, 1), (1024, 1), (4096, 1), (16384, 1), (32768, 1), (512, 16))


def bench_gdn(r: Run, s: LayerShapes, kernels: dict[str, Callable]) -> None:
    hk, hv, dk, dv = s.gdn_k_heads, s.gdn_v_heads, s.head_k_dim, s.head_v_dim
    for length, seqs in GDN_SEQS:
        if r.spent():
            return
        n = length * seqs
        case = f"prefill n={length} seqs={seqs}"
        io = 2 * n * (2 * hk * dk + 2 * hv * dv) + 6 * n * hv
        state = seqs * hv * dk * dv * 4
        flops = 2.0 * n * hv * (64 * (dk + dv) + 4 * dk * dv)

        def inputs(seed: int) -> dict:
            g = torch.Generator("cuda").manual_seed(seed)
            rnd = lambda *sh: torch.randn(*sh, generator=g, device="cuda")  # noqa: E731
            return {"q": rnd(1, n, hk, dk).bfloat16(), "k": rnd(1, n, hk, dk).bfloat16(), "v": rnd(1, n, hv, dv).bfloat16(),
                    "g": torch.nn.functional.logsigmoid(rnd(1, n, hv)) * 0.1,
                    "beta": torch.rand(1, n, hv, generator=g, device="cuda").bfloat16(),
                    "initial_state": rnd(seqs, hv, dv, dk) * 0.05,
                    "cu_seqlens": torch.arange(seqs + 1, device="cuda", dtype=torch.int64) * length}
        xs = [inputs(i) for i in range(_copies(io + 2 * state, 4))]
        outs = {}
        for name, fn in kernels.items():
            def one(fn=fn, name=name) -> None:
                calls = [lambda x=x: fn(**x, output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True)
                         for x in xs]
                o, final = calls[0]()
                outs[name] = (o.float(), final.float())
                ref = "fla" if name != "fla" and "fla" in outs else ""
                err = rel_err(outs[name][0], outs["fla"][0]) if ref else None
                r.time("gdn_prefill", case, name, calls, flops, io + 2 * state, reps=10, ref=ref, err=err)
                if ref:
                    r.log(f"  final state rel err vs fla {rel_err(outs[name][1], outs['fla'][1]):.2e}")
            r.guard(f"gdn {case} {name}", one)
        del xs, outs


# ------------------------------------------------------------------------------ MoE
MOE_TOKENS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)
MOE_PROFILE = (1, 4, 32)


def bench_moe(r: Run, s: LayerShapes) -> None:
    from calibrate.model.work import moe_work

    w = [moe_inputs(1, s.hidden, s.num_experts, s.expert_width, s.top_k, True, "cuda", seed=100 + i)
         for i in range(3)]
    for t in MOE_TOKENS:
        if r.spent():
            return
        xs = [torch.randn(t, s.hidden, device="cuda").bfloat16() for _ in range(6)]
        calls = [lambda x=x, ww=w[i % 3]: FM.fused_moe(**{**ww, "x": x}) for i, x in enumerate(xs)]
        flops, nbytes = moe_work(s, t)
        r.guard(f"moe T={t}", lambda: r.time("moe", f"tokens={t}", "triton_fused", calls, flops, nbytes))
        if t in MOE_PROFILE:
            r.guard(f"moe profile T={t}", lambda: _profile(r, t, calls))


def _profile(r: Run, t: int, calls: list[Callable[[], object]]) -> None:
    """Each kernel's mean GPU time per call, the calls queued behind a busy GPU."""
    from torch.profiler import ProfilerActivity, profile

    reps = 30
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(int(20_000 * r.cycles))
        for i in range(reps):
            calls[i % len(calls)]()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and "sleep" not in e.name:
            per.setdefault(e.name, []).append(e.device_time_total)
    for name, ts in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        r.launches.append({"tokens": t, "kernel": name[:80], "calls": len(ts), "us_per_call": round(sum(ts) / reps, 2)})
        r.log(f"  moe T={t} {name[:60]}: {sum(ts) / reps:.2f} us per call ({len(ts)} launches)")


# ------------------------------------------------------------------------------ main
def versions() -> dict[str, str | None]:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def _write(path: Path, rows: list[dict], fields: tuple[str, ...]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m calibrate.benches.packaged", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="attn,gdn,moe")
    ap.add_argument("--time-budget-s", type=float, default=240.0)
    a = ap.parse_args(argv)
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in ("attn", "gdn", "moe")]
    if bad:
        ap.error(f"--parts: unknown {', '.join(bad)}; allowed: attn, gdn, moe")
    if not torch.cuda.is_available():
        ap.exit(2, "packaged_bench: needs a CUDA GPU\n")
    a.out.mkdir(parents=True, exist_ok=True)
    r = Run(a.out, a.time_budget_s)
    r.bw, r.tflops, r.cycles = copy_bandwidth_gbs(torch.device("cuda")), matmul_tflops(torch.device("cuda")), cycles_per_us()
    s = LayerShapes.from_model(load_model(MODEL))
    fa4 = AB.load_fa4()
    gdn = {name: fn for name, fn in (("fla", load_fla_chunk()), ("flashinfer", load_flashinfer_chunk())) if fn}
    env = {**provenance.environment("cuda"), "packages": versions(), "fa4": fa4 is not None, "gdn": list(gdn)}
    r.log(f"{env['gpu']}: copy {r.bw:.0f} GB/s, matrix {r.tflops:.0f} TFLOP/s; fa4 {env['fa4']}, gdn {list(gdn)}")
    probe = HostProbe("cuda")
    with torch.inference_mode():
        for part in parts:
            r.probe(f"before {part}", probe)
            if part == "attn":
                bench_attention(r, s, fa4)
            elif part == "gdn":
                bench_gdn(r, s, gdn)
            else:
                bench_moe(r, s)
            r.probe(f"after {part}", probe)
            _write(a.out / "kernels.csv", r.rows, FIELDS)
            _write(a.out / "moe_launches.csv", r.launches, ("tokens", "kernel", "calls", "us_per_call"))
    summary = {"env": env, "copy_gbs": round(r.bw, 1), "matrix_tflops": round(r.tflops, 1),
               "host_probes": r.probes, "errors": r.errors, "elapsed_s": round(time.perf_counter() - r.t0, 1)}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if r.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
