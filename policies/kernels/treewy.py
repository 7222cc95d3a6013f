"""Triton kernels of the closed-form tree solve (TreeWY), shared by reconstruct and replay.

Verify is two launches for trees of at most ROWS_MAX (4) positions, three beyond; commit one:
  `_prep_kernel`   one program per tree: the ancestor-or-self mask (by repeated squaring
                   of the one-hot parent matrix, so no per-node loop) and the cumulative
                   log-decays G along every node's path.
  `_rows_kernel`   (T <= ROWS_MAX) solve and state pass in one, store_all's pattern: the
                   state tile S_0[rv, :] in registers, read once; positions in parent-first
                   order, each one two float32 mat-vecs on the tile (S_0 k_t, S_0 q_t) plus
                   the small ancestor sums over the pseudo-values found so far. H200, 35B
                   shapes, B = 64: 46 / 79 / 144 us at T = 1 / 2 / 4 against 230-356 us for
                   the blocked pair, but each further position costs ~35-130 us (latency-bound
                   per row), so past T = 4 the blocked pair is faster (T = 8: 398 vs ~368 us).
  `_solve_kernel`  (T > ROWS_MAX) the triangular solve, which never reads the state: with
                   W = (I + diag(b) A)^-1 diag(b) and Att the masked decayed q.k matrix,
                   X = W [G k | v] and Z = Att X, BC positions at a time (tf32x3 tl.dot).
  `_apply_kernel`  (T > ROWS_MAX) the one pass over the state: u = X_v - X_k S0^T,
                   o = Z_v + (G q - Z_k) S0^T.
  `_state_kernel`  the commit: S_a = G_a S_0 + sum over the path (G_a / G_i) u_i k_i^T, in
                   place. An unrolled, branch-free path loop (T <= COMMIT_UNROLL_MAX) measured
                   no faster on the H200 (T = 8, 16: slower), so it is off by default.
Rows of the state are independent, so every state pass splits d_v across programs.
Shapes are fixed by the maximum T only: the tree lives in device tensors, so a CUDA
graph captured once replays for any tree of at most T positions.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

BC = 16  # positions per block: the smallest tl.dot tile
MAX_POSITIONS = 128  # the ancestor mask is one [BT, BT] tile per tree
# Trees of up to ROWS_MAX positions (rounded up to a power of two) verify in one kernel, row by
# row on the register state tile (`_rows_kernel`); larger ones through the blocked tl.dot solve +
# apply. `_rows_kernel` is exact for any T <= 128 (tests force it); 4 is where it stops winning.
ROWS_MAX = int(os.environ.get("GDN_ROWS_MAX", "4"))
ROWS_UNROLL_MAX = 16  # `_rows_kernel` unrolls its rows for trees of at most this many positions
COMMIT_UNROLL_MAX = int(os.environ.get("GDN_COMMIT_UNROLL_MAX", "0"))  # 0: the looped commit
# tf32x3 keeps float32 accuracy (~1e-7 relative) on the tensor cores; plain tf32 does not.
DOT_PRECISION = os.environ.get("GDN_DOT_PRECISION", "tf32x3")


@triton.jit
def _prep_kernel(parent_ptr, lengths_ptr, g_ptr, mask_ptr, gc_ptr, T, Hv,
                 BT: tl.constexpr, HP: tl.constexpr, STEPS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    n = tl.load(lengths_ptr + b)
    r = tl.arange(0, BT)
    valid = r < n
    p = tl.load(parent_ptr + b * T + r, mask=valid, other=-1)
    # reach = I + P + ... + P^(2^s - 1) after s doublings; entries stay 0/1 (one path per pair),
    # so float16 products are exact.
    jump = (p[:, None] == r[None, :]).to(tl.float16)
    reach = (r[:, None] == r[None, :]).to(tl.float16)
    for _ in tl.static_range(STEPS):
        reach = reach + tl.dot(jump, reach).to(tl.float16)
        jump = tl.dot(jump, jump).to(tl.float16)
    anc = (reach > 0.5) & valid[:, None] & valid[None, :]
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
    pid = tl.program_id(0)
    NV: tl.constexpr = DV // BV
    bh = pid // NV
    b = (bh // Hv).to(tl.int64)
    h = bh % Hv
    hk = h // (Hv // Hk)
    n = tl.load(lengths_ptr + b)
    rc = tl.arange(0, BC)
    rk = tl.arange(0, DK)
    rv = (pid % NV) * BV + tl.arange(0, BV)
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
    pid = tl.program_id(0)
    NV: tl.constexpr = DV // BV
    bh = pid // NV
    b = (bh // Hv).to(tl.int64)
    h = bh % Hv
    hk = h // (Hv // Hk)
    n = tl.load(lengths_ptr + b)
    r = tl.arange(0, BR)
    rk = tl.arange(0, DK)
    rv = (pid % NV) * BV + tl.arange(0, BV)
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


@triton.jit
def _state_kernel(k_ptr, state_ptr, mask_ptr, gc_ptr, u_ptr, acc_ptr, out_ptr, T, Hk, Hv, A_OFFSET,
                  DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, UNROLL: tl.constexpr):
    """S_a = G_a S_0 + sum over the path to a of (G_a / G_i) u_i k_i^T, one rank-1 update per path node."""
    pid = tl.program_id(0)
    NV: tl.constexpr = DV // BV
    bh = pid // NV
    b = (bh // Hv).to(tl.int64)
    h = bh % Hv
    hk = h // (Hv // Hk)
    a = tl.load(acc_ptr + b) + A_OFFSET
    rk = tl.arange(0, DK)
    rv = (pid % NV) * BV + tl.arange(0, BV)
    p_s = ((b * Hv + h) * DV + rv[:, None]) * DK + rk[None, :]
    ga = tl.load(gc_ptr + (b * T + a) * Hv + h)
    s = tl.exp(ga) * tl.load(state_ptr + p_s).to(tl.float32)
    if UNROLL > 0:
        # Small trees: every position, unrolled and branch-free, so all path loads are in flight
        # at once; positions off the path (the mask is 0 past the tree's length) load nothing.
        for i in tl.static_range(UNROLL):
            m = tl.load(mask_ptr + b * BT * BT + a * BT + i).to(tl.int32)
            gi = tl.load(gc_ptr + (b * T + i) * Hv + h)  # i < T: written by the prep for every position
            w = tl.where(m != 0, tl.exp(ga - gi), 0.0)
            ui = tl.load(u_ptr + ((b * T + i) * Hv + h) * DV + rv, mask=(rv * 0 + m) != 0, other=0.0)
            ki = tl.load(k_ptr + ((b * T + i) * Hk + hk) * DK + rk, mask=(rk * 0 + m) != 0, other=0.0).to(tl.float32)
            s += (w * ui)[:, None] * ki[None, :]
    else:
        # Ancestors precede a (parent-first order).
        for i in range(0, a + 1):
            if tl.load(mask_ptr + b * BT * BT + a * BT + i) != 0:
                w = tl.exp(ga - tl.load(gc_ptr + (b * T + i) * Hv + h))
                ui = tl.load(u_ptr + ((b * T + i) * Hv + h) * DV + rv)
                ki = tl.load(k_ptr + ((b * T + i) * Hk + hk) * DK + rk).to(tl.float32)
                s += (w * ui)[:, None] * ki[None, :]
    tl.store(out_ptr + p_s, s.to(out_ptr.dtype.element_ty))


@dataclass
class TreeSolve:
    """What a verify leaves for commit: the pseudo-values plus the per-tree bookkeeping.

    u [B, T, Hv, Dv] float32 is the only per-head buffer; mask [B, BT, BT] int8 and
    gc [B, T, Hv] float32 are per tree and per (node, head) scalars.
    """
    k: torch.Tensor
    state: torch.Tensor
    lengths: torch.Tensor
    u: torch.Tensor
    gc: torch.Tensor
    mask: torch.Tensor


def rows_block(T: int) -> int:
    """Rows of `_rows_kernel`'s pseudo-value tile: positions padded to a power of two."""
    return max(2, triton.next_power_of_2(T))


def block_v(dv: int) -> int:
    """Columns of the state per program (DK and DV are powers of two >= 16, so it divides both)."""
    return min(32, dv)


def check_dims(dk: int, dv: int) -> None:
    for name, d in (("Dk", dk), ("Dv", dv)):
        if d < 16 or d & (d - 1):
            raise ValueError(f"the Triton kernels need {name} a power of two >= 16, got {d} "
                             "(reference.py handles any size)")


def padded(T: int) -> int:
    return max(BC, triton.next_power_of_2(T))


def lengths_or_full(lengths: torch.Tensor | None, batch: int, T: int, device: torch.device) -> torch.Tensor:
    if lengths is None:
        return torch.full((batch,), T, dtype=torch.int32, device=device)
    return lengths.to(device=device, dtype=torch.int32)


def combined_parents(count: torch.Tensor, cap: int, parent: torch.Tensor) -> torch.Tensor:
    """Replay's one tree: `cap` cache slots as a chain, then the tree, its root hanging below
    the last valid slot (count[b] - 1; -1 when the cache is empty). [B, cap + T] int32."""
    B = parent.shape[0]
    chain = (torch.arange(cap, dtype=torch.int32, device=parent.device) - 1).expand(B, cap)
    tree = parent.to(torch.int32) + cap
    tree[:, 0] = count - 1
    return torch.cat([chain, tree], dim=1)


def tree_prep(parent: torch.Tensor, lengths: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestor-or-self mask [B, BT, BT] int8 and path log-decays gc [B, T, Hv] float32."""
    B, T, Hv = g.shape
    BT = padded(T)
    mask = torch.empty(B, BT, BT, dtype=torch.int8, device=g.device)
    gc = torch.empty(B, T, Hv, dtype=torch.float32, device=g.device)
    _prep_kernel[(B,)](parent.to(torch.int32).contiguous(), lengths, g.contiguous(), mask, gc, T, Hv,
                       BT=BT, HP=max(16, triton.next_power_of_2(Hv)), STEPS=BT.bit_length() - 1,
                       num_warps=8 if BT >= 64 else 4)
    return mask, gc


def wy_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              parent: torch.Tensor, state: torch.Tensor, lengths: torch.Tensor,
              out_start: int = 0) -> tuple[torch.Tensor, TreeSolve]:
    """Outputs of positions out_start.. (earlier ones are replayed history) and the solve."""
    B, T, Hk, DK = q.shape
    Hv, DV = v.shape[2:]
    check_dims(DK, DV)
    if T > MAX_POSITIONS:
        raise ValueError(f"T (verify positions, replayed cache included) must be at most {MAX_POSITIONS}, got {T}")
    mask, gc = tree_prep(parent, lengths, g)
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    o, u = state_pass(q, k, v, beta, state, mask, gc, lengths, out_start)
    return o, TreeSolve(k=k, state=state, lengths=lengths, u=u, gc=gc, mask=mask)


def uses_rows(T: int) -> bool:
    """Whether verify of T positions runs `_rows_kernel` (else the blocked solve + apply)."""
    return rows_block(T) <= ROWS_MAX


def state_pass(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
               mask: torch.Tensor, gc: torch.Tensor, lengths: torch.Tensor,
               out_start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify after the prep: o [B, T - out_start, Hv, Dv] and u [B, T, Hv, Dv] float32 from one
    read of the state; small trees in one kernel, large ones through the blocked solve + apply."""
    B, T, Hk, DK = q.shape
    Hv, DV = v.shape[2:]
    o = torch.empty(B, T - out_start, Hv, DV, dtype=v.dtype, device=v.device)
    u = torch.empty(B, T, Hv, DV, dtype=torch.float32, device=v.device)
    BV = block_v(DV)
    if uses_rows(T):
        BR = rows_block(T)
        _rows_kernel[(B * Hv * (DV // BV),)](q, k, v, beta, state, mask, gc, lengths, o, u, T, Hk, Hv, out_start,
                                             T - out_start, DK=DK, DV=DV, BV=BV, BR=BR, BT=mask.shape[-1],
                                             UNROLLED=BR <= ROWS_UNROLL_MAX, num_warps=4 if BR <= 16 else 8)
        return o, u
    x, z = solve(q, k, v, beta, mask, gc, lengths)
    _apply_kernel[(B * Hv * (DV // BV),)](q, state, gc, lengths, x, z, o, u, T, Hk, Hv, out_start, T - out_start,
                                          DK=DK, DV=DV, BV=BV, BC=BC, PREC=DOT_PRECISION, num_warps=4)
    return o, u


def solve(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, mask: torch.Tensor,
          gc: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The state-free half of verify: X, Z [B, T, Hv, DK + DV] float32 (see `_solve_kernel`)."""
    B, T, Hk, DK = q.shape
    Hv, DV = v.shape[2:]
    x = torch.empty(B, T, Hv, DK + DV, dtype=torch.float32, device=v.device)
    z = torch.empty_like(x)
    _solve_kernel[(B * Hv,)](q, k, v, beta, mask, gc, lengths, x, z, T, Hk, Hv, DK=DK, DV=DV, BC=BC,
                             BT=mask.shape[-1], PREC=DOT_PRECISION, num_warps=4)
    return x, z


def wy_state(ctx: TreeSolve, accepted: torch.Tensor, out: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Write the state of node accepted[b] + offset into `out` (may be ctx.state itself)."""
    B, T, Hk, DK = ctx.k.shape
    Hv, DV = ctx.u.shape[2:]
    BV = block_v(DV)
    unroll = T if T <= COMMIT_UNROLL_MAX else 0
    _state_kernel[(B * Hv * (DV // BV),)](ctx.k, ctx.state, ctx.mask, ctx.gc, ctx.u, accepted.to(torch.int32), out,
                                          T, Hk, Hv, offset, DK=DK, DV=DV, BV=BV, BT=ctx.mask.shape[-1],
                                          UNROLL=unroll, num_warps=4)
    return out
