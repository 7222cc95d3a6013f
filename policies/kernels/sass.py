"""Static profile of a kernel without a GPU: compile it for sm_90 and count its SASS instructions per loop.

    python3 -m policies.kernels.sass [--kernel chain] [--shape 8x1] [--state-dtype float32] [--pending]

Triton's NVIDIA backend (ptxas, nvdisasm) ships in the triton wheel, so this runs on any machine:
it compiles the kernel at the models' head size (128) for an H100/H200 (sm_90) and prints, per loop
of the disassembly, its warp instructions and their mix, and what that is per 32 state values of a
program's tile. Issue counts are not times (latency and memory bound a kernel too), but they rank
launch shapes of an issue-bound loop at no device time.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

LABEL = re.compile(r"^\.L_x_\d+:")
INSTR = re.compile(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
BRANCH = re.compile(r"`\((\.L_x_\d+)\)")


def loops(sass: str) -> list[tuple[str, Counter]]:
    """Instruction mix of each loop of a disassembly: from a label to the last branch back to it."""
    labels: dict[str, int] = {}
    ops: list[str] = []
    back: dict[str, int] = {}
    for line in sass.splitlines():
        if LABEL.match(line.strip()):
            labels[line.strip()[:-1]] = len(ops)
            continue
        m = INSTR.search(line)
        if not m:
            continue
        ops.append(m.group(1).split(".")[0])
        target = BRANCH.search(line)
        if m.group(1) == "BRA" and target and target.group(1) in labels:
            back[target.group(1)] = len(ops)
    order = sorted(back, key=labels.get)
    return [(label, Counter(ops[labels[label]:back[label]])) for label in order]


def compile_chain(bv: int, warps: int, state_dtype: str, pending: bool) -> str:
    """The chain verify's SASS for sm_90 (tree of 16 positions, 35B-A3B head size)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from policies.kernels.chain_kernel import _chain_kernel
    ty = {a: "*bf16" for a in ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "pk_ptr")}
    ty.update({a: "*fp32" for a in ("g_ptr", "beta_ptr", "u_ptr", "gc_ptr", "pu_ptr", "pg_ptr")})
    ty.update({"lengths_ptr": "*i32", "cached_ptr": "*i32", "pn_ptr": "*i32", "mask_ptr": "*i8",
               "state_ptr": "*fp32" if state_dtype == "float32" else "*bf16"})
    consts = dict(DK=128, DV=128, BV=bv, BT=16, PENDING=pending, SKIP=False)
    sig = {a: "constexpr" if a in consts else ty.get(a, "i32") for a in _chain_kernel.arg_names}
    k = triton.compile(ASTSource(_chain_kernel, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps))
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        return subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m policies.kernels.sass", description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="chain", choices=("chain",), help="the kernel to compile")
    ap.add_argument("--shape", default="8x1", help="state rows per program x warps, e.g. 8x1, 32x4")
    ap.add_argument("--state-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--pending", action="store_true", help="with reconstruct_deferred's pending commit")
    args = ap.parse_args(argv)
    try:
        bv, warps = (int(x) for x in args.shape.lower().split("x"))
        if bv < 4 or bv & (bv - 1) or warps not in (1, 2, 4, 8):
            raise ValueError
    except ValueError:
        print(f"sass: --shape takes ROWSxWARPS (rows a power of two >= 4, warps 1, 2, 4 or 8), got {args.shape!r}",
              file=sys.stderr)
        return 2
    sass = compile_chain(bv, warps, args.state_dtype, args.pending)
    per_warp = bv * 128 / warps  # state values a warp holds
    print(f"{args.kernel} {bv}x{warps} {args.state_dtype}{' pending' if args.pending else ''}: sm_90, "
          f"{per_warp:.0f} state values per warp")
    for label, mix in loops(sass):
        n = sum(mix.values())
        top = ", ".join(f"{op} {c}" for op, c in mix.most_common(6))
        print(f"  loop {label}: {n} warp instructions ({n * 32 / per_warp:.1f} per 32 state values): {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
