from __future__ import annotations

from policies.reconstruct import Reconstruct


class ReconstructDeferred(Reconstruct):
    """TreeWY with the commit folded into the next step's verify (policies/kernels/reconstruct_deferred.py).

    One committed state, written one step late: commit only records the accepted path's
    weighted pseudo-values and keys, and the next verify reads the old state plus that
    path, writes the new state and verifies from it (one state read and one write a step).
    The recorded path is the only memory beyond reconstruct's, kept per sequence for its life.
    """

    name = "reconstruct_deferred"

    def pending_bytes_per_layer_per_gpu(self) -> int:
        """The recorded path of one sequence in one GDN layer on one tensor-parallel rank."""
        g, tp = self.model.gdn, self.model.tensor_parallel
        hv, hk = g.num_v_heads // tp, g.num_k_heads // tp
        # float32 u; k is an activation, in the model's dtype (the bytes conv_dtype_bytes reads)
        per_node = hv * g.head_v_dim * 4 + hk * g.head_k_dim * self.model.conv_dtype_bytes
        # up to depth + 1 nodes (the bonus token's node included); float32 log G_a per v-head; an int32 count
        return (self.tree.depth + 1) * per_node + hv * 4 + 4

    def cache_bytes_per_seq_per_gpu(self) -> int:
        return self.model.gdn_layers * self.pending_bytes_per_layer_per_gpu()
