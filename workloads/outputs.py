"""Output lengths other than the data's: a cap, or a resample (docs/engine.md).

vLLM's serving benchmark sets `max_tokens` to the data's output length and ignores the
end token only with `--ignore-eos`, so a real model may stop earlier; the simulator has
no model and always generates the data's length. A workload's `output_cap` and
`output_resample` say what to run instead.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from workloads.base import Sample
from workloads.schema import LengthDist
from workloads.synthetic import draw_lengths

RESAMPLE_STREAM = 2  # spawn key of the resampled lengths (the run's arrivals use 1)


def shape_outputs(sample: Sample, cap: int | None, resample: LengthDist | None, seed: int) -> Sample:
    """`sample` with each output length redrawn from `resample` (seeded), then capped at `cap`."""
    if cap is None and resample is None:
        return sample
    outputs = np.array([r.output_tokens for r in sample.requests])
    notes = []
    if resample is not None:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(RESAMPLE_STREAM,))))
        outputs = draw_lengths(resample, len(outputs), rng)
        notes.append(f"outputs resampled: lognormal median {resample.median:g} sigma {resample.sigma:g} "
                     f"in [{resample.min}, {resample.max}], seed {seed}")
    if cap is not None:
        outputs = np.minimum(outputs, cap)
        notes.append(f"outputs capped at {cap} tokens")
    requests = [replace(r, output_tokens=int(o)) for r, o in zip(sample.requests, outputs)]
    return replace(sample, requests=requests, source=f"{sample.source}; {'; '.join(notes)}")
