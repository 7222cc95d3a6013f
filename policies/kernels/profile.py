"""One policy's verify + commit at one bench shape, run a few times for a profiler to capture.

    ncu --clock-control none --set full -k 'regex:_fused_kernel|_commit_dot_kernel' -c 4 \\
        -o OUT/reconstruct-b128-333 python3 -m policies.kernels.profile --policy reconstruct --B 128 --tree 3,3,3

The inputs are the bench's (policies.kernels.bench.make_copy: 35B-A3B heads unless --model
says otherwise), the commit keeps the deepest node. `--iters` calls of each, after one
untimed call that compiles the kernels, so the profiler's kernel filter sees warm launches.
"""
from __future__ import annotations

import argparse
import sys

import torch

from policies.kernels import bench as Bn
from policies.kernels import reconstruct, reconstruct_deferred, replay, store_all
from policies.kernels.inputs import chain, full

MODULES = {"store_all": store_all, "reconstruct": reconstruct, "replay": replay,
           "reconstruct_deferred": reconstruct_deferred}


def state_arg(policy: str, state: torch.Tensor, depth: int, hk: int) -> object:
    """The verify's state argument: the pool slot, or the policy's per-request state around it."""
    if policy == "replay":
        return replay.ReplayState.start(state, flush_interval=1, max_path=depth + 1, hk=hk)
    if policy == "reconstruct_deferred":
        return reconstruct_deferred.DeferredState.start(state, max_path=depth + 1, hk=hk)
    return state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m policies.kernels.profile", description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default="reconstruct", choices=sorted(MODULES))
    ap.add_argument("--model", default="qwen3.5-35b-a3b", choices=sorted(Bn.MODELS))
    ap.add_argument("--B", type=int, default=128)
    ap.add_argument("--tree", default="1,1,1", help=f"one of {', '.join(Bn.TREES)}, or chain:T")
    ap.add_argument("--state-dtype", default="float32", choices=sorted(Bn.STATE_DTYPES))
    ap.add_argument("--iters", type=int, default=2, help="profiled calls of verify and of commit")
    args = ap.parse_args(argv)
    if args.tree.startswith("chain:") and args.tree[6:].isdigit() and int(args.tree[6:]) >= 1:
        parents = tuple(chain(int(args.tree[6:])))
    elif args.tree in Bn.TREES:
        parents = tuple(full(Bn.TREES[args.tree]))
    else:
        print(f"profile: --tree must be one of {', '.join(Bn.TREES)} or chain:T (T >= 1), got {args.tree!r}",
              file=sys.stderr)
        return 2
    if args.B < 1 or args.iters < 1:
        print("profile: --B and --iters must be >= 1", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() and not Bn.REHEARSAL:
        print("profile: needs a CUDA GPU (run it through the device tool)", file=sys.stderr)
        return 2
    hk, hv = Bn.MODELS[args.model]
    c = Bn.Case(args.model, hk, hv, args.B, args.tree, parents, args.state_dtype)
    x = Bn.make_copy(c, 0)
    mod = MODULES[args.policy]
    x["state"] = state_arg(args.policy, x["state"], c.depth, hk)
    acc = torch.full((c.B,), c.T - 1, dtype=torch.int32, device=x["q"].device)
    for _ in range(1 + args.iters):
        _, ctx = mod.verify(**x, check=False)
        mod.commit(ctx, acc, check=False)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(f"profiled {args.policy} {args.model} B={c.B} T={c.T} tree {args.tree} {args.state_dtype}: "
          f"{1 + args.iters} verify + commit calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
