"""Published vLLM runs as data: the schema of `validation/real/<name>.yaml` and the RunConfig of each.

A case names its source (repository, path, section, engine version), the model and GPU, the
engine settings by dotted RunConfig path (as `specsim run --set` takes them), the client
that produced it (guidellm's constant profile, or vLLM's own `vllm bench serve`) and its
dataset, and the numbers as published (`reported`, names in sim.validate.metrics). A case
the simulator cannot run says why in `not_expressible`. Nothing here is fitted to the
reported numbers: they only check what the GPU measurements predict.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import Field, ValidationError

from core.config import ConfigError, RunConfig, read_yaml, validate
from core.config_base import Strict
from sim.validate.client import client_overhead
from sim.validate.metrics import CLIENT_TOOLS, known_metrics
from workloads.guidellm import CHAT_TEMPLATE_TOKENS

GUIDELLM_MAX_CONCURRENCY = 512  # guidellm's settings.max_concurrency (docs/guidellm.md)


class Source(Strict):
    repository: str
    path: str
    section: str  # the document's headings down to the result block, as published
    engine: str  # e.g. "vllm 0.17.1"
    commit: str | None = None  # the repository's commit the numbers were copied from
    date: str | None = None  # when the numbers were published (a pull request's description: its date)
    backend_parameters: str = ""  # the server flags the document lists for the run


class GuidellmClient(Strict):
    tool: Literal["guidellm"]
    version: str
    profile: Literal["constant"]
    rate: float = Field(gt=0)  # requests per second
    requests: int = Field(gt=0)
    max_concurrency: int = Field(GUIDELLM_MAX_CONCURRENCY, gt=0)
    # Whether the client timed the chunks that carry the model's reasoning. guidellm times the
    # streamed chunks its response handler counts; GPUStack's handler counts `content` and
    # `reasoning_content`, and vLLM 0.17 streams a reasoning parser's thinking as `reasoning`,
    # so those runs timed the answer only and their per-token rows are not decode times
    # (docs/guidellm.md#metrics): false leaves them out of the comparison.
    reasoning_timed: bool = True


class VllmBenchClient(Strict):
    """`vllm bench serve` (vllm/benchmarks/serve.py, docs/vllm.md#serving-benchmark)."""

    tool: Literal["vllm-bench"]
    version: str  # the vLLM release or commit whose client it was
    backend: Literal["openai"] = "openai"  # /v1/completions: the prompt as sampled, no chat template
    request_rate: float = Field(math.inf, gt=0)  # --request-rate (inf: every request ready at once)
    burstiness: float = Field(1.0, gt=0)  # --burstiness: Gamma shape of the gaps, 1 = Poisson
    max_concurrency: int | None = Field(None, gt=0)  # --max-concurrency: the client's semaphore
    requests: int = Field(gt=0)  # --num-prompts
    num_warmups: int = Field(0, ge=0)  # --num-warmups: sent and finished before the timed run starts
    ignore_eos: bool  # --ignore-eos: every request generates its dataset's output length


class RandomData(Strict):
    kind: Literal["random"]
    prompt_tokens: int = Field(gt=0)
    output_tokens: int = Field(gt=0)
    seed: int = 42


class ShareGPTData(Strict):
    """ShareGPT as the case's client samples it: guidellm takes the first turns in file order,
    `vllm bench serve` shuffles with `seed` (its --seed) and filters (workloads/sharegpt.py)."""

    kind: Literal["sharegpt"]
    file: str = "ShareGPT_V3_unfiltered_cleaned_split.json"
    output_len: int | None = Field(None, gt=0)  # vllm bench's --sharegpt-output-len: every output this long
    seed: int = 0
    # vllm bench counts with the served model's tokenizer (workloads/schema.py ShareGPTSpec.tokenizer);
    # guidellm's ShareGPT is always counted with Qwen3.5's (workloads/guidellm.py)
    tokenizer: str | None = None


Client = Union[GuidellmClient, VllmBenchClient]


class Case(Strict):
    name: str
    source: Source
    model: str
    hardware: str
    num_speculative_tokens: int | None = Field(None, ge=0)
    set: dict[str, Any] = Field(default_factory=dict)  # RunConfig fields by dotted path
    why: dict[str, str] = Field(default_factory=dict)  # the reason for each `set` value
    client: Client = Field(discriminator="tool")
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
            return self.dataset.prompt_tokens + (CHAT_TEMPLATE_TOKENS if self.client.tool == "guidellm" else 0)
        total = self.reported.get("total_input_tokens")
        return total / self.client.requests if total else 0.0  # 0: the smallest measured size

    def run_config(self, source: str, overhead: dict[str, Any] | None = None,
                   overrides: dict[str, Any] | None = None) -> RunConfig:
        """The RunConfig that reproduces this case's server, client and data; `overhead`
        (sim.validate.client.load_overhead) charges the API server's time outside the engine;
        `overrides` (`specsim validate --set`, dotted RunConfig fields) replace the case's own
        values after its `set`."""
        data: dict[str, Any] = {"model": self.model, "hardware": self.hardware, "num_requests": self.client.requests,
                                "client": self._client_fields(source)}
        if overhead:
            data["client"].update(client_overhead(self.mean_prompt_tokens, overhead))
        if self.num_speculative_tokens is not None:
            data["num_speculative_tokens"] = self.num_speculative_tokens
        data.update(self._workload_fields(source))
        for key, value in self.set.items():
            _set_dotted(data, key, value, f"{source}: set.{key}")
        for key, value in (overrides or {}).items():
            _set_dotted(data, key, value, f"--set {key}")
        label = f"{source}: set" + "".join(f" + --set {key}" for key in overrides or {})
        return validate(RunConfig, data, label)

    def _client_fields(self, source: str) -> dict[str, Any]:
        c = self.client
        if isinstance(c, GuidellmClient):
            return {"request_rate": c.rate, "arrival_process": "constant", "max_concurrency": c.max_concurrency}
        if not c.ignore_eos:
            raise ConfigError(f"{source}: client.ignore_eos: false lets the model stop where it would, which "
                              "is not modelled; allowed: true (or keep the case with not_expressible)")
        # vLLM's get_request: Gamma gaps rescaled to end at n / rate, or all at once for rate inf
        # (sim.runs.run: a client without a rate sends every request at t = 0, under the semaphore).
        fields: dict[str, Any] = {"max_concurrency": c.max_concurrency, "burstiness": c.burstiness}
        if math.isfinite(c.request_rate):
            fields["request_rate"] = c.request_rate
        return fields

    def _workload_fields(self, source: str) -> dict[str, Any]:
        d, vllm = self.dataset, self.client.tool == "vllm-bench"
        if isinstance(d, RandomData):
            return {"workload": "synthetic-fixed" if vllm else "guidellm-random", "seed": d.seed,
                    "workload_overrides": {"prompt_tokens": d.prompt_tokens, "output_tokens": d.output_tokens}}
        if vllm:
            fields = {"output_len": d.output_len, "tokenizer": d.tokenizer}
            return {"workload": "sharegpt", "seed": d.seed,
                    "workload_overrides": {k: v for k, v in fields.items() if v is not None}}
        for field, what in (("output_len", "vllm bench's --sharegpt-output-len"), ("tokenizer", "vllm bench's")):
            if getattr(d, field) is not None:
                raise ConfigError(f"{source}: dataset.{field}: {what}, allowed only with client.tool vllm-bench "
                                  "(guidellm's ShareGPT asks for each reply's length, counted with Qwen3.5's tokenizer)")
        return {"workload": "guidellm-sharegpt"}


def _set_dotted(data: dict[str, Any], key: str, value: Any, source: str) -> None:
    node = data
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{source}: {p!r} is not a section")
    node[leaf] = value


def _one_line(path: Path, err: ValidationError) -> str:
    """The first problem, as `file: field: message` on one line."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        msg = "unknown field"
    elif e["type"] in ("union_tag_invalid", "union_tag_not_found") and loc == "client":
        tool = e["input"].get("tool") if isinstance(e["input"], dict) else None
        loc, msg = "client.tool", f"{tool!r} is not a client; valid: {', '.join(CLIENT_TOOLS)}"
    return f"{path}: {loc}: {msg}{more}"


def load_case(path: Path) -> Case:
    data = read_yaml(path)
    try:
        case = Case.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(path, e)) from None
    valid = known_metrics(case.client.tool)
    unknown = sorted(set(case.reported) - set(valid))
    if unknown:
        raise ConfigError(f"{path}: reported.{unknown[0]}: unknown metric of {case.client.tool}; "
                          f"valid: {', '.join(valid)}")
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
