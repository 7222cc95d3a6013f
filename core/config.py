"""Validated configuration objects, loaded by name from `configs/`.

Every default lives here, once. A bad field raises `ConfigError` naming the file, the
field path and what is allowed (pydantic's message lists the allowed literals).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.errors import ConfigError
from core.files import read_text

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
REPO_ROOT = CONFIG_DIR.parent

MiB = 1 << 20
GiB = 1 << 30

# "none": no speculative decoding (the baseline), vLLM without --speculative-config.
PolicyName = Literal["store_all", "reconstruct", "replay", "reconstruct_deferred", "none"]
DType = Literal["float32", "bfloat16", "float16"]
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "bf16": 2, "fp8": 1}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------------- model
class GDNConfig(_Strict):
    num_k_heads: int = Field(gt=0)  # q/k heads
    num_v_heads: int = Field(gt=0)
    head_k_dim: int = Field(gt=0)
    head_v_dim: int = Field(gt=0)
    conv_kernel: int = Field(4, gt=0)

    @model_validator(mode="after")
    def _grouped(self) -> "GDNConfig":
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"num_v_heads ({self.num_v_heads}) must be a multiple of num_k_heads ({self.num_k_heads})")
        return self


class AttentionConfig(_Strict):
    num_q_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    gated: bool = True
    # HF partial_rotary_factor: RoPE turns this fraction of each head's channels (Qwen3.5 / Qwen3-Next: 64 of 256)
    partial_rotary_factor: float = Field(0.25, gt=0, le=1)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)


class MoEConfig(_Strict):
    num_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    shared_experts: int = Field(1, ge=0)
    expert_width: int = Field(gt=0)  # intermediate size of one expert
    # HF shared_expert_intermediate_size / shared_experts when it differs from expert_width
    shared_expert_width: int | None = Field(None, gt=0)

    @property
    def shared_width(self) -> int:
        """Intermediate width of all shared experts together."""
        return self.shared_experts * (self.shared_expert_width or self.expert_width)


class MLPConfig(_Strict):
    """A dense SwiGLU MLP after every layer (gate and up projections, then down), where MoE models have experts."""
    intermediate_size: int = Field(gt=0)


class ModelConfig(_Strict):
    name: str
    hidden_size: int = Field(gt=0)
    # One period of the layer pattern, repeated num_layers / len(pattern) times.
    layer_pattern: list[Literal["gdn", "attn"]]
    num_layers: int = Field(gt=0)
    gdn: GDNConfig
    attention: AttentionConfig
    # The feed-forward block after every layer: exactly one of the two.
    moe: MoEConfig | None = None
    mlp: MLPConfig | None = None
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False  # HF tie_word_embeddings: the LM head is the embedding matrix
    total_params: float = Field(gt=0)  # parameters incl. embeddings, MTP layer
    active_params: float = Field(gt=0)
    tensor_parallel: int = Field(1, gt=0)
    mtp_depth: int = Field(3, ge=0)  # K: drafter passes per step (vLLM's num_speculative_tokens); 0: no MTP
    mtp_num_hidden_layers: int = Field(1, ge=0)  # MTP drafter layers: full-attention layers in the KV pool
    max_model_len: int = Field(262144, gt=0)
    weight_dtype_bytes: int = Field(2, gt=0)
    dtype: DType = "bfloat16"  # HF torch_dtype: activations and the conv state
    # HF config's mamba_ssm_dtype, which vLLM's mamba_ssm_cache_dtype=auto takes (Qwen3.5:
    # float32); a model without the field (Qwen3-Next) keeps its SSM state in `dtype`.
    mamba_ssm_dtype: DType = "bfloat16"
    kv_dtype_bytes: int = Field(2, gt=0)  # set from engine.kv_cache_dtype by sim.budget.served_model

    @property
    def state_dtype_bytes(self) -> int:
        """Bytes per SSM-state element (kernel and latency tables are keyed by it too)."""
        return DTYPE_BYTES[self.mamba_ssm_dtype]

    @property
    def conv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @model_validator(mode="after")
    def _pattern(self) -> "ModelConfig":
        if self.num_layers % len(self.layer_pattern):
            raise ValueError(f"num_layers ({self.num_layers}) is not a multiple of the layer_pattern length ({len(self.layer_pattern)})")
        if (self.moe is None) == (self.mlp is None):
            raise ValueError("give exactly one feed-forward block: moe (experts) or mlp (dense, intermediate_size)")
        return self

    @property
    def dense(self) -> bool:
        """A dense MLP, not experts, after every layer."""
        return self.mlp is not None

    # Derived quantities, model-wide (all TP ranks together) unless named _per_gpu.
    @property
    def gdn_layers(self) -> int:
        return self.num_layers // len(self.layer_pattern) * self.layer_pattern.count("gdn")

    @property
    def attn_layers(self) -> int:
        return self.num_layers - self.gdn_layers

    @property
    def pool_attn_layers(self) -> int:
        """Full-attention layers holding KV in the pool: the target's, plus the MTP drafter's when it drafts."""
        return self.attn_layers + (self.mtp_num_hidden_layers if self.mtp_depth > 0 else 0)

    @property
    def gdn_state_bytes_per_layer(self) -> int:
        g = self.gdn
        return g.num_v_heads * g.head_v_dim * g.head_k_dim * self.state_dtype_bytes

    def conv_state_bytes_per_layer(self) -> int:
        """Conv rolling window: kernel - 1 past inputs plus K lookahead slots (vLLM)."""
        g = self.gdn
        channels = 2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim
        return channels * (g.conv_kernel - 1 + self.mtp_depth) * self.conv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        a = self.attention
        return self.attn_layers * 2 * a.num_kv_heads * a.head_dim * self.kv_dtype_bytes

    # Per-GPU shards under tensor parallelism (vLLM replicates KV heads when TP > heads).
    @property
    def kv_heads_per_gpu(self) -> int:
        return max(1, self.attention.num_kv_heads // self.tensor_parallel)

    def gdn_page_bytes_per_gpu(self, spec_tokens: int) -> int:
        """One GDN layer's page for one sequence on one GPU: SSM state + conv state."""
        g = self.gdn
        tp = self.tensor_parallel
        ssm = g.num_v_heads // tp * g.head_v_dim * g.head_k_dim * self.state_dtype_bytes
        channels = (2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim) // tp
        conv = channels * (g.conv_kernel - 1 + spec_tokens) * self.conv_dtype_bytes
        return ssm + conv

    @property
    def attn_page_bytes_per_token_per_gpu(self) -> int:
        a = self.attention
        return 2 * self.kv_heads_per_gpu * a.head_dim * self.kv_dtype_bytes

    @property
    def weight_bytes_per_gpu(self) -> int:
        return math.ceil(self.total_params * self.weight_dtype_bytes / self.tensor_parallel)


# -------------------------------------------------------------------------- hardware
class HardwareConfig(_Strict):
    name: str
    gpu_name: str
    memory_mib: int = Field(gt=0)  # total device memory as the device reports it
    hbm_bandwidth_gbs: float = Field(gt=0)  # achievable copy bandwidth (read + write), GB/s
    bf16_tflops: float = Field(gt=0)  # achievable dense bf16 matrix rate
    calibration_dir: str | None = None  # relative to the repo root
    derived: bool = False  # true: numbers scaled from another GPU, not measured on this one
    derived_from: str | None = None
    scaling: dict[str, float] = Field(default_factory=dict)  # factor per latency term kind
    scaling_notes: str | None = None
    max_num_batched_tokens: int = Field(gt=0)  # vLLM default for this GPU size
    max_num_seqs: int = Field(gt=0)
    non_torch_memory_mib: float = Field(ge=0)
    cudagraph_memory_mib: float = Field(ge=0)
    nvlink_bandwidth_gbs: float = Field(gt=0)  # per-GPU unidirectional NVLink bandwidth
    nvlink_latency_us: float = Field(ge=0)  # per all-reduce hop latency
    sources: dict[str, str] = Field(default_factory=dict)  # where each stated figure comes from

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB

    @model_validator(mode="after")
    def _derived_has_source(self) -> "HardwareConfig":
        if self.derived and not (self.derived_from and self.scaling_notes):
            raise ValueError("a derived hardware profile must name derived_from and scaling_notes")
        return self


# ---------------------------------------------------------------------------- policy
class PolicyConfig(_Strict):
    name: str
    mamba_state_commit: PolicyName
    draft_tree_widths: list[int] = Field(default_factory=lambda: [1, 1, 1])
    flush_interval: int = Field(4, gt=0)  # replay: steps between flushes
    # Our reconstruct kernels replay inside a CUDA graph with a fixed maximum tree;
    # false reproduces the reference implementation, where any tree ran piecewise.
    graph_capturable_tree: bool = False

    @field_validator("draft_tree_widths")
    @classmethod
    def _widths(cls, v: list[int]) -> list[int]:
        if not v or any(w < 1 for w in v):
            raise ValueError("draft_tree_widths must be a non-empty list of positive ints, e.g. [1, 1, 1]")
        return v


# ---------------------------------------------------------------------------- engine
class EngineConfig(_Strict):
    gmu: float = Field(0.9)
    max_num_batched_tokens: int | None = Field(None, gt=0)  # None: the hardware's default
    max_num_seqs: int | None = Field(None, gt=0)
    admission: Literal["full_prompt", "first_chunk"] = "full_prompt"  # vLLM 0.33 / older
    allocator: Literal["paged", "ideal"] = "paged"
    step_overhead_us: float | None = Field(None, ge=0)  # None: calibrated or the analytic default
    # Step time: "pipeline" = GPU-time tables + host launch costs as a two-resource pipeline
    # (sim.host_model); "eager_sum" = the old sum of eager table rows (kept to compare).
    latency_pricing: Literal["pipeline", "eager_sum"] = "pipeline"
    activation_peak_mib: float | None = Field(None, ge=0)  # None: calibrated or analytic
    # vLLM engine semantics (the memory and engine-semantics issues set the defaults to current vLLM's).
    kv_cache_dtype: Literal["bf16", "fp8"] = "bf16"
    enable_prefix_caching: bool = True  # vLLM v1's default
    mamba_cache_mode: Literal["none", "align"] | None = None  # None: "align" with prefix caching, else "none"
    language_model_only: bool = False  # vLLM --language-model-only: no multimodal encoder dummy batch
    max_model_len: int | None = Field(None, gt=0)  # None: the model's max_model_len
    # vLLM refuses a max_model_len above the model's own unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (docs/vllm.md#startup-checks)
    allow_long_max_model_len: bool = False
    # vLLM's default with MTP (config/vllm.py): the next step is planned while one runs (docs/engine.md)
    async_scheduling: bool = True
    # vLLM v1 schedules spec_token_ids[:budget - 1] when the budget is short; false: 1 token (chains only)
    truncate_drafts: bool = True

    @field_validator("gmu")
    @classmethod
    def _gmu(cls, v: float) -> float:
        if not (0.0 < v <= 1.0):
            raise ValueError(f"gmu must be in (0, 1], got {v}")
        return v

    @model_validator(mode="after")
    def _cache_mode(self) -> "EngineConfig":
        # vLLM sets "align" for GDN hybrids whenever prefix caching is on; "none" is what it
        # runs with prefix caching off, and "align" has nothing to align to without it.
        if self.mamba_cache_mode == "align" and not self.enable_prefix_caching:
            raise ValueError("mamba_cache_mode 'align' needs enable_prefix_caching: true")
        if self.mamba_cache_mode == "none" and self.enable_prefix_caching:
            raise ValueError("mamba_cache_mode 'none' needs enable_prefix_caching: false "
                             "(vLLM turns a GDN hybrid's prefix caching into 'align')")
        return self

    @property
    def resolved_mamba_cache_mode(self) -> Literal["none", "align"]:
        return self.mamba_cache_mode or ("align" if self.enable_prefix_caching else "none")

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_cache_dtype]


class ClientConfig(_Strict):
    max_concurrency: int | None = Field(None, gt=0)  # closed loop when set
    request_rate: float | None = Field(None, gt=0)  # requests/s; None with no trace: all at t=0
    burstiness: float = Field(1.0, gt=0)  # Gamma shape; 1 = Poisson
    # How request_rate spaces the sends: "gamma" = vLLM's serving benchmark (burstiness above),
    # "constant" = guidellm's constant profile, request i at i / rate (workloads/arrivals.py)
    arrival_process: Literal["gamma", "constant"] = "gamma"
    use_trace_arrivals: bool = False  # replay the workload's own timestamps
    time_scale: float = Field(1.0, gt=0)  # trace replay: multiply gaps by this
    # Seconds a request spends outside the engine (HTTP both ways, tokenisation): unmeasured, so 0
    round_trip_s: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _constant_needs_rate(self) -> "ClientConfig":
        if self.arrival_process == "constant" and self.request_rate is None:
            raise ValueError("arrival_process 'constant' spaces sends at 1 / request_rate: set client.request_rate")
        return self


class MeasureConfig(_Strict):
    """Which requests the latency statistics cover: a run starts empty and, in an open loop,
    ends as its last arrivals drain, so a steady-state measurement leaves out the first and
    last requests by arrival order (the whole run counts by default)."""
    warmup_fraction: float = Field(0.0, ge=0, lt=1)
    cooldown_fraction: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _leaves_requests(self) -> "MeasureConfig":
        if self.warmup_fraction + self.cooldown_fraction >= 1:
            raise ValueError("warmup_fraction + cooldown_fraction must be < 1 (they would exclude every request)")
        return self


class RunConfig(_Strict):
    model: str = "qwen3.5-35b-a3b"
    hardware: str = "h200"
    policy: str = "store_all"
    workload: str = "synthetic-fixed"
    workload_overrides: dict[str, Any] = Field(default_factory=dict)
    policy_overrides: dict[str, Any] = Field(default_factory=dict)
    model_overrides: dict[str, Any] = Field(default_factory=dict)  # ModelConfig fields, e.g. mamba_ssm_dtype
    engine: EngineConfig = Field(default_factory=EngineConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    measure: MeasureConfig = Field(default_factory=MeasureConfig)
    num_requests: int = Field(1000, gt=0)
    seed: int = Field(0, ge=0, lt=2**63)  # numpy's SeedSequence takes non-negative integers
    trace_steps: bool = False  # write the per-step trace
    # vLLM's num_speculative_tokens: None keeps the model's mtp_depth and the policy's tree;
    # 0 is another spelling of policy "none"; K > 0 drafts a chain of K (sim.speculation).
    num_speculative_tokens: int | None = Field(None, ge=0)


# --------------------------------------------------------------------------- loading
def _names(kind: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))


def yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's error in one line: what is wrong and where (its own text spans several)."""
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = "; ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x)
    return where + (what or str(e).splitlines()[0])


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(read_text(path, "a YAML file"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{path}: expected a mapping of field: value at the top level, got {got}")
    return data


def parse_set(item: str, example: str = "engine.gmu=0.6") -> tuple[str, Any]:
    """One `--set KEY=VALUE` item: the dotted key and the value read as YAML (0.6 is a
    number, null is None, [1, 1] a list)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects KEY=VALUE (e.g. {example}), got {item!r}")
    try:
        return key.strip(), yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {item}: the value is not valid YAML ({yaml_problem(e)}); quote a string, "
                          "write a list as [1, 2]") from None


def _fields_at(cls: type[BaseModel], loc: tuple) -> list[str]:
    """The field names allowed where an unknown key `loc` was found."""
    for part in loc[:-1]:
        field = cls.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        cls = ann
    return list(cls.model_fields)


def format_validation_error(source: str, err: ValidationError, cls: type[BaseModel] | None = None) -> str:
    """One line for one bad field; a line per field when there are several."""
    fields = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden" and cls is not None and (valid := _fields_at(cls, e["loc"])):
            msg = f"unknown field; valid: {', '.join(valid)}"
        fields.append(f"{loc}: {msg}")
    if len(fields) == 1:
        return f"{source}: invalid configuration: {fields[0]}"
    return "\n".join([f"{source}: invalid configuration", *(f"  {f}" for f in fields)])


def validate(cls: type[BaseModel], data: dict[str, Any], source: str) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(source, e, cls)) from None


def _resolve(kind: str, name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    path = CONFIG_DIR / kind / f"{name_or_path}.yaml"
    if not path.exists():
        singular = {"models": "model", "hardware": "hardware", "policies": "policy"}.get(kind, kind)
        raise ConfigError(f"unknown {singular} {name_or_path!r}; valid: {', '.join(_names(kind))} (or a path to a .yaml file)")
    return path


def load_model(name: str, overrides: dict[str, Any] | None = None) -> ModelConfig:
    path = _resolve("models", name)
    data = {**read_yaml(path), **(overrides or {})}
    return validate(ModelConfig, data, str(path) + (f" with overrides {overrides}" if overrides else ""))


def load_hardware(name: str) -> HardwareConfig:
    path = _resolve("hardware", name)
    return validate(HardwareConfig, read_yaml(path), str(path))


def load_policy(name: str, overrides: dict[str, Any] | None = None) -> PolicyConfig:
    path = _resolve("policies", name)
    data = {**read_yaml(path), **(overrides or {})}
    return validate(PolicyConfig, data, str(path) + (f" with overrides {overrides}" if overrides else ""))


def model_names() -> list[str]:
    return _names("models")


def policy_names() -> list[str]:
    return _names("policies")


def hardware_names() -> list[str]:
    return _names("hardware")
