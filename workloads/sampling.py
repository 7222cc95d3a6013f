"""Sampling steps shared by the datasets that vLLM's benchmark samples."""
from __future__ import annotations

import random
from typing import TypeVar

T = TypeVar("T")


def oversample(kept: list[T], num_requests: int, seed: int) -> list[T]:
    """vLLM's `maybe_oversample_requests`: when a dataset yields fewer than `num_requests`,
    reseed Python's `random` with the run's seed and draw each missing one from `kept`."""
    rng = random.Random(seed)
    return kept + [rng.choice(kept) for _ in range(num_requests - len(kept))]
