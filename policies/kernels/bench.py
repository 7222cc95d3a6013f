"""Time verify and commit of every policy per GDN layer on a GPU, against the copy roofline.

    python3 -m policies.kernels.bench --out results/calibration/h200 [--quick] [--git-commit SHA]
        [--policies reconstruct --reference-store-all --stem kernels_reconstruct]
    python3 -m policies.kernels.bench --out results/calibration/h200 --merge RUN/kernels.csv --merge-run run3
    python3 -m policies.kernels.bench --out results/calibration/h200 --merge-variants FILE --variant pp \
        --merge-run variants1-pp --merge-keep-run run3

Writes kernels.csv (one row per model, policy, B, tree, mode) and
kernels_provenance.json (GPU, versions, command, the GPU tests' result (run first: a failure
stops the bench), copy bandwidth, reconstruct's kernels
one by one against T, the fla reference); `--stem` renames both. Graph timings: a CUDA graph of
back-to-back calls on distinct buffers (at least 512 MB together, so each call starts
with a cold L2), median over replays divided by the calls per graph. Eager timings:
the same calls launched from Python one by one (argument checks off), median.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from policies.kernels import treewy
from policies.kernels.bench_cases import (BATCHES, FIELDS, KERNELS_B, MAX_FOOTPRINT, MODELS, POLICIES, REHEARSAL,
                                          STATE_DTYPES, STUDY_MODELS, TREES, cases, none_cases)
from policies.kernels.bench_extras import environment, kernels_vs_T, run_variants, summary
from policies.kernels.bench_fla import fla_reference, none_rows
from policies.kernels.bench_merge import drop_rows, merge, variant_rows
from policies.kernels.bench_policy import policy_variants, run_policy
from policies.kernels.bench_timing import copy_bandwidth, recover
from policies.kernels.gpu_checks import run_gpu_tests
from policies.kernels.tuning import Tuning
from policies.kernels.variants import VARIANTS, fastest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m policies.kernels.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for kernels.csv and kernels_provenance.json")
    ap.add_argument("--quick", action="store_true", help="35B only, B in {128, 1}, trees (1,1,1) and (3,3,3)")
    ap.add_argument("--budget-s", "--time-budget-s", dest="budget_s", type=float, default=0.0,
                    help="start no new case after this many seconds (0: no limit); the rest is listed as not run")
    ap.add_argument("--git-commit", default=os.environ.get("GIT_COMMIT", "unknown"),
                    help="commit of the code measured (the device copy has no .git)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help=f"comma-separated policies to time (default: all of {','.join(POLICIES)}; none: the "
                         "no-speculation decode step; empty: no policy)")
    ap.add_argument("--state-dtype", default="float32",
                    help=f"comma-separated state dtypes of the main table ({','.join(STATE_DTYPES)})")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)),
                    help="comma-separated batch sizes of the main table, in the order they run (a --budget-s cut "
                         "loses the last)")
    ap.add_argument("--models", default=",".join(STUDY_MODELS),
                    help=f"comma-separated models of the main table, of {','.join(MODELS)} (default: "
                         f"{','.join(STUDY_MODELS)})")
    ap.add_argument("--trees", default="",
                    help=f"semicolon-separated trees of the main table, of {';'.join(TREES)};chain (default: all)")
    ap.add_argument("--modes", default="graph,eager",
                    help="comma-separated timing modes of the main table: graph (CUDA-graph replay: what the "
                         "pipeline pricing reads), eager (the old eager-sum pricing)")
    ap.add_argument("--tuning", default="",
                    help="kernel choice for the whole run, e.g. 'verify_bv=16,verify_warps=2' (fields of treewy.Tuning)")
    ap.add_argument("--variants", default="",
                    help=f"first time these tunings ('all' or a comma list of {','.join(VARIANTS)}) at the target "
                         "shapes, into variants.csv")
    ap.add_argument("--pick-variant", action="store_true",
                    help="the main table runs the tuning the --variants run found fastest (verify + commit summed "
                         "over its cases), recorded in the provenance (tuning_picked)")
    ap.add_argument("--gpu-test-jobs", type=int, default=1,
                    help="run the GPU tests split over this many pytest processes at once (their time is compiling)")
    ap.add_argument("--variants-budget-s", type=float, default=0.0,
                    help="start no new variant case after this many seconds of the run (0: only --budget-s)")
    ap.add_argument("--reference-store-all", action="store_true",
                    help="also time store_all at 35B-A3B (1,1,1), B in {64, 128}, and (3,3,3), B = 128, as a "
                         "same-run reference")
    ap.add_argument("--no-fla", action="store_true", help="skip the fla outside reference")
    ap.add_argument("--stem", default="kernels", help="output names: STEM.csv and STEM_provenance.json")
    ap.add_argument("--kernel-ts", default="1,2,4,8,16,32,64,128",
                    help="chain lengths T of the kernel-by-kernel table (B = 64; empty: none)")
    ap.add_argument("--merge", type=Path, default=None,
                    help="no run: merge this kernels CSV (from another device run) into OUT/STEM.csv, its rows "
                         "replacing those of the same case (MERGE_KEY); provenance parts per run")
    ap.add_argument("--merge-run", default="", help="with --merge: the label of the merged run (column `run`)")
    ap.add_argument("--merge-base-run", default="run1",
                    help="with --merge: the label of OUT/STEM.csv's rows that have no `run` yet")
    ap.add_argument("--merge-note", action="append", default=[], help="with --merge: a note kept in the provenance")
    ap.add_argument("--skip-gpu-tests", action="store_true",
                    help="measure without first running the GPU tests (recorded in the provenance)")
    ap.add_argument("--merge-variants", type=Path, default=None,
                    help="no run: merge one tuning (--variant) of this --variants file (variants.csv, graph timings) "
                         "into OUT/STEM.csv as a run of its own (--merge-run), like --merge")
    ap.add_argument("--variant", default="", help="with --merge-variants: the tuning (column `variant`) to merge")
    ap.add_argument("--merge-drop", action="append", default=[],
                    help="with --merge: leave out the merged file's rows of POLICY@TREE[@REPLAYED] (e.g. "
                         "'reconstruct@1,1,1': rows timing a kernel the default tuning no longer runs there)")
    ap.add_argument("--merge-keep-run", action="append", default=[],
                    help="with --merge/--merge-variants: fail rather than replace any row of this run")
    args = ap.parse_args(argv)
    if args.merge is not None or args.merge_variants is not None:
        if not args.merge_run:
            ap.error("--merge/--merge-variants need --merge-run (the merged run's label)")
        if args.merge is not None and args.merge_variants is not None:
            ap.error("--merge and --merge-variants exclude each other")
        command = shlex.join(["python3", "-m", "policies.kernels.bench"] + list(sys.argv[1:] if argv is None else argv))
        src, new, extra = args.merge, None, None
        if args.merge_drop:
            if args.merge is None:
                ap.error("--merge-drop goes with --merge")
            try:
                new = drop_rows(args.merge, args.merge_drop)
            except ValueError as exc:
                ap.error(str(exc))
            extra = {"dropped": args.merge_drop}
        if args.merge_variants is not None:
            if not args.variant:
                ap.error("--merge-variants needs --variant")
            src = args.merge_variants
            new = variant_rows(src, args.variant)
            extra = {"source_file": str(src), "variant": args.variant, "conversion_command": command}
        try:
            counts = merge(args.out / f"{args.stem}.csv", src, args.merge_run, args.merge_base_run,
                           args.merge_note, new=new, keep_runs=tuple(args.merge_keep_run), command=command,
                           part_extra=extra)
        except ValueError as exc:
            print(f"bench --merge: {exc}", file=sys.stderr)
            return 2
        print(f"merged {src} into {args.out / args.stem}.csv: rows per run {counts}")
        return 0
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if any(p not in POLICIES for p in policies):
        ap.error(f"--policies takes a comma-separated subset of {','.join(POLICIES)}, got {args.policies!r}")
    dtypes = tuple(d.strip() for d in args.state_dtype.split(",") if d.strip())
    if not dtypes or any(d not in STATE_DTYPES for d in dtypes):
        ap.error(f"--state-dtype takes a comma-separated subset of {','.join(STATE_DTYPES)}, got {args.state_dtype!r}")
    try:
        batches = tuple(int(b) for b in args.batches.split(",") if b.strip())
    except ValueError:
        batches = ()
    if not batches or any(b not in BATCHES for b in batches):
        ap.error(f"--batches takes a comma-separated subset of {','.join(map(str, BATCHES))}, got {args.batches!r}")
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    if not models or any(m not in MODELS for m in models):
        ap.error(f"--models takes a comma-separated subset of {','.join(MODELS)}, got {args.models!r}")
    trees = tuple(t for t in args.trees.split(";") if t) or (*TREES, "chain")  # in order: tree outer, then B
    if any(t not in (*TREES, "chain") for t in trees):
        ap.error(f"--trees takes a semicolon-separated subset of {';'.join(TREES)};chain, got {args.trees!r}")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or any(m not in ("graph", "eager") for m in modes):
        ap.error(f"--modes takes a comma-separated subset of graph,eager, got {args.modes!r}")
    variants = tuple(VARIANTS) if args.variants == "all" else tuple(v for v in args.variants.split(",") if v)
    if any(v not in VARIANTS for v in variants):
        ap.error(f"--variants takes 'all' or a comma-separated subset of {','.join(VARIANTS)}, got {args.variants!r}")
    if args.pick_variant and (not variants or args.tuning):
        ap.error("--pick-variant needs --variants and excludes --tuning")
    if args.gpu_test_jobs < 1:
        ap.error(f"--gpu-test-jobs takes a positive count, got {args.gpu_test_jobs}")
    try:
        treewy.TUNING = Tuning.parse(args.tuning) if args.tuning else treewy.TUNING
    except (ValueError, TypeError) as exc:
        ap.error(f"--tuning: {exc}")
    if not torch.cuda.is_available() and not REHEARSAL:
        print("bench: needs a CUDA GPU (run it through the device tool)", file=sys.stderr)
        return 2
    t_start = time.time()
    deadline = t_start + args.budget_s if args.budget_s else math.inf
    args.out.mkdir(parents=True, exist_ok=True)
    prov = environment(args)
    prov["gpu_tests"] = {"skipped": "--skip-gpu-tests"} if args.skip_gpu_tests else run_gpu_tests(jobs=args.gpu_test_jobs)
    print(f"GPU tests: {json.dumps(prov['gpu_tests'])}", flush=True)
    if not prov["gpu_tests"].get("passed", args.skip_gpu_tests):
        (args.out / f"{args.stem}_provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
        print("bench: the GPU tests failed; kernels that fail their checks are not measured "
              "(--skip-gpu-tests measures anyway, and the provenance says so)", file=sys.stderr)
        return 1
    copy_bw = copy_bandwidth()
    prov["copy_bw_bytes_per_s"] = copy_bw
    print(f"copy bandwidth {copy_bw / 1e12:.3f} TB/s (1 GiB device-to-device, read + write)", flush=True)
    prov["bytes_formula"] = {
        "store_all": "verify S(1+T) + inputs + o; commit 2S (read the accepted slot, write the state)",
        "reconstruct": "verify S + inputs + o + u; commit 2S + path (u, k)",
        "reconstruct_deferred": "verify 2S (the previous step's commit: read, write) + pending path (u, k) + inputs "
                                "+ o + u; commit 2 x path (u, k) (read, write the pending slots)",
        "replay": "verify S + inputs + cached inputs + o + u (cache + tree); commit flush 2S + path (u, k) over "
                  "cache + path, append 2 x path inputs",
        "units": "S = B Hv 128 128 x (4: float32 state, 2: bfloat16, column state_dtype); q, k, v, o bf16; "
                 "g, beta, u float32",
    }
    prov["policies"] = list(policies) + (["store_all (reference: 35B (1,1,1), B 64, 128; (3,3,3), B 128)"]
                                         if args.reference_store_all and "store_all" not in policies else [])
    prov["state_dtypes"] = list(dtypes)
    prov["batches"], prov["modes"], prov["trees"] = list(batches), list(modes), list(trees)
    prov["tuning"] = treewy.TUNING.label()
    prov_path = args.out / f"{args.stem}_provenance.json"
    skipped: list[str] = []
    if variants:
        prov["variants"] = {v: VARIANTS[v].label() for v in variants}
        v_deadline = min(deadline, t_start + args.variants_budget_s) if args.variants_budget_s else deadline
        skipped += run_variants(copy_bw, args.out, v_deadline, variants)
        if args.pick_variant:
            with (args.out / "variants.csv").open(newline="") as fh:
                try:
                    name, sums = fastest(list(csv.DictReader(fh)))
                except ValueError as exc:
                    print(f"bench --pick-variant: {exc}", file=sys.stderr)
                    return 1
            treewy.TUNING = VARIANTS[name]
            prov["tuning"] = treewy.TUNING.label()
            prov["tuning_picked"] = {"variant": name, "label": treewy.TUNING.label(),
                                     "total_us_summed_over_cases": sums}
            print(f"picked variant {name} ({treewy.TUNING.label()}); sums {sums}", flush=True)
        prov_path.write_text(json.dumps(prov, indent=1) + "\n")
    try:
        prov["fla_fused_recurrent"] = ({"available": False, "reason": "--no-fla"} if args.no_fla
                                       else fla_reference(copy_bw, args.quick))
    except Exception as exc:  # an outside reference failing must not lose our own measurements
        prov["fla_fused_recurrent"] = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
        recover()
    print("fla", json.dumps(prov["fla_fused_recurrent"])[:3000], flush=True)
    kts = tuple(int(t) for t in args.kernel_ts.split(",") if t.strip())
    try:
        prov["kernels_vs_T"] = kernels_vs_T(copy_bw, B=KERNELS_B, Ts=kts) if "reconstruct" in policies and kts else []
    except Exception as exc:  # the per-kernel table failing must not lose the main rows
        prov["kernels_vs_T"] = [{"error": f"{type(exc).__name__}: {exc}"}]
        recover()
    for r in prov["kernels_vs_T"]:
        print("kernels", r, flush=True)
    prov_path.write_text(json.dumps(prov, indent=1) + "\n")  # partial, rewritten at the end
    csv_path = args.out / f"{args.stem}.csv"
    with csv_path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        if "none" in policies:  # the no-speculation baseline first: cheap, and every B of it
            nc = none_cases(dtypes, (128, 1) if args.quick else batches, ("qwen3.5-35b-a3b",) if args.quick else models)
            rows, prov["none"] = none_rows(nc, copy_bw, modes, deadline, f"time budget {args.budget_s:.0f} s")
            skipped += prov["none"].get("skipped", []) or ([] if rows else [f"none: {prov['none'].get('reason')}"])
            for r in rows:
                w.writerow(r)
                if r["mode"] == "graph":
                    print(f"{r['model'][:14]:14} none           B={r['B']:<3} T=1   {r['state_dtype'][:4]} decode "
                          f"{r['verify_us']:9.1f} us {r['pct_of_copy_bw']:5.1f}%", flush=True)
            fh.flush()
        for c in sorted((c for c in cases(args.quick, dtypes, batches, models) if c.tree in trees),
                        key=lambda c: trees.index(c.tree)):  # stable: the trees named first run at every B first
            if time.time() > deadline:
                skipped.append(f"{c.model} B={c.B} T={c.T} {c.tree} {c.state_dtype}: not run "
                               f"(time budget {args.budget_s:.0f} s)")
                continue
            for policy, replayed, flush in policy_variants(c, policies, args.reference_store_all):
                try:
                    rows = run_policy(c, policy, replayed, flush, copy_bw, modes=modes)
                except Exception as exc:  # one failing case is logged; the rest still run
                    print(f"FAILED {policy} {c}: {type(exc).__name__}: {exc}", flush=True)
                    skipped.append(f"{c.model} {policy} B={c.B} T={c.T} {c.state_dtype}: {type(exc).__name__}: {exc}")
                    recover()
                    continue
                if not rows:
                    skipped.append(f"{c.model} {policy} B={c.B} T={c.T}: one call's buffers exceed {MAX_FOOTPRINT >> 30} GiB")
                for r in rows:
                    w.writerow(r)
                    if r["mode"] == "graph":
                        print(f"{c.model[:14]:14} {policy[:14]:14} r={replayed:<3} f={int(flush)} B={c.B:<3} T={c.T:<3} "
                              f"{c.tree:14} {c.state_dtype[:4]} verify {r['verify_us']:9.1f} commit {r['commit_us']:8.1f} "
                              f"us {r['pct_of_copy_bw']:5.1f}% extra {r['extra_mem_bytes'] / 2**20:9.1f} MiB", flush=True)
                fh.flush()
    prov["skipped"] = skipped
    prov["wall_s"] = round(time.time() - t_start, 1)
    prov_path.write_text(json.dumps(prov, indent=1) + "\n")
    print(summary(args.out, args.stem), flush=True)
    for r in prov["fla_fused_recurrent"].get("rows", []):
        print(f"  fla fused_recurrent chain T={r['T']} B={r['B']}: {r['us']} us ({r['pct_of_copy_bw']}%), "
              f"state vs reconstruct {r['rel_err_state_vs_reconstruct']:.1e}")
    for line in skipped:
        print("skipped:", line)
    print(f"wrote {csv_path} in {prov['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
