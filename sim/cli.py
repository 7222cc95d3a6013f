"""`specsim`: one CLI with a subcommand per job.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`main(args) -> int`; modules are imported only when their subcommand runs, so the
simulator never imports torch or triton unless `calibrate` or a kernel bench runs.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from core.errors import ConfigError
from core.tables import TableError

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("sim.runs.run", "simulate one configuration; with --out, write summary.json + requests.csv + config.yaml"),
    "sweep": ("sim.runs.sweep", "run a grid of configurations in parallel, resumably"),
    "plan": ("sim.plan.cli", "the highest request rate each configuration sustains under SLOs; GPUs for a target load"),
    "figures": ("sim.figures.cli", "draw the breakdown figures and report.md of a sweep"),
    "report": ("sim.readme", "print the README's numbers from the committed outputs in docs/"),
    "validate": ("sim.validate.cli", "simulate the published vLLM runs of validation/real and compare"),
    "memory": ("sim.runs.memory_cli", "per-sequence memory facts and the pool geometry"),
    "model": ("sim.runs.model_import", "write a model YAML from a Hugging Face config.json (`specsim model import`)"),
    "workload": ("workloads.cli", "workload statistics (`specsim workload stats NAME`)"),
    "calibrate": ("calibrate.cli", "measure layers on a GPU, merge tables, validate the latency model"),
    "bench": ("sim.runs.bench", "simulator speed benchmark (steps per second)"),
}


class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help where X is a real value: options whose
    default is None or False take it from elsewhere (a config file, the grid), and their
    help says so."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (action.option_strings and "default" not in text and "%(default)" not in text
                and default not in (None, False, [], argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        return text


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specsim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Only the chosen subcommand's module is imported (its arguments may need it).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(importlib.import_module(args._module).main(args) or 0)
    except (ConfigError, TableError) as e:  # a calibration folder missing or mangling a table: data, not our bug
        print(f"specsim {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path the user named that cannot be read or written: their input, not our bug
        where = f": {e.filename}" if e.filename else ""
        print(f"specsim {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specsim {args.command}: interrupted", file=sys.stderr)
        return 130
