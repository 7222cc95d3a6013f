"""The configurations a plan compares: policy x tree x gmu x max_num_seqs x max_num_batched_tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.config import load_policy
from sim.runs.speculation import speculates


@dataclass(frozen=True)
class Candidate:
    """One configuration whose capacity the plan finds."""
    policy: str
    tree: tuple[int, ...] | None  # None: no speculation
    gmu: float
    max_num_seqs: int
    max_num_batched_tokens: int

    def assignment(self) -> dict[str, Any]:
        a: dict[str, Any] = {"policy": self.policy, "engine.gmu": self.gmu, "engine.max_num_seqs": self.max_num_seqs,
                             "engine.max_num_batched_tokens": self.max_num_batched_tokens}
        if self.tree is not None:
            a["policy_overrides.draft_tree_widths"] = list(self.tree)
        return a

    @property
    def tree_label(self) -> str:
        return "no speculation" if self.tree is None else ",".join(map(str, self.tree))

    @property
    def label(self) -> str:
        tree = f"tree {self.tree_label}, " if self.tree else ""
        return (f"{self.policy} ({tree}gmu {self.gmu:g}, max_num_seqs {self.max_num_seqs}, "
                f"max_num_batched_tokens {self.max_num_batched_tokens})")


def candidates(policies: list[str], trees: list[tuple[int, ...]], gmus: list[float],
               max_num_seqs: list[int], max_num_batched_tokens: list[int]) -> list[Candidate]:
    """The cross product, in the order given; a policy that does not speculate takes no tree,
    and without `trees` each speculative policy keeps its own (its YAML's draft_tree_widths)."""
    out: list[Candidate] = []
    for policy in dict.fromkeys(policies):
        shapes: list[tuple[int, ...] | None] = [None]
        if speculates(policy):
            shapes = list(dict.fromkeys(trees)) or [tuple(load_policy(policy).draft_tree_widths)]
        for tree in shapes:
            for gmu in dict.fromkeys(gmus):
                for seqs in dict.fromkeys(max_num_seqs):
                    for tokens in dict.fromkeys(max_num_batched_tokens):
                        out.append(Candidate(policy, tree, gmu, seqs, tokens))
    return out
