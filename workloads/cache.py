"""Per-user cache of derived data (token-length tables), so a second run starts fast.

`SPECSIM_CACHE_DIR` overrides `${XDG_CACHE_HOME:-~/.cache}/gdn-specsim`. Files are
written to a temporary name and renamed, so parallel sweep workers never read half
a file. A cache file that cannot be parsed is treated as absent and rebuilt.
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np


def cache_dir() -> Path:
    if os.environ.get("SPECSIM_CACHE_DIR"):
        return Path(os.environ["SPECSIM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gdn-specsim"


def write_table(path: Path, columns: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """CSV with a first comment line holding `meta` as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(columns)
    rows = np.column_stack([np.asarray(columns[c], dtype=np.int64) for c in names])
    meta = {**meta, "rows": len(rows)}  # read_table checks it: a short file is a stale one
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write("# " + json.dumps(meta, sort_keys=True) + "\n")
        f.write(",".join(names) + "\n")
        np.savetxt(f, rows, fmt="%d", delimiter=",")
    os.replace(tmp, path)


def read_table(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The columns and meta written by `write_table`, or None if absent or unreadable."""
    try:
        with path.open() as f:
            meta = json.loads(f.readline().removeprefix("# "))
            names = f.readline().strip().split(",")
            with warnings.catch_warnings():  # an empty table is valid, not worth a warning
                warnings.simplefilter("ignore", UserWarning)
                rows = np.loadtxt(f, dtype=np.int64, delimiter=",", ndmin=2)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if rows.size == 0:
        rows = np.zeros((0, len(names)), np.int64)
    if rows.shape[1] != len(names) or len(rows) != meta.get("rows"):
        return None
    return {n: rows[:, i] for i, n in enumerate(names)}, meta
