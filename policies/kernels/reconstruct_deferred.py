"""`reconstruct_deferred`: TreeWY with the commit folded into the next step's verify.

    ds = DeferredState.start(state, max_path=depth + 1, hk=Hk)
    o, ctx = verify(q, k, v, g, beta, parent, ds, lengths=None)
    ds = commit(ctx, accepted)         # records the accepted path; no state pass
    flush(ds, rows=None)               # writes pending commits into ds.state (returns it)
    discard(ds, rows)                  # drops pending commits (slot freed or re-filled)

reconstruct moves three state passes a step (verify reads S; commit reads and writes it).
Here commit only copies the accepted path's weighted pseudo-values and keys (depth + 1
nodes) into a per-sequence pending buffer; the next verify reads the old state, adds the
pending rank-(depth + 1) update in registers, writes the result back (the previous
step's committed state) and verifies the new tree on it: one read and one write a step.

Between two steps `ds.state` holds the state one commit behind. A request that ends or
is preempted by recompute (vLLM V1 frees its state) needs `discard` for its slot, or the
next request placed there would inherit the update; one whose state is read elsewhere
(swap-out, prefix caching) needs `flush` first. Both are per-row and capture in a graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from policies.kernels.checks import capturing, check_accepted, check_inputs, resolve_chain
from policies.kernels.treewy import Pending, TreeSolve, apply_pending, gather_path, lengths_or_full, wy_verify


@dataclass
class DeferredState:
    """state [B, Hv, Dv, Dk]: committed up to the previous step; pending: that step's commit."""
    state: torch.Tensor
    pending: Pending

    @classmethod
    def start(cls, state: torch.Tensor, max_path: int, hk: int, k_dtype: torch.dtype = torch.bfloat16
              ) -> "DeferredState":
        """Nothing pending over `state`; keys kept in `k_dtype` (the model's k dtype: exact)."""
        if max_path < 1:
            raise ValueError(f"max_path (longest accepted path, tree depth + 1) must be >= 1, got {max_path}")
        if state.dim() != 4 or not state.is_contiguous():
            raise ValueError(f"state must be a contiguous [B, Hv, Dv, Dk] tensor, got {tuple(state.shape)}")
        B, Hv, DV, DK = state.shape
        if hk < 1 or Hv % hk:
            raise ValueError(f"v heads (Hv = {Hv}) must be a multiple of q/k heads (hk = {hk})")
        return cls(state=state, pending=Pending.empty(B, max_path, Hv, DV, hk, DK, k_dtype, state.device))

    def pending_bytes_per_seq(self) -> int:
        """Memory this policy keeps per sequence per GDN layer beyond the state."""
        p = self.pending
        return sum(x[0].numel() * x.element_size() for x in (p.pu, p.pk, p.pg, p.pn))


@dataclass
class DeferredSolve:
    solve: TreeSolve
    ds: DeferredState


def _rows_mask(rows: torch.Tensor | None, batch: int, device: torch.device) -> torch.Tensor:
    if rows is None:
        return torch.ones(batch, dtype=torch.bool, device=device)
    if rows.dtype != torch.bool or tuple(rows.shape) != (batch,):
        raise ValueError(f"rows must be a bool tensor [B={batch}], got {rows.dtype} {tuple(rows.shape)}")
    return rows.to(device)


def verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           parent: torch.Tensor, state: DeferredState, lengths: torch.Tensor | None = None,
           check: bool = True, chain: bool | None = None) -> tuple[torch.Tensor, DeferredSolve]:
    """Apply the pending commit to state.state (written), then verify the tree from it.
    chain: the trees are chains (recurrent-form verify); None: found from `parent` when check reads it."""
    ds = state
    check_inputs(q, k, v, g, beta, parent, ds.state, lengths, values=check)
    if k.shape[2] != ds.pending.pk.shape[2]:
        raise ValueError(f"k has {k.shape[2]} heads but the DeferredState was started with hk = {ds.pending.pk.shape[2]}")
    B, T = parent.shape
    o, solve = wy_verify(q, k, v, g, beta, parent, ds.state, lengths_or_full(lengths, B, T, v.device),
                         pending=ds.pending, chain=resolve_chain(chain, parent, lengths, check))
    return o, DeferredSolve(solve=solve, ds=ds)


def commit(ctx: DeferredSolve, accepted: torch.Tensor, check: bool = True) -> DeferredState:
    """Record the path to accepted[b] as the pending commit (replacing the one verify applied)."""
    check_accepted(accepted, ctx.solve.lengths, ctx.ds.state.shape[0], values=check)
    if check and not capturing():
        rows = torch.arange(accepted.shape[0], device=accepted.device)
        nodes = int(ctx.solve.mask[rows, accepted.long()].sum(-1).max())
        if nodes > ctx.ds.pending.max_path:
            raise ValueError(f"accepted path of {nodes} nodes exceeds the DeferredState's max_path = "
                             f"{ctx.ds.pending.max_path}")
    gather_path(ctx.solve, accepted, ctx.ds.pending)
    return ctx.ds


def flush(ds: DeferredState, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Write the pending commits of `rows` (bool [B]; None: all) into ds.state and clear them."""
    sel = _rows_mask(rows, ds.state.shape[0], ds.state.device)
    apply_pending(ds.state, ds.pending, sel)
    discard(ds, sel)
    return ds.state


def discard(ds: DeferredState, rows: torch.Tensor) -> None:
    """Drop the pending commits of `rows` (bool [B]) without writing them."""
    sel = _rows_mask(rows, ds.state.shape[0], ds.state.device)
    ds.pending.pn.masked_fill_(sel, 0)
    ds.pending.pg.masked_fill_(sel[:, None], 0.0)
