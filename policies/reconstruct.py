from __future__ import annotations

from policies.base import TREEWY_MAX_POSITIONS, CommitPolicy


class Reconstruct(CommitPolicy):
    """TreeWY: one committed state; transient pseudo-values; commit rebuilds in place."""

    name = "reconstruct"
    max_kernel_positions = TREEWY_MAX_POSITIONS

    def transient_bytes_per_step_per_seq(self) -> int:
        g = self.model.gdn
        # float32 pseudo-values u: [N+1, d_v] per v-head per GDN layer.
        return self.model.gdn_layers * g.num_v_heads * self.verify_positions * g.head_v_dim * 4

    def forces_eager(self) -> bool:
        return not self.tree.is_chain and not self.cfg.graph_capturable_tree
