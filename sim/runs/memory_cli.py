"""`specsim memory`: docs/design.md#the-commit-policies' facts for a model, policy and tree, and the pool vLLM builds.

With `--hardware` (budget from gmu) or `--kv-cache-memory-gib` (the available KV memory
as a vLLM log states it) it also prints the lines vLLM logs at startup, in vLLM's format.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, get_args

from core.config import (ConfigError, DType, EngineConfig, GiB, PerformanceMode, RunConfig, hardware_names, model_names,
                         validate)
from policies import DraftTree
from sim.engine.memory import memory_facts, pool_facts
from sim.engine.vllm_version import parse_version
from sim.runs.startup_checks import serve

MiB = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help=f"one of {', '.join(model_names())} or a model .yaml")
    p.add_argument("--policy", default=None, help="commit policy, or none: no speculative decoding "
                   "(default store_all, vLLM's own; none with --num-speculative-tokens 0)")
    p.add_argument("--tree", default=None,
                   help="per-depth widths, e.g. 1,1,1 or 3,3,3 (default: a chain of --num-speculative-tokens, "
                        "else the policy's)")
    p.add_argument("--hardware", default=None, help=f"derive the KV budget on this GPU: {', '.join(hardware_names())}")
    p.add_argument("--gmu", type=float, default=None, help=f"GPU memory utilisation with --hardware (default: "
                   f"{EngineConfig().gmu})")
    p.add_argument("--kv-cache-memory-gib", type=float, default=None,
                   help="available KV cache memory per GPU in GiB, as vLLM logs it (instead of deriving it from gmu)")
    p.add_argument("--max-model-len", type=int, default=None, help="tokens per request (default: the model's)")
    p.add_argument("--num-speculative-tokens", type=int, default=None,
                   help="K, the MTP drafts per step (default: the model's mtp_depth; 0: no MTP layer, no draft states)")
    p.add_argument("--mamba-cache-mode", choices=["none", "align"], default=None,
                   help="none: prefix caching off; align: on (vLLM's default for GDN hybrids)")
    p.add_argument("--mamba-ssm-dtype", choices=list(get_args(DType)), default=None,
                   help="SSM state dtype (default: the model's, float32 for Qwen3.5)")
    p.add_argument("--kv-cache-dtype", choices=["bf16", "fp8"], default=None)
    p.add_argument("--performance-mode", choices=list(get_args(PerformanceMode)), default=None,
                   help="vLLM's --performance-mode: throughput doubles the default max_num_batched_tokens and "
                        "max_num_seqs, so the profile run's peak (default: balanced)")
    p.add_argument("--tensor-parallel", type=int, default=None, help="tensor-parallel size (default: the model's)")
    p.add_argument("--vllm-version", default="current",
                   help="print vLLM's lines as this release does, e.g. 0.17.1 (the 'GPU KV cache size' formula "
                        "changed after 0.19: docs/memory.md)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _run_config(args: argparse.Namespace) -> RunConfig:
    """The flags as the run configuration `specsim run` would take, so both pass one check."""
    data: dict[str, Any] = {"model": args.model, "engine": {}, "model_overrides": {}}
    if args.policy is not None:
        data["policy"] = args.policy
    if args.hardware is not None:
        data["hardware"] = args.hardware
    if args.num_speculative_tokens is not None:
        data["num_speculative_tokens"] = args.num_speculative_tokens
    if args.tree:
        try:
            data["policy_overrides"] = {"draft_tree_widths": list(DraftTree.parse(args.tree).widths)}
        except ValueError as e:
            raise ConfigError(f"--tree: {e}") from None
    for key, value in (("tensor_parallel", args.tensor_parallel), ("mamba_ssm_dtype", args.mamba_ssm_dtype)):
        if value is not None:
            data["model_overrides"][key] = value
    engine = data["engine"]
    for key, value in (("gmu", args.gmu), ("kv_cache_dtype", args.kv_cache_dtype), ("max_model_len", args.max_model_len),
                       ("performance_mode", args.performance_mode)):
        if value is not None:
            engine[key] = value
    if args.mamba_cache_mode:
        engine.update(mamba_cache_mode=args.mamba_cache_mode, enable_prefix_caching=args.mamba_cache_mode == "align")
    return validate(RunConfig, data, "specsim memory flags")


def main(args: argparse.Namespace) -> int:
    if args.kv_cache_memory_gib is not None and not args.kv_cache_memory_gib > 0:
        raise ConfigError(f"--kv-cache-memory-gib must be a positive number of GiB, got {args.kv_cache_memory_gib}")
    if args.gmu is not None and args.hardware is None:
        raise ConfigError(f"--gmu {args.gmu:g} sizes the pool as a share of a GPU's memory: it needs --hardware "
                          f"({', '.join(hardware_names())}); --kv-cache-memory-gib gives the pool without one")
    parse_version(args.vllm_version)  # a bad version fails before anything is computed
    served = serve(_run_config(args), with_hardware=args.hardware is not None)
    model, policy, engine = served.model, served.policy, served.cfg.engine
    facts = memory_facts(model, policy)
    lines: list[str] = []
    if args.hardware or args.kv_cache_memory_gib is not None:
        kv = int(args.kv_cache_memory_gib * GiB) if args.kv_cache_memory_gib is not None else None
        pool, lines = pool_facts(model, served.hw, engine, policy, kv, args.vllm_version)
        facts.update(pool)
    if args.json:
        print(json.dumps({**facts, "vllm_log": lines}, indent=2))
        return 0
    for line in lines:
        print(line)
    if lines:
        print()
    width = max(map(len, facts))
    for k, v in facts.items():
        extra = f"  ({v / MiB:,.2f} MiB)" if isinstance(v, int) and (k.endswith("bytes") or "_bytes_" in k) else ""
        print(f"{k:<{width}}  {v:,}{extra}" if isinstance(v, int) and not isinstance(v, bool) else f"{k:<{width}}  {v}")
    return 0
