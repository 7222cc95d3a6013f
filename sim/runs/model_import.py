"""`specsim model import CONFIG.json`: a model YAML from a Hugging Face config of a GDN hybrid.

Reads the fields the simulator needs from the checkpoint's `config.json` (the text
model's, under `text_config` for the Qwen3.5 vision-language releases), validates
them against the model schema, writes `configs/models/<name>.yaml` atomically and
prints every field it could not read with the value it used instead. The key names
are those of Hugging Face transformers' configuration classes (Qwen3NextConfig,
Qwen3_5TextConfig, Qwen3_5MoeTextConfig); docs/models.md lists each mapping.
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.config import (CONFIG_DIR, DTYPE_BYTES, ConfigError, EngineConfig, ModelConfig, load_hardware, load_policy,
                         validate)
from core.files import atomic_write_text
from core.projections import attention_projections, elements, gdn_projections, mlp_projections, moe_projections
from policies import make_policy
from sim.runs.startup_checks import check_tensor_parallel, tp_problem

# model_type of the config (or of its text_config) -> the family whose key names it uses.
FAMILIES: dict[str, str] = {
    "qwen3_next": "Qwen3-Next (MoE)",
    "qwen3_5_moe": "Qwen3.5 MoE",
    "qwen3_5_moe_text": "Qwen3.5 MoE",
    "qwen3_5": "Qwen3.5 dense",
    "qwen3_5_text": "Qwen3.5 dense",
}
LAYER_KINDS = {"linear_attention": "gdn", "full_attention": "attn"}
TP_CHOICES = (1, 2, 4, 8)
DEFAULT_MTP_DEPTH = 3  # the drafts per step the study serves (vLLM num_speculative_tokens); not a checkpoint fact
SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS (v1/sample/sampler.py): a lower temperature samples greedily
SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)b(?:-a(\d+(?:\.\d+)?)b)?(?![a-z0-9])")


@dataclass
class Imported:
    """The model fields and what was not in the config (field -> how its value was chosen)."""

    data: dict[str, Any]
    defaults: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def text_config(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """The language model's config: `text_config` when the release nests it, else the whole file."""
    model_type = cfg.get("model_type")
    text = cfg.get("text_config")
    inner = text.get("model_type") if isinstance(text, dict) else None
    if model_type not in FAMILIES and inner not in FAMILIES:
        supported = ", ".join(sorted(FAMILIES))
        raise ConfigError(f"{source}: model_type {model_type!r} is not a supported GDN hybrid; supported: {supported}")
    return text if isinstance(text, dict) else cfg


def _get(text: dict[str, Any], source: str, *keys: str) -> Any:
    for k in keys:
        if k in text and text[k] is not None:
            return text[k]
    raise ConfigError(f"{source}: {' or '.join(keys)} missing; the model YAML needs it")


def _count(text: dict[str, Any], source: str, *keys: str, minimum: int = 1) -> int:
    """A count or width of the config: an integer of at least `minimum` (JSON's true, 2.5 or "8" are not)."""
    value = _get(text, source, *keys)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        key = next(k for k in keys if text.get(k) is not None)
        raise ConfigError(f"{source}: {key} {json.dumps(value)}: allowed: an integer >= {minimum}")
    return value


def _count_or(text: dict[str, Any], source: str, key: str, default: int, minimum: int = 0) -> int:
    return _count(text, source, key, minimum=minimum) if text.get(key) is not None else default


def layer_pattern(text: dict[str, Any], source: str) -> tuple[list[str], int]:
    """The shortest period of the layer types, and the layer count."""
    n = _count(text, source, "num_hidden_layers")
    if isinstance(text.get("layer_types"), list):
        kinds = []
        for t in text["layer_types"]:
            if t not in LAYER_KINDS:
                raise ConfigError(f"{source}: layer_types holds {t!r}; supported: {', '.join(LAYER_KINDS)}")
            kinds.append(LAYER_KINDS[t])
        if len(kinds) != n:
            raise ConfigError(f"{source}: layer_types lists {len(kinds)} layers but num_hidden_layers is {n}")
    else:  # Qwen3-Next: every full_attention_interval-th layer is full attention (transformers' rule)
        every = _count(text, source, "full_attention_interval")
        kinds = ["attn" if (i + 1) % every == 0 else "gdn" for i in range(n)]
    for p in range(1, n + 1):
        if n % p == 0 and kinds == kinds[:p] * (n // p):
            return kinds[:p], n
    raise AssertionError("unreachable: the whole list is a period")


def _ffn(text: dict[str, Any], source: str, imp: Imported) -> None:
    if text.get("num_experts") is not None:
        if text.get("mlp_only_layers"):
            raise ConfigError(f"{source}: mlp_only_layers {text['mlp_only_layers']}: dense layers inside an MoE model "
                              "are not modelled (every layer has the same feed-forward block)")
        if _count_or(text, source, "decoder_sparse_step", 1) != 1:
            raise ConfigError(f"{source}: decoder_sparse_step {text['decoder_sparse_step']}: only an MoE block after "
                              "every layer (1) is modelled")
        width = _count(text, source, "moe_intermediate_size")
        moe: dict[str, Any] = {"num_experts": _count(text, source, "num_experts"),
                               "top_k": _count(text, source, "num_experts_per_tok"), "expert_width": width}
        shared = _count_or(text, source, "shared_expert_intermediate_size", 0)
        if not shared:
            moe["shared_experts"] = 0
            imp.defaults["moe.shared_experts"] = "0 (no shared_expert_intermediate_size)"
        elif shared % width == 0:
            moe["shared_experts"] = shared // width
        else:
            moe.update(shared_experts=1, shared_expert_width=shared)
        imp.data["moe"] = moe
    else:
        imp.data["mlp"] = {"intermediate_size": _count(text, source, "intermediate_size")}


def _rotary(text: dict[str, Any]) -> float | None:
    """partial_rotary_factor: top level (Qwen3-Next, Qwen3.5) or inside rope_parameters (transformers 5)."""
    rope = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), dict) else {}
    value = text.get("partial_rotary_factor", rope.get("partial_rotary_factor"))
    return float(value) if value is not None else None


def _dtype(text: dict[str, Any], cfg: dict[str, Any], imp: Imported) -> str:
    dtype = text.get("dtype") or text.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype")
    if dtype is None:
        imp.defaults["dtype"] = "bfloat16 (no dtype / torch_dtype)"
        return "bfloat16"
    return str(dtype)


def param_counts(m: dict[str, Any]) -> tuple[float, float]:
    """(total, active) parameters of the text model from its shapes: embeddings, LM head unless tied,
    every layer's mixer, norms and feed-forward block, and the MTP drafter layers (a vision encoder is not counted)."""
    h, g, a = m["hidden_size"], m["gdn"], m["attention"]
    qk, v = g["num_k_heads"] * g["head_k_dim"], g["num_v_heads"] * g["head_v_dim"]
    gdn = elements(gdn_projections(h, g["num_k_heads"], g["num_v_heads"], g["head_k_dim"], g["head_v_dim"])) \
        + (2 * qk + v) * g["conv_kernel"] + 3 * g["num_v_heads"]
    attn = elements(attention_projections(h, a["num_q_heads"], a["num_kv_heads"], a["head_dim"], a["gated"]))
    if "moe" in m:
        e = m["moe"]
        shared_width = e["shared_experts"] * e.get("shared_expert_width", e["expert_width"])
        ffn = elements(moe_projections(h, e["num_experts"], e["expert_width"], shared_width))
        expert = elements(mlp_projections(h, e["expert_width"]))
        # active: top_k routed experts, the shared expert and its gate; not the router
        ffn_active = ffn - (e["num_experts"] - e["top_k"]) * expert - h * e["num_experts"]
    else:
        ffn = ffn_active = elements(mlp_projections(h, m["mlp"]["intermediate_size"]))
    pattern = m["layer_pattern"]
    per_period = sum(gdn if k == "gdn" else attn for k in pattern) + len(pattern) * 2 * h
    layers = m["num_layers"] // len(pattern)
    mixers = layers * per_period
    mtp = m["mtp_num_hidden_layers"] * (attn + 2 * h + 2 * h * h + 3 * h)  # attention layer, its norms, fc, fc norms
    embed = m["vocab_size"] * h * (1 if m["tie_word_embeddings"] else 2)
    blocks = m["num_layers"] + m["mtp_num_hidden_layers"]
    return (float(embed + mixers + mtp + blocks * ffn + h),
            float(embed + mixers + mtp + blocks * ffn_active + h))


def _params(m: dict[str, Any], imp: Imported) -> None:
    match = SIZE.search(m["name"])
    total, active = param_counts(m)
    if match:
        m["total_params"] = float(match.group(1)) * 1e9
        m["active_params"] = float(match.group(2)) * 1e9 if match.group(2) else m["total_params"]
        imp.notes.append(f"total_params {m['total_params']:.4g}, active_params {m['active_params']:.4g}: the sizes the "
                         f"name states (the model card's; the text model's shapes count {total:.4g} and {active:.4g})")
    else:
        m["total_params"], m["active_params"] = total, active
        imp.defaults["total_params"] = f"{total:.4g} counted from the shapes (the name states no size; no vision encoder)"
        imp.defaults["active_params"] = f"{active:.4g} counted from the shapes"


def _tensor_parallel(m: dict[str, Any], hardware: str, imp: Imported) -> None:
    """The smallest TP size that splits the heads evenly and at which vLLM would start on `hardware` at
    gmu 0.9 serving vLLM's own policy: the weights, profile-run peak and graphs fit, and the pool holds one
    max_model_len request (its startup check, sim.engine.pool.check_one_request_fits)."""
    from sim.engine.budget import block_layout, memory_budget, served_model
    from sim.engine.pool import check_one_request_fits, make_pool

    hw, engine = load_hardware(hardware), EngineConfig(gmu=0.9)
    for tp in TP_CHOICES:
        model = served_model(ModelConfig.model_validate({**m, "tensor_parallel": tp}), engine)
        if tp_problem(model, tp):
            continue
        policy = make_policy(model, load_policy("store_all"))
        try:
            pool_bytes = memory_budget(model, hw, engine).pool_bytes
            layout = block_layout(model, policy, pool_bytes, engine)
            check_one_request_fits(make_pool("paged", model, policy, layout, pool_bytes), model.max_model_len,
                                   str(policy.tree))
        except ConfigError:
            continue
        m["tensor_parallel"] = tp
        imp.defaults["tensor_parallel"] = (f"{tp}: the smallest of {TP_CHOICES} at which vLLM would start on "
                                           f"{hardware} at gmu 0.9 (weights fit, one max_model_len request fits)")
        return
    raise ConfigError(f"{m['name']}: does not fit {hardware} at tensor parallel {TP_CHOICES[-1]}; "
                      "give --tensor-parallel")


def import_config(cfg: dict[str, Any], source: str, name: str, tensor_parallel: int | None = None,
                  hardware: str = "h200", generation: dict[str, Any] | None = None) -> Imported:
    text = text_config(cfg, source)
    imp = Imported({})
    pattern, layers = layer_pattern(text, source)
    m = imp.data
    m["name"] = name
    m["hidden_size"] = _count(text, source, "hidden_size")
    m["layer_pattern"], m["num_layers"] = pattern, layers
    m["gdn"] = {"num_k_heads": _count(text, source, "linear_num_key_heads"),
                "num_v_heads": _count(text, source, "linear_num_value_heads"),
                "head_k_dim": _count(text, source, "linear_key_head_dim"),
                "head_v_dim": _count(text, source, "linear_value_head_dim"),
                "conv_kernel": _count(text, source, "linear_conv_kernel_dim")}
    heads = _count(text, source, "num_attention_heads")
    head_dim = _count_or(text, source, "head_dim", m["hidden_size"] // heads, minimum=1)
    if "head_dim" not in text:
        imp.defaults["attention.head_dim"] = f"{head_dim} (hidden_size / num_attention_heads: no head_dim)"
    m["attention"] = {"num_q_heads": heads, "num_kv_heads": _count(text, source, "num_key_value_heads"),
                      "head_dim": head_dim, "gated": bool(text.get("attn_output_gate", True))}
    if "attn_output_gate" not in text:
        imp.defaults["attention.gated"] = "true (no attn_output_gate: Qwen3-Next's attention is always gated)"
    rotary = _rotary(text)
    if rotary is None:
        imp.defaults["attention.partial_rotary_factor"] = "0.25 (no partial_rotary_factor)"
        rotary = 0.25
    m["attention"]["partial_rotary_factor"] = rotary
    _ffn(text, source, imp)
    m["vocab_size"] = _count(text, source, "vocab_size")
    m["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    m["generation_sampling"], why = generation_sampling(generation)
    if generation is None:
        imp.defaults["generation_sampling"] = f"random ({why})"
    else:
        imp.notes.append(f"generation_sampling {m['generation_sampling']} ({why})")
    mtp_keys = [k for k in ("mtp_num_hidden_layers", "num_nextn_predict_layers") if text.get(k) is not None]
    if not mtp_keys:
        imp.defaults["mtp_num_hidden_layers"] = "1 (no mtp_num_hidden_layers: vLLM's MTP drafter runs one layer)"
    m["mtp_num_hidden_layers"] = _count(text, source, mtp_keys[0], minimum=0) if mtp_keys else 1
    m["mtp_depth"] = DEFAULT_MTP_DEPTH if m["mtp_num_hidden_layers"] else 0
    imp.defaults["mtp_depth"] = f"{m['mtp_depth']} (drafts per step are a serving choice: --num-speculative-tokens)"
    m["max_model_len"] = _count(text, source, "max_position_embeddings")
    dtype = _dtype(text, cfg, imp)
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ConfigError(f"{source}: dtype {dtype!r}; supported: bfloat16, float16, float32")
    m["dtype"] = dtype
    m["weight_dtype_bytes"] = DTYPE_BYTES[dtype]
    ssm = text.get("mamba_ssm_dtype")
    if ssm is None:
        imp.defaults["mamba_ssm_dtype"] = f"{dtype} (no mamba_ssm_dtype: vLLM keeps the state in the model dtype)"
    m["mamba_ssm_dtype"] = str(ssm or dtype)
    quant = cfg.get("quantization_config") or text.get("quantization_config")
    if quant and quant.get("quant_method") == "fp8" and list(quant.get("weight_block_size") or []) == [128, 128]:
        m["weights"] = "fp8"  # block-FP8 (docs/fp8.md): e4m3 blocks of 128 x 128, float32 scales
        imp.notes.append(f"quantization_config {json.dumps(quant, sort_keys=True)}: the block-FP8 checkpoint, "
                         "weights: fp8 (its weight bytes from the tensor list, its own calibration folder)")
    elif quant:
        imp.notes.append(f"quantization_config {json.dumps(quant, sort_keys=True)} read but not modelled: "
                         f"weights are priced at {dtype}")
    _params(m, imp)
    check_model(m, f"{source} imported as {name}")  # one line for a shape the schema refuses, before TP is chosen
    if tensor_parallel is not None:
        m["tensor_parallel"] = tensor_parallel
    else:
        _tensor_parallel(m, hardware, imp)
    check_model(m, f"{source} imported as {name}")
    return imp


def generation_sampling(gen: dict[str, Any] | None) -> tuple[str, str]:
    """The sampling path vLLM 0.17.1 gives a request that sends no sampling parameters, from the
    checkpoint's generation_config.json (`ModelConfig.get_diff_sampling_param` reads its temperature,
    top_k and top_p, not do_sample), and why. docs/sampling.md."""
    if gen is None:
        return "random", "no generation_config.json beside config.json: vLLM's own defaults, temperature 1"
    temperature, top_k, top_p = gen.get("temperature"), gen.get("top_k"), gen.get("top_p")
    if isinstance(temperature, (int, float)) and temperature < SAMPLING_EPS:
        return "greedy", f"generation_config.json: temperature {temperature}"
    if (isinstance(top_k, int) and top_k > 0) or (isinstance(top_p, (int, float)) and top_p < 1.0):
        return "top_k_top_p", f"generation_config.json: top_k {top_k}, top_p {top_p}"
    return "random", f"generation_config.json: temperature {temperature}, no top_k or top_p"


def check_model(m: dict[str, Any], source: str) -> None:
    """The imported fields against the schema and vLLM's start-up rules (tensor parallelism)."""
    check_tensor_parallel(validate(ModelConfig, {"tensor_parallel": 1, **m}, source))


def default_name(cfg: dict[str, Any], path: Path) -> str:
    """`_name_or_path`'s last part when the config has it, else the folder the file is in."""
    named = cfg.get("_name_or_path")
    return (str(named).rstrip("/").rsplit("/", 1)[-1] if named else path.resolve().parent.name).lower()


def render(imp: Imported, source: str) -> str:
    head = [f"# Imported from {source} by `specsim model import`.",
            *(f"# {k}: {v}" for k, v in imp.defaults.items()),
            *(f"# {n}" for n in imp.notes)]
    return "\n".join(head) + "\n" + yaml.safe_dump(imp.data, sort_keys=False, default_flow_style=None)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    i = sub.add_parser("import", help="write a model YAML from a Hugging Face config.json")
    i.add_argument("config", type=Path, help="the checkpoint's config.json")
    i.add_argument("--name", default=None, help="model name (default: the config's _name_or_path, else its folder)")
    i.add_argument("--tensor-parallel", type=int, default=None,
                   help="TP size (default: the smallest that fits --hardware at gmu 0.9)")
    i.add_argument("--hardware", default="h200", help="hardware config the default TP size is chosen for")
    i.add_argument("--out", type=Path, default=None, help="output YAML (default: configs/models/NAME.yaml)")
    i.add_argument("--force", action="store_true", help="overwrite an existing output file")


def main(args: argparse.Namespace) -> int:
    if not args.config.is_file():
        raise ConfigError(f"config {args.config}: no such file")
    try:
        cfg = json.loads(args.config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config {args.config}: not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"config {args.config}: expected a JSON object at the top level")
    if args.tensor_parallel is not None and args.tensor_parallel < 1:
        raise ConfigError(f"--tensor-parallel must be a positive integer, got {args.tensor_parallel}")
    name = args.name or default_name(cfg, args.config)
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        raise ConfigError(f"--name {name!r}: use lower-case letters, digits, '.', '_' and '-'")
    out = args.out or CONFIG_DIR / "models" / f"{name}.yaml"
    if out.exists() and not args.force:
        raise ConfigError(f"--out {out} exists; pass --force to overwrite it")
    gen_path = args.config.parent / "generation_config.json"
    try:
        generation = json.loads(gen_path.read_text()) if gen_path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{gen_path}: not valid JSON: {e}") from None
    if generation is not None and not isinstance(generation, dict):
        raise ConfigError(f"{gen_path}: expected a JSON object at the top level")
    imp = import_config(cfg, str(args.config), name, args.tensor_parallel, args.hardware, generation)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render(imp, f"{args.config.resolve().parent.name}/{args.config.name}"))
    print(f"wrote {out}")
    for k, v in imp.defaults.items():
        print(f"  not in the config: {k} = {v}")
    for n in imp.notes:
        print(f"  note: {n}")
    return 0
