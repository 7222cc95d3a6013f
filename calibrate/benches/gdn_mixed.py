"""The GDN core of a step that mixes decodes with a prefill, as vLLM 0.17.1 runs it
(`python3 -m calibrate.benches.gdn_mixed`).

Without speculation, vLLM's GDN layer (`Qwen3NextGatedDeltaNet._forward_core`, which Qwen3.5's
layer inherits; metadata from `v1/attention/backends/gdn_attn.py`) treats every request of the
step as "non-spec". When the step holds no prefill, the decodes' states are updated in place by
`fused_recurrent_gated_delta_rule`, which the `none` policy's kernel row prices. When it holds
one, the decodes go with the prefills through the chunked prefill path instead:

    initial_state = ssm_state[non_spec_state_indices].contiguous()   # gather every request's state
    initial_state[~has_initial_state] = 0
    out, final = chunk_gated_delta_rule(...)                         # FlashInfer's on SM90, varlen
    ssm_state[non_spec_state_indices] = final.to(ssm_state.dtype)    # scatter them back

This bench times that sequence (FlashInfer's kernel through calibrate/model/flashinfer_gdn.py, fp32
states as Qwen3.5's `mamba_ssm_dtype`) for B one-token decodes beside one prefill chunk of n
tokens, and the same prefill alone, in the same run. `extra_us` = the two's difference is what B
decodes cost a mixed step's GDN layer in place of their decode kernel.
"""
from __future__ import annotations

import time

import torch

from calibrate.benches.outputs import bench_parser, write_outputs
from calibrate.device.timing import copy_bandwidth_gbs, time_calls
from calibrate.model.flashinfer_gdn import load_flashinfer_chunk
from calibrate.model.shapes import LayerShapes
from core.config import load_model
from core.tables import GDN_MIXED_COLUMNS

MODULE = "calibrate.benches.gdn_mixed"

DECODES = (1, 4, 16, 64, 128, 256, 512, 1024)
PREFILL_TOKENS = (256, 1024, 4096, 8192)
COPIES = 2  # state pools a timing alternates between, each larger than the L2


class MixedStep:
    """One layer's inputs for B decodes and one n-token prefill, their states in a pool of slots."""

    def __init__(self, s: LayerShapes, b: int, n: int, dev: torch.device, gen: torch.Generator) -> None:
        self.b, self.n = b, n
        seqs, tokens = b + 1, b + n
        self.q = torch.randn(1, tokens, s.gdn_k_heads, s.head_k_dim, generator=gen, device=dev).bfloat16()
        self.k = torch.randn(1, tokens, s.gdn_k_heads, s.head_k_dim, generator=gen, device=dev).bfloat16()
        self.v = torch.randn(1, tokens, s.gdn_v_heads, s.head_v_dim, generator=gen, device=dev).bfloat16()
        self.g = torch.nn.functional.logsigmoid(torch.randn(1, tokens, s.gdn_v_heads, generator=gen, device=dev))
        self.beta = torch.rand(1, tokens, s.gdn_v_heads, generator=gen, device=dev).bfloat16()
        # vLLM orders a batch's decodes before its prefills (split_decodes_and_prefills)
        lens = torch.tensor([0] + [1] * b + [n], device=dev)
        self.cu_seqlens = torch.cumsum(lens, 0).to(torch.int64)
        slots = 2 * seqs
        self.pool = torch.randn(slots, s.gdn_v_heads, s.head_v_dim, s.head_k_dim, generator=gen, device=dev) * 0.1
        self.idx = torch.randperm(slots, generator=gen, device=dev)[:seqs]
        self.has_initial = torch.ones(seqs, dtype=torch.bool, device=dev)
        self.has_initial[-1] = False  # the prefill starts from zero, its decodes from their cached states
        self.state_bytes = s.gdn_v_heads * s.head_v_dim * s.head_k_dim * 4

    def run(self, chunk) -> torch.Tensor:
        initial = self.pool[self.idx].contiguous()
        initial[~self.has_initial, ...] = 0
        out, final = chunk(self.q, self.k, self.v, self.g, self.beta, initial_state=initial, output_final_state=True,
                           cu_seqlens=self.cu_seqlens, use_qk_l2norm_in_kernel=True, state_v_first=True)
        self.pool[self.idx] = final.to(self.pool.dtype)
        return out


def check(chunk, s: LayerShapes, dev: torch.device) -> float:
    """The mixed call against each request run alone from its own state (vLLM's decode is the same
    recurrence): the largest difference of outputs and of written states."""
    gen = torch.Generator(dev).manual_seed(3)
    m = MixedStep(s, 4, 100, dev, gen)
    before = m.pool.clone()
    out = m.run(chunk)
    err = 0.0
    for i in range(5):
        a, e = int(m.cu_seqlens[i]), int(m.cu_seqlens[i + 1])
        state = before[m.idx[i]].unsqueeze(0) if i < 4 else torch.zeros_like(before[:1])
        o, f = chunk(m.q[:, a:e], m.k[:, a:e], m.v[:, a:e], m.g[:, a:e], m.beta[:, a:e], initial_state=state,
                     output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True)
        err = max(err, float((o.float() - out[:, a:e].float()).abs().max()), float((f[0] - m.pool[m.idx[i]]).abs().max()))
    if err > 2e-2:
        raise AssertionError(f"mixed GDN call differs from its requests run alone by {err:.3g}")
    return err


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(MODULE, __doc__, budget_s=150.0)
    ap.add_argument("--model", default="qwen3.5-35b-a3b")
    ap.add_argument("--decodes", default=",".join(map(str, DECODES)))
    ap.add_argument("--prefill-tokens", default=",".join(map(str, PREFILL_TOKENS)))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    dev = torch.device("cuda")
    chunk = load_flashinfer_chunk()
    if chunk is None:
        raise SystemExit("gdn_mixed_bench: FlashInfer's GDN prefill is not importable; source .carry-b/setup.sh b first")
    s = LayerShapes.from_model(load_model(args.model))
    bw = copy_bandwidth_gbs(dev)
    err = check(chunk, s, dev)
    print(f"[{time.monotonic() - t0:5.1f}s] copy {bw:.0f} GB/s; mixed call against requests alone: max diff {err:.2e}",
          flush=True)
    gen = torch.Generator(dev).manual_seed(9)
    rows, skipped = [], []
    for n in [int(x) for x in args.prefill_tokens.split(",")]:
        alone = None
        for b in [0] + [int(x) for x in args.decodes.split(",")]:
            if time.monotonic() - t0 > args.time_budget_s:
                skipped.append(f"n={n} B={b}")
                continue
            steps = [MixedStep(s, b, n, dev, gen) for _ in range(COPIES)]
            calls = [lambda m=m: m.run(chunk) for m in steps]
            for c in calls:  # FlashInfer compiles per shape: outside the timing
                c()
            torch.cuda.synchronize()
            t = time_calls(calls, "eager", dev, budget_s=0.08)
            if b == 0:
                alone = t.us
            moved = 6 * (b + 1) * steps[0].state_bytes  # gather, kernel and scatter each read and write every state
            rows.append({"model": args.model, "mode": "eager", "B": b, "tokens": n, "us": round(t.us, 2),
                         "us_p10": round(t.us_p10, 2), "us_p90": round(t.us_p90, 2), "reps": t.reps,
                         "prefill_alone_us": round(alone, 2), "extra_us": round(t.us - alone, 2),
                         "state_bytes_moved": moved, "pct_copy": round(100 * moved / (t.us * 1e-6) / (bw * 1e9), 1)})
            r = rows[-1]
            print(f"[{time.monotonic() - t0:5.1f}s] n={n} B={b}: {r['us']} us, +{r['extra_us']} over the prefill alone, "
                  f"{r['pct_copy']}% of copy", flush=True)
            del steps, calls
            torch.cuda.empty_cache()
    write_outputs(args.out, "gdn_mixed", rows, GDN_MIXED_COLUMNS, MODULE, args, argv, {
        "copy_bandwidth_gbs": round(bw, 1), "check_max_diff": err, "skipped": skipped,
        "kernel": "flashinfer.gdn_prefill.chunk_gated_delta_rule via calibrate/model/flashinfer_gdn.py, fp32 states",
        "wall_s": round(time.monotonic() - t0, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
