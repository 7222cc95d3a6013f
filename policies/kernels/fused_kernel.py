"""`_fused_kernel`: TreeWY's default verify, solve and state pass in one program (see its docstring)."""
from __future__ import annotations

import triton
import triton.language as tl

from policies.kernels.commit_kernels import _apply_pending
from policies.kernels.tile_math import _ancestors, _dot, state_block


@triton.jit
def _fused_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, state_ptr, mask_ptr, gc_ptr, lengths_ptr, o_ptr, u_ptr,
                  pu_ptr, pk_ptr, pg_ptr, pn_ptr, parent_ptr, g_ptr, T, Hk, Hv, O_START, T_OUT, P,
                  DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                  NSQ: tl.constexpr, PENDING: tl.constexpr, QK16: tl.constexpr, PK16: tl.constexpr,
                  PREC: tl.constexpr, PDOT: tl.constexpr, PACK: tl.constexpr, PREP: tl.constexpr,
                  S16: tl.constexpr, SPARSE: tl.constexpr):
    """Solve and state pass in one program per (sequence, v-head, v-block), 16 positions at a time.

    The tile s = S_0[rv, :] is read once (PENDING: S_old, brought up to date by the previous
    step's deferred commit and written back). Per block j of positions, with earlier blocks'
    pseudo-values U_i (this program's own u rows, read back):
      R_j = b_j (V_j - G_j K_j S_0^T) - sum_{i<j} A_ji U_i,   U_j = (I + L_jj)^-1 R_j
      O_j = G_j Q_j S_0^T + sum_{i<=j} Att_ji U_i
    K_j S_0^T and Q_j S_0^T are the only products with the state; every product is float32
    accurate (`_dot`). L_jj is strictly lower triangular, so
    (I + L)^-1 = (I - L)(I + L^2)(I + L^4)(I + L^8): NSQ factors (L^(2^NSQ) = 0 for a block of
    at most 2^NSQ positions) of independent tl.dot products instead of a 16-step substitution
    whose every step is a cross-thread reduction. PACK (T <= 8): one block whose k and q rows
    share a 16-row tile, halving the products with the state. PREP (T <= 16): the tree prep
    done here, per program, instead of `_prep_kernel`'s launch (the v-block-0 programs write
    gc and, for head 0, the mask that commit reads). S16: a bfloat16 state is an exact `_dot`
    operand, so its products are one bf16 tensor-core product, not the three of a split.
    """
    b, h, hk, vb, rv = state_block(Hk, Hv, DV=DV, BV=BV)
    n = tl.load(lengths_ptr + b)
    rc = tl.arange(0, BC)
    rk = tl.arange(0, DK)
    p_s = state_ptr + ((b * Hv + h) * DV + rv[:, None]) * DK + rk[None, :]
    s = tl.load(p_s).to(tl.float32)
    if PENDING:
        s = _apply_pending(s, pu_ptr, pk_ptr, pg_ptr, pn_ptr, b, h, hk, rv, rk, Hk, Hv, P, DK=DK, DV=DV, BC=BC,
                           K16=PK16, PREC=PREC, DOT=PDOT)
        s = s.to(state_ptr.dtype.element_ty)
        tl.store(p_s, s)
        s = s.to(tl.float32)  # verify from the state exactly as committed (bf16: rounded)
    if S16:
        st = tl.trans(s.to(tl.bfloat16))  # exact: s holds bf16 values
    else:
        st = tl.trans(s)
    lower = rc[:, None] > rc[None, :]
    if PREP:
        ancr = _ancestors(parent_ptr, b, n, T, BT=BC, STEPS=4)
        gv = tl.load(g_ptr + (b * T + rc) * Hv + h, mask=rc < n, other=0.0).to(tl.float32)
        gcr = tl.sum(tl.where(ancr, gv[None, :], 0.0), axis=1)
        if vb == 0:
            tl.store(gc_ptr + (b * T + rc) * Hv + h, gcr, mask=rc < T)
            if h == 0:
                tl.store(mask_ptr + b * BC * BC + rc[:, None] * BC + rc[None, :], ancr.to(tl.int8))
    if PACK:
        # T <= 8: K and Q share one 16-row tile, so a single product with the state gives
        # S k_p (rows 0-7) and S q_p (rows 8-15); sh moves rows 8-15 up to their positions.
        half: tl.constexpr = BC // 2
        isk = rc < half
        pos = rc % half
        mp = pos < n
        kq = tl.where(isk[:, None],
                      tl.load(k_ptr + ((b * T + pos[:, None]) * Hk + hk) * DK + rk[None, :], mask=(isk & mp)[:, None],
                              other=0.0),
                      tl.load(q_ptr + ((b * T + pos[:, None]) * Hk + hk) * DK + rk[None, :], mask=(~isk & mp)[:, None],
                              other=0.0)).to(tl.float32)
        m0 = isk & mp  # rows that are positions
        v0 = tl.load(v_ptr + ((b * T + rc[:, None]) * Hv + h) * DV + rv[None, :], mask=m0[:, None],
                     other=0.0).to(tl.float32)
        b0 = tl.load(beta_ptr + (b * T + rc) * Hv + h, mask=m0, other=0.0).to(tl.float32)
        if PREP:
            g0 = tl.where(m0, gcr, 0.0)
            anc = ancr & m0[:, None] & m0[None, :]
        else:
            g0 = tl.load(gc_ptr + (b * T + rc) * Hv + h, mask=m0, other=0.0)
            anc = (tl.load(mask_ptr + b * BT * BT + rc[:, None] * BT + rc[None, :]) != 0) & m0[:, None] & m0[None, :]
        dec = tl.where(anc, tl.exp(g0[:, None] - g0[None, :]), 0.0)
        sh = (rc[None, :] == rc[:, None] + half).to(tl.float32)
        rr = _dot(kq, st, QK16, S16, PREC)
        gg = _dot(kq, tl.trans(kq), QK16, QK16, PREC)  # k.k top left, q.k bottom left
        uj = b0[:, None] * (v0 - tl.exp(g0)[:, None] * tl.where(m0[:, None], rr, 0.0))
        if NSQ > 0:
            lp = tl.where(lower, b0[:, None] * dec * gg, 0.0)
            uj -= _dot(lp, uj, False, False, PREC)
            for _ in tl.static_range(NSQ - 1):
                lp = _dot(lp, lp, False, False, PREC)
                uj += _dot(lp, uj, False, False, PREC)
        oj = _dot(tl.exp(g0)[:, None] * sh, rr, False, False, PREC) \
            + _dot(dec * _dot(sh, gg, True, False, PREC), uj, False, False, PREC)
        inside = (isk & (rc < T))[:, None]
        tl.store(u_ptr + ((b * T + rc[:, None]) * Hv + h) * DV + rv[None, :], uj, mask=inside)
        tl.store(o_ptr + ((b * T_OUT + rc[:, None] - O_START) * Hv + h) * DV + rv[None, :],
                 oj.to(o_ptr.dtype.element_ty), mask=inside & (rc >= O_START)[:, None])
    else:
        for j in range(0, tl.cdiv(T, BC)):
            tj = j * BC + rc
            mj = tj < n
            kj = tl.load(k_ptr + ((b * T + tj[:, None]) * Hk + hk) * DK + rk[None, :], mask=mj[:, None],
                         other=0.0).to(tl.float32)
            qj = tl.load(q_ptr + ((b * T + tj[:, None]) * Hk + hk) * DK + rk[None, :], mask=mj[:, None],
                         other=0.0).to(tl.float32)
            vj = tl.load(v_ptr + ((b * T + tj[:, None]) * Hv + h) * DV + rv[None, :], mask=mj[:, None],
                         other=0.0).to(tl.float32)
            bj = tl.load(beta_ptr + (b * T + tj) * Hv + h, mask=mj, other=0.0).to(tl.float32)
            if PREP:  # one block: j = 0
                gj = tl.where(mj, gcr, 0.0)
            else:
                gj = tl.load(gc_ptr + (b * T + tj) * Hv + h, mask=mj, other=0.0)
            ej = tl.exp(gj)
            rhs = bj[:, None] * (vj - ej[:, None] * _dot(kj, st, QK16, S16, PREC))
            oj = ej[:, None] * _dot(qj, st, QK16, S16, PREC)
            for i in range(0, j):
                ti = i * BC + rc
                anc = tl.load(mask_ptr + b * BT * BT + tj[:, None] * BT + ti[None, :]) != 0
                # SPARSE: the mask is block-sparse (in BFS order the leaves fill the last blocks, and a
                # leaf is nobody's ancestor); a block without ancestors adds nothing, so is skipped.
                go = True
                if SPARSE:
                    go = tl.max(anc.to(tl.int32)) > 0
                if go:
                    ki = tl.load(k_ptr + ((b * T + ti[:, None]) * Hk + hk) * DK + rk[None, :],
                                 mask=(ti < n)[:, None], other=0.0).to(tl.float32)
                    gi = tl.load(gc_ptr + (b * T + ti) * Hv + h, mask=ti < n, other=0.0)
                    ui = tl.load(u_ptr + ((b * T + ti[:, None]) * Hv + h) * DV + rv[None, :])
                    dec = tl.where(anc, tl.exp(gj[:, None] - gi[None, :]), 0.0)
                    a_ji = bj[:, None] * dec * _dot(kj, tl.trans(ki), QK16, QK16, PREC)
                    rhs -= _dot(a_ji, ui, False, False, PREC)
                    oj += _dot(dec * _dot(qj, tl.trans(ki), QK16, QK16, PREC), ui, False, False, PREC)
            if PREP:
                anc = ancr
            else:
                anc = tl.load(mask_ptr + b * BT * BT + tj[:, None] * BT + tj[None, :]) != 0
            dec = tl.where(anc, tl.exp(gj[:, None] - gj[None, :]), 0.0)
            uj = rhs
            if NSQ > 0:
                go = True
                if SPARSE:  # a block of leaves (no strict ancestors in it): U = R
                    go = tl.max((anc & lower).to(tl.int32)) > 0
                if go:
                    lp = tl.where(lower, bj[:, None] * dec * _dot(kj, tl.trans(kj), QK16, QK16, PREC), 0.0)
                    uj = rhs - _dot(lp, rhs, False, False, PREC)
                    for _ in tl.static_range(NSQ - 1):
                        lp = _dot(lp, lp, False, False, PREC)
                        uj += _dot(lp, uj, False, False, PREC)
            oj += _dot(dec * _dot(qj, tl.trans(kj), QK16, QK16, PREC), uj, False, False, PREC)
            inside = (tj < T)[:, None]
            tl.store(u_ptr + ((b * T + tj[:, None]) * Hv + h) * DV + rv[None, :], uj, mask=inside)
            to = tj - O_START
            tl.store(o_ptr + ((b * T_OUT + to[:, None]) * Hv + h) * DV + rv[None, :], oj.to(o_ptr.dtype.element_ty),
                     mask=inside & (tj >= O_START)[:, None])
            # Later blocks of this program read these u rows back.
            tl.debug_barrier()
