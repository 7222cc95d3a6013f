"""Published vLLM runs as data: the schema of `validation/real/<name>.yaml` and the RunConfig of each.

A case names its source (repository, path, section, engine version), the model and GPU, the
engine settings by dotted RunConfig path (as `specsim run --set` takes them), the client
(guidellm's constant profile) and dataset that produced it, and the numbers as published
(`reported`). A case the simulator cannot run says why in `not_expressible`. Nothing here is
fitted to the reported numbers: they only check what the GPU measurements predict.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.config import ConfigError, RunConfig, read_yaml, validate
from sim.validate_client import client_overhead
from workloads.guidellm import CHAT_TEMPLATE_TOKENS

# Published metric names (GPUStack's "Serving Benchmark Result" lines) -> guidellm_metrics' names
# of the same quantity in a simulated run. GPUStack's "TPOT (excl. 1st token)" is guidellm's
# inter-token latency; its "ITL" and the peaks are kept as published but not compared (docs/guidellm.md).
COMPARED: dict[str, str] = {
    "successful_requests": "successful_requests", "duration_s": "duration_s",
    "total_input_tokens": "total_input_tokens", "total_output_tokens": "total_output_tokens",
    "request_throughput": "request_throughput", "output_throughput_tok_s": "output_throughput_tok_s",
    "total_throughput_tok_s": "total_throughput_tok_s",
    **{f"latency_{s}_s": f"latency_{s}_s" for s in ("mean", "median", "p95", "p99")},
    **{f"ttft_{s}_ms": f"ttft_{s}_ms" for s in ("mean", "median", "p95", "p99")},
    **{f"tpot_{s}_ms": f"itl_{s}_ms" for s in ("mean", "median", "p95", "p99")},
}
NOT_COMPARED = ("max_concurrency", "peak_output_throughput_tok_s", "peak_concurrent_requests",
                *(f"itl_{s}_ms" for s in ("mean", "median", "p95", "p99")))
GUIDELLM_MAX_CONCURRENCY = 512  # guidellm's settings.max_concurrency (docs/guidellm.md)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    repository: str
    path: str
    section: str  # the document's headings down to the result block, as published
    engine: str  # e.g. "vllm 0.17.1"
    commit: str | None = None  # the repository's commit the numbers were copied from
    backend_parameters: str = ""  # the server flags the document lists for the run


class Client(_Strict):
    tool: Literal["guidellm"]
    version: str
    profile: Literal["constant"]
    rate: float = Field(gt=0)  # requests per second
    requests: int = Field(gt=0)
    max_concurrency: int = Field(GUIDELLM_MAX_CONCURRENCY, gt=0)


class RandomData(_Strict):
    kind: Literal["random"]
    prompt_tokens: int = Field(gt=0)
    output_tokens: int = Field(gt=0)
    seed: int = 42


class ShareGPTData(_Strict):
    kind: Literal["sharegpt"]
    file: str = "ShareGPT_V3_unfiltered_cleaned_split.json"


class Case(_Strict):
    name: str
    source: Source
    model: str
    hardware: str
    num_speculative_tokens: int | None = Field(None, ge=0)
    set: dict[str, Any] = Field(default_factory=dict)  # RunConfig fields by dotted path
    why: dict[str, str] = Field(default_factory=dict)  # the reason for each `set` value
    client: Client
    dataset: Union[RandomData, ShareGPTData] = Field(discriminator="kind")
    reported: dict[str, float]
    not_expressible: str | None = None  # why the simulator cannot run this case (it is then skipped)

    @property
    def expressible(self) -> bool:
        return self.not_expressible is None

    @property
    def mean_prompt_tokens(self) -> float:
        """Prompt tokens per request as the server counts them (the published total where there is one)."""
        if isinstance(self.dataset, RandomData):
            return self.dataset.prompt_tokens + CHAT_TEMPLATE_TOKENS
        total = self.reported.get("total_input_tokens")
        return total / self.client.requests if total else 0.0  # 0: the smallest measured size

    def run_config(self, source: str, overhead: dict[str, Any] | None = None) -> RunConfig:
        """The RunConfig that reproduces this case's server, client and data; `overhead`
        (sim.validate_client.load_overhead) charges the API server's time outside the engine."""
        data: dict[str, Any] = {
            "model": self.model, "hardware": self.hardware, "num_requests": self.client.requests,
            "client": {"request_rate": self.client.rate, "arrival_process": "constant",
                       "max_concurrency": self.client.max_concurrency,
                       **(client_overhead(self.mean_prompt_tokens, overhead) if overhead else {})},
        }
        if self.num_speculative_tokens is not None:
            data["num_speculative_tokens"] = self.num_speculative_tokens
        if isinstance(self.dataset, RandomData):
            data.update(workload="guidellm-random", seed=self.dataset.seed,
                        workload_overrides={"prompt_tokens": self.dataset.prompt_tokens,
                                            "output_tokens": self.dataset.output_tokens})
        else:
            data["workload"] = "guidellm-sharegpt"
        for key, value in self.set.items():
            node = data
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"{source}: set.{key}: {p!r} is not a section")
            node[leaf] = value
        return validate(RunConfig, data, f"{source}: set")


def _one_line(path: Path, err: ValidationError) -> str:
    """The first problem, as `file: field: message` on one line."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        msg = "unknown field"
    return f"{path}: {loc}: {msg}{more}"


def load_case(path: Path) -> Case:
    data = read_yaml(path)
    try:
        case = Case.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(path, e)) from None
    unknown = sorted(set(case.reported) - set(COMPARED) - set(NOT_COMPARED))
    if unknown:
        raise ConfigError(f"{path}: reported.{unknown[0]}: unknown metric; valid: "
                          f"{', '.join([*COMPARED, *NOT_COMPARED])}")
    if case.expressible:
        try:
            case.run_config(str(path))
        except ConfigError as e:
            raise ConfigError(" ".join(str(e).split())) from None  # pydantic's lines joined into one
    return case


def load_cases(folder: Path) -> list[tuple[Path, Case]]:
    if not folder.is_dir():
        raise ConfigError(f"--real {folder}: no such folder (the published runs are in validation/real)")
    paths = sorted(folder.glob("*.yaml"))
    if not paths:
        raise ConfigError(f"--real {folder}: no case files (*.yaml) there")
    cases = [(p, load_case(p)) for p in paths]
    names = [c.name for _, c in cases]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigError(f"--real {folder}: two case files are named {dup!r}")
    return cases
