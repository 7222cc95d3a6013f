"""Tree-aware short convolution (depthwise causal conv1d, kernel 4) and its per-policy state.

In a tree, node t's window is its own input and its nearest ancestors' inputs; where
the path runs out above the root, the window continues into the conv state (the last
K - 1 committed inputs, newest in the last column, vLLM's [B, C, K - 1] layout):

    y_t = silu(bias + sum_j weight[:, K-1-j] * x[anc_j(t)])      anc_0(t) = t

The rolling state must follow the accepted path, once per policy:
  store_all    verify writes every position's window [B, T, K-1, C]; commit copies the accepted one.
  reconstruct  commit rebuilds the accepted node's window from the path, in place.
  replay       the inputs accepted since the last flush are a chain above the root (read in
               place from the cache); commit appends the accepted path's inputs, and every
               flush_interval-th commit rebuilds the conv state from the path instead.

One launch does what vLLM's decode core does around its recurrence (causal_conv1d_update,
then q/k L2 norms fused into the next kernel): the verify reads the layer's projection rows in
place (any row stride), can L2-normalise the leading q/k heads and write q, k and v as three
contiguous tensors (`split`), so no copy, norm or split runs between the projection and the
SSM verify.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from policies.kernels.checks import capturing, check_accepted
from policies.kernels.treewy import lengths_or_full
from policies.replay import cache_slots

BTB_MAX = 16  # positions per program at most; a tree of T positions gets next_power_of_2(T)
BCH = 128  # channels per program (one q/k head when the conv normalises them)
NORM_EPS = 1e-6  # fla's l2norm: x / sqrt(sum(x^2) + eps), as the prefill's use_qk_l2norm_in_kernel


@triton.jit
def _window_step(x_ptr, sx, cache_ptr, cnt, cs_ptr, parent_ptr, b, cur, used, live, ch, T, C, CAP,
                 K: tl.constexpr, HAS_CACHE: tl.constexpr):
    """One step up the path: the tree's input at `cur`; above the root the cached inputs, newest
    first (replay: `cnt` of them), then the conv state's columns, newest first."""
    in_tree = cur >= 0
    chm = ch < C
    xv = tl.load(x_ptr + (b * T + cur)[:, None] * sx + ch[None, :], mask=(live & in_tree)[:, None] & chm[None, :],
                 other=0.0).to(tl.float32)
    above = used - cnt  # >= 0: conv-state column K - 2 - above
    sv = tl.load(cs_ptr + (b * C + ch[None, :]) * (K - 1) + (K - 2 - above)[:, None],
                 mask=(live & ~in_tree & (above >= 0))[:, None] & chm[None, :], other=0.0).to(tl.float32)
    val = tl.where(in_tree[:, None], xv, sv)
    if HAS_CACHE:
        in_cache = ~in_tree & (above < 0)
        cv = tl.load(cache_ptr + (b * CAP + cnt - 1 - used)[:, None] * C + ch[None, :],
                     mask=(live & in_cache)[:, None] & chm[None, :], other=0.0).to(tl.float32)
        val = tl.where(in_cache[:, None], cv, val)
    par = tl.load(parent_ptr + b * T + cur, mask=live & in_tree, other=-1)
    return val, tl.where(in_tree, par, -1), tl.where(in_tree, used, used + 1)


@triton.jit
def _conv_kernel(x_ptr, sx, w_ptr, bias_ptr, parent_ptr, cs_ptr, cache_ptr, count_ptr, lengths_ptr, y_ptr,
                 states_ptr, T, C, CAP, ROWS, SPLIT_A, SPLIT_B, NORM, eps,
                 K: tl.constexpr, BTB: tl.constexpr, BCH: tl.constexpr, HAS_BIAS: tl.constexpr,
                 SILU: tl.constexpr, STORE_STATES: tl.constexpr, HAS_CACHE: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_c = tl.program_id(1)
    nblk = tl.cdiv(T, BTB)
    b = (pid_t // nblk).to(tl.int64)
    t = (pid_t % nblk) * BTB + tl.arange(0, BTB)
    ch = pid_c * BCH + tl.arange(0, BCH)
    chm = ch < C
    n = tl.load(lengths_ptr + b)
    live = t < n
    cnt = 0
    if HAS_CACHE:
        cnt = tl.load(count_ptr + b)
    acc = tl.zeros([BTB, BCH], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ch, mask=chm, other=0.0).to(tl.float32)[None, :]
    cur = tl.where(live, t, -1)
    used = tl.zeros([BTB], dtype=tl.int32)
    for j in tl.static_range(K):
        val, cur, used = _window_step(x_ptr, sx, cache_ptr, cnt, cs_ptr, parent_ptr, b, cur, used, live, ch, T, C,
                                      CAP, K, HAS_CACHE)
        acc += tl.load(w_ptr + ch * K + (K - 1 - j), mask=chm, other=0.0).to(tl.float32)[None, :] * val
        if STORE_STATES:
            if j < K - 1:  # channels fastest: the window stores coalesce
                tl.store(states_ptr + ((b * T + t[:, None]) * (K - 1) + (K - 2 - j)) * C + ch[None, :],
                         val.to(states_ptr.dtype.element_ty), mask=live[:, None] & chm[None, :])
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    if pid_c * BCH < NORM:  # this program's channels are one q/k head
        acc = acc / tl.sqrt(tl.sum(acc * acc, axis=1) + eps)[:, None]
    acc = tl.where(live[:, None], acc, 0.0)
    # Three contiguous outputs [ROWS, width] one after another: channels [0, A), [A, B), [B, C).
    lo = tl.where(ch < SPLIT_A, 0, tl.where(ch < SPLIT_B, SPLIT_A, SPLIT_B))
    hi = tl.where(ch < SPLIT_A, SPLIT_A, tl.where(ch < SPLIT_B, SPLIT_B, C))
    row = b * T + t
    off = lo.to(tl.int64)[None, :] * ROWS + row[:, None] * (hi - lo)[None, :] + (ch - lo)[None, :]
    tl.store(y_ptr + off, acc.to(y_ptr.dtype.element_ty), mask=(t < T)[:, None] & chm[None, :])


@triton.jit
def _path_window_kernel(x_ptr, sx, parent_ptr, cs_ptr, cache_ptr, count_ptr, acc_ptr, out_ptr, T, C, CAP,
                        K: tl.constexpr, KP: tl.constexpr, BCH: tl.constexpr, HAS_CACHE: tl.constexpr):
    """Conv state of node accepted[b]: its window's newest K - 1 inputs (may write over cs)."""
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BCH + tl.arange(0, BCH)
    chm = ch < C
    one = tl.arange(0, 1)
    cur = tl.load(acc_ptr + b + one * 0)
    cnt = 0
    if HAS_CACHE:
        cnt = tl.load(count_ptr + b)
    used = tl.zeros([1], dtype=tl.int32)
    live = one == 0
    cols = tl.arange(0, KP)
    win = tl.zeros([KP, BCH], dtype=tl.float32)
    for j in tl.static_range(K - 1):
        val, cur, used = _window_step(x_ptr, sx, cache_ptr, cnt, cs_ptr, parent_ptr, b, cur, used, live, ch, T, C,
                                      CAP, K, HAS_CACHE)
        win = tl.where(cols[:, None] == K - 2 - j, val, win)
    # Every read of cs happened above: the store may overwrite it.
    tl.store(out_ptr + (b * C + ch[None, :]) * (K - 1) + cols[:, None], win.to(out_ptr.dtype.element_ty),
             mask=(cols[:, None] < K - 1) & chm[None, :])


@triton.jit
def _gather_window_kernel(states_ptr, acc_ptr, out_ptr, T, C, K: tl.constexpr, KP: tl.constexpr,
                          BCH: tl.constexpr):
    """store_all's commit: the accepted position's window [K - 1, C] into the conv state [C, K - 1]."""
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BCH + tl.arange(0, BCH)
    cols = tl.arange(0, KP)
    m = (cols[:, None] < K - 1) & (ch[None, :] < C)
    a = tl.load(acc_ptr + b)
    win = tl.load(states_ptr + ((b * T + a) * (K - 1) + cols[:, None]) * C + ch[None, :], mask=m)
    tl.store(out_ptr + (b * C + ch[None, :]) * (K - 1) + cols[:, None], win.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _append_kernel(x_ptr, sx, parent_ptr, acc_ptr, count_ptr, cache_ptr, plen_ptr, T, C, CAP, BCH: tl.constexpr):
    """Append the accepted path's inputs to the cache, root first."""
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BCH + tl.arange(0, BCH)
    chm = ch < C
    a = tl.load(acc_ptr + b)
    cnt = tl.load(count_ptr + b)
    depth = cnt * 0 - 1
    cur = a
    while cur >= 0:
        depth += 1
        cur = tl.load(parent_ptr + b * T + cur)
    d = cnt * 0
    cur = a
    while cur >= 0:
        slot = cnt + depth - d
        val = tl.load(x_ptr + (b * T + cur) * sx + ch, mask=chm)
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


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x [B, T, C] and its row stride: rows may lie apart (a projection's leading channels), channels may not."""
    B, T, _ = x.shape
    if x.stride(2) != 1 or (B > 1 and x.stride(0) != T * x.stride(1)):
        x = x.contiguous()
    return x, x.stride(1)


def tree_conv(x: torch.Tensor, weight: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor,
              lengths: torch.Tensor | None = None, bias: torch.Tensor | None = None, silu: bool = True,
              norm_channels: int = 0, norm_dim: int = BCH, store_states: bool = False,
              cache: tuple[torch.Tensor, torch.Tensor] | None = None, split: tuple[int, int] | None = None
              ) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor | None]:
    """y [B, T, C] and, with store_states, every position's window [B, T, K - 1, C].

    norm_channels: the leading channels L2-normalised in groups of norm_dim after the SiLU (the
    q and k heads). cache: (inputs [B, Cap, C], count [B] int32), a chain of `count` inputs above
    each root, oldest first, before the conv state. split: (a, b) returns y as three contiguous
    tensors [B, T, a], [B, T, b - a], [B, T, C - b] instead of one."""
    _check(x, weight, parent, conv_state, bias)
    B, T, C = x.shape
    K = weight.shape[1]
    if norm_channels:
        if norm_dim < 16 or norm_dim & (norm_dim - 1) or norm_channels % norm_dim or norm_channels > C:
            raise ValueError(f"norm_dim must be a power of two >= 16 dividing norm_channels <= C={C}, "
                             f"got norm_dim={norm_dim}, norm_channels={norm_channels}")
    a, s = split if split is not None else (C, C)
    if not 0 < a <= s <= C:
        raise ValueError(f"split must be (a, b) with 0 < a <= b <= C={C}, got {split}")
    x, sx = _rows(x)
    lengths = lengths_or_full(lengths, B, T, x.device)
    y = torch.empty(B * T * C, dtype=x.dtype, device=x.device)
    states = torch.empty(B, T, K - 1, C, dtype=conv_state.dtype, device=x.device) if store_states else None
    cx, count = cache if cache is not None else (x, lengths)
    bch = norm_dim if norm_channels else BCH
    btb = min(BTB_MAX, triton.next_power_of_2(T))
    grid = (B * triton.cdiv(T, btb), triton.cdiv(C, bch))
    _conv_kernel[grid](x, sx, weight.contiguous(), bias if bias is not None else weight,
                       parent.to(torch.int32).contiguous(), conv_state, cx, count, lengths, y,
                       states if states is not None else y, T, C, cx.shape[1], B * T, a, s, norm_channels, NORM_EPS,
                       K=K, BTB=btb, BCH=bch, HAS_BIAS=bias is not None, SILU=silu, STORE_STATES=store_states,
                       HAS_CACHE=cache is not None, num_warps=4)
    if split is None:
        return y.view(B, T, C), states
    n = B * T
    return tuple(part.view(B, T, -1) for part in y.split([n * a, n * (s - a), n * (C - s)])), states


def path_window(x: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor, accepted: torch.Tensor,
                out: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Write the conv state of node accepted[b] into `out` (may be conv_state itself); cache as tree_conv's."""
    B, T, C = x.shape
    K = conv_state.shape[-1] + 1
    x, sx = _rows(x)
    cx, count = cache if cache is not None else (x, accepted)
    _path_window_kernel[(B, triton.cdiv(C, BCH))](x, sx, parent.to(torch.int32).contiguous(), conv_state, cx, count,
                                                  accepted.to(torch.int32), out, T, C, cx.shape[1], K=K,
                                                  KP=triton.next_power_of_2(K - 1), BCH=BCH,
                                                  HAS_CACHE=cache is not None, num_warps=4)
    return out


# ---------------------------------------------------------------- store_all
@dataclass
class ConvStates:
    states: torch.Tensor
    conv_state: torch.Tensor
    lengths: torch.Tensor


def store_all_verify(x: torch.Tensor, weight: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor,
                     lengths: torch.Tensor | None = None, bias: torch.Tensor | None = None, **out: object
                     ) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], ConvStates]:
    """out: tree_conv's output options (norm_channels, norm_dim, split)."""
    y, states = tree_conv(x, weight, parent, conv_state, lengths, bias, store_states=True, **out)
    return y, ConvStates(states, conv_state, lengths_or_full(lengths, *parent.shape, x.device))


def store_all_commit(ctx: ConvStates, accepted: torch.Tensor, check: bool = True) -> torch.Tensor:
    B, T, K1, C = ctx.states.shape
    check_accepted(accepted, ctx.lengths, B, values=check)
    _gather_window_kernel[(B, triton.cdiv(C, BCH))](ctx.states, accepted.to(torch.int32), ctx.conv_state, T, C,
                                                    K=K1 + 1, KP=triton.next_power_of_2(K1), BCH=BCH, num_warps=4)
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
                       lengths: torch.Tensor | None = None, bias: torch.Tensor | None = None, **out: object
                       ) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], ConvPath]:
    """out: tree_conv's output options (norm_channels, norm_dim, split)."""
    y, _ = tree_conv(x, weight, parent, conv_state, lengths, bias, **out)
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
        cap = cache_slots(flush_interval, max_path)
        # One slot at least (flush_interval 1 caches nothing): the kernels take the cache's pointer.
        return cls(conv_state, torch.zeros(B, max(cap, 1), C, dtype=dtype, device=conv_state.device),
                   torch.zeros(B, dtype=torch.int32, device=conv_state.device), flush_interval)


@dataclass
class ReplayConvCtx:
    rs: ReplayConvState
    x: torch.Tensor
    parent: torch.Tensor
    lengths: torch.Tensor


def replay_verify(x: torch.Tensor, weight: torch.Tensor, parent: torch.Tensor, conv_state: ReplayConvState,
                  lengths: torch.Tensor | None = None, bias: torch.Tensor | None = None, **out: object
                  ) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], ReplayConvCtx]:
    """out: tree_conv's output options (norm_channels, norm_dim, split)."""
    if not isinstance(conv_state, ReplayConvState):
        raise ValueError(f"conv_state must be a ReplayConvState, got {type(conv_state).__name__}")
    rs = conv_state
    B, T, _ = x.shape
    lengths = lengths_or_full(lengths, B, T, x.device)
    y, _ = tree_conv(x, weight, parent, rs.conv_state, lengths, bias, cache=(rs.x, rs.count), **out)
    return y, ReplayConvCtx(rs, x, parent, lengths)


def replay_commit(ctx: ReplayConvCtx, accepted: torch.Tensor, check: bool = True) -> ReplayConvState:
    """check=False skips the value checks, which read device tensors back (a host sync)."""
    rs = ctx.rs
    B, T, C = ctx.x.shape
    check_accepted(accepted, ctx.lengths, B, values=check)
    rs.steps += 1
    if rs.steps >= rs.flush_interval:
        path_window(ctx.x, ctx.parent, rs.conv_state, accepted, out=rs.conv_state, cache=(rs.x, rs.count))
        rs.count.zero_()
        rs.steps = 0
        return rs
    cap = rs.x.shape[1]
    x, sx = _rows(ctx.x)
    plen = torch.empty(B, dtype=torch.int32, device=accepted.device)
    _append_kernel[(B, triton.cdiv(C, BCH))](x, sx, ctx.parent.to(torch.int32).contiguous(), accepted.to(torch.int32),
                                            rs.count, rs.x, plen, T, C, cap, BCH=BCH, num_warps=4)
    if check and not capturing() and bool((rs.count + plen > cap).any()):
        raise ValueError(f"replay conv cache overflow: {cap} slots per sequence; check flush_interval and max_path")
    rs.count += plen
    return rs
