"""Reading configurations: YAML files by name from `configs/`, `--set` items, and pydantic's
errors turned into one line per bad field naming the file, the field path and what is allowed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from core.config_hardware import HardwareConfig
from core.config_model import ModelConfig
from core.config_policy import PolicyConfig
from core.errors import ConfigError
from core.files import read_text
from core.yaml_text import load_yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
REPO_ROOT = CONFIG_DIR.parent


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
        data = load_yaml(read_text(path, "a YAML file"))
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
        return key.strip(), load_yaml(text)
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
        elif e["type"].endswith("_type"):  # the schema takes no other type: say what was given
            msg += f", got {e['input']!r} (a {type(e['input']).__name__}; quote nothing that is a number)" \
                if isinstance(e["input"], str) else f", got {e['input']!r}"
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
    """A GPU profile. Its calibration_dir must exist: without the tables a run would be priced
    by the roofline under the same GPU name; calibration_dir: null asks for that outright."""
    path = _resolve("hardware", name)
    hw = validate(HardwareConfig, read_yaml(path), str(path))
    if hw.calibration_dir is not None and not (REPO_ROOT / hw.calibration_dir).is_dir():
        raise ConfigError(f"{path}: calibration_dir {hw.calibration_dir}: no such folder (relative to {REPO_ROOT}); "
                          "allowed: a folder of calibration tables, or calibration_dir: null to price every step by "
                          "the analytic roofline")
    return hw


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
