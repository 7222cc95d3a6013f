"""What a stand-alone GPU bench takes and leaves: `--out`, `--time-budget-s` and `--git-commit`, then
its table and its provenance (`STEM.csv`, `STEM_provenance.json`), each written whole or not at all."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from calibrate.device import provenance
from core.tables import write_rows


def bench_parser(module: str, doc: str, budget_s: float | None) -> argparse.ArgumentParser:
    """The bench's parser with the arguments every bench has (`budget_s` None: no time budget)."""
    ap = argparse.ArgumentParser(prog=f"python3 -m {module}", description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    if budget_s is not None:
        ap.add_argument("--time-budget-s", type=float, default=budget_s)
    ap.add_argument("--git-commit", default=os.environ.get("GIT_COMMIT", "unknown"))
    return ap


def write_outputs(out: Path, stem: str, rows: Sequence[dict], columns: Sequence[str], module: str,
                  args: argparse.Namespace, argv: list[str] | None, record: dict) -> None:
    """The table, then the provenance: the machine, the commit, the command as typed, and `record`."""
    write_rows(out / f"{stem}.csv", list(rows), tuple(columns))
    command = f"python3 -m {module} " + " ".join(argv if argv is not None else sys.argv[1:])
    provenance.write(out / f"{stem}_provenance.json", {**provenance.environment("cuda"), "git_commit": args.git_commit,
                                                       "command": command, **record})
