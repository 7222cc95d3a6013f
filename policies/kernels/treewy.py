"""Triton kernels of the closed-form tree solve (TreeWY), shared by reconstruct, reconstruct_deferred and replay.

Verify is two launches (one with `Tuning.prep` for T <= 16); commit one. `TUNING` picks:
  `_prep_kernel`   one program per tree: the ancestor-or-self mask (`_ancestors`: repeated
                   squaring of the one-hot parent matrix, no per-node loop) and the cumulative
                   log-decays G along every node's path.
  `_fused_kernel`  (verify "fused", the default) solve and state pass in one program per
                   (sequence, v-head, v-block): S_0[rv, :] read once, 16 positions a block, every
                   product a tl.dot (`_dot`: float32-accurate, bf16x3 or tf32x3), the in-block
                   triangular inverse as a product of NSQ factors. With a `Pending` commit
                   (reconstruct_deferred) it first brings S_old up to date and writes it back.
  `_rows_kernel`   (verify "rows", T <= rows_max) row by row on the register tile, store_all's
                   pattern; run 2 (H200, 35B, B = 64): 46 / 79 / 144 us at T = 1 / 2 / 4, then
                   ~35-130 us per further position (latency-bound cross-thread reductions).
  `_solve_kernel` + `_apply_kernel`  (verify "blocked", run 1's) the state-free solve to X, Z,
                   then u = X_v - X_k S0^T, o = Z_v + (G q - Z_k) S0^T.
  `_commit_dot_kernel` / `_state_kernel`  the commit: S_a = G_a S_0 + sum over the path
                   (G_a / G_i) u_i k_i^T, in place; 16 path nodes per tl.dot, or one rank-1
                   update per node (run 1: 77% of copy bandwidth at B = 64, T = 4).
  `_gather_path_kernel`  reconstruct_deferred's commit: the accepted path's weighted u and k
                   into the pending buffer; `_flush_kernel` writes a pending commit alone.
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
ROWS_UNROLL_MAX = 16  # `_rows_kernel` unrolls its rows for trees of at most this many positions
# tf32x3 keeps float32 accuracy (~1e-7 relative) on the tensor cores; plain tf32 does not.
VERIFY_KINDS = ("fused", "blocked", "rows")
PRECISIONS = ("tf32x3", "bf16x3", "ieee")
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
COMMIT_KINDS = ("dot", "loop")


@dataclass(frozen=True)
class Tuning:
    """Which kernel runs each pass and its launch shape; the bench's variants mode times several.

    verify: "fused" (`_fused_kernel`: solve and state pass in one, 16-position tl.dot blocks),
    "blocked" (`_solve_kernel` + `_apply_kernel`) or "rows" (`_rows_kernel`, row by row);
    rows_max: trees of at most this many positions use "rows" whatever `verify` says.
    commit: "dot" (`_commit_dot_kernel`, the path in 16-node tl.dot blocks) or "loop"
    (`_state_kernel`, one rank-1 update per path node). pending (reconstruct_deferred): the
    previous commit in tl.dot blocks or one rank-1 update per node. pack: trees of at most 8
    positions multiply the state once, k and q rows in one tile (see `_fused_kernel`). prep:
    trees of at most 16 positions skip `_prep_kernel`, the fused verify doing its work. prec:
    see `_dot`. bv: state
    rows per program (pending_bv: the verify that applies a pending commit). stages:
    Triton's software pipelining of the block loops; 1 (none) by default: most trees are one
    block, and a deeper pipeline's shared-memory buffers cut the programs in flight per SM.
    """
    verify: str = "fused"
    # Session 14's variants run (kernels_variants_run8.csv, 35B-A3B, B = 128 / 64, float32): 64 state
    # rows per verify program cut reconstruct's verify by 17-20% at every tree ((1,1,1) 203.6 ->
    # 163.0 us, (3,3,3) 1,069 -> 876, chain 64 805 -> 666), but slow reconstruct_deferred's (its
    # verify also applies and writes the pending commit: (1,1,1) 338.8 -> 433.9), which keeps 32
    # (pending_bv). A 3-stage pipeline on the commit alone: (1,1,1) 192.9 -> 160.4 us, chain 16
    # 102.2 -> 86.9 (on the verify it costs 2-40%).
    verify_bv: int = 64
    pending_bv: int = 32
    verify_warps: int = 4
    verify_stages: int = 1
    rows_max: int = 0
    commit: str = "dot"
    commit_bv: int = 32
    commit_warps: int = 4
    commit_stages: int = 3
    pending: str = "dot"
    # Register caps (Triton's maxnreg; 0: the compiler's choice). ncu (PROFILE.md): 138 / 130
    # registers allow 3 programs of 4 warps per SM; <= 128 allows 4, <= 96 five. 128 is run 5's
    # fastest (kernels_variants_run5.csv: 5,601 us summed over its eight cases; no cap 6,457, 96 6,740).
    verify_maxnreg: int = 128
    commit_maxnreg: int = 128
    # The fused verify of trees it runs in 16-position blocks (more than 8 positions, or pack off):
    # its own block, warps and register cap. ncu (session 15, results/calibration/h200/ncu/session15):
    # at 128 registers the block loop spills past L1 ((3,3,3) at B = 128 wrote 438 MB to DRAM for
    # 126 MB of u and o), and its 61 KB of shared memory allow 3 programs per SM anyway, so 4
    # programs' worth of registers bought nothing. Capped at 168 (3 programs of 4 warps): run 11's
    # variants (kernels_variants_run11.csv, 35B-A3B) verify (3,3,3) at B = 128 875.8 -> 733.7 us,
    # chains at B = 64: 64 positions 660.5 -> 545.7, 16 positions 142.4 -> 134.6; no cap (2
    # programs) 2% slower summed, 32 rows or 8 warps slower.
    loop_bv: int = 64
    loop_warps: int = 4
    loop_maxnreg: int = 168
    # Defaults: the fastest tuning of H200 round 1 (results/calibration/h200/kernels_variants.csv).
    pack: bool = True
    prep: bool = True
    prec: str = "bf16x3"

    def __post_init__(self) -> None:
        if self.verify not in VERIFY_KINDS:
            raise ValueError(f"Tuning.verify must be one of {', '.join(VERIFY_KINDS)}, got {self.verify!r}")
        if self.commit not in COMMIT_KINDS:
            raise ValueError(f"Tuning.commit must be one of {', '.join(COMMIT_KINDS)}, got {self.commit!r}")
        for name in ("verify_bv", "pending_bv", "commit_bv", "loop_bv"):
            bv = getattr(self, name)
            if bv < 16 or bv & (bv - 1):
                raise ValueError(f"Tuning.{name} must be a power of two >= 16, got {bv}")
        if self.prec not in PRECISIONS:
            raise ValueError(f"Tuning.prec must be one of {', '.join(PRECISIONS)} (plain tf32 loses float32 "
                             f"accuracy), got {self.prec!r}")
        for name in ("verify_maxnreg", "commit_maxnreg", "loop_maxnreg"):
            r = getattr(self, name)
            if r and not 24 <= r <= 255:
                raise ValueError(f"Tuning.{name} must be 0 (compiler's choice) or 24..255 registers, got {r}")
        if self.pending not in ("dot", "loop"):
            raise ValueError(f"Tuning.pending must be dot or loop, got {self.pending!r}")

    @property
    def dot_prec(self) -> str:
        """tl.dot's input_precision for the kernels without `_dot` (bf16x3 is `_dot`'s own)."""
        return "tf32x3" if self.prec == "bf16x3" else self.prec

    @classmethod
    def parse(cls, text: str) -> "Tuning":
        """"verify=fused,verify_bv=16,commit=loop" (fields not named keep their defaults)."""
        kw: dict[str, object] = {}
        names = {f: type(getattr(cls(), f)) for f in cls.__dataclass_fields__}
        for item in filter(None, (x.strip() for x in text.split(","))):
            key, _, val = item.partition("=")
            if key not in names:
                raise ValueError(f"unknown tuning field {key!r}; valid: {', '.join(names)}")
            if names[key] is bool:
                if val.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(f"tuning field {key} takes true or false, got {val!r}")
                kw[key] = val.lower() in ("true", "1")
            else:
                kw[key] = names[key](val)
        return cls(**kw)

    def launch(self, maxnreg: int) -> dict[str, int]:
        """Launch options for a register cap (none at 0: older Tritons lack the option)."""
        return {"maxnreg": maxnreg} if maxnreg else {}

    def label(self) -> str:
        return ",".join(f"{f}={getattr(self, f)}" for f in self.__dataclass_fields__)


# GDN_TUNING="verify=rows,rows_max=4,commit=loop" reproduces run 2's defaults.
TUNING = Tuning.parse(os.environ.get("GDN_TUNING", ""))


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
def _fused_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, state_ptr, mask_ptr, gc_ptr, lengths_ptr, o_ptr, u_ptr,
                  pu_ptr, pk_ptr, pg_ptr, pn_ptr, parent_ptr, g_ptr, T, Hk, Hv, O_START, T_OUT, P,
                  DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                  NSQ: tl.constexpr, PENDING: tl.constexpr, QK16: tl.constexpr, PK16: tl.constexpr,
                  PREC: tl.constexpr, PDOT: tl.constexpr, PACK: tl.constexpr, PREP: tl.constexpr,
                  S16: tl.constexpr):
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
                ki = tl.load(k_ptr + ((b * T + ti[:, None]) * Hk + hk) * DK + rk[None, :], mask=(ti < n)[:, None],
                             other=0.0).to(tl.float32)
                gi = tl.load(gc_ptr + (b * T + ti) * Hv + h, mask=ti < n, other=0.0)
                ui = tl.load(u_ptr + ((b * T + ti[:, None]) * Hv + h) * DV + rv[None, :])
                anc = tl.load(mask_ptr + b * BT * BT + tj[:, None] * BT + ti[None, :]) != 0
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


@dataclass
class Pending:
    """A commit not yet written (reconstruct_deferred): the accepted path of the last step.

    pu [B, P, Hv, Dv] float32: pseudo-values weighted by G_a / G_i; pk [B, P, Hk, Dk]: keys;
    pg [B, Hv] float32: log G_a; pn [B] int32: path nodes pending (0: nothing, pg = 0).
    """
    pu: torch.Tensor
    pk: torch.Tensor
    pg: torch.Tensor
    pn: torch.Tensor

    @classmethod
    def empty(cls, batch: int, max_path: int, hv: int, dv: int, hk: int, dk: int, k_dtype: torch.dtype,
              device: torch.device) -> "Pending":
        # Zeros: slots past pn are masked, but a NaN there would still poison 0 * NaN nowhere else.
        return cls(pu=torch.zeros(batch, max_path, hv, dv, dtype=torch.float32, device=device),
                   pk=torch.zeros(batch, max_path, hk, dk, dtype=k_dtype, device=device),
                   pg=torch.zeros(batch, hv, dtype=torch.float32, device=device),
                   pn=torch.zeros(batch, dtype=torch.int32, device=device))

    @property
    def max_path(self) -> int:
        return self.pu.shape[1]


def _bf16(*xs: torch.Tensor) -> bool:
    """Whether every tensor holds bfloat16 values (an exact `_dot` operand)."""
    return all(x.dtype == torch.bfloat16 for x in xs)


def rows_block(T: int) -> int:
    """Rows of `_rows_kernel`'s pseudo-value tile: positions padded to a power of two."""
    return max(2, triton.next_power_of_2(T))


def block_v(dv: int, bv: int = 32) -> int:
    """Columns of the state per program (DK and DV are powers of two >= 16, so it divides both)."""
    return min(bv, dv)


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
              out_start: int = 0, pending: Pending | None = None) -> tuple[torch.Tensor, TreeSolve]:
    """Outputs of positions out_start.. (earlier ones are replayed history) and the solve.
    With `pending`, the deferred commit is first applied to `state` (written in place)."""
    B, T, Hk, DK = q.shape
    Hv, DV = v.shape[2:]
    check_dims(DK, DV)
    if T > MAX_POSITIONS:
        raise ValueError(f"T (verify positions, replayed cache included) must be at most {MAX_POSITIONS}, got {T}")
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    if TUNING.prep and T <= BC and (pending is not None or verify_kernel(T) == "fused"):
        # `_fused_kernel` writes both (PREP); poisoned here, so a tile it missed shows.
        mask = torch.empty(B, BC, BC, dtype=torch.int8, device=v.device)
        gc = torch.empty(B, T, Hv, dtype=torch.float32, device=v.device)
        prep = (parent.to(torch.int32).contiguous(), g.contiguous())
    else:
        mask, gc = tree_prep(parent, lengths, g)
        prep = None
    o, u = state_pass(q, k, v, beta, state, mask, gc, lengths, out_start, pending, prep)
    return o, TreeSolve(k=k, state=state, lengths=lengths, u=u, gc=gc, mask=mask)


def verify_kernel(T: int, tuning: Tuning | None = None) -> str:
    """Which kernel verifies T positions: "rows", "fused" or "blocked"."""
    t = tuning or TUNING
    return "rows" if rows_block(T) <= t.rows_max else t.verify


def state_pass(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
               mask: torch.Tensor, gc: torch.Tensor, lengths: torch.Tensor, out_start: int = 0,
               pending: Pending | None = None, prep: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify after the prep: o [B, T - out_start, Hv, Dv] and u [B, T, Hv, Dv] float32 from one
    read of the state (the kernel per `TUNING`); `pending` needs the fused kernel. prep: (parent,
    g) when the fused kernel is to fill mask and gc itself (T <= 16)."""
    B, T, Hk, DK = q.shape
    Hv, DV = v.shape[2:]
    t = TUNING
    o = torch.empty(B, T - out_start, Hv, DV, dtype=v.dtype, device=v.device)
    u = torch.empty(B, T, Hv, DV, dtype=torch.float32, device=v.device)
    kind = "fused" if pending is not None else verify_kernel(T, t)
    if kind == "fused":
        packed = t.pack and T <= BC // 2
        if pending is not None:
            bv, warps, nreg = t.pending_bv, t.verify_warps, t.verify_maxnreg
        elif packed:
            bv, warps, nreg = t.verify_bv, t.verify_warps, t.verify_maxnreg
        else:
            bv, warps, nreg = t.loop_bv, t.loop_warps, t.loop_maxnreg
        BV = block_v(DV, bv)
        pd = pending or Pending(pu=u, pk=k, pg=gc, pn=lengths)  # placeholders: PENDING=False reads none
        par, g = prep or (lengths, gc)  # placeholders when PREP=False
        _fused_kernel[(B * Hv * (DV // BV),)](q, k, v, beta, state, mask, gc, lengths, o, u, pd.pu, pd.pk, pd.pg,
                                              pd.pn, par, g, T, Hk, Hv, out_start, T - out_start, pd.pu.shape[1],
                                              DK=DK, DV=DV, BV=BV, BT=mask.shape[-1], BC=BC,
                                              NSQ=(min(T, BC) - 1).bit_length(), PENDING=pending is not None,
                                              QK16=_bf16(q, k), PK16=_bf16(pd.pk), PREC=t.prec,
                                              PDOT=t.pending == "dot", PACK=packed,
                                              PREP=prep is not None, S16=state.dtype == torch.bfloat16,
                                              num_warps=warps, num_stages=t.verify_stages, **t.launch(nreg))
        return o, u
    BV = block_v(DV)
    if kind == "rows":
        BR, BV = rows_block(T), block_v(DV, t.verify_bv)
        _rows_kernel[(B * Hv * (DV // BV),)](q, k, v, beta, state, mask, gc, lengths, o, u, T, Hk, Hv, out_start,
                                             T - out_start, DK=DK, DV=DV, BV=BV, BR=BR, BT=mask.shape[-1],
                                             UNROLLED=BR <= ROWS_UNROLL_MAX,
                                             num_warps=t.verify_warps if BR <= 16 else max(8, t.verify_warps))
        return o, u
    x, z = solve(q, k, v, beta, mask, gc, lengths)
    _apply_kernel[(B * Hv * (DV // BV),)](q, state, gc, lengths, x, z, o, u, T, Hk, Hv, out_start, T - out_start,
                                          DK=DK, DV=DV, BV=BV, BC=BC, PREC=t.dot_prec, num_warps=4)
    return o, u


def solve(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, mask: torch.Tensor,
          gc: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The state-free half of the blocked verify: X, Z [B, T, Hv, DK + DV] float32 (see `_solve_kernel`)."""
    B, T, Hk, DK = q.shape
    Hv, DV = v.shape[2:]
    x = torch.empty(B, T, Hv, DK + DV, dtype=torch.float32, device=v.device)
    z = torch.empty_like(x)
    _solve_kernel[(B * Hv,)](q, k, v, beta, mask, gc, lengths, x, z, T, Hk, Hv, DK=DK, DV=DV, BC=BC,
                             BT=mask.shape[-1], PREC=TUNING.dot_prec, num_warps=4)
    return x, z


def wy_state(ctx: TreeSolve, accepted: torch.Tensor, out: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Write the state of node accepted[b] + offset into `out` (may be ctx.state itself)."""
    B, T, Hk, DK = ctx.k.shape
    Hv, DV = ctx.u.shape[2:]
    t = TUNING
    BV = block_v(DV, t.commit_bv)
    args = (ctx.k, ctx.state, ctx.mask, ctx.gc, ctx.u, accepted.to(torch.int32), out, T, Hk, Hv, offset)
    if t.commit == "dot":
        _commit_dot_kernel[(B * Hv * (DV // BV),)](*args, DK=DK, DV=DV, BV=BV, BT=ctx.mask.shape[-1], BC=BC,
                                                   K16=_bf16(ctx.k), PREC=t.prec, num_warps=t.commit_warps,
                                                   num_stages=t.commit_stages, **t.launch(t.commit_maxnreg))
    else:
        _state_kernel[(B * Hv * (DV // BV),)](*args, DK=DK, DV=DV, BV=BV, BT=ctx.mask.shape[-1],
                                              num_warps=t.commit_warps, **t.launch(t.commit_maxnreg))
    return out


def gather_path(ctx: TreeSolve, accepted: torch.Tensor, pending: Pending) -> Pending:
    """Deferred commit: the accepted path's weighted pseudo-values and keys into `pending`."""
    B, T, Hk, DK = ctx.k.shape
    Hv, DV = ctx.u.shape[2:]
    _gather_path_kernel[(B, pending.max_path)](ctx.k, ctx.mask, ctx.gc, ctx.u, accepted.to(torch.int32), pending.pu,
                                               pending.pk, pending.pg, pending.pn, T, Hk, Hv, pending.max_path,
                                               DK=DK, DV=DV, BT=ctx.mask.shape[-1],
                                               HVP=triton.next_power_of_2(Hv), HKP=triton.next_power_of_2(Hk),
                                               num_warps=4)
    return pending


def apply_pending(state: torch.Tensor, pending: Pending, rows: torch.Tensor) -> torch.Tensor:
    """Write the pending commit of sequences with rows[b] != 0 into `state` (in place)."""
    B, Hv, DV, DK = state.shape
    BV = block_v(DV, TUNING.commit_bv)
    _flush_kernel[(B * Hv * (DV // BV),)](state, rows.to(torch.int32), pending.pu, pending.pk, pending.pg, pending.pn,
                                          pending.pk.shape[2], Hv, pending.max_path, DK=DK, DV=DV, BV=BV, BC=BC,
                                          K16=_bf16(pending.pk), PREC=TUNING.prec, DOT=TUNING.pending == "dot",
                                          num_warps=TUNING.commit_warps,
                                          num_stages=TUNING.commit_stages, **TUNING.launch(TUNING.commit_maxnreg))
    return state
