"""Tree-aware short convolution (depthwise causal conv1d, kernel 4) and its per-policy state.

In a tree, node t's window is its own input and its nearest ancestors' inputs; where
the path runs out above the root, the window continues into the conv state (the last
K - 1 committed inputs, newest in the last column, vLLM's [B, C, K - 1] layout):

    y_t = silu(bias + sum_j weight[:, K-1-j] * x[anc_j(t)])      anc_0(t) = t

The rolling state must follow the accepted path, once per policy:
  store_all    verify writes every position's conv state [B, T, C, K-1]; commit copies the accepted one.
  reconstruct  commit rebuilds the accepted node's window from the path, in place.
  replay       the cached inputs since the last flush form a chain above the root; commit
               appends the accepted path's inputs, and every flush_interval-th commit
               rebuilds the conv state from the path instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from policies.kernels.checks import capturing, check_accepted
from policies.kernels.treewy import combined_parents, lengths_or_full

BTB = 16   # positions per program
BCH = 128  # channels per program


@triton.jit
def _window_step(x_ptr, cs_ptr, parent_ptr, b, cur, used, live, ch, T, C, K: tl.constexpr):
    """One step up the path: the input at `cur`, or the next conv-state column once above the root."""
    in_tree = cur >= 0
    chm = ch < C
    xv = tl.load(x_ptr + (b * T + cur)[:, None] * C + ch[None, :], mask=(live & in_tree)[:, None] & chm[None, :],
                 other=0.0).to(tl.float32)
    col = K - 2 - used
    sv = tl.load(cs_ptr + (b * C + ch[None, :]) * (K - 1) + col[:, None], mask=(live & ~in_tree)[:, None] & chm[None, :],
                 other=0.0).to(tl.float32)
    par = tl.load(parent_ptr + b * T + cur, mask=live & in_tree, other=-1)
    return tl.where(in_tree[:, None], xv, sv), tl.where(in_tree, par, -1), tl.where(in_tree, used, used + 1)


@triton.jit
def _conv_kernel(x_ptr, w_ptr, bias_ptr, parent_ptr, cs_ptr, lengths_ptr, y_ptr, states_ptr, T, C, O_START, T_OUT,
                 K: tl.constexpr, BTB: tl.constexpr, BCH: tl.constexpr, HAS_BIAS: tl.constexpr,
                 SILU: tl.constexpr, STORE_STATES: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_c = tl.program_id(1)
    nblk = tl.cdiv(T, BTB)
    b = (pid_t // nblk).to(tl.int64)
    t = (pid_t % nblk) * BTB + tl.arange(0, BTB)
    ch = pid_c * BCH + tl.arange(0, BCH)
    chm = ch < C
    n = tl.load(lengths_ptr + b)
    live = t < n
    acc = tl.zeros([BTB, BCH], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ch, mask=chm, other=0.0).to(tl.float32)[None, :]
    cur = tl.where(live, t, -1)
    used = tl.zeros([BTB], dtype=tl.int32)
    for j in tl.static_range(K):
        val, cur, used = _window_step(x_ptr, cs_ptr, parent_ptr, b, cur, used, live, ch, T, C, K)
        acc += tl.load(w_ptr + ch * K + (K - 1 - j), mask=chm, other=0.0).to(tl.float32)[None, :] * val
        if STORE_STATES:
            if j < K - 1:
                tl.store(states_ptr + ((b * T + t[:, None]) * C + ch[None, :]) * (K - 1) + (K - 2 - j),
                         val.to(states_ptr.dtype.element_ty), mask=live[:, None] & chm[None, :])
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    acc = tl.where(live[:, None], acc, 0.0)
    to = t - O_START
    tl.store(y_ptr + (b * T_OUT + to[:, None]) * C + ch[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=((t >= O_START) & (t < T))[:, None] & chm[None, :])


@triton.jit
def _path_window_kernel(x_ptr, parent_ptr, cs_ptr, acc_ptr, out_ptr, T, C, A_OFFSET,
                        K: tl.constexpr, KP: tl.constexpr, BCH: tl.constexpr):
    """Conv state of node accepted[b] + A_OFFSET: its window's newest K - 1 inputs (may write over cs)."""
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BCH + tl.arange(0, BCH)
    chm = ch < C
    one = tl.arange(0, 1)
    cur = tl.load(acc_ptr + b + one * 0) + A_OFFSET
    used = tl.zeros([1], dtype=tl.int32)
    live = one == 0
    cols = tl.arange(0, KP)
    win = tl.zeros([KP, BCH], dtype=tl.float32)
    for j in tl.static_range(K - 1):
        val, cur, used = _window_step(x_ptr, cs_ptr, parent_ptr, b, cur, used, live, ch, T, C, K)
        win = tl.where(cols[:, None] == K - 2 - j, val, win)
    # Every read of cs happened above: the store may overwrite it.
    tl.store(out_ptr + (b * C + ch[None, :]) * (K - 1) + cols[:, None], win.to(out_ptr.dtype.element_ty),
             mask=(cols[:, None] < K - 1) & chm[None, :])


@triton.jit
def _append_kernel(x_ptr, parent_ptr, acc_ptr, count_ptr, cache_ptr, plen_ptr, T, C, CAP, BCH: tl.constexpr):
    """Append the accepted path's inputs (tree part, positions >= CAP) to the cache, root first."""
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BCH + tl.arange(0, BCH)
    chm = ch < C
    a = tl.load(acc_ptr + b) + CAP
    cnt = tl.load(count_ptr + b)
    depth = cnt * 0 - 1
    cur = a
    while cur >= CAP:
        depth += 1
        cur = tl.load(parent_ptr + b * T + cur)
    d = cnt * 0
    cur = a
    while cur >= CAP:
        slot = cnt + depth - d
        val = tl.load(x_ptr + (b * T + cur) * C + ch, mask=chm)
        # The launcher reports an overflow; the bound keeps a captured graph inside the buffer.
        tl.store(cache_ptr + (b * CAP + slot) * C + ch, val.to(cache_ptr.dtype.element_ty), mask=chm & (slot + ch * 0 < CAP))
        d += 1
        cur = tl.load(parent_ptr + b * T + cur)
    if tl.program_id(1) == 0:
        tl.store(plen_ptr + b, depth + 1)


def _check(x: torch.Tensor, weight: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor,
           bias: torch.Tensor | None) -> None:
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, C], got {tuple(x.shape)}")
    B, T, C = x.shape
    if weight.dim() != 2 or weight.shape[0] != C:
        raise ValueError(f"weight must be [C={C}, K], got {tuple(weight.shape)}")
    K = weight.shape[1]
    if K < 2:
        raise ValueError(f"weight's kernel width K must be at least 2, got {K}")
    if tuple(conv_state.shape) != (B, C, K - 1) or not conv_state.is_contiguous():
        raise ValueError(f"conv_state must be a contiguous [B={B}, C={C}, K-1={K - 1}], got {tuple(conv_state.shape)}")
    if tuple(parent.shape) != (B, T):
        raise ValueError(f"parent must be [B={B}, T={T}], got {tuple(parent.shape)}")
    if bias is not None and tuple(bias.shape) != (C,):
        raise ValueError(f"bias must be [C={C}], got {tuple(bias.shape)}")


def tree_conv(x: torch.Tensor, weight: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor,
              lengths: torch.Tensor | None = None, bias: torch.Tensor | None = None, silu: bool = True,
              store_states: bool = False, out_start: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """y [B, T - out_start, C] (positions before out_start are history) and, with
    store_states, every position's conv state [B, T, C, K - 1]."""
    _check(x, weight, parent, conv_state, bias)
    B, T, C = x.shape
    K = weight.shape[1]
    lengths = lengths_or_full(lengths, B, T, x.device)
    y = torch.empty(B, T - out_start, C, dtype=x.dtype, device=x.device)
    states = torch.empty(B, T, C, K - 1, dtype=conv_state.dtype, device=x.device) if store_states else None
    grid = (B * triton.cdiv(T, BTB), triton.cdiv(C, BCH))
    _conv_kernel[grid](x.contiguous(), weight.contiguous(), bias if bias is not None else weight,
                       parent.to(torch.int32).contiguous(), conv_state, lengths, y,
                       states if states is not None else y, T, C, out_start, T - out_start, K=K, BTB=BTB, BCH=BCH,
                       HAS_BIAS=bias is not None, SILU=silu, STORE_STATES=store_states, num_warps=4)
    return y, states


def path_window(x: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor, accepted: torch.Tensor,
                out: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Write the conv state of node accepted[b] + offset into `out` (may be conv_state itself)."""
    B, T, C = x.shape
    K = conv_state.shape[-1] + 1
    _path_window_kernel[(B, triton.cdiv(C, BCH))](x.contiguous(), parent.to(torch.int32).contiguous(), conv_state,
                                                  accepted.to(torch.int32), out, T, C, offset, K=K,
                                                  KP=triton.next_power_of_2(K - 1), BCH=BCH, num_warps=4)
    return out


# ---------------------------------------------------------------- store_all
@dataclass
class ConvStates:
    states: torch.Tensor
    conv_state: torch.Tensor
    lengths: torch.Tensor


def store_all_verify(x: torch.Tensor, weight: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor,
                     lengths: torch.Tensor | None = None, bias: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, ConvStates]:
    y, states = tree_conv(x, weight, parent, conv_state, lengths, bias, store_states=True)
    return y, ConvStates(states, conv_state, lengths_or_full(lengths, *parent.shape, x.device))


def store_all_commit(ctx: ConvStates, accepted: torch.Tensor, check: bool = True) -> torch.Tensor:
    B = ctx.conv_state.shape[0]
    check_accepted(accepted, ctx.lengths, B, values=check)
    ctx.conv_state.copy_(ctx.states[torch.arange(B, device=accepted.device), accepted.long()])
    return ctx.conv_state


# ---------------------------------------------------------------- reconstruct
@dataclass
class ConvPath:
    """Only references to this step's inputs: commit walks the accepted path in them."""
    x: torch.Tensor
    parent: torch.Tensor
    conv_state: torch.Tensor
    lengths: torch.Tensor


def reconstruct_verify(x: torch.Tensor, weight: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor,
                       lengths: torch.Tensor | None = None, bias: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, ConvPath]:
    y, _ = tree_conv(x, weight, parent, conv_state, lengths, bias)
    return y, ConvPath(x, parent, conv_state, lengths_or_full(lengths, *parent.shape, x.device))


def reconstruct_commit(ctx: ConvPath, accepted: torch.Tensor, check: bool = True) -> torch.Tensor:
    check_accepted(accepted, ctx.lengths, ctx.conv_state.shape[0], values=check)
    return path_window(ctx.x, ctx.parent, ctx.conv_state, accepted, out=ctx.conv_state)


# ---------------------------------------------------------------- replay
@dataclass
class ReplayConvState:
    """conv_state [B, C, K-1] at the last flush; x [B, Cap, C] the inputs accepted since,
    count [B] int32 of them valid; steps: commits since the flush (host side)."""
    conv_state: torch.Tensor
    x: torch.Tensor
    count: torch.Tensor
    flush_interval: int
    steps: int = 0

    @classmethod
    def start(cls, conv_state: torch.Tensor, flush_interval: int, max_path: int, dtype: torch.dtype) -> "ReplayConvState":
        if flush_interval < 1 or max_path < 1:
            raise ValueError(f"flush_interval and max_path must be >= 1, got {flush_interval}, {max_path}")
        B, C, _ = conv_state.shape
        cap = (flush_interval - 1) * max_path
        return cls(conv_state, torch.zeros(B, cap, C, dtype=dtype, device=conv_state.device),
                   torch.zeros(B, dtype=torch.int32, device=conv_state.device), flush_interval)


@dataclass
class ReplayConvCtx:
    rs: ReplayConvState
    x: torch.Tensor
    parent: torch.Tensor
    lengths: torch.Tensor


def replay_verify(x: torch.Tensor, weight: torch.Tensor, parent: torch.Tensor, conv_state: ReplayConvState,
                  lengths: torch.Tensor | None = None, bias: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, ReplayConvCtx]:
    if not isinstance(conv_state, ReplayConvState):
        raise ValueError(f"conv_state must be a ReplayConvState, got {type(conv_state).__name__}")
    rs = conv_state
    B, T, _ = x.shape
    cap = rs.x.shape[1]
    lengths = lengths_or_full(lengths, B, T, x.device)
    xc = torch.cat([rs.x.to(x.dtype), x], dim=1)
    pc = combined_parents(rs.count, cap, parent)
    y, _ = tree_conv(xc, weight, pc, rs.conv_state, lengths + cap, bias, out_start=cap)
    return y, ReplayConvCtx(rs, xc, pc, lengths)


def replay_commit(ctx: ReplayConvCtx, accepted: torch.Tensor, check: bool = True) -> ReplayConvState:
    """check=False skips the value checks, which read device tensors back (a host sync)."""
    rs = ctx.rs
    B, cap = rs.x.shape[:2]
    check_accepted(accepted, ctx.lengths, B, values=check)
    rs.steps += 1
    if rs.steps >= rs.flush_interval:
        path_window(ctx.x, ctx.parent, rs.conv_state, accepted, out=rs.conv_state, offset=cap)
        rs.count.zero_()
        rs.steps = 0
        return rs
    C = rs.x.shape[2]
    plen = torch.empty(B, dtype=torch.int32, device=accepted.device)
    _append_kernel[(B, triton.cdiv(C, BCH))](ctx.x, ctx.parent, accepted.to(torch.int32), rs.count, rs.x, plen,
                                            ctx.x.shape[1], C, cap, BCH=BCH, num_warps=4)
    if check and not capturing() and bool((rs.count + plen > cap).any()):
        raise ValueError(f"replay conv cache overflow: {cap} slots per sequence; check flush_interval and max_path")
    rs.count += plen
    return rs
