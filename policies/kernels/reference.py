"""Plain-torch references for the GDN tree kernels (docs/design.md#the-recurrence).

`recurrence` is the literal gated delta rule run node by node, each node starting
from its parent's state; it is the ground truth. `tree_solve` is the closed form
(ancestor-masked decay-weighted Gram matrix, unit lower-triangular solve for the
pseudo-values) and `tree_state` rebuilds one node's state from it. Both take the
kernels' signature and compute in float64 unless told otherwise.
"""
from __future__ import annotations

import torch

from policies.kernels.checks import check_inputs, head_group, seq_lengths


def _heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """q/k heads [B, T, Hk, D] -> one per v-head [B, T, Hv, D] (v-head h reads h // group)."""
    return x.repeat_interleave(group, dim=2) if group > 1 else x


def recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               parent: torch.Tensor, state: torch.Tensor, lengths: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Literal recurrence. Returns o [B, T, Hv, Dv] and every node's state [B, T, Hv, Dv, Dk].

    Positions past a tree's length get o = 0 and state = 0.
    """
    check_inputs(q, k, v, g, beta, parent, state, lengths)
    group = head_group(k, v)
    B, T, Hv, Dv = v.shape
    q, k = _heads(q, group).to(dtype), _heads(k, group).to(dtype)
    v, a, beta = v.to(dtype), g.to(dtype).exp(), beta.to(dtype)
    s0 = state.to(dtype)
    o = torch.zeros(B, T, Hv, Dv, dtype=dtype, device=v.device)
    states = torch.zeros(B, T, Hv, Dv, state.shape[-1], dtype=dtype, device=v.device)
    n = seq_lengths(lengths, B, T).tolist()
    par = parent.cpu().tolist()
    for b in range(B):
        for t in range(n[b]):
            p = par[b][t]
            prev = s0[b] if p < 0 else states[b, p]
            kt, bt, at = k[b, t], beta[b, t], a[b, t]
            # S_t = a S (I - b k k^T) + b v k^T, per head.
            sk = torch.einsum("hvd,hd->hv", prev, kt)
            s = at[:, None, None] * (prev - bt[:, None, None] * sk[..., None] * kt[:, None, :]) \
                + bt[:, None, None] * v[b, t][..., None] * kt[:, None, :]
            states[b, t] = s
            o[b, t] = torch.einsum("hvd,hd->hv", s, q[b, t])
    return o, states


def ancestor_mask(parent: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """M[b, t, i] = True when i is t itself or an ancestor of t (both inside the tree)."""
    B, T = parent.shape
    n = seq_lengths(lengths, B, T).tolist()
    par = parent.cpu().tolist()
    m = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for t in range(n[b]):
            p = par[b][t]
            if p >= 0:
                m[b, t] = m[b, p]
            m[b, t, t] = True
    return m.to(parent.device)


def tree_solve(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               parent: torch.Tensor, state: torch.Tensor, lengths: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed form. Returns o [B, T, Hv, Dv] and pseudo-values u [B, T, Hv, Dv]."""
    check_inputs(q, k, v, g, beta, parent, state, lengths)
    group = head_group(k, v)
    q, k = _heads(q, group).to(dtype), _heads(k, group).to(dtype)
    v, g, beta, s0 = v.to(dtype), g.to(dtype), beta.to(dtype), state.to(dtype)
    anc = ancestor_mask(parent, lengths)                                   # [B, T, T]
    strict = anc & ~torch.eye(anc.shape[-1], dtype=torch.bool, device=anc.device)
    # log G_t: the decays summed along the path from the committed state to t.
    gc = torch.einsum("bti,bih->bth", anc.to(dtype), g)                    # [B, T, Hv]
    ratio = (gc[:, :, None, :] - gc[:, None, :, :]).exp()                  # G_t / G_i  [B, T, T, Hv]
    kk = torch.einsum("bthd,bihd->bthi", k, k)                             # [B, T, Hv, T]
    qk = torch.einsum("bthd,bihd->bthi", q, k)
    decay = ratio.permute(0, 1, 3, 2)                                      # [B, T, Hv, T]
    a_mat = torch.where(strict[:, :, None, :], decay * kk, 0.0)
    s0k = torch.einsum("bhvd,bthd->bthv", s0, k)
    gt = gc.exp()[..., None]
    rhs = beta[..., None] * (v - gt * s0k)
    # (I + diag(b) A) U = R, solved per (b, h) as a unit lower-triangular system.
    lhs = torch.eye(a_mat.shape[1], dtype=dtype, device=a_mat.device) + (beta[..., None] * a_mat).permute(0, 2, 1, 3)  # [B, Hv, T, T]
    u = torch.linalg.solve_triangular(lhs, rhs.permute(0, 2, 1, 3), upper=False, unitriangular=True)
    u = u.permute(0, 2, 1, 3)                                              # [B, T, Hv, Dv]
    att = torch.where(anc[:, :, None, :], decay * qk, 0.0)
    o = gt * torch.einsum("bhvd,bthd->bthv", s0, q) + torch.einsum("bthi,bihv->bthv", att, u)
    valid = anc.diagonal(dim1=1, dim2=2)[..., None, None]                  # [B, T, 1, 1]
    return torch.where(valid, o, 0.0), u


def tree_state(k: torch.Tensor, g: torch.Tensor, parent: torch.Tensor, state: torch.Tensor, u: torch.Tensor,
               accepted: torch.Tensor, lengths: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """S_a = G_a S_0 + sum over the path to a of (G_a / G_i) u_i k_i^T, for a = accepted[b]."""
    B, T, Hv, _ = u.shape
    k = _heads(k, Hv // k.shape[2]).to(dtype)
    anc = ancestor_mask(parent, lengths)
    gc = torch.einsum("bti,bih->bth", anc.to(dtype), g.to(dtype))
    rows = torch.arange(B, device=u.device)
    acc = accepted.long().to(u.device)
    path = anc[rows, acc]                                                  # [B, T]
    w = torch.where(path[..., None], (gc[rows, acc][:, None, :] - gc).exp(), 0.0)  # [B, T, Hv]
    return gc[rows, acc].exp()[..., None, None] * state.to(dtype) \
        + torch.einsum("bth,bthv,bthd->bhvd", w, u.to(dtype), k)


def tree_conv(x: torch.Tensor, weight: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor,
              lengths: torch.Tensor | None = None, bias: torch.Tensor | None = None, silu: bool = True,
              norm_channels: int = 0, norm_dim: int = 128, dtype: torch.dtype = torch.float64
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv along each node's ancestor path, walked literally.

    Returns y [B, T, C] and every node's conv state [B, T, C, K-1] (its window's newest
    K - 1 inputs, oldest first); positions past a tree's length are 0. The leading
    norm_channels of y are L2-normalised in groups of norm_dim (fla's l2norm, eps 1e-6).
    """
    B, T, C = x.shape
    K = weight.shape[1]
    x, w, cs = x.to(dtype), weight.to(dtype), conv_state.to(dtype)
    y = torch.zeros(B, T, C, dtype=dtype, device=x.device)
    states = torch.zeros(B, T, C, K - 1, dtype=dtype, device=x.device)
    n = seq_lengths(lengths, B, T).tolist()
    par = parent.cpu().tolist()
    for b in range(B):
        for t in range(n[b]):
            window, node = [], t            # newest first
            while node >= 0 and len(window) < K:
                window.append(x[b, node])
                node = par[b][node]
            window += [cs[b, :, K - 2 - i] for i in range(K - len(window))]
            acc = sum(w[:, K - 1 - j] * window[j] for j in range(K))
            if bias is not None:
                acc = acc + bias.to(dtype)
            y[b, t] = acc * torch.sigmoid(acc) if silu else acc
            states[b, t] = torch.stack(window[:K - 1][::-1], dim=-1)
    if norm_channels:
        qk = y[..., :norm_channels].unflatten(-1, (-1, norm_dim))
        y[..., :norm_channels] = (qk / (qk.square().sum(-1, keepdim=True) + 1e-6).sqrt()).flatten(-2)
    return y, states
