"""`reconstruct` (TreeWY): verify keeps only pseudo-values; commit rebuilds the accepted state in place.

    o, ctx = verify(q, k, v, g, beta, parent, state, lengths=None, chain=None)
    state = commit(ctx, accepted)    # writes into the `state` given to verify, returns it

Per step this moves: verify reads S_0 once and writes o and u ([B, T, Hv, Dv] each);
commit reads S_0 and the accepted path's u and k, and writes S_a over S_0.
"""
from __future__ import annotations

import torch

from policies.kernels.checks import check_accepted, check_inputs, resolve_chain
from policies.kernels.treewy import TreeSolve, lengths_or_full, wy_state, wy_verify


def verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           parent: torch.Tensor, state: torch.Tensor, lengths: torch.Tensor | None = None,
           check: bool = True, chain: bool | None = None) -> tuple[torch.Tensor, TreeSolve]:
    """chain: the trees are chains (recurrent-form verify); None: found from `parent` when check reads it."""
    check_inputs(q, k, v, g, beta, parent, state, lengths, values=check)
    if not state.is_contiguous():
        raise ValueError("state must be contiguous: commit rebuilds it in place")
    B, T = parent.shape
    return wy_verify(q, k, v, g, beta, parent, state, lengths_or_full(lengths, B, T, v.device),
                     chain=resolve_chain(chain, parent, lengths, check))


def commit(ctx: TreeSolve, accepted: torch.Tensor, check: bool = True) -> torch.Tensor:
    check_accepted(accepted, ctx.lengths, ctx.state.shape[0], values=check)
    return wy_state(ctx, accepted, out=ctx.state)
