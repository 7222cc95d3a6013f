"""What sampling adds to a step on the GPU: vLLM 0.17.1's sampler against greedy argmax
(`python3 -m calibrate.benches.sampler`).

The `lm_head` tables end in greedy token ids (fp32 logits, argmax). A server that samples runs
vLLM's `Sampler.forward` instead (`v1/sample/sampler.py`): with every request random (a
checkpoint's `generation_config.json` asks for temperature, top-k and top-p, and vLLM applies it by
default), it divides the fp32 logits by the temperatures in place, masks them with top-k/top-p
(`TopKTopPSampler.forward_native` -> `apply_top_k_top_p`: vLLM's Triton kernel from 8 rows,
`v1/sample/ops/topk_topp_triton.py`, and its torch sort below that), then `random_sample`: fp32
softmax, exponential noise, divide, argmax. None of it is in a CUDA graph. This bench runs that
path with vLLM's own kernel (the wheel's Python files travel in the carry) and the greedy path on
the same bf16 logits, both from the fp32 cast on, and writes each per rows and vocabulary: GPU
time (captured in a CUDA graph, cold L2) and eager time (launches from Python, as vLLM issues
them). `extra_us` = sampled - greedy is what a sampled step costs beyond the table's LM head.

The Triton kernel searches for its pivots, so its time depends on the logits: `gaussian` rows
(unit normal, what a random LM head gives) and `peaked` rows (a normal bulk of spread 2 with 32
tokens lifted 4 to 12 above its maximum, as a trained model's few likely tokens) bound it.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from calibrate.benches.outputs import bench_parser, write_outputs
from calibrate.benches.profile_peak import apply_top_k_top_p as torch_top_k_top_p, check_sampler
from calibrate.device.timing import Timing, copy_bandwidth_gbs, time_calls
from core.config import load_model
from core.tables import SAMPLER_COLUMNS

MODULE = "calibrate.benches.sampler"

ROWS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096)
DISTS = ("gaussian", "peaked")
MODES = ("graph", "eager")
TOP_K, TOP_P, TEMPERATURE = 20, 0.95, 1.0  # Qwen3.5's recommended thinking-mode sampling
TRITON_FROM_ROWS = 8  # `apply_top_k_top_p`: the Triton kernel from 8 rows, a full torch sort below
COPIES = 2  # logits tensors a timing alternates between (each of 8 rows or more exceeds the L2 alone)
SAMPLINGS = ("top_k_top_p", "random")  # every request random: with top-k and top-p, and without


def load_vllm_top_k_top_p():
    """vLLM's Triton top-k/top-p mask and its module file (for provenance), or a SystemExit naming what is missing."""
    try:
        from vllm.v1.sample.ops import topk_topp_triton as mod
    except ImportError as e:
        raise SystemExit(f"sampler_bench: vLLM's sampler kernel is not importable ({e}); "
                         "source .carry-a/setup.sh a first (make carry builds it)") from None
    # vLLM asks its platform object for the SM count, and that object loads vLLM's compiled extension,
    # which does not travel; CudaPlatform.num_compute_units is this (vllm/platforms/cuda.py).
    mod.num_compute_units = lambda device_id=0: torch.cuda.get_device_properties(device_id).multi_processor_count
    return mod.apply_top_k_top_p_triton, Path(mod.__file__)


def make_logits(rows: int, vocab: int, dist: str, gen: torch.Generator, device: torch.device,
                dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Logits as the LM head leaves them (bf16); fp32 ones have no ties for the mask check."""
    x = torch.randn(rows, vocab, generator=gen, device=device)
    if dist == "peaked":
        x *= 2.0
        top = x.max(dim=1, keepdim=True).values
        idx = torch.randint(0, vocab, (rows, 32), generator=gen, device=device)
        lift = 4.0 + 8.0 * torch.rand(rows, 32, generator=gen, device=device)
        x.scatter_(1, idx, top + lift)
    elif dist != "gaussian":
        raise ValueError(f"dist must be one of {', '.join(DISTS)}, got {dist!r}")
    return x.to(dtype)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.to(torch.float32).argmax(dim=-1)


def sampled(logits: torch.Tensor, temp: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
            top_k_top_p) -> torch.Tensor:
    """`Sampler.forward` for all-random requests without logprobs or penalties, in vLLM's order
    (k and p None: no request asks for top-k or top-p, and `apply_top_k_top_p` returns at once)."""
    x = logits.to(torch.float32)
    x.div_(temp.unsqueeze(dim=1))  # apply_temperature
    if k is not None or p is not None:
        x = top_k_top_p(x, k, p) if x.shape[0] >= TRITON_FROM_ROWS else torch_top_k_top_p(x, k, p)
    probs = x.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div_(q).argmax(dim=-1).view(-1).to(torch.int32)


def check_mask(top_k_top_p, device: torch.device, vocab: int) -> dict:
    """vLLM's Triton mask against its torch sort fallback (the rule it implements) on the same logits:
    the rows whose kept tokens differ, per distribution, on 64 rows."""
    gen = torch.Generator(device).manual_seed(11)
    out = {}
    for dist in DISTS:
        x = make_logits(64, vocab, dist, gen, device, torch.float32)
        k = torch.full((64,), TOP_K, dtype=torch.int32, device=device)
        p = torch.full((64,), TOP_P, device=device)
        a = torch.isfinite(top_k_top_p(x.clone(), k, p))
        b = torch.isfinite(torch_top_k_top_p(x.clone(), k, p))
        bad = int((a != b).any(dim=1).sum())
        kept = a.sum(dim=1).float()
        if bad > 1 or int(kept.max()) > TOP_K or int(kept.min()) < 1:
            raise AssertionError(f"vLLM's top-k/top-p kernel disagrees with the sort rule on {dist} logits: "
                                 f"{bad} of 64 rows differ, kept {int(kept.min())}-{int(kept.max())} tokens")
        out[dist] = {"rows_differing": bad, "mean_kept": round(float(kept.mean()), 2)}
    return out


def _timed(fn, srcs: list[torch.Tensor], mode: str, device: torch.device) -> Timing:
    calls = [lambda s=s: fn(s) for s in srcs]
    for c in calls:  # compile and allocate (the kernel's buffer cache) outside any capture
        c()
    torch.cuda.synchronize()
    return time_calls(calls, mode, device, budget_s=0.05)


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(MODULE, __doc__, budget_s=150.0)
    ap.add_argument("--models", default="qwen3.5-35b-a3b,qwen3-next-80b-a3b",
                    help="models whose vocabularies to time (one table row set per distinct vocabulary)")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    dev = torch.device("cuda")
    top_k_top_p, kernel_file = load_vllm_top_k_top_p()
    vocabs = sorted({load_model(m).vocab_size for m in args.models.split(",")}, reverse=True)
    rows_list = [int(r) for r in args.rows.split(",")]
    bw = copy_bandwidth_gbs(dev)
    float64_err = check_sampler(dev)
    checks = {str(v): check_mask(top_k_top_p, dev, v) for v in vocabs}
    print(f"[{time.monotonic() - t0:5.1f}s] copy {bw:.0f} GB/s; sort-rule check {checks}; float64 check {float64_err:.1e}",
          flush=True)
    gen = torch.Generator(dev).manual_seed(5)
    out_rows: list[dict] = []
    skipped: list[str] = []
    with torch.inference_mode():
        for sampling, vocab, dist in [(m, v, d) for m in SAMPLINGS for v in vocabs for d in DISTS
                                      if m == "top_k_top_p" or d == "gaussian"]:  # no pivot search: one distribution
            for rows in rows_list:
                if time.monotonic() - t0 > args.time_budget_s:
                    skipped.append(f"sampling={sampling} vocab={vocab} dist={dist} rows={rows}")
                    continue
                srcs = [make_logits(rows, vocab, dist, gen, dev) for _ in range(COPIES)]
                temp = torch.full((rows,), TEMPERATURE, device=dev)
                k = torch.full((rows,), TOP_K, dtype=torch.int32, device=dev) if sampling == "top_k_top_p" else None
                p = torch.full((rows,), TOP_P, device=dev) if sampling == "top_k_top_p" else None
                for mode in MODES:
                    g = _timed(greedy, srcs, mode, dev)
                    s = _timed(lambda x: sampled(x, temp, k, p, top_k_top_p), srcs, mode, dev)
                    # bytes of the greedy path's pass (bf16 read, fp32 write, fp32 read) at the copy rate
                    nbytes = rows * vocab * (2 + 4 + 4)
                    out_rows.append({
                        "sampling": sampling, "vocab": vocab, "dist": dist, "rows": rows, "mode": mode,
                        "path": "none" if k is None else "triton" if rows >= TRITON_FROM_ROWS else "torch-sort",
                        "greedy_us": round(g.us, 2), "sampled_us": round(s.us, 2),
                        "extra_us": round(s.us - g.us, 2), "greedy_us_p90": round(g.us_p90, 2),
                        "sampled_us_p90": round(s.us_p90, 2), "reps": min(g.reps, s.reps),
                        "pct_copy": round(100 * nbytes / (g.us * 1e-6) / (bw * 1e9), 1)})
                    r = out_rows[-1]
                    print(f"[{time.monotonic() - t0:5.1f}s] {sampling} V={vocab} {dist} rows={rows} {mode}: greedy "
                          f"{r['greedy_us']} us, sampled {r['sampled_us']} us (+{r['extra_us']})", flush=True)
                del srcs
                torch.cuda.empty_cache()
    write_outputs(args.out, "sampler", out_rows, SAMPLER_COLUMNS, MODULE, args, argv, {
            "copy_bandwidth_gbs": round(bw, 1), "top_k": TOP_K, "top_p": TOP_P, "temperature": TEMPERATURE,
            "vllm_kernel": "vllm 0.17.1 v1/sample/ops/topk_topp_triton.py apply_top_k_top_p_triton",
            "vllm_kernel_sha256": hashlib.sha256(kernel_file.read_bytes()).hexdigest(),
            "sort_rule_check": checks, "float64_check_max_err": float64_err, "skipped": skipped,
            "wall_s": round(time.monotonic() - t0, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
