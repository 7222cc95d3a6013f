"""Draft trees written as per-depth widths: (1,1,1) is a chain of 3, (3,3,3) has 39 nodes.

The empty tree () drafts nothing: the no-speculation baseline's, one position per step."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property


@dataclass(frozen=True)
class DraftTree:
    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        if any(int(w) < 1 for w in self.widths):
            raise ValueError(f"draft_tree_widths must be positive ints, got {self.widths}")

    @classmethod
    def parse(cls, text: str | list[int] | tuple[int, ...]) -> "DraftTree":
        if isinstance(text, str):
            items = text.strip().removeprefix("(").removesuffix(")").split(",")
            # "3,,3" is a typo, not the tree (3, 3): every item must be a positive width
            if not all(x.strip().isdigit() and int(x) > 0 for x in items):
                raise ValueError(f"tree must be comma-separated positive widths such as 1,1,1 or 3,3,3; got {text!r}")
            widths = tuple(int(x) for x in items)
        else:
            widths = tuple(int(x) for x in text)
        return cls(widths)

    @property
    def depth(self) -> int:
        return len(self.widths)

    @cached_property
    def nodes_per_depth(self) -> tuple[int, ...]:
        out, n = [], 1
        for w in self.widths:
            n *= w
            out.append(n)
        return tuple(out)

    @cache
    def later_pass_widths(self, draft_depth: int) -> tuple[int, ...]:
        """Rows per speculating request of each MTP drafter pass after the first: pass d
        (1 .. draft_depth - 1) drafts from the nodes of depth d; past the tree's depth the
        deepest level's count repeats. Every step model prices its passes from this."""
        per = self.nodes_per_depth
        return tuple(per[min(d, len(per)) - 1] for d in range(1, draft_depth)) if per else ()

    @property
    def num_nodes(self) -> int:
        """Draft nodes N (the root token excluded)."""
        return sum(self.nodes_per_depth)

    @property
    def verify_positions(self) -> int:
        """Positions in one verify pass: the root token plus N draft nodes."""
        return 1 + self.num_nodes

    @property
    def is_chain(self) -> bool:
        return all(w == 1 for w in self.widths)

    @cached_property
    def parents(self) -> tuple[int, ...]:
        """Parent index of each verify position in BFS order; position 0 is the root (-1)."""
        parents, frontier = [-1], [0]
        for w in self.widths:
            nxt = []
            for p in frontier:
                for _ in range(w):
                    parents.append(p)
                    nxt.append(len(parents) - 1)
            frontier = nxt
        return tuple(parents)

    def __str__(self) -> str:
        return ",".join(str(w) for w in self.widths)
