"""Argument checks shared by every verify/commit entry point.

Shape checks never touch device memory. Value checks (parent order, accepted range)
read the tensors back, so they are skipped while a CUDA graph is being captured: a
captured graph replays with whatever the device tensors hold.
"""
from __future__ import annotations

import torch


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _shape(name: str, x: torch.Tensor, dims: int, expected: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != dims:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a tensor of shape {expected}, got {got}")


def head_group(k: torch.Tensor, v: torch.Tensor) -> int:
    """How many v-heads share one q/k head."""
    hk, hv = k.shape[2], v.shape[2]
    if hk < 1 or hv % hk:
        raise ValueError(f"v heads (Hv = {hv}) must be a multiple of q/k heads (Hk = {hk})")
    return hv // hk


def seq_lengths(lengths: torch.Tensor | None, batch: int, positions: int) -> torch.Tensor:
    """Per-tree sizes on the CPU (all `positions` when lengths is None)."""
    if lengths is None:
        return torch.full((batch,), positions, dtype=torch.int64)
    return lengths.detach().to("cpu", torch.int64)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 parent: torch.Tensor, state: torch.Tensor, lengths: torch.Tensor | None,
                 values: bool = True) -> None:
    """Shapes always; with `values`, also parent order and lengths (one device-to-host read)."""
    _shape("q", q, 4, "[B, T, Hk, Dk]")
    B, T, Hk, Dk = q.shape
    _shape("k", k, 4, "[B, T, Hk, Dk]")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)} = [B, T, Hk, Dk], got {tuple(k.shape)}")
    _shape("v", v, 4, "[B, T, Hv, Dv]")
    if v.shape[:2] != (B, T):
        raise ValueError(f"v must be [B={B}, T={T}, Hv, Dv], got {tuple(v.shape)}")
    head_group(k, v)
    Hv, Dv = v.shape[2:]
    for name, x in (("g", g), ("beta", beta)):
        _shape(name, x, 3, "[B, T, Hv]")
        if tuple(x.shape) != (B, T, Hv):
            raise ValueError(f"{name} must be [B={B}, T={T}, Hv={Hv}], got {tuple(x.shape)}")
    _shape("parent", parent, 2, "[B, T]")
    if tuple(parent.shape) != (B, T) or parent.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"parent must be an int32 tensor [B={B}, T={T}], got {parent.dtype} {tuple(parent.shape)}")
    _shape("state", state, 4, "[B, Hv, Dv, Dk]")
    if tuple(state.shape) != (B, Hv, Dv, Dk):
        raise ValueError(f"state must be [B={B}, Hv={Hv}, Dv={Dv}, Dk={Dk}], got {tuple(state.shape)}")
    if lengths is not None:
        _shape("lengths", lengths, 1, "[B]")
        if lengths.shape[0] != B:
            raise ValueError(f"lengths must be [B={B}], got {tuple(lengths.shape)}")
    if T < 1:
        raise ValueError("T (verify positions) must be at least 1: position 0 is the root token")
    if not values or capturing():
        return
    n = seq_lengths(lengths, B, T)
    if bool(((n < 1) | (n > T)).any()):
        raise ValueError(f"lengths must lie in [1, T={T}], got {n.tolist()}")
    par = parent.detach().to("cpu", torch.int64)
    if bool((par[:, 0] != -1).any()):
        raise ValueError(f"parent[:, 0] must be -1 (position 0 is the root token), got {par[:, 0].tolist()}")
    pos = torch.arange(T)
    inside = pos[None, :] < n[:, None]
    bad = inside & (pos[None, :] > 0) & ((par < 0) | (par >= pos[None, :]))
    if bool(bad.any()):
        b, t = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"parent must be parent-first (0 <= parent[b, t] < t for t >= 1); "
                         f"parent[{b}, {t}] = {int(par[b, t])}")


def check_accepted(accepted: torch.Tensor, lengths: torch.Tensor, batch: int, values: bool = True) -> None:
    """accepted[b] must index a node of tree b (the range check reads accepted back)."""
    _shape("accepted", accepted, 1, "[B]")
    if accepted.shape[0] != batch:
        raise ValueError(f"accepted must be [B={batch}], got {tuple(accepted.shape)}")
    if not values or capturing():
        return
    acc = accepted.detach().to("cpu", torch.int64)
    n = lengths.detach().to("cpu", torch.int64)
    if bool(((acc < 0) | (acc >= n)).any()):
        raise ValueError(f"accepted must lie in [0, lengths[b]) per tree; got {acc.tolist()} for lengths {n.tolist()}")


def is_chain(parent: torch.Tensor, lengths: torch.Tensor | None) -> bool:
    """Whether every tree is a chain (parent[b, t] = t - 1 within its length); one device-to-host read."""
    B, T = parent.shape
    n = seq_lengths(lengths, B, T)
    par = parent.detach().to("cpu", torch.int64)
    pos = torch.arange(T)
    inside = (pos[None, :] < n[:, None]) & (pos[None, :] > 0)
    return not bool((inside & (par != pos[None, :] - 1)).any())


def resolve_chain(chain: bool | None, parent: torch.Tensor, lengths: torch.Tensor | None, values: bool) -> bool:
    """The verify's `chain` flag: None finds it from the parents when values are read (else False);
    True is checked there (ValueError naming `chain` when a tree is not one)."""
    if not values or capturing():
        return bool(chain)
    found = is_chain(parent, lengths)
    if chain and not found:
        raise ValueError("chain=True needs every tree a chain (parent[b, t] = t - 1 for 1 <= t < lengths[b])")
    return found if chain is None else chain
