"""The profile run's memory peak, measured as vLLM's `profile_run` makes it (GPU).

    python3 -m calibrate.benches.profile_peak --out DIR --time-budget-s 120

vLLM sizes the KV pool after a profile run: a dummy forward of max_num_batched_tokens
tokens spread over min(max_num_seqs, tokens) requests (GDN layers skip their kernels),
then a dummy sampler over one row per request with the whole vocabulary in fp32 (every
TP rank gathers the full logits), then, with speculative decoding, a dummy rejection
sampler over one draft token per request. The phases run one after the other, so the
peak is that of the larger. Here, per model at its YAML tensor parallelism (per-GPU
shapes) and per point of the server defaults:

- forward: one GDN layer, one attention layer and two feed-forward (MoE or MLP) blocks of real shapes
  (calibrate/model/layers.py), the residual stream kept, as the peak lies inside one layer;
- sampler: vLLM's dummy sampling metadata (temperature 0.5, top-p 0.9, top-k vocab - 1,
  no penalties) through its torch fallback (`apply_top_k_top_p`: a full sort), and a
  sort-free path (softmax only, what a FlashInfer sampling kernel needs) beside it;
- rejection sampler: fp32 target logits, the same top-k/top-p, softmax, and the
  exponential draws of the recovered-token sampler.

Peaks are `torch.cuda.max_memory_allocated` above what was allocated before the phase
(weights, and for the sampler the forward's output). A float64 check of the sampler's
filtered distribution runs first. Writes DIR/<model>/profile_peak.json with provenance;
one failing point is logged and recorded as failed, the rest go on.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from calibrate.device import provenance
from calibrate.model import layers as L
from calibrate.model.shapes import LayerShapes
from calibrate.tables.grid import QUICK
from calibrate.tables.measure import Harness
from core.config import ModelConfig, load_hardware, load_model, model_names

TEMPERATURE, TOP_P = 0.5, 0.9  # vLLM's _dummy_sampler_run metadata (top_k = vocab - 1)
# (max_num_batched_tokens, max_num_seqs, speculative): the OpenAI server defaults on >= 70 GiB
# GPUs, with and without MTP, and a smaller max_num_seqs.
POINTS = ((8192, 1024, False), (8192, 1024, True), (8192, 256, True))


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """vLLM's torch fallback (`sample/ops/topk_topp_sampler.py`): sort, mask, unsort."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    kth = logits_sort.gather(1, (logits_sort.size(1) - k.long()).unsqueeze(1))
    logits_sort.masked_fill_(logits_sort < kth, -float("inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def sample(logits_model_dtype: torch.Tensor, sort: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's Sampler on the dummy metadata: (sampled ids, the filtered probabilities)."""
    rows, vocab = logits_model_dtype.shape
    dev = logits_model_dtype.device
    temperature = torch.full((rows,), TEMPERATURE, device=dev)
    logits = logits_model_dtype.to(torch.float32)
    greedy = logits.argmax(dim=-1)  # neither all-greedy nor all-random: both are computed
    logits.div_(temperature.unsqueeze(1))
    if sort:
        k = torch.full((rows,), vocab - 1, device=dev)
        logits = apply_top_k_top_p(logits, k, torch.full((rows,), TOP_P, device=dev))
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    random = probs.div(q).argmax(dim=-1)
    return torch.where(temperature < 1e-5, greedy, random), probs


def rejection_sample(rows: int, vocab: int, device: torch.device) -> torch.Tensor:
    """The dummy rejection-sampler pass: one draft token per request, no draft probabilities."""
    target_logits = torch.randn(rows, vocab, device=device, dtype=torch.float32)
    target_logits.div_(TEMPERATURE)
    k = torch.full((rows,), vocab - 1, device=device)
    target_probs = apply_top_k_top_p(target_logits, k, torch.full((rows,), TOP_P, device=device)).softmax(-1)
    q = torch.empty_like(target_probs).exponential_()  # recovered-token sampler's draws
    return target_probs.div(q).argmax(dim=-1)


def check_sampler(device: torch.device) -> float:
    """Max error of the filtered distribution against a float64 top-k/top-p; raises if off."""
    torch.manual_seed(0)
    rows, vocab = 5, 1003
    # float32 logits: distinct values, so the sort has no ties to break differently.
    logits = (torch.randn(rows, vocab, device=device, dtype=torch.float64) * 3).float()
    ids, probs = sample(logits.clone(), sort=True)  # sample() divides its fp32 input in place
    x = logits.double() / TEMPERATURE
    ref = torch.zeros_like(x)
    for r in range(rows):
        order = x[r].argsort(descending=True)[:-1]  # top-k = vocab - 1 drops the smallest
        p = x[r][order].softmax(-1)
        # Keep a token while the mass strictly above it is under top_p.
        kept = order[(p.cumsum(0) - p) < TOP_P]
        ref[r, kept] = x[r, kept].softmax(-1)
    err = (probs.double() - ref).abs().max().item()
    if err > 1e-4 or not bool((ref.gather(1, ids[:, None]) > 0).all()):
        raise AssertionError(f"sampler emulation disagrees with the float64 top-k/top-p reference (max error {err:.2e})")
    return err


def _peak(device: torch.device, run: Callable[[], object]) -> tuple[int, object]:
    if device.type != "cuda":  # tests run the phases on the CPU for their shapes, with no allocator stats
        return 0, run()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base, out


def measure_point(h: Harness, model: ModelConfig, tokens: int, seqs: int, speculative: bool) -> dict:
    s, d = h.shapes, h.device
    gdn, attn, ffn = L.gdn_weights(s, d), L.attn_weights(s, d), L.ffn_weights(s, d)
    head, embed = L.head_weights(s, d), L._w(s.vocab, s.hidden, device=d)
    rows = min(seqs, tokens)
    ids = torch.randint(0, s.vocab, (tokens,), device=d)
    positions = torch.arange(tokens, device=d)
    cos, sin = L.rope_tables(positions, s.rotary_dim)

    def forward() -> torch.Tensor:
        conv = h.randn(s.conv_kernel - 1, s.gdn_conv_channels)
        kc, vc = h.randn(tokens, s.kv_heads, s.head_dim), h.randn(tokens, s.kv_heads, s.head_dim)

        def causal(q, k, v):
            return L.prefill_core(q.transpose(0, 1)[None], None, None, k.transpose(0, 1)[None],
                                  v.transpose(0, 1)[None])[0].transpose(0, 1)
        x = embed.index_select(0, ids)
        x = L.ffn_forward(L.gdn_forward(x, gdn, s, conv), ffn, s)
        return L.ffn_forward(L.attn_forward(x, attn, s, cos, sin, positions, kc, vc, causal), ffn, s)

    fwd_peak, hidden = _peak(d, forward)
    if not bool(torch.isfinite(hidden).all()):
        raise FloatingPointError("dummy forward produced non-finite hidden states")
    # One logit row per request: its last token (vLLM's logit_indices).
    last = (torch.arange(1, rows + 1, device=d) * (tokens // rows)) - 1
    last[-1] = tokens - 1

    def logits() -> torch.Tensor:
        shard = torch.nn.functional.linear(torch.nn.functional.rms_norm(hidden[last], (s.hidden,), head.norm, L.EPS),
                                           head.lm_head)
        # Every TP rank gathers the whole vocabulary (vLLM's all-gather of the vocab-parallel head).
        return shard if s.tp == 1 else torch.cat([shard] * s.tp, dim=-1)[:, :model.vocab_size]

    out = {"max_num_batched_tokens": tokens, "max_num_seqs": seqs, "speculative": speculative, "rows": rows,
           "vocab": model.vocab_size, "tensor_parallel": model.tensor_parallel, "forward_peak_bytes": fwd_peak}
    for path, sort in (("torch_sort", True), ("no_sort", False)):
        peak, res = _peak(d, lambda: sample(logits(), sort))
        ids_out = res[0]
        del res  # the probabilities: not live in the next phase
        if not bool(((ids_out >= 0) & (ids_out < model.vocab_size)).all()):
            raise AssertionError(f"sampler ({path}) returned token ids outside the vocabulary")
        out[f"sampler_peak_bytes_{path}"] = peak
        gc.collect()
    out["rejection_sampler_peak_bytes"] = _peak(d, lambda: rejection_sample(rows, model.vocab_size, d))[0] \
        if speculative else 0
    out["sampler_peak_bytes"] = max(out["sampler_peak_bytes_torch_sort"], out["rejection_sampler_peak_bytes"])
    out["profile_peak_bytes"] = max(fwd_peak, out["sampler_peak_bytes"])
    out["profile_peak_bytes_no_sort"] = max(fwd_peak, out["sampler_peak_bytes_no_sort"],
                                            out["rejection_sampler_peak_bytes"])
    out["status"] = "ok"
    return out


def run_model(model: ModelConfig, out_dir: Path, deadline: float, log: Callable[[str], None]) -> int:
    hw = load_hardware("h200")
    dev = torch.device("cuda")
    h = Harness(LayerShapes.from_model(model), QUICK, dev, ("eager",), hw.hbm_bandwidth_gbs, hw.bf16_tflops, log=log)
    points, failed = [], 0
    for tokens, seqs, spec in POINTS:
        tag = f"{model.name} tokens={tokens} seqs={seqs} spec={spec}"
        if time.monotonic() > deadline:
            points.append({"max_num_batched_tokens": tokens, "max_num_seqs": seqs, "speculative": spec,
                           "status": "skipped: time budget spent"})
            log(f"skip {tag}: time budget spent")
            continue
        t0 = time.monotonic()
        try:
            with torch.inference_mode():
                p = measure_point(h, model, tokens, seqs, spec)
            points.append(p)
            log(f"{tag}: forward {p['forward_peak_bytes'] / 2**30:.2f} GiB, sampler sort "
                f"{p['sampler_peak_bytes_torch_sort'] / 2**30:.2f} / no-sort {p['sampler_peak_bytes_no_sort'] / 2**30:.2f}"
                f" GiB, rejection {p['rejection_sampler_peak_bytes'] / 2**30:.2f} GiB -> profile peak "
                f"{p['profile_peak_bytes'] / 2**30:.2f} GiB ({time.monotonic() - t0:.1f} s)")
        except Exception as e:  # record it and go on with the next point
            failed += 1
            points.append({"max_num_batched_tokens": tokens, "max_num_seqs": seqs, "speculative": spec,
                           "status": f"failed: {type(e).__name__}: {e}"})
            log(f"{tag} FAILED: {traceback.format_exc()}")
        finally:
            gc.collect()
            torch.cuda.empty_cache()
    env = provenance.environment("cuda")
    provenance.write(out_dir / model.name / "profile_peak.json", {
        "model": model.name, "what": "vLLM profile-run peak per GPU: dummy forward, dummy sampler, dummy rejection "
        "sampler (calibrate/benches/profile_peak.py docstring); profile_peak_bytes follows vLLM's torch top-k/top-p "
        "fallback (full sort), profile_peak_bytes_no_sort a sort-free sampling kernel",
        "points": points,
        "provenance": {**env, "git_commit": provenance.git_commit(), "command": " ".join(sys.argv)},
    })
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m calibrate.benches.profile_peak", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="writes OUT/<model>/profile_peak.json")
    p.add_argument("--time-budget-s", type=float, default=120.0, help="stop starting new points after this")
    p.add_argument("--models", default=",".join(model_names()), help="comma-separated model names")
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    if not torch.cuda.is_available():
        print("calibrate.benches.profile_peak: no CUDA device here", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.time_budget_s
    try:
        log(f"sampler check: max error {check_sampler(torch.device('cuda')):.2e} against float64")
    except AssertionError as e:
        log(f"sampler check FAILED: {e}")
        return 1
    failed = 0
    for name in args.models.split(","):
        try:
            failed += run_model(load_model(name), args.out, deadline, log)
        except Exception:  # a model that cannot even build its layers: the others still run
            failed += 1
            log(f"{name} FAILED: {traceback.format_exc()}")
    log(f"done: {failed} failed; wrote {args.out}/<model>/profile_peak.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
