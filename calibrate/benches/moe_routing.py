"""The fused MoE's time under skewed expert routing (`python3 -m calibrate.benches.moe_routing`).

The `moe` tables time random router weights on random tokens: every token's top-k is a uniform
draw, so a batch of T tokens touches as many experts as chance allows. A trained router on real
text prefers some experts. Where the layer is bound by reading expert weights (small batches),
fewer distinct experts means fewer bytes; where it is bound by the most loaded expert's rows
(large batches), a hot expert means a longer tail. This bench measures which way and how far.

Skew is a stable popularity over experts, the same for every token: expert e's router logit gets
a bias `alpha * g_e` (g_e standard normal, drawn once), added through one input channel held at
1.0 (x[:, 0] = 1, router_w[:, 0] = bias), so the kernels under test are the table's own
(`calibrate.kernels.fused_moe.fused_moe`, default configs) and nothing else changes. The router's
other logits have unit spread (`moe_inputs`), so alpha is in units of that spread; alpha = 0 is
the tables' routing. Each row records what the routing did: distinct experts touched, the most
loaded expert's pairs, and their mean over touched experts.
"""
from __future__ import annotations

import time

import torch

from calibrate.benches.outputs import bench_parser, write_outputs
from calibrate.device.timing import copy_bandwidth_gbs, time_calls
from calibrate.kernels import fused_moe as FM
from calibrate.kernels.inputs import moe_inputs
from calibrate.model.shapes import LayerShapes
from calibrate.model.work import moe_work
from core.config import load_model

MODULE = "calibrate.benches.moe_routing"

TOKENS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048)
ALPHAS = (0.0, 0.5, 1.0, 1.5, 2.0)
CALLS = 6  # per graph, over 3 weight copies, each call its own tokens
COLUMNS = ("model", "tokens", "alpha", "distinct_experts", "max_pairs", "mean_pairs", "us", "us_p10", "us_p90",
           "reps", "pct_copy", "us_over_uniform")


def skew(inputs: dict, bias: torch.Tensor) -> dict:
    """The same weights and tokens with `bias` added to every token's router logits."""
    x = inputs["x"].clone()
    x[:, 0] = 1.0
    router = inputs["router_w"].clone()
    router[:, 0] = bias.to(router.dtype)
    return {**inputs, "x": x, "router_w": router}


def routing_stats(x: torch.Tensor, router_w: torch.Tensor, top_k: int) -> tuple[int, int, float]:
    """Distinct experts, the most loaded expert's pairs and the mean over touched experts, from
    the router's own top-k (softmax is monotone, so the top-k of the logits)."""
    ids = torch.topk(x.float() @ router_w.float().T, top_k, dim=1).indices
    counts = torch.bincount(ids.flatten(), minlength=router_w.shape[0])
    touched = int((counts > 0).sum())
    return touched, int(counts.max()), float(counts.sum()) / max(1, touched)


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(MODULE, __doc__, budget_s=90.0)
    ap.add_argument("--model", default="qwen3.5-35b-a3b")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--alphas", default=",".join(map(str, ALPHAS)))
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    t0 = time.monotonic()
    s = LayerShapes.from_model(load_model(args.model))
    tokens = [int(t) for t in args.tokens.split(",")]
    alphas = [float(a) for a in args.alphas.split(",")]
    bw = copy_bandwidth_gbs(dev)
    weights = [moe_inputs(1, s.hidden, s.num_experts, s.expert_width, s.top_k, True, dev, seed=300 + i)
               for i in range(3)]
    gen = torch.Generator(dev).manual_seed(7)
    popularity = torch.randn(s.num_experts, generator=gen, device=dev)
    rows: list[dict] = []
    skipped: list[str] = []
    for t in tokens:
        uniform_us = None
        for a in alphas:
            if time.monotonic() - t0 > args.time_budget_s:
                skipped.append(f"T={t} alpha={a}")
                continue
            calls = []
            stats = []
            for i in range(CALLS):
                base = {**weights[i % 3], "x": torch.randn(t, s.hidden, generator=gen, device=dev).to(torch.bfloat16)}
                inp = skew(base, a * popularity)
                stats.append(routing_stats(inp["x"], inp["router_w"], s.top_k))
                calls.append(lambda inp=inp: FM.fused_moe(**inp))
            calls[0]()
            torch.cuda.synchronize()
            tm = time_calls(calls, "graph", dev, budget_s=0.05)
            _, nbytes = moe_work(s, t)
            if a == 0.0:
                uniform_us = tm.us
            rows.append({"model": args.model, "tokens": t, "alpha": a,
                         "distinct_experts": round(sum(x[0] for x in stats) / CALLS, 1),
                         "max_pairs": round(sum(x[1] for x in stats) / CALLS, 1),
                         "mean_pairs": round(sum(x[2] for x in stats) / CALLS, 2),
                         "us": round(tm.us, 3), "us_p10": round(tm.us_p10, 3), "us_p90": round(tm.us_p90, 3),
                         "reps": tm.reps, "pct_copy": round(100 * nbytes / (tm.us * 1e-6) / (bw * 1e9), 1),
                         "us_over_uniform": "" if uniform_us is None else round(tm.us / uniform_us, 3)})
            r = rows[-1]
            print(f"[{time.monotonic() - t0:6.1f}s] T={t} alpha={a}: {r['us']} us, {r['distinct_experts']} experts, "
                  f"max {r['max_pairs']} pairs, x{r['us_over_uniform']} of uniform", flush=True)
    write_outputs(args.out, "moe_routing", rows, COLUMNS, MODULE, args, argv, {
        "copy_bandwidth_gbs": round(bw, 1), "kernel": "calibrate.kernels.fused_moe.fused_moe, default configs",
        "skipped": skipped, "wall_s": round(time.monotonic() - t0, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
