"""Pieces the calibrator's Triton kernels share."""
from __future__ import annotations

import os

import triton
import triton.language as tl

# Triton's CPU interpreter multiplies bf16 tiles in tl.dot as raw 16-bit patterns
# (garbage; fp32 is right), so under TRITON_INTERPRET=1 the kernels upcast first.
INTERPRET: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def mma(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b with fp32 accumulation; on the GPU a bf16 tensor-core dot."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)
