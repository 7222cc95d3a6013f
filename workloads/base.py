"""What a workload hands the engine: requests with lengths, optionally arrival times."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.config import ConfigError


class WorkloadError(ConfigError):
    """Bad workload input: missing file, missing columns, bad rows, empty after filtering."""


@dataclass(frozen=True)
class RequestSpec:
    request_id: int
    prompt_tokens: int
    output_tokens: int
    category: str = ""  # e.g. a Spec-Bench category; selects an acceptance distribution
    arrival_s: float | None = None  # trace timestamp (relative to the first request), if any


@dataclass
class Workload:
    name: str
    requests: list[RequestSpec]
    source: str  # where the data came from (file, package version, generator parameters)
    # Per-category acceptance: category ("" = default) -> per-depth rank probabilities,
    # rows = tree depths, columns = P(target token has rank 0, 1, 2, ...) among the
    # drafter's candidates; the remainder of each row is "not among the candidates".
    acceptance: dict[str, list[list[float]]] = field(default_factory=dict)
    arrival: str = "closed"  # the workload's default arrival process: closed | poisson | gamma | trace


@dataclass(frozen=True)
class Sample:
    """What a dataset loader returns before the registry wraps it into a Workload."""

    requests: list[RequestSpec]
    source: str
    categories: frozenset[str] = frozenset()  # every category the data set has (acceptance keys)
