"""Sweep grids: a YAML file of axes and fixed values over `RunConfig` fields -> points.

A grid names `RunConfig` fields by dotted path (`engine.gmu`, `client.max_concurrency`,
`policy_overrides.draft_tree_widths`, `workload_overrides.path`, ...). `axes` are
crossed in the order written (the last axis varies fastest); `fixed` values apply to
every point; `workloads.<name>` holds per-workload changes merged over both (an axis
set to null is dropped, e.g. BurstGPT sweeps `client.request_rate` instead of
`client.max_concurrency`). Every point is validated into a `RunConfig`, so a bad value
fails before anything runs, naming the field and what is allowed.
"""
from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from core.config import (
    CONFIG_DIR,
    REPO_ROOT,
    ConfigError,
    PolicyConfig,
    RunConfig,
    load_hardware,
    load_model,
    load_policy,
    read_yaml,
    validate,
)
from sim.runs.speculation import speculates

GRID_KEYS = ("description", "fixed", "axes", "workloads")
WORKLOAD_KEYS = ("fixed", "axes")
# The workload comes from `--workload`, so one sweep directory holds one workload.
CLI_ONLY = ("workload",)
# Fields a grid may name inside a dict-valued RunConfig field; None: any key (the
# workload validates its own overrides when it loads).
DICT_FIELD_KEYS: dict[str, tuple[str, ...] | None] = {
    "policy_overrides": tuple(k for k in PolicyConfig.model_fields if k not in ("name", "mamba_state_commit")),
    "workload_overrides": None,
    "model_overrides": ("weights", "mamba_ssm_dtype", "tensor_parallel"),  # e.g. the FP8 checkpoint: weights: fp8
}
TREE_FIELD = "policy_overrides.draft_tree_widths"
# Axes that set the offered load; the first one a grid sweeps is its load axis.
LOAD_FIELDS = ("client.max_concurrency", "client.request_rate")


def _leaf_paths(cls: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in cls.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _leaf_paths(ann, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def valid_fields() -> list[str]:
    """Every dotted path a grid may set (derived from RunConfig, so it never drifts)."""
    paths = [p for p in _leaf_paths(RunConfig) if p not in CLI_ONLY]
    for field, keys in DICT_FIELD_KEYS.items():
        paths += [f"{field}.{k}" for k in keys] if keys is not None else [f"{field}.<key>"]
    return sorted(paths)


def check_field(path: str, source: str) -> None:
    if path in CLI_ONLY:
        raise ConfigError(f"{source}: {path!r} cannot be set in a grid; it is chosen with --{path}")
    head, _, rest = path.partition(".")
    if head in DICT_FIELD_KEYS and rest:
        keys = DICT_FIELD_KEYS[head]
        if keys is None or rest in keys:
            return
    elif path in _leaf_paths(RunConfig) or head in DICT_FIELD_KEYS:
        return
    raise ConfigError(f"{source}: unknown grid field {path!r}; valid: {', '.join(valid_fields())}")


def set_field(data: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted RunConfig path (`engine.gmu`) in a nested dict of config data."""
    *parents, last = path.split(".")
    for p in parents:
        data = data.setdefault(p, {})
    data[last] = value


@dataclass(frozen=True)
class Grid:
    path: Path
    description: str
    fixed: dict[str, Any]  # dotted path -> value
    axes: dict[str, list[Any]]  # dotted path -> values, in crossing order

    @property
    def load_axis(self) -> str | None:
        return next((f for f in LOAD_FIELDS if f in self.axes), None)

    def assignments(self) -> list[dict[str, Any]]:
        """One {dotted path: value} per point: fixed values, then one value per axis."""
        names = list(self.axes)
        return [{**self.fixed, **dict(zip(names, combo))} for combo in itertools.product(*self.axes.values())]

    def points(self, workload: str) -> list[RunConfig]:
        """Every point as a RunConfig. A tree crossed with a policy axis is the speculating
        policies' tree: a point of the policy that drafts nothing has none (as `specsim plan`'s
        --tree), where `specsim run --policy none --tree ...` is refused."""
        points = []
        drafts = functools.cache(speculates)
        for assignment in self.assignments():
            if TREE_FIELD in assignment and not drafts(assignment.get("policy", RunConfig().policy)):
                assignment = {k: v for k, v in assignment.items() if k != TREE_FIELD}
            data: dict[str, Any] = {"workload": workload}
            for path, value in assignment.items():
                set_field(data, path, value)
            points.append(validate(RunConfig, data, f"{self.path}: point {assignment}"))
        _check_names(points)
        return points


def _check_names(points: list[RunConfig]) -> None:
    """Load every named model, hardware and policy once, so a typo fails before the sweep."""
    for name in sorted({p.model for p in points}):
        load_model(name)
    for name in sorted({p.hardware for p in points}):
        load_hardware(name)
    seen: set[tuple[str, str]] = set()
    for p in points:
        key = (p.policy, json.dumps(p.policy_overrides, sort_keys=True))
        if key not in seen:
            seen.add(key)
            load_policy(p.policy, p.policy_overrides)

def _mapping(value: Any, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: expected a mapping of field -> value, got {type(value).__name__}")
    return value


def _axes(raw: dict[str, Any], source: str) -> dict[str, list[Any] | None]:
    out: dict[str, list[Any] | None] = {}
    for path, values in raw.items():
        check_field(path, source)
        if values is None:  # drops an inherited axis
            out[path] = None
            continue
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{source}: axis {path!r} must be a non-empty list of values, got {values!r}")
        if len({repr(v) for v in values}) != len(values):
            raise ConfigError(f"{source}: axis {path!r} repeats a value: {values}")
        out[path] = values
    return out


def _fixed(raw: dict[str, Any], source: str) -> dict[str, Any]:
    for path in raw:
        check_field(path, source)
    return dict(raw)


def _check_workload_names(per_workload: dict[str, Any], source: str) -> None:
    from workloads import workload_names

    valid = workload_names()
    if unknown := sorted(set(per_workload) - set(valid)):
        raise ConfigError(f"{source}: unknown workload(s) {unknown}; valid: {', '.join(valid)}")


def load_grid(
    path: str | Path,
    workload: str,
    model: str | None = None,
    hardware: str | None = None,
    sets: dict[str, Any] | None = None,
) -> Grid:
    """Read a grid YAML for one workload; `model`/`hardware` and `sets` (dotted field ->
    value, the CLI's `--set`) replace the grid's fixed value or axis of that field."""
    path = Path(path)
    if not path.exists():
        grids = ", ".join(sorted(str(g.relative_to(REPO_ROOT)) for g in (CONFIG_DIR / "grids").glob("*.yaml")))
        raise ConfigError(f"--grid {path}: grid file does not exist; the shipped grids: {grids}")
    raw = read_yaml(path)
    source = str(path)
    if unknown := sorted(set(raw) - set(GRID_KEYS)):
        raise ConfigError(f"{source}: unknown top-level key(s) {unknown}; valid: {', '.join(GRID_KEYS)}")
    fixed = _fixed(_mapping(raw.get("fixed"), f"{source}: fixed"), f"{source}: fixed")
    axes = _axes(_mapping(raw.get("axes"), f"{source}: axes"), f"{source}: axes")
    per_workload = _mapping(raw.get("workloads"), f"{source}: workloads")
    _check_workload_names(per_workload, f"{source}: workloads")
    name = Path(workload).stem if workload.endswith((".yaml", ".yml")) else workload
    if name in per_workload:
        wsource = f"{source}: workloads.{name}"
        extra = _mapping(per_workload[name], wsource)
        if unknown := sorted(set(extra) - set(WORKLOAD_KEYS)):
            raise ConfigError(f"{wsource}: unknown key(s) {unknown}; valid: {', '.join(WORKLOAD_KEYS)}")
        wfixed = _fixed(_mapping(extra.get("fixed"), wsource), wsource)
        waxes = _axes(_mapping(extra.get("axes"), wsource), wsource)
        axes = {k: v for k, v in axes.items() if k not in wfixed}
        fixed = {k: v for k, v in fixed.items() if k not in waxes}
        fixed.update(wfixed)
        axes.update(waxes)
    for field in sets or {}:
        check_field(field, "--set")
    chosen = {k: v for k, v in (("model", model), ("hardware", hardware)) if v is not None}
    for name, value in {**chosen, **(sets or {})}.items():
        axes.pop(name, None)
        fixed[name] = value
    kept = {k: v for k, v in axes.items() if v is not None}
    if both := sorted(set(kept) & set(fixed)):
        raise ConfigError(f"{source}: field(s) {both} are both fixed and an axis; keep one")
    return Grid(path=path, description=str(raw.get("description", "")), fixed=fixed, axes=kept)

