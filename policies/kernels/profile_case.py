"""Nsight Compute profile of one policy's verify + commit at one bench shape on the GPU.

    python3 -m policies.kernels.profile_case --out DIR [--policy reconstruct_deferred] [--tree 1,1,1]
        [--B 128] [--state-dtype float32] [--tuning prec=bf16x3] [--kernels _fused_kernel|_commit_dot_kernel]

Any policy (store_all, reconstruct, replay, reconstruct_deferred) and any bench tree
(policies.kernels.bench.TREES) or chainN; the inputs are the bench's (make_copy, 35B-A3B heads).

Runs itself under `ncu --clock-control none --set full` (so clocks are the ones the bench
sees), capturing the named kernels of one verify + commit after a warm-up step, and writes
DIR/profile.ncu-rep plus DIR/profile.txt (the details page: throughput, occupancy, stall
reasons, shared-memory and register use per kernel). About 30-60 s per case.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

POLICIES = ("store_all", "reconstruct", "replay", "reconstruct_deferred")


def _run_case(args: argparse.Namespace) -> None:
    import importlib

    import torch

    from policies.kernels import bench, replay, reconstruct_deferred, treewy
    from policies.kernels.inputs import chain, full

    if args.tuning:
        treewy.TUNING = treewy.Tuning.parse(args.tuning)
    hk, hv = bench.MODELS["qwen3.5-35b-a3b"]
    parents = tuple(chain(int(args.tree[len("chain"):]))) if args.tree.startswith("chain") else tuple(
        full(bench.TREES[args.tree]))
    c = bench.Case("qwen3.5-35b-a3b", hk, hv, args.B, args.tree, parents, args.state_dtype)
    x = bench.make_copy(c, 0)
    if args.policy == "replay":  # a cache flushed every commit: verify and commit see the tree alone
        x["state"] = replay.ReplayState.start(x["state"], flush_interval=1, max_path=c.depth + 1, hk=hk)
    elif args.policy == "reconstruct_deferred":
        x["state"] = reconstruct_deferred.DeferredState.start(x["state"], max_path=c.depth + 1, hk=hk)
    mod = importlib.import_module(f"policies.kernels.{args.policy}")
    acc = torch.full((c.B,), c.T - 1, dtype=torch.int32, device=bench.DEVICE)
    for _ in range(2):  # ncu skips the first step; reconstruct_deferred's second applies a full pending path
        mod.commit(mod.verify(**x, check=False)[1], acc, check=False)
    bench._sync()
    print(f"ran {args.policy} B={c.B} T={c.T} tree {args.tree} {args.state_dtype}: 2 verify + commit steps")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m policies.kernels.profile_case", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--policy", default="reconstruct", choices=POLICIES)
    ap.add_argument("--tree", default="1,1,1", help="a policies.kernels.bench TREES key (1,1,1, 3,3,3, ...) "
                                                   "or chainN (N positions)")
    ap.add_argument("--B", type=int, default=128)
    ap.add_argument("--state-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tuning", default="", help="treewy.Tuning fields, e.g. prec=bf16x3,verify_bv=64")
    ap.add_argument("--kernels", default="_fused_kernel|_commit_dot_kernel|_state_kernel|_gather_path_kernel",
                    help="regex of kernel names to profile")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from policies.kernels.bench import TREES

    if args.tree not in TREES and not (args.tree.startswith("chain") and args.tree[5:].isdigit()
                                       and int(args.tree[5:]) >= 1):
        ap.error(f"--tree must be one of {', '.join(TREES)} or chainN (N >= 1), got {args.tree!r}")
    if args.B < 1:
        ap.error(f"--B must be >= 1, got {args.B}")
    if args.child:
        _run_case(args)
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
        print(txt.stdout[-6000:], flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
