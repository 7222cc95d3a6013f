"""User-given data files: find them, read CSV tables, and reject bad rows by line number."""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from workloads.base import WorkloadError

if TYPE_CHECKING:
    import pandas as pd

R = TypeVar("R")


def resolve_path(path: str | None, path_env: str | None, workload: str, where_to_get: str) -> Path:
    """The data file from the `path` key (YAML or override), else from `$path_env`."""
    how = (f"give it as the workload override path=FILE (`specsim run --workload {workload} --set "
           f"workload_overrides.path=FILE`, the same for `specsim sweep`, `make sweep WORKLOAD={workload} "
           f"ARGS='--set workload_overrides.path=FILE'`, `specsim workload stats {workload} --set path=FILE`)")
    if path_env:
        how += f" or set the environment variable {path_env}=FILE"
    raw, origin = (path, "path") if path else (os.environ.get(path_env or "") or None, path_env)
    if not raw:
        raise WorkloadError(f"workload {workload!r} needs a data file that is not shipped with gdn-specsim: "
                            f"{how}. The data: {where_to_get}")
    p = Path(raw).expanduser()
    if not p.is_file():
        raise WorkloadError(f"workload {workload!r}: data file not found: {p} (from {origin}); {how}. "
                            f"The data: {where_to_get}")
    return p


def read_csv(path: Path, columns: list[str], what: str) -> pd.DataFrame:
    """The CSV's `columns` (others ignored); missing columns are named with those found."""
    import pandas as pd  # here, not at module level: a run that reads no trace file skips its import
    try:
        # keep_default_na=False: an empty or "NA" cell keeps its column non-numeric, so
        # numeric_column reports its line instead of a silent NaN
        df = pd.read_csv(path, keep_default_na=False, skipinitialspace=True, low_memory=False)
    except pd.errors.EmptyDataError:
        raise WorkloadError(f"{path}: empty file, expected a {what} CSV with columns {', '.join(columns)}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{path}: not a readable CSV ({what}): {e}") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise WorkloadError(f"{path}: missing column(s) {', '.join(map(repr, missing))} for a {what}; "
                            f"expected {', '.join(columns)}; found {', '.join(map(repr, df.columns))}")
    return df[columns]


def numeric_column(df: pd.DataFrame, column: str, path: Path, integer: bool) -> np.ndarray:
    """The column as numbers; a non-numeric, negative or (if `integer`) fractional cell is
    reported with its line in the file (the header is line 1)."""
    import pandas as pd  # here, not at module level: a run that reads no trace file skips its import
    values = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=float)
    checks = [(~np.isfinite(values), "is not a number"), (values < 0, "is negative")]
    if integer:
        checks.append((np.isfinite(values) & (values != np.round(values)), "is not a whole number"))
    for bad, why in checks:
        if bad.any():
            i = int(np.argmax(bad))
            raise WorkloadError(f"{path}: line {i + 2}: column {column!r} value {str(df[column].iloc[i])!r} {why}"
                                + (f" ({int(bad.sum())} such rows)" if bad.sum() > 1 else ""))
    return values.astype(np.int64) if integer else values


def memo_by_file(read: Callable[..., R]) -> Callable[..., R]:
    """Memoise `read(path, *args)` per process on the file's identity (resolved path, size,
    modification time): a sweep loads the workload once per point, the file is parsed once
    per worker. Callers must not modify what `read` returns."""

    @functools.lru_cache(maxsize=8)
    def cached(key: tuple[str, int, int], *args: Any) -> R:
        return read(Path(key[0]), *args)

    @functools.wraps(read)
    def wrapper(path: Path, *args: Any) -> R:
        st = path.stat()
        return cached((str(path.resolve()), st.st_size, st.st_mtime_ns), *args)

    return wrapper
