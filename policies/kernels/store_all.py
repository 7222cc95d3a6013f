"""`store_all` (vLLM/SGLang default): verify writes one full state per verify position.

    o, ctx = verify(q, k, v, g, beta, parent, state, lengths=None)
    state = commit(ctx, accepted)    # copies the accepted position's state into `state`

Verify runs the literal recurrence, node by node, each node from its parent's state:
the running state stays in registers along a chain and is read back from the
per-position buffer where a node's parent is not the node before it. The per-position
states [B, T, Hv, Dv, Dk] are the baseline's real traffic and memory. vLLM commits by
pointing the next step at the accepted slot; this commit copies it once instead, so
the interface returns a [B, Hv, Dv, Dk] state (its time is reported separately).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from policies.kernels.checks import check_accepted, check_inputs
from policies.kernels.tile_math import state_block
from policies.kernels.treewy import block_v, check_dims, lengths_or_full


@triton.jit
def _verify_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, parent_ptr, state_ptr, lengths_ptr, o_ptr, states_ptr,
                   T, Hk, Hv, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    b, h, hk, _, rv = state_block(Hk, Hv, DV=DV, BV=BV)  # b int64: per-position states pass 2^31 elements
    n = tl.load(lengths_ptr + b)
    rk = tl.arange(0, DK)
    tile = rv[:, None] * DK + rk[None, :]
    s = tl.load(state_ptr + (b * Hv + h) * DV * DK + tile).to(tl.float32)
    for t in range(0, n):
        p = tl.load(parent_ptr + b * T + t)
        if p != t - 1:  # the root's parent is -1 == t - 1: it starts from S_0
            s = tl.load(states_ptr + ((b * T + p) * Hv + h) * DV * DK + tile).to(tl.float32)
        kt = tl.load(k_ptr + ((b * T + t) * Hk + hk) * DK + rk).to(tl.float32)
        qt = tl.load(q_ptr + ((b * T + t) * Hk + hk) * DK + rk).to(tl.float32)
        vt = tl.load(v_ptr + ((b * T + t) * Hv + h) * DV + rv).to(tl.float32)
        at = tl.exp(tl.load(g_ptr + (b * T + t) * Hv + h).to(tl.float32))
        bt = tl.load(beta_ptr + (b * T + t) * Hv + h).to(tl.float32)
        # a S (I - b k k^T) + b v k^T == a S + (b (v - a S k)) k^T
        sk = tl.sum(s * kt[None, :], axis=1)
        s = at * s + (bt * (vt - at * sk))[:, None] * kt[None, :]
        tl.store(states_ptr + ((b * T + t) * Hv + h) * DV * DK + tile, s.to(states_ptr.dtype.element_ty))
        tl.store(o_ptr + ((b * T + t) * Hv + h) * DV + rv, tl.sum(s * qt[None, :], axis=1).to(o_ptr.dtype.element_ty))
        # A later sibling reads this state back, written by other threads of this program.
        tl.debug_barrier()
    for t in range(n, T):
        tl.store(o_ptr + ((b * T + t) * Hv + h) * DV + rv, tl.zeros([BV], dtype=o_ptr.dtype.element_ty))


@triton.jit
def _select_kernel(states_ptr, acc_ptr, out_ptr, T, Hv, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    pid = tl.program_id(0)
    NV: tl.constexpr = DV // BV
    bh = pid // NV
    b = (bh // Hv).to(tl.int64)
    h = bh % Hv
    a = tl.load(acc_ptr + b)
    tile = ((pid % NV) * BV + tl.arange(0, BV))[:, None] * DK + tl.arange(0, DK)[None, :]
    s = tl.load(states_ptr + ((b * T + a) * Hv + h) * DV * DK + tile)
    tl.store(out_ptr + (b * Hv + h) * DV * DK + tile, s.to(out_ptr.dtype.element_ty))


@dataclass
class StoredStates:
    """states [B, T, Hv, Dv, Dk] in the state's dtype; positions past a tree's length are unwritten."""
    states: torch.Tensor
    state: torch.Tensor
    lengths: torch.Tensor


def verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           parent: torch.Tensor, state: torch.Tensor, lengths: torch.Tensor | None = None,
           check: bool = True) -> tuple[torch.Tensor, StoredStates]:
    check_inputs(q, k, v, g, beta, parent, state, lengths, values=check)
    if not state.is_contiguous():
        raise ValueError("state must be contiguous: commit writes the accepted state into it")
    B, T, Hk, DK = q.shape
    Hv, DV = v.shape[2:]
    check_dims(DK, DV)
    lengths = lengths_or_full(lengths, B, T, v.device)
    o = torch.empty(B, T, Hv, DV, dtype=v.dtype, device=v.device)
    states = torch.empty(B, T, Hv, DV, DK, dtype=state.dtype, device=v.device)
    BV = block_v(DV)
    _verify_kernel[(B * Hv * (DV // BV),)](q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(),
                                       beta.contiguous(), parent.to(torch.int32).contiguous(), state, lengths, o,
                                       states, T, Hk, Hv, DK=DK, DV=DV, BV=BV, num_warps=4)
    return o, StoredStates(states=states, state=state, lengths=lengths)


def commit(ctx: StoredStates, accepted: torch.Tensor, check: bool = True) -> torch.Tensor:
    check_accepted(accepted, ctx.lengths, ctx.state.shape[0], values=check)
    B, T, Hv, DV, DK = ctx.states.shape
    BV = block_v(DV)
    _select_kernel[(B * Hv * (DV // BV),)](ctx.states, accepted.to(torch.int32), ctx.state, T, Hv,
                                       DK=DK, DV=DV, BV=BV, num_warps=4)
    return ctx.state
