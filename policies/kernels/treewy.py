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
  `_chain_kernel`  (chains the caller declares, up to `Tuning.chain_max` / `chain_pending_max`) the verify in
                   recurrent form: the state tile in registers, float32 FMA, no solve (chain_kernel.py).
                   `_chain_prefetch_kernel` (`Tuning.chain_prefetch`) the same walk for short chains, its
                   loads all issued first.
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

from policies.base import TREEWY_MAX_POSITIONS
from policies.kernels.chain_kernel import _chain_kernel, _chain_prefetch_kernel
from policies.kernels.commit_kernels import _commit_dot_kernel, _flush_kernel, _gather_path_kernel, _state_kernel
from policies.kernels.fused_kernel import _fused_kernel
from policies.kernels.tuning import Tuning
from policies.kernels.verify_kernels import _apply_kernel, _prep_kernel, _rows_kernel, _solve_kernel

BC = 16  # positions per block: the smallest tl.dot tile
MAX_POSITIONS = TREEWY_MAX_POSITIONS  # the ancestor mask is one [BT, BT] tile per tree
PREFETCH_MAX = 8  # `_chain_prefetch_kernel` holds every position and pending node in registers: short chains only
ROWS_UNROLL_MAX = 16  # `_rows_kernel` unrolls its rows for trees of at most this many positions

# GDN_TUNING="verify=rows,rows_max=4,commit=loop" reproduces run 2's defaults.
TUNING = Tuning.parse(os.environ.get("GDN_TUNING", ""))


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
              out_start: int = 0, pending: Pending | None = None, chain: bool = False,
              cached: torch.Tensor | None = None) -> tuple[torch.Tensor, TreeSolve]:
    """Outputs of positions out_start.. (earlier ones are replayed history) and the solve.
    With `pending`, the deferred commit is first applied to `state` (written in place).
    chain: every tree is a chain (parent[t] = t - 1), verified in recurrent form when TUNING.chain and
    T <= TUNING.chain_max (TUNING.chain_pending_max with `pending`);
    with `cached` (replay), positions [cached[b], out_start) are unused cache slots off the chain."""
    B, T, Hk, DK = q.shape
    Hv, DV = v.shape[2:]
    check_dims(DK, DV)
    if T > MAX_POSITIONS:
        raise ValueError(f"T (verify positions, replayed cache included) must be at most {MAX_POSITIONS}, got {T}")
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    if chain and TUNING.chain and T <= (TUNING.chain_max if pending is None else TUNING.chain_pending_max):
        o, u, mask, gc = chain_pass(q, k, v, g.contiguous(), beta, state, lengths, out_start, pending, cached)
        return o, TreeSolve(k=k, state=state, lengths=lengths, u=u, gc=gc, mask=mask)
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


def chain_pass(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               state: torch.Tensor, lengths: torch.Tensor, out_start: int = 0, pending: Pending | None = None,
               cached: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The recurrent verify of chains (`_chain_kernel`): o, u as `state_pass` returns them, and the
    ancestor mask [B, BT, BT] and path log-decays gc [B, T, Hv] it writes for the commit.
    cached (replay): per sequence, the valid slots of positions [0, out_start); the rest are skipped."""
    B, T, Hk, DK = q.shape
    Hv, DV = v.shape[2:]
    t = TUNING
    BV = min(t.chain_bv, DV)
    o = torch.empty(B, T - out_start, Hv, DV, dtype=v.dtype, device=v.device)
    u = torch.empty(B, T, Hv, DV, dtype=torch.float32, device=v.device)
    mask = torch.empty(B, padded(T), padded(T), dtype=torch.int8, device=v.device)
    gc = torch.empty(B, T, Hv, dtype=torch.float32, device=v.device)
    pd = pending or Pending(pu=u, pk=k, pg=gc, pn=lengths)  # placeholders: PENDING=False reads none
    P = pd.pu.shape[1]
    if t.chain_prefetch and cached is None and out_start == 0 and T <= PREFETCH_MAX and P <= PREFETCH_MAX:
        _chain_prefetch_kernel[(B * Hv * (DV // BV),)](
            q, k, v, g, beta, state, lengths, o, u, mask, gc, pd.pu, pd.pk, pd.pg, pd.pn, Hk, Hv, T=T, P=P,
            TP=triton.next_power_of_2(T), PP=triton.next_power_of_2(P), DK=DK, DV=DV, BV=BV, BT=mask.shape[-1],
            PENDING=pending is not None, num_warps=t.chain_warps)
        return o, u, mask, gc
    _chain_kernel[(B * Hv * (DV // BV),)](q, k, v, g, beta, state, lengths, lengths if cached is None else cached, o, u,
                                          mask, gc, pd.pu, pd.pk, pd.pg, pd.pn, T, Hk, Hv, out_start, T - out_start,
                                          pd.pu.shape[1], DK=DK, DV=DV, BV=BV, BT=mask.shape[-1],
                                          PENDING=pending is not None, SKIP=cached is not None,
                                          num_warps=t.chain_warps)
    return o, u, mask, gc


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
                                              SPARSE=t.sparse,
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
