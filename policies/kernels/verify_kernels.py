"""TreeWY verify kernels other than the fused one: the tree prep (`_prep_kernel`), the blocked
pair (`_solve_kernel` + `_apply_kernel`) and the row-by-row verify (`_rows_kernel`)."""
from __future__ import annotations

import triton
import triton.language as tl

from policies.kernels.tile_math import _ancestors, state_block


@triton.jit
def _prep_kernel(parent_ptr, lengths_ptr, g_ptr, mask_ptr, gc_ptr, T, Hv,
                 BT: tl.constexpr, HP: tl.constexpr, STEPS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    n = tl.load(lengths_ptr + b)
    r = tl.arange(0, BT)
    valid = r < n
    anc = _ancestors(parent_ptr, b, n, T, BT=BT, STEPS=STEPS)
    tl.store(mask_ptr + b * BT * BT + r[:, None] * BT + r[None, :], anc.to(tl.int8))
    h = tl.arange(0, HP)
    gv = tl.load(g_ptr + (b * T + r[:, None]) * Hv + h[None, :], mask=valid[:, None] & (h[None, :] < Hv), other=0.0)
    gc = tl.dot(anc.to(tl.float32), gv.to(tl.float32), input_precision="ieee")
    tl.store(gc_ptr + (b * T + r[:, None]) * Hv + h[None, :], gc, mask=(r[:, None] < T) & (h[None, :] < Hv))


@triton.jit
def _solve_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, mask_ptr, gc_ptr, lengths_ptr, x_ptr, z_ptr, T, Hk, Hv,
                  DK: tl.constexpr, DV: tl.constexpr, BC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr):
    """X = (I + diag(b) A)^-1 diag(b) [G k | v] and Z = Att X, one program per (sequence, v-head).

    Nothing here reads the state: u = X_v - X_k S0^T and o = Z_v + (G q - Z_k) S0^T follow
    in `_apply_kernel`. Block by block of BC positions: earlier blocks enter through
    their stored X; the diagonal block is inverted by forward substitution on its
    BC x BC matrix alone, then applied with one product per side.
    """
    bh = tl.program_id(0)
    b = (bh // Hv).to(tl.int64)
    h = bh % Hv
    hk = h // (Hv // Hk)
    n = tl.load(lengths_ptr + b)
    rc = tl.arange(0, BC)
    rk = tl.arange(0, DK)
    rv = tl.arange(0, DV)
    W: tl.constexpr = DK + DV
    lower = rc[:, None] > rc[None, :]
    eye = (rc[:, None] == rc[None, :]).to(tl.float32)
    for j in range(0, tl.cdiv(T, BC)):
        tj = j * BC + rc
        mj = tj < n
        kj = tl.load(k_ptr + ((b * T + tj[:, None]) * Hk + hk) * DK + rk[None, :], mask=mj[:, None], other=0.0).to(tl.float32)
        qj = tl.load(q_ptr + ((b * T + tj[:, None]) * Hk + hk) * DK + rk[None, :], mask=mj[:, None], other=0.0).to(tl.float32)
        vj = tl.load(v_ptr + ((b * T + tj[:, None]) * Hv + h) * DV + rv[None, :], mask=mj[:, None], other=0.0).to(tl.float32)
        bj = tl.load(beta_ptr + (b * T + tj) * Hv + h, mask=mj, other=0.0).to(tl.float32)
        gj = tl.load(gc_ptr + (b * T + tj) * Hv + h, mask=mj, other=0.0)
        rk_ = (bj * tl.exp(gj))[:, None] * kj
        rv_ = bj[:, None] * vj
        zk = tl.zeros([BC, DK], dtype=tl.float32)
        zv = tl.zeros([BC, DV], dtype=tl.float32)
        for i in range(0, j):
            ti = i * BC + rc
            row_i = (b * T + ti[:, None]) * Hv + h
            ki = tl.load(k_ptr + ((b * T + ti[:, None]) * Hk + hk) * DK + rk[None, :], mask=(ti < n)[:, None], other=0.0).to(tl.float32)
            gi = tl.load(gc_ptr + (b * T + ti) * Hv + h)
            xki = tl.load(x_ptr + row_i * W + rk[None, :])
            xvi = tl.load(x_ptr + row_i * W + DK + rv[None, :])
            anc = tl.load(mask_ptr + b * BT * BT + tj[:, None] * BT + ti[None, :]) != 0
            dec = tl.where(anc, tl.exp(gj[:, None] - gi[None, :]), 0.0)
            a_ji = bj[:, None] * dec * tl.dot(kj, tl.trans(ki), input_precision=PREC)
            att = dec * tl.dot(qj, tl.trans(ki), input_precision=PREC)
            rk_ -= tl.dot(a_ji, xki, input_precision=PREC)
            rv_ -= tl.dot(a_ji, xvi, input_precision=PREC)
            zk += tl.dot(att, xki, input_precision=PREC)
            zv += tl.dot(att, xvi, input_precision=PREC)
        anc = tl.load(mask_ptr + b * BT * BT + tj[:, None] * BT + tj[None, :]) != 0
        dec = tl.where(anc, tl.exp(gj[:, None] - gj[None, :]), 0.0)
        lmat = tl.where(lower, bj[:, None] * dec * tl.dot(kj, tl.trans(kj), input_precision=PREC), 0.0)
        # (I + L)^-1 row by row: inv[t] = e_t - sum_{i<t} L[t, i] inv[i].
        inv = eye
        for t in tl.static_range(1, BC):
            sel = rc[:, None] == t
            lrow = tl.sum(tl.where(sel, lmat, 0.0), axis=0)
            inv = tl.where(sel, inv - tl.sum(lrow[:, None] * inv, axis=0)[None, :], inv)
        xkj = tl.dot(inv, rk_, input_precision=PREC)
        xvj = tl.dot(inv, rv_, input_precision=PREC)
        row_j = (b * T + tj[:, None]) * Hv + h
        inside = (tj < T)[:, None]
        tl.store(x_ptr + row_j * W + rk[None, :], xkj, mask=inside)
        tl.store(x_ptr + row_j * W + DK + rv[None, :], xvj, mask=inside)
        # Later blocks of this program read these rows back.
        tl.debug_barrier()
        att = dec * tl.dot(qj, tl.trans(kj), input_precision=PREC)
        tl.store(z_ptr + row_j * W + rk[None, :], zk + tl.dot(att, xkj, input_precision=PREC), mask=inside)
        tl.store(z_ptr + row_j * W + DK + rv[None, :], zv + tl.dot(att, xvj, input_precision=PREC), mask=inside)


@triton.jit
def _apply_kernel(q_ptr, state_ptr, gc_ptr, lengths_ptr, x_ptr, z_ptr, o_ptr, u_ptr, T, Hk, Hv, O_START, T_OUT,
                  DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """The only pass over the state: u = X_v - X_k S0^T, o = Z_v + (G q - Z_k) S0^T."""
    b, h, hk, _, rv = state_block(Hk, Hv, DV=DV, BV=BV)
    n = tl.load(lengths_ptr + b)
    rc = tl.arange(0, BC)
    rk = tl.arange(0, DK)
    W: tl.constexpr = DK + DV
    s0t = tl.trans(tl.load(state_ptr + ((b * Hv + h) * DV + rv[:, None]) * DK + rk[None, :]).to(tl.float32))
    for j in range(0, tl.cdiv(T, BC)):
        tj = j * BC + rc
        mj = tj < n
        row = (b * T + tj[:, None]) * Hv + h
        xk = tl.load(x_ptr + row * W + rk[None, :], mask=(tj < T)[:, None], other=0.0)
        zk = tl.load(z_ptr + row * W + rk[None, :], mask=(tj < T)[:, None], other=0.0)
        xv = tl.load(x_ptr + row * W + DK + rv[None, :], mask=(tj < T)[:, None], other=0.0)
        zv = tl.load(z_ptr + row * W + DK + rv[None, :], mask=(tj < T)[:, None], other=0.0)
        qj = tl.load(q_ptr + ((b * T + tj[:, None]) * Hk + hk) * DK + rk[None, :], mask=mj[:, None], other=0.0).to(tl.float32)
        ej = tl.exp(tl.load(gc_ptr + (b * T + tj) * Hv + h, mask=mj, other=0.0))
        u = xv - tl.dot(xk, s0t, input_precision=PREC)
        o = tl.where(mj[:, None], zv + tl.dot(ej[:, None] * qj - zk, s0t, input_precision=PREC), 0.0)
        tl.store(u_ptr + row * DV + rv[None, :], u, mask=(tj < T)[:, None])
        to = tj - O_START
        tl.store(o_ptr + ((b * T_OUT + to[:, None]) * Hv + h) * DV + rv[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=((tj >= O_START) & (tj < T))[:, None])


@triton.jit
def _rows_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, state_ptr, mask_ptr, gc_ptr, lengths_ptr, o_ptr, u_ptr,
                 T, Hk, Hv, O_START, T_OUT,
                 DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr, BT: tl.constexpr,
                 UNROLLED: tl.constexpr):
    """Solve and state pass in one, row by row on the register tile (trees of T <= ROWS_MAX).

    One program per (sequence, v-head, v-block); s = S_0[rv, :] stays in registers and is read
    once. For each position t in parent-first order, with U the pseudo-values found so far:
      u_t = b_t (v_t - G_t S_0 k_t - sum_{i strict anc} (G_t/G_i)(k_t.k_i) u_i)
      o_t = G_t S_0 q_t + sum_{i anc or self} (G_t/G_i)(q_t.k_i) u_i
    All products are float32 mat-vecs (exact to ~1e-7, no tensor-core rounding). UNROLLED
    (BR <= 16): all BR rows unrolled, positions past the length masked to zero rows, so every
    row's loads and S_0 mat-vecs can be scheduled together; else a loop over the valid
    positions that loads row t + 1 while computing row t.
    """
    b, h, hk, _, rv = state_block(Hk, Hv, DV=DV, BV=BV)
    n = tl.load(lengths_ptr + b)
    r = tl.arange(0, BR)
    rk = tl.arange(0, DK)
    s = tl.load(state_ptr + ((b * Hv + h) * DV + rv[:, None]) * DK + rk[None, :]).to(tl.float32)
    valid = r < n
    kall = tl.load(k_ptr + ((b * T + r[:, None]) * Hk + hk) * DK + rk[None, :], mask=valid[:, None],
                   other=0.0).to(tl.float32)
    gall = tl.load(gc_ptr + (b * T + r) * Hv + h, mask=valid, other=0.0)
    U = tl.zeros([BR, BV], dtype=tl.float32)
    if UNROLLED:
        ball = tl.load(beta_ptr + (b * T + r) * Hv + h, mask=valid, other=0.0).to(tl.float32)
        for t in tl.static_range(BR):
            # Rows t >= n load zeros: b_t = 0 and an empty ancestor row give u_t = o_t = 0.
            kt = tl.load(k_ptr + ((b * T + t) * Hk + hk) * DK + rk, mask=(rk * 0 + t) < n, other=0.0).to(tl.float32)
            qt = tl.load(q_ptr + ((b * T + t) * Hk + hk) * DK + rk, mask=(rk * 0 + t) < n, other=0.0).to(tl.float32)
            vt = tl.load(v_ptr + ((b * T + t) * Hv + h) * DV + rv, mask=(rv * 0 + t) < n, other=0.0).to(tl.float32)
            bt = tl.sum(tl.where(r == t, ball, 0.0), axis=0)
            gt = tl.sum(tl.where(r == t, gall, 0.0), axis=0)
            anc = (tl.load(mask_ptr + b * BT * BT + t * BT + r) != 0) & valid
            dec = tl.where(anc, tl.exp(gt - gall), 0.0)
            sk = tl.sum(s * kt[None, :], axis=1)
            sq = tl.sum(s * qt[None, :], axis=1)
            kk = tl.sum(kall * kt[None, :], axis=1)
            qk = tl.sum(kall * qt[None, :], axis=1)
            et = tl.exp(gt)
            wk = tl.where(r != t, dec * kk, 0.0)
            ut = bt * (vt - et * sk - tl.sum(wk[:, None] * U, axis=0))
            U = tl.where(r[:, None] == t, ut[None, :], U)
            ot = et * sq + tl.sum((dec * qk)[:, None] * U, axis=0)
            tl.store(u_ptr + ((b * T + t) * Hv + h) * DV + rv, ut, mask=(rv * 0 + t) < T)
            tl.store(o_ptr + ((b * T_OUT + t - O_START) * Hv + h) * DV + rv, ot.to(o_ptr.dtype.element_ty),
                     mask=((rv * 0 + t) < T) & ((rv * 0 + t) >= O_START))
    else:
        # Row 0 (n >= 1: lengths are at least 1), then row min(t + 1, n - 1) ahead of each step.
        kt = tl.load(k_ptr + (b * T * Hk + hk) * DK + rk).to(tl.float32)
        qt = tl.load(q_ptr + (b * T * Hk + hk) * DK + rk).to(tl.float32)
        vt = tl.load(v_ptr + (b * T * Hv + h) * DV + rv).to(tl.float32)
        bt = tl.load(beta_ptr + b * T * Hv + h).to(tl.float32)
        at = tl.load(mask_ptr + b * BT * BT + r)
        for t in range(0, n):
            nx = tl.minimum(t + 1, n - 1)
            kn = tl.load(k_ptr + ((b * T + nx) * Hk + hk) * DK + rk).to(tl.float32)
            qn = tl.load(q_ptr + ((b * T + nx) * Hk + hk) * DK + rk).to(tl.float32)
            vn = tl.load(v_ptr + ((b * T + nx) * Hv + h) * DV + rv).to(tl.float32)
            bn = tl.load(beta_ptr + (b * T + nx) * Hv + h).to(tl.float32)
            an = tl.load(mask_ptr + b * BT * BT + nx * BT + r)
            gt = tl.sum(tl.where(r == t, gall, 0.0), axis=0)
            anc = (at != 0) & valid
            dec = tl.where(anc, tl.exp(gt - gall), 0.0)
            sk = tl.sum(s * kt[None, :], axis=1)
            sq = tl.sum(s * qt[None, :], axis=1)
            kk = tl.sum(kall * kt[None, :], axis=1)
            qk = tl.sum(kall * qt[None, :], axis=1)
            et = tl.exp(gt)
            wk = tl.where(r != t, dec * kk, 0.0)
            ut = bt * (vt - et * sk - tl.sum(wk[:, None] * U, axis=0))
            U = tl.where(r[:, None] == t, ut[None, :], U)
            ot = et * sq + tl.sum((dec * qk)[:, None] * U, axis=0)
            tl.store(u_ptr + ((b * T + t) * Hv + h) * DV + rv, ut)
            if t >= O_START:
                tl.store(o_ptr + ((b * T_OUT + t - O_START) * Hv + h) * DV + rv, ot.to(o_ptr.dtype.element_ty))
            kt, qt, vt, bt, at = kn, qn, vn, bn, an
        for t in range(n, T):
            tl.store(u_ptr + ((b * T + t) * Hv + h) * DV + rv, tl.zeros([BV], dtype=tl.float32))
            if t >= O_START:
                tl.store(o_ptr + ((b * T_OUT + t - O_START) * Hv + h) * DV + rv,
                         tl.zeros([BV], dtype=o_ptr.dtype.element_ty))
