"""What the kernel benchmark records beside its main table: reconstruct kernel by kernel, tuning variants,
the environment, the closing summary."""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton

from policies.kernels import reconstruct, treewy
from policies.kernels.bench_cases import COLD_BYTES, Case, D, DEVICE, MODELS, REHEARSAL, policy_bytes
from policies.kernels.bench_policy import make_copy, run_policy
from policies.kernels.bench_timing import recover, time_graph
from policies.kernels.inputs import chain
from policies.kernels.treewy import lengths_or_full, solve, state_pass, tree_prep, verify_kernel, wy_state
from policies.kernels.variants import VARIANTS, VARIANT_CASES, check_tuning


def kernels_vs_T(copy_bw: float, B: int = 64, model: str = "qwen3.5-35b-a3b",
                 Ts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)) -> list[dict]:
    """reconstruct on chains, kernel by kernel (graph timing): the tree prep, the state pass
    (the kernel `treewy.TUNING` picks; the blocked verify's solve also alone)
    and the commit to the deepest node; each pass over the state with its % of copy bandwidth."""
    hk, hv = MODELS[model]
    out = []
    for T in Ts:
        c = Case(model, hk, hv, B, "chain", tuple(chain(T)))
        copies = max(2, math.ceil(COLD_BYTES / policy_bytes(c, "reconstruct", 0, True)[0]))
        xs = [make_copy(c, s) for s in range(copies)]
        acc = torch.full((B,), T - 1, dtype=torch.int32, device=DEVICE)
        for x in xs:
            x["lengths"] = lengths_or_full(None, B, T, DEVICE)
            x["mask"], x["gc"] = tree_prep(x["parent"], x["lengths"], x["g"])
            x["ctx"] = reconstruct.verify(**{n: x[n] for n in ("q", "k", "v", "g", "beta", "parent", "state",
                                                                "lengths")}, check=False)[1]
        t = dict(prep=[lambda x=x: tree_prep(x["parent"], x["lengths"], x["g"]) for x in xs],
                 state_pass=[lambda x=x: state_pass(x["q"], x["k"], x["v"], x["beta"], x["state"], x["mask"], x["gc"],
                                                    x["lengths"]) for x in xs],
                 commit=[lambda x=x: wy_state(x["ctx"], acc, out=x["state"]) for x in xs])
        if verify_kernel(T) == "blocked":
            t["solve"] = [lambda x=x: solve(x["q"], x["k"], x["v"], x["beta"], x["mask"], x["gc"], x["lengths"])
                          for x in xs]
        row = dict(model=model, B=B, T=T, state_pass_kernel=verify_kernel(T))
        row.update({f"{name}_us": round(time_graph(calls), 2) for name, calls in t.items()})
        vb, cb = policy_bytes(c, "reconstruct", 0, True)  # the state pass moves all of verify's bytes but g's
        row["state_pass_pct_of_copy_bw"] = round(100 * vb / (row["state_pass_us"] * 1e-6) / copy_bw, 1)
        row["commit_pct_of_copy_bw"] = round(100 * cb / (row["commit_us"] * 1e-6) / copy_bw, 1)
        out.append(row)
        del xs, t
    return out


def run_variants(copy_bw: float, out: Path, deadline: float, names: tuple[str, ...]) -> list[str]:
    """Each tuning of `names`: the exactness check, then graph timings of reconstruct and
    reconstruct_deferred at VARIANT_CASES (35B-A3B, float32 state). Writes variants.csv as it
    goes; returns what did not run. A failing variant is logged and skipped."""
    model = "qwen3.5-35b-a3b"
    hk, hv = MODELS[model]
    fields = ["variant", "tuning", "check", "policy", "model", "B", "T", "tree", "verify_us", "commit_us",
              "total_us", "bytes", "pct_of_copy_bw", "state_dtype"]
    skipped = []
    with (out / "variants.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for name in names:
            tuning = VARIANTS[name]
            if time.time() > deadline:
                skipped.append(f"variant {name}: not run (time budget)")
                continue
            try:
                errs = check_tuning(tuning, hk, hv, D, DEVICE, exact_outputs=False)
            except Exception as exc:  # one broken variant must not stop the others
                print(f"variant {name}: check failed to run: {type(exc).__name__}: {exc}", flush=True)
                skipped.append(f"variant {name}: check raised {type(exc).__name__}: {exc}")
                recover()
                continue
            # states in float32 (~1e-7 when right); outputs in bf16 against the rounded reference
            ok = max(errs["reconstruct_state"], errs["deferred_state"]) < 1e-5 and \
                max(errs["reconstruct_o"], errs["deferred_o"]) < 1e-2
            print(f"variant {name} ({tuning.label()}): check {'ok' if ok else 'FAILED'} "
                  + " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)
            if not ok:
                skipped.append(f"variant {name}: inexact {errs}")
                continue
            old = treewy.TUNING
            treewy.TUNING = tuning
            try:
                for tree, parents, B in VARIANT_CASES:
                    if REHEARSAL:
                        B = 2
                    c = Case(model, hk, hv, B, tree, parents)
                    for policy in ("reconstruct", "reconstruct_deferred"):
                        if time.time() > deadline:
                            skipped.append(f"variant {name} {policy} B={B} T={c.T}: not run (time budget)")
                            continue
                        try:
                            rows = run_policy(c, policy, 0, True, copy_bw, modes=("graph",))
                        except Exception as exc:
                            print(f"variant {name} {policy} T={c.T}: {type(exc).__name__}: {exc}", flush=True)
                            skipped.append(f"variant {name} {policy} B={B} T={c.T}: {type(exc).__name__}: {exc}")
                            recover()
                            continue
                        for r in rows:
                            w.writerow(dict(variant=name, tuning=tuning.label(), check=max(errs.values()), policy=policy,
                                            model=model, B=B, T=c.T, tree=tree, verify_us=r["verify_us"],
                                            commit_us=r["commit_us"], total_us=r["total_us"], bytes=r["bytes"],
                                            pct_of_copy_bw=r["pct_of_copy_bw"], state_dtype=c.state_dtype))
                            print(f"variant {name:20} {policy:20} B={B:<3} T={c.T:<3} {tree:6} verify "
                                  f"{r['verify_us']:8.1f} commit {r['commit_us']:7.1f} total {r['total_us']:8.1f} us "
                                  f"{r['pct_of_copy_bw']:5.1f}%", flush=True)
                        fh.flush()
            finally:
                treewy.TUNING = old
    return skipped


def environment(args: argparse.Namespace) -> dict:
    if REHEARSAL:
        return dict(gpu="none (CPU rehearsal, TRITON_INTERPRET=1, toy sizes)", torch=torch.__version__,
                    triton=triton.__version__, git_commit=args.git_commit,
                    command=" ".join([os.path.basename(sys.executable)] + sys.argv))
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    p = torch.cuda.get_device_properties(0)
    return dict(gpu=torch.cuda.get_device_name(0), sms=p.multi_processor_count,
                l2_bytes=getattr(p, "L2_cache_size", None), nvidia_smi=smi.stdout.strip(),
                torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                python=platform.python_version(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                git_commit=args.git_commit, command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                tuning=dataclasses.asdict(treewy.TUNING))


def summary(out: Path, stem: str) -> str:
    """The short table printed last (a GPU run returns only the end of its output): per
    variant case the fastest tuning against the default, then the main table's graph rows."""
    lines = []
    vpath = out / "variants.csv"
    if vpath.exists():
        rows = list(csv.DictReader(vpath.open()))
        keys = sorted({(r["policy"], r["tree"], int(r["T"]), int(r["B"])) for r in rows})
        lines.append("variants (graph, verify + commit us, % of copy bw): default | best")
        for k in keys:
            rs = [r for r in rows if (r["policy"], r["tree"], int(r["T"]), int(r["B"])) == k]
            best = min(rs, key=lambda r: float(r["total_us"]))
            d = next((r for r in rs if r["variant"] == "default"), None)
            dd = f"{float(d['total_us']):8.1f} ({d['pct_of_copy_bw']}%)" if d else "       -"
            lines.append(f"  {k[0][:20]:20} {k[1]:6} T={k[2]:<3} B={k[3]:<3} {dd} | {float(best['total_us']):8.1f} "
                         f"({best['pct_of_copy_bw']}%) {best['variant']}: v {best['verify_us']} c {best['commit_us']}")
        by_v: dict[str, float] = {}
        for r in rows:
            by_v[r["variant"]] = by_v.get(r["variant"], 0.0) + float(r["total_us"])
        lines.append("  sum over cases: " + ", ".join(f"{v} {t:.0f}" for v, t in sorted(by_v.items(), key=lambda x: x[1])))
    kpath = out / f"{stem}.csv"
    if kpath.exists():
        lines.append("main table (graph): policy tree B dtype verify commit total %bw")
        for r in csv.DictReader(kpath.open()):
            if r["mode"] == "graph":
                lines.append(f"  {r['policy'][:20]:20} {r['tree']:13} B={r['B']:<3} {r['state_dtype'][:4]} "
                             f"r={r['replayed_tokens']:<2} f={r['flush']} {r['verify_us']:>9} {r['commit_us']:>8} "
                             f"{r['total_us']:>9} {r['pct_of_copy_bw']}%")
    return "\n".join(lines)
