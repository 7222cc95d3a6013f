"""TreeWY commit kernels: the accepted state rebuilt in place (`_state_kernel`, `_commit_dot_kernel`),
and reconstruct_deferred's pending commit (`_apply_pending`, `_flush_kernel`, `_gather_path_kernel`)."""
from __future__ import annotations

import triton
import triton.language as tl

from policies.kernels.tile_math import _dot, state_block


@triton.jit
def _state_kernel(k_ptr, state_ptr, mask_ptr, gc_ptr, u_ptr, acc_ptr, out_ptr, T, Hk, Hv, A_OFFSET,
                  DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr):
    """S_a = G_a S_0 + sum over the path to a of (G_a / G_i) u_i k_i^T, one rank-1 update per path node."""
    b, h, hk, _, rv = state_block(Hk, Hv, DV=DV, BV=BV)
    a = tl.load(acc_ptr + b) + A_OFFSET
    rk = tl.arange(0, DK)
    p_s = ((b * Hv + h) * DV + rv[:, None]) * DK + rk[None, :]
    ga = tl.load(gc_ptr + (b * T + a) * Hv + h)
    s = tl.exp(ga) * tl.load(state_ptr + p_s).to(tl.float32)
    # Ancestors precede a (parent-first order).
    for i in range(0, a + 1):
        if tl.load(mask_ptr + b * BT * BT + a * BT + i) != 0:
            w = tl.exp(ga - tl.load(gc_ptr + (b * T + i) * Hv + h))
            ui = tl.load(u_ptr + ((b * T + i) * Hv + h) * DV + rv)
            ki = tl.load(k_ptr + ((b * T + i) * Hk + hk) * DK + rk).to(tl.float32)
            s += (w * ui)[:, None] * ki[None, :]
    tl.store(out_ptr + p_s, s.to(out_ptr.dtype.element_ty))


@triton.jit
def _commit_dot_kernel(k_ptr, state_ptr, mask_ptr, gc_ptr, u_ptr, acc_ptr, out_ptr, T, Hk, Hv, A_OFFSET,
                       DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                       K16: tl.constexpr, PREC: tl.constexpr):
    """`_state_kernel`'s sum as (w u)^T k products over 16 path slots at a time: every load of a
    block is issued at once instead of one dependent mask test per node."""
    b, h, hk, _, rv = state_block(Hk, Hv, DV=DV, BV=BV)
    a = tl.load(acc_ptr + b) + A_OFFSET
    rc = tl.arange(0, BC)
    rk = tl.arange(0, DK)
    p_s = ((b * Hv + h) * DV + rv[:, None]) * DK + rk[None, :]
    ga = tl.load(gc_ptr + (b * T + a) * Hv + h)
    # The state load is issued first and joined last: the path products accumulate on their own
    # (ncu: accumulating into the loaded tile made them wait on it, 62% of copy bandwidth).
    s0 = tl.load(state_ptr + p_s)
    acc = tl.zeros([BV, DK], dtype=tl.float32)
    for j in range(0, tl.cdiv(a + 1, BC)):
        tj = j * BC + rc
        on = (tl.load(mask_ptr + b * BT * BT + a * BT + tj) != 0) & (tj < T)
        w = tl.where(on, tl.exp(ga - tl.load(gc_ptr + (b * T + tj) * Hv + h, mask=on, other=0.0)), 0.0)
        uj = tl.load(u_ptr + ((b * T + tj[:, None]) * Hv + h) * DV + rv[None, :], mask=on[:, None], other=0.0)
        kj = tl.load(k_ptr + ((b * T + tj[:, None]) * Hk + hk) * DK + rk[None, :], mask=on[:, None],
                     other=0.0).to(tl.float32)
        acc += _dot(tl.trans(w[:, None] * uj), kj, False, K16, PREC)
    s = tl.exp(ga) * s0.to(tl.float32) + acc
    tl.store(out_ptr + p_s, s.to(out_ptr.dtype.element_ty))


@triton.jit
def _apply_pending(s, pu_ptr, pk_ptr, pg_ptr, pn_ptr, b, h, hk, rv, rk, Hk, Hv, P,
                   DK: tl.constexpr, DV: tl.constexpr, BC: tl.constexpr, K16: tl.constexpr, PREC: tl.constexpr,
                   DOT: tl.constexpr):
    """The previous step's commit on the tile s = S_old[rv, :]: G_a S_old + sum_i pu_i pk_i^T,
    with pu already weighted by G_a / G_i (`_gather_path_kernel`). DOT: 16 path slots per
    tl.dot; else one rank-1 FMA update per pending node (no layout change of s)."""
    npend = tl.load(pn_ptr + b)
    s = tl.exp(tl.load(pg_ptr + b * Hv + h)) * s
    if DOT:
        rc = tl.arange(0, BC)
        for j in range(0, tl.cdiv(npend, BC)):
            tj = j * BC + rc
            on = tj < npend
            pu = tl.load(pu_ptr + ((b * P + tj[:, None]) * Hv + h) * DV + rv[None, :], mask=on[:, None], other=0.0)
            pk = tl.load(pk_ptr + ((b * P + tj[:, None]) * Hk + hk) * DK + rk[None, :], mask=on[:, None],
                         other=0.0).to(tl.float32)
            s += _dot(tl.trans(pu), pk, False, K16, PREC)
    else:
        for i in range(0, npend):
            pu = tl.load(pu_ptr + ((b * P + i) * Hv + h) * DV + rv)
            pk = tl.load(pk_ptr + ((b * P + i) * Hk + hk) * DK + rk).to(tl.float32)
            s += pu[:, None] * pk[None, :]
    return s


@triton.jit
def _flush_kernel(state_ptr, sel_ptr, pu_ptr, pk_ptr, pg_ptr, pn_ptr, Hk, Hv, P,
                  DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, K16: tl.constexpr,
                  PREC: tl.constexpr, DOT: tl.constexpr):
    """The pending commit of the selected sequences written into the state (nothing else)."""
    b, h, hk, _, rv = state_block(Hk, Hv, DV=DV, BV=BV)
    if tl.load(sel_ptr + b) != 0:
        rk = tl.arange(0, DK)
        p_s = state_ptr + ((b * Hv + h) * DV + rv[:, None]) * DK + rk[None, :]
        s = _apply_pending(tl.load(p_s).to(tl.float32), pu_ptr, pk_ptr, pg_ptr, pn_ptr, b, h, hk, rv, rk, Hk, Hv, P,
                           DK=DK, DV=DV, BC=BC, K16=K16, PREC=PREC, DOT=DOT)
        tl.store(p_s, s.to(state_ptr.dtype.element_ty))


@triton.jit
def _gather_path_kernel(k_ptr, mask_ptr, gc_ptr, u_ptr, acc_ptr, pu_ptr, pk_ptr, pg_ptr, pn_ptr, T, Hk, Hv, P,
                        DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, HVP: tl.constexpr,
                        HKP: tl.constexpr):
    """Deferred commit, one program per (sequence, path slot p): the p-th node on the path to
    a = accepted[b] (ancestors in position order) copied to the pending slot, its pseudo-values
    weighted by G_a / G_i, so the next verify applies sum_p pu_p pk_p^T without the tree."""
    b = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    a = tl.load(acc_ptr + b)
    r = tl.arange(0, BT)
    on = tl.load(mask_ptr + b * BT * BT + a * BT + r) != 0
    rank = tl.cumsum(on.to(tl.int32), axis=0)
    count = tl.sum(on.to(tl.int32), axis=0)
    node = tl.sum(tl.where(on & (rank == p + 1), r, 0), axis=0)
    hv = tl.arange(0, HVP)
    hkr = tl.arange(0, HKP)
    rv = tl.arange(0, DV)
    rk = tl.arange(0, DK)
    ga = tl.load(gc_ptr + (b * T + a) * Hv + hv, mask=hv < Hv, other=0.0)
    if p == 0:
        tl.store(pg_ptr + b * Hv + hv, ga, mask=hv < Hv)
        tl.store(pn_ptr + b, tl.minimum(count, P))  # in bounds even unchecked (commit(check=False))
    if p < count:
        w = tl.exp(ga - tl.load(gc_ptr + (b * T + node) * Hv + hv, mask=hv < Hv, other=0.0))
        mv = (hv < Hv)[:, None]
        uu = tl.load(u_ptr + ((b * T + node) * Hv + hv[:, None]) * DV + rv[None, :], mask=mv, other=0.0)
        tl.store(pu_ptr + ((b * P + p) * Hv + hv[:, None]) * DV + rv[None, :], w[:, None] * uu, mask=mv)
        mk = (hkr < Hk)[:, None]
        kk = tl.load(k_ptr + ((b * T + node) * Hk + hkr[:, None]) * DK + rk[None, :], mask=mk, other=0.0)
        tl.store(pk_ptr + ((b * P + p) * Hk + hkr[:, None]) * DK + rk[None, :], kk.to(pk_ptr.dtype.element_ty),
                 mask=mk)
