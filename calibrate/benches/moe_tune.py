"""Tune the fused MoE on the GPU: time candidate configs per token count, keep the fastest as its table.

    python3 -m calibrate.benches.moe_tune --out DIR [--models a,b] [--time-budget-s 150] [--no-install]

For each model's shapes (per GPU) and each token count of vLLM's tables (1 ... 4096, plus
8192), every candidate is first checked against the float64 reference (fresh random
inputs, output NaN-poisoned) and then timed in CUDA-graph replay (6 back-to-back calls on
3 weight copies, cold L2) against the copy and bf16 matrix rates measured in the same run.
Candidates go round-robin over token counts (all defaults first), so a spent budget
leaves every size with its most promising ones timed. Writes DIR/moe_tune.csv (every
timing), DIR/<table>.json (the fastest per token count, `moe_configs.file_name`),
DIR/summary.json and DIR/log.txt, and installs the tables in `moe_configs.TABLE_DIR`
(unless --no-install) so a later `sim calibrate measure --jobs moe` in the same tree
runs them. Exit 1 if a check failed or a case raised.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from calibrate.benches import kernels as KB
from calibrate.device.timing import copy_bandwidth_gbs, matmul_tflops, time_calls
from calibrate.kernels import fused_moe as FM
from calibrate.kernels import moe_configs as MC
from calibrate.kernels.inputs import moe_inputs
from calibrate.model.work import moe_work
from calibrate.tables.host import HostProbe

TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192)
CALLS = 6  # per graph, on 3 weight copies, each with its own tokens (so its own experts)
C = MC.MoEConfig


def candidates(tokens: int, smem_limit: int | None = None) -> list[MC.MoEConfig]:
    """The heuristic default first, then tiles after vLLM's H100/H200 tables for these widths
    (our BLOCK_N = half of theirs, see moe_configs), most promising first; tiles that would not
    fit `smem_limit` bytes of shared memory per block are left out."""
    if tokens <= 16:
        extra = [C(False, 16, 32, 64, 4, 4, 1), C(False, 16, 16, 128, 4, 4), C(False, 16, 64, 128, 8, 3),
                 C(False, 16, 64, 64, 4, 3), C(False, 16, 32, 256, 4, 3)]
    elif tokens <= 96:
        extra = [C(True, 16, 32, 128, 4, 2, 1), C(False, 16, 32, 128, 4, 4), C(True, 16, 64, 128, 4, 3, 1),
                 C(True, 16, 128, 128, 8, 2, 1), C(True, 16, 32, 64, 4, 4, 1)]
    elif tokens <= 512:
        extra = [C(True, 16, 128, 128, 8, 2, 1), C(True, 32, 64, 128, 8, 3, 1), C(True, 16, 64, 128, 4, 3, 1),
                 C(True, 32, 64, 64, 4, 4), C(True, 16, 64, 64, 4, 3, 1)]
    elif tokens <= 2048:
        extra = [C(True, 64, 64, 64, 4, 3, 1), C(True, 32, 64, 128, 8, 3, 1), C(True, 128, 64, 64, 8, 3, 16),
                 C(True, 64, 128, 64, 8, 3), C(True, 64, 64, 128, 4, 3)]
    else:
        extra = [C(True, 128, 128, 64, 8, 4, 16), C(True, 128, 64, 64, 4, 4), C(True, 64, 128, 64, 4, 3, 32),
                 C(True, 128, 64, 64, 8, 3, 16), C(True, 128, 128, 32, 8, 4)]
    default = MC.default_config(tokens)
    return [default] + MC.fitting([c for c in extra if c != default], smem_limit)


def tune_model(b: KB.Bench, roof: KB.Roof, model: str, rows: list[dict]) -> dict[int, MC.MoEConfig]:
    s = KB._shapes(model)
    weights = [{k: v for k, v in moe_inputs(1, s.hidden, s.num_experts, s.expert_width, s.top_k, True, b.device,
                                             seed=100 + i).items() if k != "x"} for i in range(3)]
    b.log(f"{model}: E={s.num_experts} N={s.expert_width} H={s.hidden} top_k={s.top_k}, "
          f"3 weight copies of {s.moe_weight_bytes / 1e9:.2f} GB")
    smem = KB.smem_limit(b.device)
    plans = {t: candidates(t, smem) for t in TOKENS}
    checked: dict[MC.MoEConfig, bool] = {}
    best: dict[int, tuple[float, MC.MoEConfig]] = {}
    for rank in range(max(len(p) for p in plans.values())):
        for t in TOKENS:
            if rank >= len(plans[t]):
                continue
            cfg = plans[t][rank]
            if b.spent():
                b.skipped.append(f"{model} T={t} {KB._cfg(cfg)}")
                continue
            if cfg not in checked:  # once per config: the check runs both routing paths' kernels
                checked[cfg] = KB.check_moe_config(b, model, 37 if cfg.sorted else 5, cfg)
            if not checked[cfg]:
                continue

            def run(t=t, cfg=cfg) -> None:
                xs = [torch.randn(t, s.hidden, device=b.device).to(torch.bfloat16) for _ in range(CALLS)]
                fns = [lambda x=x, w=weights[i % 3]: FM.fused_moe(x, **w, config=cfg) for i, x in enumerate(xs)]
                fns[0]()
                tg = time_calls(fns, "graph", b.device, budget_s=0.05)
                flops, nbytes = moe_work(s, t)
                sec = tg.us * 1e-6
                rows.append({"model": model, "tokens": t, "config": KB._cfg(cfg), "us": round(tg.us, 2),
                             "us_p10": round(tg.us_p10, 2), "us_p90": round(tg.us_p90, 2), "flops": int(flops),
                             "bytes": int(nbytes), "pct_bw": round(100 * nbytes / sec / (roof.bw_gbs * 1e9), 1),
                             "pct_flops": round(100 * flops / sec / (roof.tflops * 1e12), 1)})
                b.log(f"{model} T={t} {KB._cfg(cfg)}: {tg.us:.1f} us ({rows[-1]['pct_bw']}% copy, "
                      f"{rows[-1]['pct_flops']}% matrix)")
                if t not in best or tg.us < best[t][0]:
                    best[t] = (tg.us, cfg)
            b.guard(f"time {model} T={t} {KB._cfg(cfg)}", run)
    del weights
    torch.cuda.empty_cache()
    return {t: cfg for t, (_, cfg) in sorted(best.items())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m calibrate.benches.moe_tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for moe_tune.csv, the tables, summary.json")
    p.add_argument("--models", default=",".join(KB.MODELS), help=f"comma-separated model configs (default {','.join(KB.MODELS)})")
    p.add_argument("--time-budget-s", type=float, default=150.0, help="stop timing new cases after this many seconds")
    p.add_argument("--no-install", action="store_true", help="write the tables to --out only, not into the package")
    args = p.parse_args(argv)
    if args.time_budget_s <= 0:
        print(f"--time-budget-s must be > 0, got {args.time_budget_s}", file=sys.stderr)
        return 2
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        try:
            if KB._shapes(m).num_experts == 0:
                raise ValueError("not an MoE model")
        except Exception as e:  # unknown name or a dense model: one line, no traceback
            print(f"--models: {m!r} is not an MoE model config ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("calibrate.benches.moe_tune: no CUDA device here", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    b = KB.Bench(args.out, args.time_budget_s, torch.device("cuda"))
    device = torch.cuda.get_device_name()
    rows: list[dict] = []
    probes = []
    tables = {}
    with torch.inference_mode():
        probe = HostProbe(b.device)
        probes.append({"where": "start", "us": probe()})
        roof = KB.Roof(copy_bandwidth_gbs(b.device), matmul_tflops(b.device))
        b.log(f"{device}: copy {roof.bw_gbs:.0f} GB/s, bf16 matmul {roof.tflops:.0f} TFLOP/s, "
              f"host probe {probes[0]['us']} us")
        for i, model in enumerate(models):
            b.deadline_s = b.elapsed() + (b.budget_s - b.elapsed()) / (len(models) - i)
            table = tune_model(b, roof, model, rows)
            s = KB._shapes(model)
            name = MC.file_name(s.num_experts, s.expert_width, device)
            if table:
                MC.write_table(args.out / name, table)
                if not args.no_install:
                    MC.write_table(MC.TABLE_DIR / name, table)
                tables[name] = {str(t): KB._cfg(c) for t, c in table.items()}
                b.log(f"{model}: table {name} with {len(table)} token counts")
        probes.append({"where": "end", "us": probe()})
    KB._write_csv(args.out / "moe_tune.csv", rows)
    summary = {"gpu": device, "copy_bandwidth_gbs": round(roof.bw_gbs, 1), "matmul_tflops": round(roof.tflops, 1),
               "host_probes": probes, "wall_s": round(b.elapsed(), 1), "tables": tables,
               "checks_failed": [c for c in b.checks if not c["ok"]], "errors": b.errors, "skipped": b.skipped}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    b.log(f"done: {len(rows)} timings, {len(tables)} tables, {len(b.errors)} errors, {len(b.skipped)} skipped")
    return 1 if b.errors or summary["checks_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
