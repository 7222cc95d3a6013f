"""What every configuration schema shares: the strict base model, dtype names and their sizes, byte units."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

MiB = 1 << 20
GiB = 1 << 30

DType = Literal["float32", "bfloat16", "float16"]
# vLLM 0.17.1's sampling paths for a batch whose requests are all alike (v1/sample/sampler.py,
# docs/sampling.md): argmax; temperature, softmax and an exponential draw; the same after vLLM's
# top-k/top-p mask.
SamplingPath = Literal["greedy", "random", "top_k_top_p"]
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "bf16": 2, "fp8": 1}


class Strict(BaseModel):
    """A schema that refuses unknown fields, takes each value only as its own type (no `true`
    or "5" where a number belongs, no 1 for a boolean; an int stands for a float) and cannot
    be changed once made."""
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
