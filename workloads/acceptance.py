"""Per-category acceptance distributions attached to a workload in YAML (`acceptance:`)."""
from __future__ import annotations

import math

from workloads.base import WorkloadError

TOLERANCE = 1e-9  # rows written with rounded decimals may exceed 1 by float error


def validate_acceptance(table: dict[str, list[list[float]]], categories: frozenset[str],
                        source: str) -> dict[str, list[list[float]]]:
    """Rows = tree depths, columns = P(rank 0), P(rank 1), ...; each row non-negative with
    sum <= 1 (the remainder is 'not among the candidates'). Keys: "" (default) or a
    category the data has."""
    for category, rows in table.items():
        where = f"{source}: acceptance[{category!r}]"
        if category and category not in categories:
            valid = ", ".join(repr(c) for c in ["", *sorted(categories)])
            raise WorkloadError(f"{where}: unknown category; valid: {valid} ('' is the workload's default)")
        if not rows or any(not row for row in rows):
            raise WorkloadError(f"{where}: needs at least one row (tree depth) of at least one probability")
        for d, row in enumerate(rows):
            if any(not math.isfinite(p) or p < 0 for p in row):
                raise WorkloadError(f"{where} row {d} (depth {d + 1}): probabilities must be finite and >= 0, got {row}")
            if sum(row) > 1 + TOLERANCE:
                raise WorkloadError(f"{where} row {d} (depth {d + 1}): probabilities sum to {sum(row):.6g} > 1")
    return {c: [list(map(float, r)) for r in rows] for c, rows in table.items()}
