"""Triton helpers shared by the TreeWY kernels: which state tile a program owns, the ancestor
mask of a tree, and float32-accurate tile products (`_dot`)."""
from __future__ import annotations

import os

import triton
import triton.language as tl

_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def state_block(Hk, Hv, DV: tl.constexpr, BV: tl.constexpr):
    """What a state-pass program owns (programs are (request, value head, value block), value blocks
    fastest): its request b (int64: offsets pass 2^31 elements at large B x T), value head h, the
    q/k head hk that head reads, its value block's index vb and rows rv."""
    pid = tl.program_id(0)
    NV: tl.constexpr = DV // BV
    bh = pid // NV
    b = (bh // Hv).to(tl.int64)
    h = bh % Hv
    vb = pid % NV
    return b, h, h // (Hv // Hk), vb, vb * BV + tl.arange(0, BV)


@triton.jit
def _ancestors(parent_ptr, b, n, T, BT: tl.constexpr, STEPS: tl.constexpr):
    """Ancestor-or-self mask [BT, BT] of tree b's first n positions, by repeated squaring of the
    one-hot parent matrix (no per-node loop): reach = I + P + ... + P^(2^s - 1) after s
    doublings; entries stay 0/1 (one path per pair), so float16 products are exact."""
    r = tl.arange(0, BT)
    valid = r < n
    p = tl.load(parent_ptr + b * T + r, mask=valid, other=-1)
    jump = (p[:, None] == r[None, :]).to(tl.float16)
    reach = (r[:, None] == r[None, :]).to(tl.float16)
    for _ in tl.static_range(STEPS):
        reach = reach + tl.dot(jump, reach).to(tl.float16)
        jump = tl.dot(jump, jump).to(tl.float16)
    return (reach > 0.5) & valid[:, None] & valid[None, :]


@triton.jit
def _split3(x):
    """x (float32) as three bfloat16 parts, hi + mid + lo == x to all 24 mantissa bits."""
    hi = x.to(tl.bfloat16)
    r = x - hi.to(tl.float32)
    mid = r.to(tl.bfloat16)
    return hi, mid, (r - mid.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _bdot(a, b):
    """tl.dot of bfloat16 tiles, float32 result."""
    if _INTERPRETED:  # the interpreter multiplies bfloat16 tiles as their raw uint16 bits
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _dot(a, b, A16: tl.constexpr, B16: tl.constexpr, PREC: tl.constexpr):
    """a @ b in float32 accuracy. PREC "bf16x3": an operand holding bfloat16 values (A16, B16:
    the model's q and k) enters as is and the other as three bfloat16 parts, so each partial
    product is exact and the float32 sum is a float32 dot product: three bf16 tensor-core
    products (one when both are bf16) against tf32x3's three tf32 ones at half bf16's rate.
    Neither bf16: tf32x3. Other PREC: tl.dot's own input precision."""
    if PREC == "bf16x3":
        if A16 and B16:
            out = _bdot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        elif A16:
            x = a.to(tl.bfloat16)
            hi, mid, lo = _split3(b)
            out = _bdot(x, hi) + (_bdot(x, mid) + _bdot(x, lo))
        elif B16:
            x = b.to(tl.bfloat16)
            hi, mid, lo = _split3(a)
            out = _bdot(hi, x) + (_bdot(mid, x) + _bdot(lo, x))
        else:
            out = tl.dot(a, b, input_precision="tf32x3")
    else:
        out = tl.dot(a, b, input_precision=PREC)
    return out
