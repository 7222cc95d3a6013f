"""Synthetic workloads: fixed lengths, or lognormal prompt and output lengths from YAML."""
from __future__ import annotations

import numpy as np

from workloads.base import RequestSpec, Sample
from workloads.schema import FixedSpec, LengthDist, SyntheticSpec


def draw_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """round(exp(N(ln median, sigma^2))) clipped to [min, max]; the median is kept because
    rounding and clipping (min <= median <= max) are monotone."""
    x = rng.lognormal(mean=np.log(dist.median), sigma=dist.sigma, size=n)
    return np.clip(np.rint(x), dist.min, dist.max).astype(np.int64)


def _describe(d: LengthDist) -> str:
    return f"lognormal median {d.median:g} sigma {d.sigma:g} in [{d.min}, {d.max}]"


def load_synthetic(spec: SyntheticSpec, num_requests: int, seed: int) -> Sample:
    rng = np.random.default_rng(seed)
    prompt = draw_lengths(spec.prompt, num_requests, rng)  # all prompts first, then all outputs
    output = draw_lengths(spec.output, num_requests, rng)
    requests = [RequestSpec(request_id=i, prompt_tokens=int(p), output_tokens=int(o))
                for i, (p, o) in enumerate(zip(prompt, output))]
    source = f"synthetic: prompt {_describe(spec.prompt)}, output {_describe(spec.output)}, seed {seed}"
    return Sample(requests, source)


def load_fixed(spec: FixedSpec, num_requests: int) -> Sample:
    requests = [RequestSpec(request_id=i, prompt_tokens=spec.prompt_tokens, output_tokens=spec.output_tokens)
                for i in range(num_requests)]
    return Sample(requests, f"synthetic: fixed prompt {spec.prompt_tokens}, output {spec.output_tokens} tokens")
