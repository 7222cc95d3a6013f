"""Nsight Compute profile of one policy's verify + commit at one bench shape on the GPU.

    python3 -m policies.kernels.profile_case --out DIR [--policy reconstruct_deferred] [--tree 1,1,1]
        [--B 128] [--state-dtype float32] [--tuning prec=bf16x3] [--kernels _fused_kernel|_commit_dot_kernel]

Any policy (store_all, reconstruct, replay, reconstruct_deferred) and any bench tree
(policies.kernels.bench_cases.TREES) or chainN; the inputs are the bench's (make_copy, 35B-A3B heads).

Runs itself under `ncu --clock-control none --set full` (so clocks are the ones the bench
sees), capturing the named kernels of one verify + commit after a warm-up step, and writes
DIR/profile.ncu-rep, DIR/profile.txt (the details page: throughput, occupancy, stall
reasons, shared-memory and register use per kernel), DIR/raw.csv (every metric) and
DIR/summary.json (`summarize_raw`: what bounds each kernel, in a few numbers). About 20-60 s
per case. `--from-raw` writes summary.json again from DIR/raw.csv alone (no GPU).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

POLICIES = ("store_all", "reconstruct", "replay", "reconstruct_deferred")
MODEL = "qwen3.5-35b-a3b"  # the heads of every profiled case
STALLS_KEPT = 4  # the largest warp stall reasons per kernel in summary.json
STALL = "smsp__average_warps_issue_stalled_"
STALL_END = "_per_issue_active.ratio"
# summary.json's metrics: name -> (ncu metric, unit it must be read in).
METRICS = {
    "duration_us": ("gpu__time_duration.sum", "us"),
    "dram_read_mb": ("dram__bytes_read.sum", "Mbyte"),
    "dram_write_mb": ("dram__bytes_write.sum", "Mbyte"),
    "warp_instructions": ("smsp__inst_issued.sum", "inst"),
    "issue_active_pct": ("smsp__issue_active.avg.pct_of_peak_sustained_active", "%"),
    "registers": ("launch__registers_per_thread", "register/thread"),
    "shared_kb": ("launch__shared_mem_per_block_dynamic", "Kbyte/block"),
    "blocks_per_sm_by_registers": ("launch__occupancy_limit_registers", "block"),
    "blocks_per_sm_by_shared": ("launch__occupancy_limit_shared_mem", "block"),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "%"),
    "spill_instructions": ("sass__inst_executed_register_spilling", "inst"),
    "local_store_sectors_missed": ("l1tex__t_sectors_pipe_lsu_mem_local_op_st_lookup_miss.sum", "sector"),
    "sm_ghz": ("smsp__cycles_elapsed.avg.per_second", "Ghz"),
}


def summarize_raw(path: Path, state_values: int) -> list[dict]:
    """Per profiled kernel of `ncu --page raw --csv` output (a header row, a units row, a row per
    kernel): METRICS, the DRAM rate, the warp instructions per 32 state values (`state_values`:
    B Hv dk dv of the case), the time the kernel would take at 100% issue (duration x issue-active)
    and the STALLS_KEPT largest stall reasons (cycles per issued instruction)."""
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    if len(rows) < 3:
        raise ValueError(f"{path}: no kernel rows (ncu --page raw --csv output expected)")
    head, units = rows[0], rows[1]
    col = {h: i for i, h in enumerate(head)}

    def num(row: list[str], metric: str, unit: str) -> float:
        if metric not in col:
            raise ValueError(f"{path}: metric {metric} missing")
        if units[col[metric]] not in (unit, ""):
            raise ValueError(f"{path}: {metric} in {units[col[metric]]!r}, expected {unit!r}")
        return float(row[col[metric]].replace(",", ""))
    out = []
    for row in rows[2:]:
        k = {"kernel": row[col["Kernel Name"]]}
        k.update({name: num(row, m, u) for name, (m, u) in METRICS.items()})
        dur = k["duration_us"]
        k["dram_tbs"] = round((k["dram_read_mb"] + k["dram_write_mb"]) / dur, 3)  # MB per us
        k["instructions_per_32_values"] = round(k["warp_instructions"] * 32 / state_values, 1)
        k["us_at_full_issue"] = round(dur * k["issue_active_pct"] / 100, 1)
        stalls = {h[len(STALL):-len(STALL_END)]: float(row[i]) for h, i in col.items()
                  if h.startswith(STALL) and h.endswith(STALL_END) and row[i]}
        k["stalls_cycles_per_instruction"] = dict(sorted(stalls.items(), key=lambda x: -x[1])[:STALLS_KEPT])
        out.append(k)
    return out


def state_values(args: argparse.Namespace) -> int:
    from policies.kernels.bench_cases import D, MODELS

    _, hv = MODELS[MODEL]
    return args.B * hv * D * D


def write_summary(args: argparse.Namespace) -> list[dict]:
    n = state_values(args)
    kernels = summarize_raw(args.out / "raw.csv", n)
    case = {"model": MODEL, "policy": args.policy, "tree": args.tree, "B": args.B, "state_dtype": args.state_dtype,
            "tuning": args.tuning, "state_values": n}
    (args.out / "summary.json").write_text(json.dumps({"case": case, "kernels": kernels}, indent=1) + "\n")
    return kernels


def _run_case(args: argparse.Namespace) -> None:
    import importlib

    import torch

    from policies.kernels import replay, reconstruct_deferred, treewy
    from policies.kernels.bench_cases import CHAIN_POLICIES, DEVICE, MODELS, TREES, Case
    from policies.kernels.bench_policy import make_copy
    from policies.kernels.bench_timing import sync
    from policies.kernels.inputs import chain, full

    if args.tuning:
        treewy.TUNING = treewy.Tuning.parse(args.tuning)
    hk, hv = MODELS[MODEL]
    parents = tuple(chain(int(args.tree[len("chain"):]))) if args.tree.startswith("chain") else tuple(
        full(TREES[args.tree]))
    c = Case(MODEL, hk, hv, args.B, args.tree, parents, args.state_dtype)
    x = make_copy(c, 0)
    if args.policy == "replay":  # a cache flushed every commit: verify and commit see the tree alone
        x["state"] = replay.ReplayState.start(x["state"], flush_interval=1, max_path=c.depth + 1, hk=hk)
    elif args.policy == "reconstruct_deferred":
        x["state"] = reconstruct_deferred.DeferredState.start(x["state"], max_path=c.depth + 1, hk=hk)
    mod = importlib.import_module(f"policies.kernels.{args.policy}")
    acc = torch.full((c.B,), c.T - 1, dtype=torch.int32, device=DEVICE)
    hint = {"chain": c.is_chain} if args.policy in CHAIN_POLICIES else {}
    for _ in range(2):  # ncu skips the first step; reconstruct_deferred's second applies a full pending path
        mod.commit(mod.verify(**x, check=False, **hint)[1], acc, check=False)
    sync()
    print(f"ran {args.policy} B={c.B} T={c.T} tree {args.tree} {args.state_dtype}: 2 verify + commit steps")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m policies.kernels.profile_case", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--policy", default="reconstruct", choices=POLICIES)
    ap.add_argument("--tree", default="1,1,1", help="a policies.kernels.bench_cases TREES key (1,1,1, 3,3,3, ...) "
                                                   "or chainN (N positions)")
    ap.add_argument("--B", type=int, default=128)
    ap.add_argument("--state-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tuning", default="", help="treewy.Tuning fields, e.g. prec=bf16x3,verify_bv=64")
    ap.add_argument("--kernels", default="_fused_kernel|_chain_kernel|_commit_dot_kernel|_state_kernel|_gather_path_kernel",
                    help="regex of kernel names to profile")
    ap.add_argument("--from-raw", action="store_true",
                    help="no profile: write OUT/summary.json from OUT/raw.csv (a profile of this case)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from policies.kernels.bench_cases import TREES

    if args.tree not in TREES and not (args.tree.startswith("chain") and args.tree[5:].isdigit()
                                       and int(args.tree[5:]) >= 1):
        ap.error(f"--tree must be one of {', '.join(TREES)} or chainN (N >= 1), got {args.tree!r}")
    if args.B < 1:
        ap.error(f"--B must be >= 1, got {args.B}")
    if args.child:
        _run_case(args)
        return 0
    if args.from_raw:
        try:
            kernels = write_summary(args)
        except (OSError, ValueError) as e:
            print(f"profile_case: {e}", file=sys.stderr)
            return 2
        print(json.dumps(kernels, indent=1))
        return 0
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not os.path.exists(ncu):
        print("profile_case: ncu not found (PATH, /usr/local/cuda/bin)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rep = args.out / "profile"
    child = [sys.executable, "-m", "policies.kernels.profile_case", "--child", "--out", str(args.out), "--policy",
             args.policy, "--tree", args.tree, "--B", str(args.B), "--state-dtype", args.state_dtype,
             "--tuning", args.tuning]
    # Each step launches two matching kernels (verify, commit): skip the warm-up step's.
    cmd = [ncu, "--clock-control", "none", "--set", "full", "-k", f"regex:{args.kernels}", "--launch-skip", "2",
           "--launch-count", "2", "-f", "-o", str(rep)] + child
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd).returncode
    if rc == 0:
        txt = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "details"], capture_output=True, text=True)
        (args.out / "profile.txt").write_text(txt.stdout + txt.stderr)
        raw = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "raw", "--csv"], capture_output=True,
                             text=True)
        (args.out / "raw.csv").write_text(raw.stdout)
        print(txt.stdout[-6000:], flush=True)
        print(json.dumps(write_summary(args), indent=1), flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
