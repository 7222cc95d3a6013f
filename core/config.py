"""Validated configuration objects, loaded by name from `configs/`: the one place to import them from.

Every default lives once, in the schema module that holds it: `core.config_model` (the served
model), `core.config_hardware` (the GPU), `core.config_policy` (the commit policy),
`core.config_engine` (vLLM's engine settings), `core.config_run` (a run: client load,
measurement window, seed). `core.config_load` reads them; a bad field raises `ConfigError`
naming the file, the field path and what is allowed (pydantic's message lists the allowed literals).
"""
from __future__ import annotations

from core.config_base import DTYPE_BYTES, DType, GiB, MiB
from core.config_engine import EngineConfig, PerformanceMode
from core.config_hardware import HardwareConfig
from core.config_load import (CONFIG_DIR, REPO_ROOT, format_validation_error, hardware_names, load_hardware,
                              load_model, load_policy, model_names, parse_set, policy_names, read_yaml, validate,
                              yaml_problem)
from core.config_model import AttentionConfig, GDNConfig, MLPConfig, ModelConfig, MoEConfig
from core.config_policy import PolicyConfig, PolicyName
from core.config_run import ClientConfig, MeasureConfig, RunConfig
from core.errors import ConfigError

__all__ = ["CONFIG_DIR", "DTYPE_BYTES", "REPO_ROOT", "AttentionConfig", "ClientConfig", "ConfigError", "DType",
           "EngineConfig", "GDNConfig", "GiB", "HardwareConfig", "MLPConfig", "MeasureConfig", "MiB", "ModelConfig",
           "MoEConfig", "PerformanceMode", "PolicyConfig", "PolicyName", "RunConfig", "format_validation_error",
           "hardware_names", "load_hardware", "load_model", "load_policy", "model_names", "parse_set",
           "policy_names", "read_yaml", "validate", "yaml_problem"]
