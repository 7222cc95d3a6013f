"""Workloads by name: `configs/workloads/<name>.yaml` (or a path to such a YAML)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from core.config import CONFIG_DIR, format_validation_error, read_yaml
from core.yaml_text import load_yaml
from workloads import azure, burstgpt, guidellm, sharegpt, specbench, synthetic
from workloads.acceptance import validate_acceptance
from workloads.base import Sample, Workload, WorkloadError
from workloads.files import resolve_path
from workloads.outputs import shape_outputs
from workloads.schema import (SPEC_KINDS, AzureSpec, BurstGPTSpec, FixedSpec, GuidellmRandomSpec, GuidellmShareGPTSpec,
                              ShareGPTSpec, SpecBenchSpec, SyntheticSpec, WorkloadSpec)

WORKLOAD_DIR = CONFIG_DIR / "workloads"


def workload_names() -> list[str]:
    return sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml"))


def workload_path(name: str) -> Path:
    p = Path(name)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise WorkloadError(f"workload file not found: {p}")
        return p
    path = WORKLOAD_DIR / f"{name}.yaml"
    if not path.is_file():
        raise WorkloadError(f"unknown workload {name!r}; valid: {', '.join(workload_names())} (or a path to a .yaml file)")
    return path


def parse_set(items: list[str]) -> dict[str, Any]:
    """`key=value` strings (`--set`) -> overrides; values are read as YAML (`512` is an int,
    `null` is None, `[a, b]` a list); dotted keys reach nested fields (`prompt.median=800`)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise WorkloadError(f"--set {item!r}: expected key=value, e.g. path=data/trace.csv")
        try:
            out[key.strip()] = load_yaml(value) if value.strip() else None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """YAML data with overrides applied: dotted keys (`prompt.median`) and nested mappings
    (`{"prompt": {"median": 800}}`, as `specsim run --set workload_overrides.prompt.median=800`
    gives them) both change one field and keep its siblings."""
    merged = dict(data)
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = merged
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                raise WorkloadError(f"override {key!r}: {part!r} is not a mapping in this workload")
            node[part] = child = dict(child)  # copy: never mutate the YAML's own dicts
            node = child
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            value = apply_overrides(node[leaf], value)
        node[leaf] = value
    return merged


def load_spec(name: str, overrides: dict[str, Any] | None = None) -> WorkloadSpec:
    path = workload_path(name)
    data = {"name": path.stem, **read_yaml(path)}
    data = apply_overrides(data, overrides or {})
    source = str(path) + (f" with overrides {overrides}" if overrides else "")
    kind = data.get("kind")
    if kind not in SPEC_KINDS:
        raise WorkloadError(f"{source}: kind {kind!r} is not a workload kind; valid: {', '.join(SPEC_KINDS)}")
    # Validated against its kind's own class (not the union), so errors name the key as the
    # YAML and `--set workload_overrides.<key>` do, and an unknown key lists the valid ones.
    cls = SPEC_KINDS[kind]
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise WorkloadError(format_validation_error(source, e, cls)) from None


def _sample(spec: WorkloadSpec, num_requests: int, seed: int) -> Sample:
    if isinstance(spec, FixedSpec):
        return synthetic.load_fixed(spec, num_requests)
    if isinstance(spec, SyntheticSpec):
        return synthetic.load_synthetic(spec, num_requests, seed)
    if isinstance(spec, ShareGPTSpec):
        limits = sharegpt.Limits(spec.min_tokens, spec.max_prompt_tokens, spec.max_total_tokens)
        path = Path(spec.path).expanduser() if spec.path else None
        requests, source = sharegpt.load(path, num_requests, seed, limits, spec.max_conversations, spec.output_len,
                                         spec.tokenizer)
        return Sample(requests, source)
    if isinstance(spec, SpecBenchSpec):
        path = resolve_path(spec.path, spec.path_env, spec.name, specbench.DATA_HINT)
        return specbench.load(path, num_requests, seed, spec.output_budget, spec.categories)
    if isinstance(spec, BurstGPTSpec):
        path = resolve_path(spec.path, spec.path_env, spec.name, burstgpt.DATA_HINT)
        return burstgpt.load(path, num_requests, seed, spec.model_filter, trace=spec.arrival == "trace")
    if isinstance(spec, AzureSpec):
        path = resolve_path(spec.path, spec.path_env, spec.name, azure.DATA_HINT)
        return azure.load(path, num_requests)
    if isinstance(spec, GuidellmRandomSpec):
        return guidellm.load_random(num_requests, spec.prompt_tokens, spec.output_tokens, spec.chat_template_tokens)
    if isinstance(spec, GuidellmShareGPTSpec):
        path = Path(spec.path).expanduser() if spec.path else None
        return guidellm.load_sharegpt(path, num_requests, spec.chat_template_tokens)
    raise AssertionError(f"no loader for workload kind {spec.kind!r}")


def load_workload(name: str, num_requests: int, seed: int, overrides: dict[str, Any] | None = None) -> Workload:
    """The requests of workload `name` (a YAML under configs/workloads/ or a path to one).

    `overrides` replace YAML keys (e.g. `path`, `output_budget`, `model_filter`,
    `prompt_tokens`; dotted keys for nested ones). Same arguments, same requests.
    """
    if not isinstance(num_requests, int) or num_requests <= 0:
        raise WorkloadError(f"num_requests must be a positive integer, got {num_requests!r}")
    spec = load_spec(name, overrides)
    sample = shape_outputs(_sample(spec, num_requests, seed), spec.output_cap, spec.output_resample, seed)
    if not sample.requests:
        raise WorkloadError(f"workload {spec.name!r} is empty after filtering ({sample.source})")
    acceptance = validate_acceptance(spec.acceptance, sample.categories, f"workload {spec.name!r}")
    return Workload(name=spec.name, requests=sample.requests, source=sample.source,
                    acceptance=acceptance, arrival=spec.arrival)
