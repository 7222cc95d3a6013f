"""YAML as every file and `--set` value of the project is read: a key given twice is an error
(PyYAML keeps the last one silently), and `1e3` or `1.5e3` is a number, as YAML 1.2 and JSON
read it (PyYAML's YAML 1.1 rules make them strings, which a strict schema then refuses)."""
from __future__ import annotations

import re
from typing import Any

import yaml

# YAML 1.2's floats with an exponent that YAML 1.1 reads as strings (1e3, 1.5e3, -2E-4, .5e1).
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$")


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names one key twice."""


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):
                continue  # PyYAML's own error names an unhashable key
            if key in seen:
                first = seen[key]
                raise DuplicateKeyError(None, None, f"key {key!r} given twice (first on line {first.line + 1}); "
                                        "keep one", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+.0123456789"))


def load_yaml(text: str) -> Any:
    """`text` as YAML; raises yaml.YAMLError (DuplicateKeyError for a key given twice)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
