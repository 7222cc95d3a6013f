"""`specsim workload stats NAME`: count and length percentiles of a workload, its arrival
rate, optionally a histogram PNG."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.config import RunConfig
from workloads.registry import load_workload, parse_set, workload_names
from workloads.stats import format_stats, save_histogram, workload_stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["stats"], help="what to do with the workload")
    p.add_argument("name", help=f"workload: {', '.join(workload_names())}, or a path to a workload YAML")
    p.add_argument("--num-requests", type=int, default=RunConfig.model_fields["num_requests"].default,
                   help="requests to sample (default: as `specsim run`)")
    p.add_argument("--seed", type=int, default=RunConfig.model_fields["seed"].default)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a workload YAML key, e.g. path=FILE, output_budget=512, model_filter=null")
    p.add_argument("--hist", type=Path, default=None, metavar="FILE.png", help="also save a length histogram")
    p.add_argument("--json", action="store_true", help="print JSON")


def main(args: argparse.Namespace) -> int:
    w = load_workload(args.name, args.num_requests, args.seed, parse_set(args.overrides))
    stats = workload_stats(w)
    print(json.dumps(stats, indent=2) if args.json else format_stats(stats))
    if args.hist:
        save_histogram(w, args.hist)
        if not args.json:
            print(f"histogram  {args.hist}")
    return 0
