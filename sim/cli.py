"""`specsim`: one CLI with a subcommand per job.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`main(args) -> int`; modules are imported only when their subcommand runs, so the
simulator never imports torch or triton unless `calibrate` or a kernel bench runs.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from core.config import ConfigError

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("sim.run", "simulate one configuration and write summary.json + requests.csv"),
    "sweep": ("sim.sweep", "run a grid of configurations in parallel, resumably"),
    "figures": ("sim.figures", "draw the breakdown figures and report.md of a sweep"),
    "memory": ("sim.memory_cli", "per-sequence memory facts and the pool geometry"),
    "workload": ("workloads.cli", "workload statistics (`specsim workload stats NAME`)"),
    "calibrate": ("calibrate.cli", "measure layers on a GPU, merge tables, validate the latency model"),
    "bench": ("sim.bench", "simulator speed benchmark (steps per second)"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specsim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Only the chosen subcommand's module is imported (its arguments may need it).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(importlib.import_module(args._module).main(args) or 0)
    except ConfigError as e:
        print(f"specsim {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specsim {args.command}: interrupted", file=sys.stderr)
        return 130
