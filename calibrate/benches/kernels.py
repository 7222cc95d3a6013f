"""GPU check and benchmark of the fused MoE and paged attention against their speed targets.

    python3 -m calibrate.benches.kernels --out DIR [--time-budget-s 150]

First every kernel is checked against `naive.py` (float64) at real Qwen3.5 shapes:
fresh random inputs, outputs NaN-poisoned, several sizes, shuffled block tables, the
model's enlarged block sizes. Then candidate configurations are timed in CUDA-graph
replay (back-to-back calls on rotated weights / disjoint KV blocks, >= 512 MB per
graph so the L2 starts cold), eagerly, and by host launch time, against the copy
bandwidth and bf16 matrix rate measured in the same run. Writes DIR/checks.csv,
DIR/moe.csv, DIR/attn.csv, DIR/summary.json and DIR/log.txt. A failing case is
logged and skipped; the budget stops timing (never the checks) when spent.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from calibrate.device.timing import ROTATE_BYTES, Timing, copy_bandwidth_gbs, matmul_tflops, time_calls
from calibrate.kernels import fused_moe as FM
from calibrate.kernels import moe_configs as MC
from calibrate.kernels import paged_attention as PA
from calibrate.kernels.inputs import moe_inputs, nan_poison, paged_inputs
from calibrate.kernels.naive import fused_moe_ref, paged_attention_ref, reshape_and_cache_ref
from calibrate.model import layers as L
from calibrate.model import work as W
from calibrate.model.shapes import LayerShapes
from calibrate.tables import measure as M
from calibrate.tables.grid import QUICK
from core.config import load_model
from policies.kernels.inputs import rel_err

MOE_TOL = ATTN_TOL = 2e-2  # relative RMS: bf16 intermediates and outputs
MOE_TARGETS_US = {1: 40.0, 512: 540.0, 8192: 2000.0}  # speed targets, 35B-A3B per layer, graph mode
DECODE_TARGET = (128, 4, 4096, 70.0)  # B, P, ctx, % of copy rate on the bytes read
MOE_TOKENS = (1, 4, 16, 64, 128, 512, 2048, 8192)
DECODE_SHAPES = ((128, 4, 4096), (1, 1, 4096), (8, 4, 4096), (32, 4, 4096), (128, 1, 4096), (512, 1, 1024),
                 (64, 16, 4096), (16, 64, 4096))
PREFILL_SHAPES = ((2048, 0), (2048, 16384), (8192, 0))
MOE_CALLS = 6  # calls per graph, on 3 weight copies, each with its own tokens (so its own experts)
MOE_SHARE = 0.55  # of the timing budget left after the checks; attention gets the rest


def moe_candidates(tokens: int, smem_limit: int | None = None) -> list[FM.MoEConfig]:
    """The default first, then variants around it (most promising first); a variant whose launch
    would not fit `smem_limit` bytes of shared memory per block is left out, not tried."""
    C = FM.MoEConfig
    if tokens <= 16:
        extra = [C(False, 16, 16, 128, 4, 4), C(False, 16, 64, 128, 4, 4), C(False, 16, 32, 256, 4, 3),
                 C(False, 16, 32, 64, 4, 5), C(False, 16, 32, 128, 2, 4), C(True, 16, 32, 128, 4, 4)]
    elif tokens <= 512:
        extra = [C(True, 16, 128, 128, 4, 4), C(True, 32, 64, 128, 4, 4), C(True, 16, 32, 128, 4, 4),
                 C(True, 64, 64, 64, 4, 4), C(True, 32, 128, 64, 4, 4), C(True, 64, 128, 64, 8, 3)]
    else:
        extra = [C(True, 64, 128, 64, 4, 4), C(True, 128, 128, 64, 8, 4), C(True, 128, 64, 64, 4, 4),
                 C(True, 64, 64, 64, 4, 4), C(True, 128, 256, 64, 8, 3), C(True, 128, 128, 32, 8, 4)]
    default = FM.default_config(tokens)
    return [default] + MC.fitting([c for c in extra if c != default], smem_limit)


def smem_limit(device: torch.device) -> int | None:
    """The device's shared memory per block with opt-in (232,448 B on the H200); None off CUDA."""
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin if device.type == "cuda" else None


def attn_candidates(q_len: int, group: int) -> list[PA.AttnConfig]:
    C = PA.AttnConfig
    default = PA.default_config(q_len, group)
    if q_len * group <= 64:
        extra = [C(default.block_m, 32, 4, 2), C(default.block_m, 64, 4, 3), C(default.block_m, 32, 4, 3),
                 C(default.block_m, 64, 8, 2), C(default.block_m, 64, 4, 2, num_splits=2),
                 C(default.block_m, 64, 4, 2, num_splits=1), C(default.block_m, 16, 4, 4)]
    else:
        extra = [C(128, 64, 8, 2, 1), C(64, 32, 4, 3, 1), C(128, 32, 8, 3, 1), C(64, 64, 4, 2, 1)]
    return [default] + [c for c in extra if c != default]


@dataclass
class Bench:
    out: Path
    budget_s: float
    device: torch.device
    t0: float = field(default_factory=time.perf_counter)
    checks: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def log(self, msg: str) -> None:
        line = f"[{self.elapsed():7.1f} s] {msg}"
        print(line, flush=True)
        with (self.out / "log.txt").open("a") as f:
            f.write(line + "\n")

    deadline_s: float | None = None  # the current part's share of the budget

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def spent(self) -> bool:
        return self.elapsed() > min(self.budget_s, self.deadline_s or self.budget_s)

    def guard(self, what: str, fn: Callable[[], object]) -> object:
        """Run one case; a failure is logged and recorded, never fatal."""
        try:
            return fn()
        except Exception as e:  # one bad case must not cost the GPU run
            self.errors.append(f"{what}: {type(e).__name__}: {e}")
            self.log(f"FAILED {what}: {traceback.format_exc()}")
            return None

    def check(self, kernel: str, case: str, config: object, out: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
        err = rel_err(out, ref)
        ok = bool(err < tol)  # NaN (an unwritten element) fails
        self.checks.append({"kernel": kernel, "case": case, "config": _cfg(config), "rel_err": f"{err:.3e}",
                            "tol": tol, "ok": ok})
        self.log(f"check {kernel} {case} {_cfg(config)}: rel err {err:.2e} {'ok' if ok else 'FAIL'}")
        return ok


def _cfg(config: object) -> str:
    return "default" if config is None else " ".join(f"{k}={v}" for k, v in asdict(config).items())


# ---------------------------------------------------------------------------------- checks
MODELS = ("qwen3.5-35b-a3b", "qwen3.5-397b-a17b")


def _shapes(model: str) -> LayerShapes:
    return LayerShapes.from_model(load_model(model))


def check_moe_config(b: Bench, model: str, t: int, cfg: FM.MoEConfig | None) -> bool:
    s = _shapes(model)
    x = moe_inputs(t, s.hidden, s.num_experts, s.expert_width, s.top_k, True, b.device, seed=t)

    def run() -> bool:
        with nan_poison():
            out = FM.fused_moe(**x, config=cfg)
        return b.check("fused_moe", f"{model} T={t}", cfg, out, fused_moe_ref(**x), MOE_TOL)
    return bool(b.guard(f"check fused_moe {model} T={t} {_cfg(cfg)}", run))


def check_moe(b: Bench) -> None:
    """Default configs at sizes on both sides of each config boundary, both models."""
    for t in (1, 5, 16, 17, 100, 256, 257, 2048, 3000):
        check_moe_config(b, MODELS[0], t, None)
    for t in (1, 64, 1000):
        check_moe_config(b, MODELS[1], t, None)


def _contexts(g: torch.Generator, n: int, lo: int, hi: int) -> list[int]:
    return torch.randint(lo, hi, (n,), generator=g).tolist()


ATTN_CASES_SEED = 13


def attn_cases() -> list[tuple[str, list[int], list[int], int, int, int]]:
    """(name, q_lens, contexts, block size, kv heads, group): random contexts, the models' block sizes."""
    g = torch.Generator().manual_seed(ATTN_CASES_SEED)
    return [
        ("decode-B8-bs1072", [1] * 8, _contexts(g, 8, 1, 6000), 1072, 2, 8),
        ("verify-B16-P4-bs560", [4] * 16, _contexts(g, 16, 0, 5000), 560, 2, 8),
        ("verify-B3-P64-bs544", [64] * 3, _contexts(g, 3, 100, 3000), 544, 2, 8),
        ("mixed-prefill700-bs1072", [700, 1, 4, 4, 64, 1, 17], [3000] + _contexts(g, 6, 0, 4000), 1072, 2, 8),
        ("prefill2048-bs16", [2048], [0], 16, 2, 8),
        ("prefill1000-ctx5000-bs560", [1000], [5000], 560, 2, 8),
        ("397b-verify-B12-P4-bs544", [4] * 12, _contexts(g, 12, 0, 9000), 544, 1, 4),
    ]


def check_attn_config(b: Bench, case: tuple, cfg: PA.AttnConfig | None) -> bool:
    name, q_lens, ctxs, bs, hkv, group = case
    x = paged_inputs(q_lens, ctxs, bs, hkv, group, 256, b.device, seed=len(name))

    def run() -> bool:
        with nan_poison():
            out = PA.paged_attention(**x, config=cfg)
        return b.check("paged_attention", name, cfg, out, paged_attention_ref(**x), ATTN_TOL)
    return bool(b.guard(f"check paged_attention {name} {_cfg(cfg)}", run))


def check_attention(b: Bench) -> None:
    """Default configs on every case, and forced 4-way key splits (the flash-decoding merge)."""
    for case in attn_cases():
        _, q_lens, _, _, _, group = case
        check_attn_config(b, case, None)
        rows = max(q_lens) * group
        check_attn_config(b, case, PA.AttnConfig(16 if rows <= 16 else 64, 64, num_splits=4))

    def cache() -> None:
        x = paged_inputs([1], [3000], 1072, 2, 8, 256, b.device)
        n = 300
        k = torch.randn(n, 2, 256, device=b.device).to(torch.bfloat16)
        v = torch.randn(n, 2, 256, device=b.device).to(torch.bfloat16)
        slots = torch.randperm(x["k_cache"].shape[0] * 1072, device=b.device)[:n]
        kr, vr = x["k_cache"].clone(), x["v_cache"].clone()
        reshape_and_cache_ref(k, v, kr, vr, slots)
        PA.reshape_and_cache(k, v, x["k_cache"], x["v_cache"], slots)
        ok = torch.equal(kr, x["k_cache"]) and torch.equal(vr, x["v_cache"])
        b.checks.append({"kernel": "reshape_and_cache", "case": "300 tokens bs1072", "config": "default",
                         "rel_err": "0" if ok else "mismatch", "tol": 0, "ok": ok})
        b.log(f"check reshape_and_cache: {'ok' if ok else 'FAIL'}")
    b.guard("check reshape_and_cache", cache)


# ---------------------------------------------------------------------------------- timing
@dataclass
class Roof:
    bw_gbs: float
    tflops: float

    def row(self, t_graph: Timing, t_eager: Timing, host: float, flops: float, nbytes: float) -> dict:
        s = t_graph.us * 1e-6
        return {"us": round(t_graph.us, 2), "us_p10": round(t_graph.us_p10, 2), "us_p90": round(t_graph.us_p90, 2),
                "eager_us": round(t_eager.us, 2), "host_us": host, "copies": t_graph.copies,
                "flops": int(flops), "bytes": int(nbytes),
                "pct_bw": round(100 * nbytes / s / (self.bw_gbs * 1e9), 1),
                "pct_flops": round(100 * flops / s / (self.tflops * 1e12), 1)}


def _time(b: Bench, fns: list[Callable[[], object]]) -> tuple[Timing, Timing, float]:
    fns[0]()
    torch.cuda.synchronize()
    host = M.host_us(fns, b.device)
    return time_calls(fns, "graph", b.device, budget_s=0.05), time_calls(fns, "eager", b.device, budget_s=0.03), host


def time_moe(b: Bench, roof: Roof, rows: list[dict]) -> None:
    s = LayerShapes.from_model(load_model("qwen3.5-35b-a3b"))
    weights = [moe_inputs(1, s.hidden, s.num_experts, s.expert_width, s.top_k, True, b.device, seed=100 + i)
               for i in range(3)]
    b.log(f"moe: 3 weight copies of {s.moe_weight_bytes / 1e9:.2f} GB")
    # Defaults at the targets' sizes, at the other sizes, then the targets' candidates, then the rest.
    plan = [(t, FM.default_config(t)) for t in sorted(MOE_TOKENS, key=lambda t: t not in MOE_TARGETS_US)]
    smem = smem_limit(b.device)
    plan += [(t, c) for t in MOE_TARGETS_US for c in moe_candidates(t, smem)[1:]]
    plan += [(t, c) for t in MOE_TOKENS if t not in MOE_TARGETS_US for c in moe_candidates(t, smem)[1:]]
    layer_done: set[int] = set()
    for t, cfg in plan:
        if b.spent():
            b.skipped.append(f"moe T={t} {_cfg(cfg)}")
            continue

        if cfg != FM.default_config(t) and not check_moe_config(b, MODELS[0], min(t, 3000), cfg):
            continue  # a wrong candidate is not worth timing

        def run(t=t, cfg=cfg) -> None:
            xs = [torch.randn(t, s.hidden, device=b.device).to(torch.bfloat16) for _ in range(MOE_CALLS)]
            args = [{k: v for k, v in weights[i % 3].items() if k != "x"} for i in range(MOE_CALLS)]
            fns = [lambda x=x, a=a: FM.fused_moe(x, **a, config=cfg) for x, a in zip(xs, args)]
            flops, nbytes = W.moe_work(s, t)
            tg, te, host = _time(b, fns)
            target = MOE_TARGETS_US.get(t)
            rows.append({"what": "fused_moe", "tokens": t, "config": _cfg(cfg), **roof.row(tg, te, host, flops, nbytes),
                         "target_us": target or "", "meets": "" if target is None else tg.us <= target})
            b.log(f"moe T={t} {_cfg(cfg)}: graph {tg.us:.1f} us ({rows[-1]['pct_bw']}% bw, {rows[-1]['pct_flops']}% "
                  f"flops), eager {te.us:.1f}, host {host:.1f}" + (f", target {target}" if target else ""))
            if t not in layer_done:  # the table's call: norm + fused MoE + residual, default config
                layer_done.add(t)
                ws = [L.MoEWeights(torch.ones(s.hidden, dtype=torch.bfloat16, device=b.device), a["router_w"],
                                   a["w13"], a["w2"], a["shared_w13"], a["shared_w2"], a["shared_gate_w"]) for a in args]
                lg, le, lh = _time(b, [lambda x=x, w=w: L.moe_forward(x, w, s) for x, w in zip(xs, ws)])
                rows.append({"what": "moe_forward", "tokens": t, "config": "default",
                             **roof.row(lg, le, lh, flops, nbytes), "target_us": target or "",
                             "meets": "" if target is None else lg.us <= target})
                b.log(f"moe layer T={t}: graph {lg.us:.1f} us, eager {le.us:.1f}, host {lh:.1f}")
        b.guard(f"time moe T={t} {_cfg(cfg)}", run)
    del weights


def time_attention(b: Bench, roof: Roof, rows: list[dict]) -> None:
    s = LayerShapes.from_model(load_model("qwen3.5-35b-a3b"))
    h = M.Harness(s, QUICK, b.device, ("graph",), roof.bw_gbs, roof.tflops, log=b.log, rotate_bytes=ROTATE_BYTES)
    group = s.q_heads // s.kv_heads
    pool = M.PagedKV(h, [(bb, c + p) for bb, p, c in DECODE_SHAPES] + [(1, c + n) for n, c in PREFILL_SHAPES])
    b.log(f"attention: paged pool of {pool.num_blocks} blocks x {pool.block} tokens")
    plan = [("decode", shape, PA.default_config(shape[1], group)) for shape in DECODE_SHAPES]
    plan += [("decode", DECODE_SHAPES[0], c) for c in attn_candidates(DECODE_SHAPES[0][1], group)[1:]]
    plan += [("prefill", shape, PA.default_config(shape[0], group)) for shape in PREFILL_SHAPES]
    plan += [("decode", (1, 1, 4096), c) for c in attn_candidates(1, group)[1:]]
    plan += [("prefill", PREFILL_SHAPES[0], c) for c in attn_candidates(PREFILL_SHAPES[0][0], group)[1:]]
    defaults = {cfg for _, _, cfg in plan[:len(DECODE_SHAPES)]} | {PA.default_config(n, group) for n, _ in PREFILL_SHAPES}
    by_name = {c[0]: c for c in attn_cases()}
    cases = {"decode": by_name["verify-B16-P4-bs560"], "prefill": by_name["mixed-prefill700-bs1072"]}
    for kind, shape, cfg in plan:
        if b.spent():
            b.skipped.append(f"{kind} {shape} {_cfg(cfg)}")
            continue

        if cfg not in defaults and not check_attn_config(b, cases[kind], cfg):
            continue  # a wrong candidate is not worth timing

        def run(kind=kind, shape=shape, cfg=cfg) -> None:
            if kind == "decode":
                bb, p, c = shape
                flops, nbytes = W.decode_work(s, bb, p, c)
                q = torch.randn(bb * p, s.q_heads, s.head_dim, device=b.device).to(torch.bfloat16)
                batches = [pool.batch(p, [c + p] * bb) for _ in range(M.kv_copies(h, nbytes))]
                label = {"B": bb, "P": p, "ctx": c}
            else:
                n, c = shape
                flops, nbytes = W.prefill_work(s, n, c)
                q = torch.randn(n, s.q_heads, s.head_dim, device=b.device).to(torch.bfloat16)
                batches = [pool.batch(n, [c + n]) for _ in range(M.kv_copies(h, nbytes))]
                label = {"B": 1, "P": n, "ctx": c}
            tg, te, host = _time(b, [M.core_call(q, kv, cfg) for kv in batches])
            row = {"what": kind, **label, "config": _cfg(cfg), **roof.row(tg, te, host, flops, nbytes)}
            if kind == "decode" and shape == DECODE_SHAPES[0]:
                row["target_pct_bw"] = DECODE_TARGET[3]
                row["meets"] = row["pct_bw"] >= DECODE_TARGET[3]
            rows.append(row)
            b.log(f"{kind} {label} {_cfg(cfg)}: graph {tg.us:.1f} us ({row['pct_bw']}% bw, {row['pct_flops']}% "
                  f"flops), eager {te.us:.1f}, host {host:.1f}")
        b.guard(f"time {kind} {shape} {_cfg(cfg)}", run)
    del pool


def _write_csv(path: Path, rows: list[dict]) -> None:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def _best(rows: list[dict], key: Callable[[dict], object]) -> dict:
    best: dict = {}
    for r in rows:
        k = key(r)
        if k is not None and (k not in best or r["us"] < best[k]["us"]):
            best[k] = r
    return {str(k): {"us": r["us"], "pct_bw": r["pct_bw"], "pct_flops": r["pct_flops"], "config": r["config"]}
            for k, r in best.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m calibrate.benches.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for checks.csv, moe.csv, attn.csv, summary.json")
    p.add_argument("--time-budget-s", type=float, default=150.0, help="stop timing new cases after this many seconds")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: checks, moe, attn")
    args = p.parse_args(argv)
    if args.time_budget_s <= 0:
        print(f"--time-budget-s must be > 0, got {args.time_budget_s}", file=sys.stderr)
        return 2
    skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    if skip - {"checks", "moe", "attn"}:
        print(f"--skip: unknown {sorted(skip - {'checks', 'moe', 'attn'})}; valid: checks, moe, attn", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("calibrate.benches.kernels: no CUDA device here", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    b = Bench(args.out, args.time_budget_s, torch.device("cuda"))
    b.log(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__}")
    moe_rows: list[dict] = []
    attn_rows: list[dict] = []
    with torch.inference_mode():
        roof = Roof(copy_bandwidth_gbs(b.device), matmul_tflops(b.device))
        b.log(f"copy {roof.bw_gbs:.0f} GB/s, bf16 matmul {roof.tflops:.0f} TFLOP/s")
        if "checks" not in skip:
            check_moe(b)
            check_attention(b)
            _write_csv(args.out / "checks.csv", b.checks)
            torch.cuda.empty_cache()
        if "moe" not in skip:
            # MoE timing gets MOE_SHARE of what the checks left; attention the rest.
            b.deadline_s = b.elapsed() + MOE_SHARE * max(0.0, b.budget_s - b.elapsed()) if "attn" not in skip else None
            time_moe(b, roof, moe_rows)
            _write_csv(args.out / "moe.csv", moe_rows)
            torch.cuda.empty_cache()
        if "attn" not in skip:
            b.deadline_s = None
            time_attention(b, roof, attn_rows)
            _write_csv(args.out / "attn.csv", attn_rows)
    summary = {
        "gpu": torch.cuda.get_device_name(), "copy_bandwidth_gbs": round(roof.bw_gbs, 1),
        "matmul_tflops": round(roof.tflops, 1), "wall_s": round(b.elapsed(), 1),
        "checks_ok": sum(c["ok"] for c in b.checks), "checks_failed": [c for c in b.checks if not c["ok"]],
        "moe_best_by_tokens": _best([r for r in moe_rows if r["what"] == "fused_moe"], lambda r: r["tokens"]),
        "moe_layer_default": _best([r for r in moe_rows if r["what"] == "moe_forward"], lambda r: r["tokens"]),
        "moe_targets_us": MOE_TARGETS_US,
        "attn_best": _best(attn_rows, lambda r: f"{r['what']} B={r['B']} P={r['P']} ctx={r['ctx']}"),
        "decode_target": {"B": DECODE_TARGET[0], "P": DECODE_TARGET[1], "ctx": DECODE_TARGET[2],
                          "pct_bw": DECODE_TARGET[3]},
        "errors": b.errors, "skipped": b.skipped,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    b.log(f"done: {summary['checks_ok']} checks ok, {len(summary['checks_failed'])} failed, "
          f"{len(b.errors)} errors, {len(b.skipped)} skipped")
    return 1 if b.errors or summary["checks_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
