"""`specsim memory`: DESIGN.md section 3's facts for a model, policy and tree, and the pool."""
from __future__ import annotations

import argparse
import json

from core.config import EngineConfig, load_hardware, load_model, load_policy, validate
from policies import DraftTree, make_policy
from sim.memory import memory_facts, pool_facts

MiB = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--policy", required=True)
    p.add_argument("--tree", default=None, help="per-depth widths, e.g. 1,1,1 or 3,3,3 (default: the policy's)")
    p.add_argument("--hardware", default=None, help="also print the pool geometry on this GPU")
    p.add_argument("--gmu", type=float, default=0.9)
    p.add_argument("--json", action="store_true", help="print JSON")


def main(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    overrides = {"draft_tree_widths": list(DraftTree.parse(args.tree).widths)} if args.tree else {}
    policy = make_policy(model, load_policy(args.policy, overrides))
    facts = memory_facts(model, policy)
    if args.hardware:
        engine = validate(EngineConfig, {"gmu": args.gmu}, "--gmu")
        facts.update(pool_facts(model, load_hardware(args.hardware), engine, policy))
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        width = max(map(len, facts))
        for k, v in facts.items():
            extra = f"  ({v / MiB:,.2f} MiB)" if k.endswith("bytes") or "_bytes_" in k else ""
            print(f"{k:<{width}}  {v}{extra}" if not isinstance(v, int) else f"{k:<{width}}  {v:,}{extra}")
    return 0
