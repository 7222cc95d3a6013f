"""`replay` (ReplaySSM): one older state plus the cached inputs of tokens accepted since.

    rs = ReplayState.start(state, flush_interval=4, max_path=depth + 1)
    o, ctx = verify(q, k, v, g, beta, parent, rs, lengths=None)
    rs = commit(ctx, accepted)       # same object, updated in place
    materialize(rs)                  # the literal state at the last accepted node

Verify replays the cached tokens before the tree: the cache is a chain hanging above
the root, so cache + tree is one tree and the closed-form solve (treewy) runs over
both; outputs are produced for the tree only and no state is written. Commit appends
the accepted path's inputs (k, v, g, beta) to the cache; every `flush_interval`-th
commit instead writes the accepted node's state over the old one and empties the
cache. The cache holds `policies.replay.cache_slots` tokens per sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from policies.kernels.checks import capturing, check_accepted, check_inputs, resolve_chain
from policies.kernels.treewy import BC, TreeSolve, combined_parents, lengths_or_full, wy_state, wy_verify
from policies.replay import cache_slots


@dataclass
class ReplayState:
    """Per-layer replay state. Tensors are updated in place so a captured graph stays valid.

    state [B, Hv, Dv, Dk]: the state at the last flush. k [B, C, Hk, Dk], v [B, C, Hv, Dv],
    g and beta [B, C, Hv]: cached inputs in accepted order; count [B] int32: how many are
    valid per sequence. steps counts commits since the last flush (host side: a flush
    is a different launch sequence).
    """
    state: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    count: torch.Tensor
    flush_interval: int
    max_path: int
    steps: int = 0

    @classmethod
    def start(cls, state: torch.Tensor, flush_interval: int, max_path: int, hk: int,
              dtype: torch.dtype = torch.bfloat16) -> "ReplayState":
        """An empty cache over `state`; k/v are cached in `dtype`, g and beta in float32."""
        if flush_interval < 1:
            raise ValueError(f"flush_interval must be >= 1, got {flush_interval}")
        if max_path < 1:
            raise ValueError(f"max_path (longest accepted path, tree depth + 1) must be >= 1, got {max_path}")
        B, Hv, DV, DK = state.shape
        if hk < 1 or Hv % hk:
            raise ValueError(f"v heads (Hv = {Hv}) must be a multiple of q/k heads (hk = {hk})")
        C = cache_slots(flush_interval, max_path)
        # Zeros, not empty: unused slots enter the solve (off the root's path) and must stay finite.
        z = dict(device=state.device)
        return cls(state=state, k=torch.zeros(B, C, hk, DK, dtype=dtype, **z),
                   v=torch.zeros(B, C, Hv, DV, dtype=dtype, **z), g=torch.zeros(B, C, Hv, **z),
                   beta=torch.zeros(B, C, Hv, **z), count=torch.zeros(B, dtype=torch.int32, **z),
                   flush_interval=flush_interval, max_path=max_path)

    @property
    def capacity(self) -> int:
        return self.k.shape[1]


@dataclass
class ReplayCtx:
    solve: TreeSolve
    rs: ReplayState
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    lengths: torch.Tensor


@triton.jit
def _append_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, mask_ptr, acc_ptr, count_ptr,
                   ck_ptr, cv_ptr, cg_ptr, cbeta_ptr, T, C, Hk, Hv,
                   DK: tl.constexpr, DV: tl.constexpr, BC: tl.constexpr, BT: tl.constexpr):
    pid_bh = tl.program_id(0)
    b = (pid_bh // Hv).to(tl.int64)
    h = pid_bh % Hv
    grp = Hv // Hk
    hk = h // grp
    a = tl.load(acc_ptr + b) + C
    cnt = tl.load(count_ptr + b)
    rc = tl.arange(0, BC)
    cols = tl.arange(0, BT)
    rk = tl.arange(0, DK)
    rv = tl.arange(0, DV)
    for i in range(C // BC, a // BC + 1):
        ti = i * BC + rc
        # A tree node's slot is its depth below the root: its tree ancestors-or-self, minus one.
        rows = tl.load(mask_ptr + b * BT * BT + ti[:, None] * BT + cols[None, :]) != 0
        depth = tl.sum((rows & (cols[None, :] >= C)).to(tl.int32), axis=1) - 1
        # The launcher checks paths against max_path; the bound also holds inside a graph.
        on_path = (tl.load(mask_ptr + b * BT * BT + a * BT + ti) != 0) & (ti >= C) & (cnt + depth < C)
        slot = b * C + cnt + depth
        vv = tl.load(v_ptr + ((b * T + ti[:, None]) * Hv + h) * DV + rv[None, :], mask=on_path[:, None])
        tl.store(cv_ptr + (slot[:, None] * Hv + h) * DV + rv[None, :], vv.to(cv_ptr.dtype.element_ty), mask=on_path[:, None])
        gg = tl.load(g_ptr + (b * T + ti) * Hv + h, mask=on_path)
        tl.store(cg_ptr + slot * Hv + h, gg.to(cg_ptr.dtype.element_ty), mask=on_path)
        bb = tl.load(beta_ptr + (b * T + ti) * Hv + h, mask=on_path)
        tl.store(cbeta_ptr + slot * Hv + h, bb.to(cbeta_ptr.dtype.element_ty), mask=on_path)
        if h % grp == 0:
            kk = tl.load(k_ptr + ((b * T + ti[:, None]) * Hk + hk) * DK + rk[None, :], mask=on_path[:, None])
            tl.store(ck_ptr + (slot[:, None] * Hk + hk) * DK + rk[None, :], kk.to(ck_ptr.dtype.element_ty),
                     mask=on_path[:, None])


def _chain_parents(count: torch.Tensor, C: int) -> torch.Tensor:
    """Parents of the cache slots: a chain 0 <- 1 <- ... ; [B, C] int32."""
    B = count.shape[0]
    return (torch.arange(C, dtype=torch.int32, device=count.device) - 1).expand(B, C)


def verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           parent: torch.Tensor, state: ReplayState, lengths: torch.Tensor | None = None,
           check: bool = True, chain: bool | None = None) -> tuple[torch.Tensor, ReplayCtx]:
    """chain: the trees are chains, so cache + tree is one chain walked in recurrent form (the unused
    cache slots skipped); None: found from `parent` when check reads it."""
    if not isinstance(state, ReplayState):
        raise ValueError(f"state must be a ReplayState (ReplayState.start(...)), got {type(state).__name__}")
    rs = state
    check_inputs(q, k, v, g, beta, parent, rs.state, lengths, values=check)
    if k.shape[2] != rs.k.shape[2]:
        raise ValueError(f"k has {k.shape[2]} heads but the ReplayState caches {rs.k.shape[2]}")
    B, T = parent.shape
    C = rs.capacity
    lengths = lengths_or_full(lengths, B, T, v.device)
    chain = resolve_chain(chain, parent, lengths, check)
    if C == 0:
        o, solve = wy_verify(q, k, v, g, beta, parent, rs.state, lengths, chain=chain)
        return o, ReplayCtx(solve=solve, rs=rs, v=v, g=g, beta=beta, lengths=lengths)
    par = combined_parents(rs.count, C, parent)
    qc = torch.cat([torch.zeros_like(rs.k, dtype=q.dtype), q], dim=1)
    kc = torch.cat([rs.k.to(k.dtype), k], dim=1)
    vc = torch.cat([rs.v.to(v.dtype), v], dim=1)
    gc = torch.cat([rs.g.to(g.dtype), g], dim=1)
    bc = torch.cat([rs.beta.to(beta.dtype), beta], dim=1)
    o, solve = wy_verify(qc, kc, vc, gc, bc, par, rs.state, lengths + C, out_start=C, chain=chain, cached=rs.count)
    return o, ReplayCtx(solve=solve, rs=rs, v=vc, g=gc, beta=bc, lengths=lengths)


def commit(ctx: ReplayCtx, accepted: torch.Tensor, check: bool = True) -> ReplayState:
    rs, solve = ctx.rs, ctx.solve
    check_accepted(accepted, ctx.lengths, rs.state.shape[0], values=check)
    C = rs.capacity
    acc = accepted.to(torch.int32)
    rs.steps += 1
    if rs.steps >= rs.flush_interval:
        wy_state(solve, acc, out=rs.state, offset=C)
        rs.count.zero_()
        rs.steps = 0
        return rs
    B, Tc, Hk, DK = solve.k.shape
    Hv, DV = ctx.v.shape[2:]
    BT = solve.mask.shape[-1]
    path = solve.mask[torch.arange(B, device=acc.device), acc.long() + C, C:].sum(-1, dtype=torch.int32)
    if check and not capturing():
        if bool((path > rs.max_path).any()):
            raise ValueError(f"accepted path of length {path.max().item()} exceeds max_path={rs.max_path}")
    _append_kernel[(B * Hv,)](solve.k, ctx.v, ctx.g, ctx.beta, solve.mask, acc, rs.count, rs.k, rs.v, rs.g, rs.beta,
                              Tc, C, Hk, Hv, DK=DK, DV=DV, BC=BC, BT=BT, num_warps=4)
    rs.count += path
    return rs


def materialize(rs: ReplayState) -> torch.Tensor:
    """The state after the cached tokens: S at the last accepted node (a new tensor)."""
    B, Hv, DV, DK = rs.state.shape
    C = rs.capacity
    if C == 0:
        return rs.state.clone()
    q = torch.zeros_like(rs.k)
    n = rs.count.clamp(min=1)
    _, solve = wy_verify(q, rs.k, rs.v, rs.g, rs.beta, _chain_parents(rs.count, C).contiguous(), rs.state, n,
                         chain=True)
    out = wy_state(solve, n - 1, out=torch.empty_like(rs.state))
    return torch.where((rs.count > 0)[:, None, None, None], out, rs.state)
