"""`_chain_kernel`: the verify of a chain in recurrent form, the state tile in registers.

For a chain (parent[t] = t - 1) no WY solve is needed: walking the positions in order with the
state tile s = S[rv, :] in registers, position t's pseudo-value is the delta rule's correction
    s <- exp(g_t) s,   u_t = beta_t (v_t - s k_t),   s <- s + u_t k_t^T,   o_t = s q_t,
the same u_t the closed form gives (S_t = G_t S_0 + sum_{i<=t} (G_t / G_i) u_i k_i^T), so
`reconstruct`'s commit and `reconstruct_deferred`'s pending path read it unchanged. Every
product is a float32 FMA on the register tile and a reduction within the rows a warp holds
(fla's fused_recurrent structure); the state is read once and never written (PENDING: the
previous step's pending commit is applied first, rank-1 update by update, and written back).
Programs with value block 0 also write what the commit reads besides u: the path log-decays
gc[t] = sum_{i<=t} g_i and (head 0) the chain's ancestor mask (lower triangle up to the length).
SKIP (replay): positions [cached[b], O_START) are unused cache slots, off the path: the walk
goes from the last valid cache slot straight to the tree's root at O_START (u = 0, gc = 0 there).
"""
from __future__ import annotations

import triton
import triton.language as tl

from policies.kernels.commit_kernels import _apply_pending
from policies.kernels.tile_math import state_block


@triton.jit
def _step(s, gcum, t, b, h, hk, rv, rk, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, u_ptr, gc_ptr, T, Hk, Hv,
          O_START, T_OUT, lead, DK: tl.constexpr, DV: tl.constexpr):
    """Position t of the walk: decay, correct, update the tile; store u_t, o_t (t >= O_START) and gc_t."""
    kt = tl.load(k_ptr + ((b * T + t) * Hk + hk) * DK + rk).to(tl.float32)
    vt = tl.load(v_ptr + ((b * T + t) * Hv + h) * DV + rv).to(tl.float32)
    gt = tl.load(g_ptr + (b * T + t) * Hv + h).to(tl.float32)
    bt = tl.load(beta_ptr + (b * T + t) * Hv + h).to(tl.float32)
    gcum += gt
    s *= tl.exp(gt)
    ut = bt * (vt - tl.sum(s * kt[None, :], axis=1))
    s += ut[:, None] * kt[None, :]
    tl.store(u_ptr + ((b * T + t) * Hv + h) * DV + rv, ut)
    if t >= O_START:
        qt = tl.load(q_ptr + ((b * T + t) * Hk + hk) * DK + rk).to(tl.float32)
        ot = tl.sum(s * qt[None, :], axis=1)
        tl.store(o_ptr + ((b * T_OUT + t - O_START) * Hv + h) * DV + rv, ot.to(o_ptr.dtype.element_ty))
    if lead:  # value block 0 writes the per-(position, head) path log-decay
        tl.store(gc_ptr + (b * T + t) * Hv + h, gcum)
    return s, gcum


@triton.jit
def _blank(t, b, h, rv, o_ptr, u_ptr, gc_ptr, T, Hv, O_START, T_OUT, lead, DV: tl.constexpr, BV: tl.constexpr):
    """Position t off the walk: zeros, as the other verifies write."""
    tl.store(u_ptr + ((b * T + t) * Hv + h) * DV + rv, tl.zeros([BV], dtype=tl.float32))
    if t >= O_START:
        tl.store(o_ptr + ((b * T_OUT + t - O_START) * Hv + h) * DV + rv, tl.zeros([BV], dtype=o_ptr.dtype.element_ty))
    if lead:  # value block 0 writes the per-(position, head) path log-decay
        tl.store(gc_ptr + (b * T + t) * Hv + h, 0.0)


@triton.jit
def _chain_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, lengths_ptr, cached_ptr, o_ptr, u_ptr, mask_ptr,
                  gc_ptr, pu_ptr, pk_ptr, pg_ptr, pn_ptr, T, Hk, Hv, O_START, T_OUT, P,
                  DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, PENDING: tl.constexpr,
                  SKIP: tl.constexpr):
    b, h, hk, vb, rv = state_block(Hk, Hv, DV=DV, BV=BV)
    n = tl.load(lengths_ptr + b)
    if SKIP:
        c_end = tl.load(cached_ptr + b)
    else:
        c_end = O_START
    rk = tl.arange(0, DK)
    p_s = state_ptr + ((b * Hv + h) * DV + rv[:, None]) * DK + rk[None, :]
    s = tl.load(p_s).to(tl.float32)
    if PENDING:
        # rank-1 updates keep the tile's layout (a tl.dot needs 16 rows a program)
        s = _apply_pending(s, pu_ptr, pk_ptr, pg_ptr, pn_ptr, b, h, hk, rv, rk, Hk, Hv, P, DK=DK, DV=DV, BC=16,
                           K16=False, PREC="ieee", DOT=False)
        s = s.to(state_ptr.dtype.element_ty)
        tl.store(p_s, s)
        s = s.to(tl.float32)  # verify from the state exactly as committed (bf16: rounded)
    if (vb == 0) & (h == 0):
        r = tl.arange(0, BT)
        on = (r[None, :] <= r[:, None]) & (r[:, None] < n) & ((r[None, :] < c_end) | (r[None, :] >= O_START))
        tl.store(mask_ptr + b * BT * BT + r[:, None] * BT + r[None, :], on.to(tl.int8))
    gcum = 0.0
    lead = vb == 0
    for t in range(0, c_end):
        s, gcum = _step(s, gcum, t, b, h, hk, rv, rk, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, u_ptr, gc_ptr,
                        T, Hk, Hv, O_START, T_OUT, lead, DK=DK, DV=DV)
    for t in range(c_end, O_START):
        _blank(t, b, h, rv, o_ptr, u_ptr, gc_ptr, T, Hv, O_START, T_OUT, lead, DV=DV, BV=BV)
    for t in range(O_START, n):
        s, gcum = _step(s, gcum, t, b, h, hk, rv, rk, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, u_ptr, gc_ptr,
                        T, Hk, Hv, O_START, T_OUT, lead, DK=DK, DV=DV)
    for t in range(n, T):
        _blank(t, b, h, rv, o_ptr, u_ptr, gc_ptr, T, Hv, O_START, T_OUT, lead, DV=DV, BV=BV)


@triton.jit
def _row(tile, r, i):
    """Row i of a small prefetched tile (a masked sum: register tiles cannot be indexed)."""
    return tl.sum(tl.where((r == i)[:, None], tile, 0.0), axis=0)


@triton.jit
def _chain_prefetch_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, lengths_ptr, o_ptr, u_ptr, mask_ptr,
                           gc_ptr, pu_ptr, pk_ptr, pg_ptr, pn_ptr, Hk, Hv, T: tl.constexpr, P: tl.constexpr,
                           TP: tl.constexpr, PP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                           BV: tl.constexpr, BT: tl.constexpr, PENDING: tl.constexpr):
    """`_chain_kernel`'s walk for short chains without cache slots (out_start 0), every input loaded
    before the first store. The walk's loads depend on nothing it computes, but a load after a store
    to another buffer cannot be hoisted above it (the pointers may alias), so in `_chain_kernel` each
    position waits for its own loads: T + P round trips to memory a program, one here. The positions
    (TP >= T rows) and the pending path (PP >= P rows) are loaded as tiles; a position past the
    chain's length reads zeros (g = 0, beta = 0: the tile unchanged, u = o = 0, as `_blank` writes)."""
    b, h, hk, vb, rv = state_block(Hk, Hv, DV=DV, BV=BV)
    n = tl.load(lengths_ptr + b)
    rk = tl.arange(0, DK)
    rt = tl.arange(0, TP)
    on_t = rt < n
    kt_all = tl.load(k_ptr + ((b * T + rt[:, None]) * Hk + hk) * DK + rk[None, :], mask=on_t[:, None],
                     other=0.0).to(tl.float32)
    qt_all = tl.load(q_ptr + ((b * T + rt[:, None]) * Hk + hk) * DK + rk[None, :], mask=on_t[:, None],
                     other=0.0).to(tl.float32)
    vt_all = tl.load(v_ptr + ((b * T + rt[:, None]) * Hv + h) * DV + rv[None, :], mask=on_t[:, None],
                     other=0.0).to(tl.float32)
    gt_all = tl.load(g_ptr + (b * T + rt) * Hv + h, mask=on_t, other=0.0).to(tl.float32)
    bt_all = tl.load(beta_ptr + (b * T + rt) * Hv + h, mask=on_t, other=0.0).to(tl.float32)
    p_s = state_ptr + ((b * Hv + h) * DV + rv[:, None]) * DK + rk[None, :]
    if PENDING:
        rp = tl.arange(0, PP)
        on_p = rp < tl.load(pn_ptr + b)
        pu_all = tl.load(pu_ptr + ((b * P + rp[:, None]) * Hv + h) * DV + rv[None, :], mask=on_p[:, None], other=0.0)
        pk_all = tl.load(pk_ptr + ((b * P + rp[:, None]) * Hk + hk) * DK + rk[None, :], mask=on_p[:, None],
                         other=0.0).to(tl.float32)
        decay = tl.exp(tl.load(pg_ptr + b * Hv + h))
    s = tl.load(p_s).to(tl.float32)
    if PENDING:
        # the previous step's commit (`_apply_pending`, one rank-1 update a node), written back
        s = decay * s
        for i in tl.static_range(PP):
            s += _row(pu_all, rp, i)[:, None] * _row(pk_all, rp, i)[None, :]
        s = s.to(state_ptr.dtype.element_ty)
        tl.store(p_s, s)
        s = s.to(tl.float32)  # verify from the state exactly as committed (bf16: rounded)
    if (vb == 0) & (h == 0):
        r = tl.arange(0, BT)
        on = (r[None, :] <= r[:, None]) & (r[:, None] < n)
        tl.store(mask_ptr + b * BT * BT + r[:, None] * BT + r[None, :], on.to(tl.int8))
    gcum = 0.0
    lead = vb == 0
    for t in tl.static_range(T):
        kt = _row(kt_all, rt, t)
        gt = tl.sum(tl.where(rt == t, gt_all, 0.0), axis=0)
        gcum += gt
        s *= tl.exp(gt)
        ut = tl.sum(tl.where(rt == t, bt_all, 0.0), axis=0) * (_row(vt_all, rt, t) - tl.sum(s * kt[None, :], axis=1))
        s += ut[:, None] * kt[None, :]
        tl.store(u_ptr + ((b * T + t) * Hv + h) * DV + rv, ut)
        ot = tl.sum(s * _row(qt_all, rt, t)[None, :], axis=1)
        tl.store(o_ptr + ((b * T + t) * Hv + h) * DV + rv, ot.to(o_ptr.dtype.element_ty))
        if lead:  # value block 0 writes the per-(position, head) path log-decay, 0 off the chain
            tl.store(gc_ptr + (b * T + t) * Hv + h, tl.where(t < n, gcum, 0.0))
