"""Choosing the policy's rows of kernels.csv (the kernels bench) and turning them into curves over B.

A policy's verify and commit kernels were benched per tree shape (T = verify positions),
SSM-state dtype, and for replay per count of replayed tokens and flush flag; these
functions pick the rows that match the run and interpolate a chain that was not benched.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from core.config import ModelConfig
from core.interp import GridInterpolator, from_rows
from core.tables import read_rows
from policies import CommitPolicy
from sim.pricing.calibration_tables import MODES

KERNEL_COLUMNS = ("model", "policy", "B", "T", "verify_us", "commit_us", "mode")
REPLAY_COLUMNS = ("replay_tokens", "replayed_tokens", "cached_tokens")  # the kernels bench's name for it
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # kernels.csv `state_dtype`


def _tree_key(text: Any) -> tuple[int, ...] | None:
    nums = tuple(int(x) for x in re.findall(r"\d+", str(text)))
    return nums or None


def _by_mode(name: str, rows: list[dict], value: str, extrapolate: bool) -> dict[str, GridInterpolator]:
    """One curve over B per mode; a mode whose rows repeat a B is left out (ambiguous)."""
    out = {}
    for mode in MODES:
        sel = [r for r in rows if r["mode"] == mode]
        if sel and len({r["B"] for r in sel}) == len(sel) and all(float(r[value]) > 0 for r in sel):
            out[mode] = from_rows(f"{name}[{mode}]", sel, ("B",), ("log",), value=value, extrapolate=extrapolate)
    return out


def _select(rows: list[dict], policy: str, widths: tuple[int, ...], replay_col: str | None,
            replayed: int = 0, flush: int | None = None) -> list[dict]:
    """Rows of one policy at this tree (T = verify positions), replayed-token count and flush flag."""
    t = 1 + sum(_nodes(widths))
    sel = [r for r in rows if r["policy"] == policy and int(r["T"]) == t
           and (replay_col is None or int(r[replay_col] or 0) == replayed)
           and (flush is None or "flush" not in r or int(r["flush"]) == flush)]
    if not sel or "tree" not in sel[0]:
        return sel
    exact = [r for r in sel if _tree_key(r["tree"]) == widths]
    if exact or any(w != 1 for w in widths):
        return exact
    # A chain may be written as widths, as its length, or by name.
    return [r for r in sel if _tree_key(r["tree"]) in (None, (t - 1,), (t,))]


def _chain_between(rows: list[dict], policy: str, t: int, replay_col: str | None) -> list[dict]:
    """A chain of t positions that was not benchmarked: per (B, mode), log-log between the
    nearest measured chains below and above t (kernel time grows smoothly with chain length)."""
    measured = {}
    for T in sorted({int(r["T"]) for r in rows if r["policy"] == policy and int(r["T"]) >= 2}):
        sel = _select(rows, policy, (1,) * (T - 1), replay_col, flush=1)
        if sel:
            measured[T] = {(r["B"], r["mode"]): r for r in sel}
    lo = max((T for T in measured if T < t), default=None)
    hi = min((T for T in measured if T > t), default=None)
    if lo is None or hi is None:
        return []
    w = math.log(t / lo) / math.log(hi / lo)
    out = []
    for key, r in measured[lo].items():
        h = measured[hi].get(key)
        if h is None:
            continue
        out.append({**r, "T": t, "tree": f"chain {t} (between {lo} and {hi})",
                    **{c: float(r[c]) ** (1 - w) * float(h[c]) ** w for c in ("verify_us", "commit_us")}})
    return out


def _nodes(widths: tuple[int, ...]) -> list[int]:
    out, n = [], 1
    for w in widths:
        n *= w
        out.append(n)
    return out


def load_kernels(path: Path, model: ModelConfig, policy: CommitPolicy, *, extrapolate: bool = True) -> dict[str, Any]:
    """The policy's verify/commit curves over B for its tree, from the kernels bench.

    Rows are the model's and, where kernels.csv has a `state_dtype` column, its SSM-state
    dtype's; the policy's rows are found by its kernel name (e.g. reconstruct_deferred).
    Returns {} when kernels.csv is absent or has no such rows. Keys, where measured: 'verify' and 'commit'
    (mode -> curve over B, microseconds per GDN layer; replay's commit with a flush),
    'replay' ((most replayed tokens measured, verify curves at that count)) and
    'append' (replay's commit without a flush).
    """
    if not path.exists():
        return {}
    rows = [r for r in read_rows(path, KERNEL_COLUMNS) if r["model"] == model.name]
    if rows and "state_dtype" in rows[0]:
        # Kernels benched at the model's SSM-state dtype only (fp32 states move twice the bytes);
        # a table without the column predates it: bf16 states.
        rows = [r for r in rows if STATE_DTYPE_BYTES.get(str(r["state_dtype"])) == model.state_dtype_bytes]
    if not rows:
        return {}
    rep = next((c for c in REPLAY_COLUMNS if c in rows[0]), None)
    widths = policy.tree.widths
    out: dict[str, Any] = {}
    # Rows without replayed tokens commit with a flush (the state written back).
    sel = _select(rows, policy.kernel, widths, rep, flush=1)
    if not sel and policy.tree.is_chain:
        sel = _chain_between(rows, policy.kernel, policy.tree.verify_positions, rep)
    out["verify"] = _by_mode(f"kernels/{policy.kernel}.verify", sel, "verify_us", extrapolate)
    out["commit"] = _by_mode(f"kernels/{policy.kernel}.commit", sel, "commit_us", extrapolate)
    if rep and policy.name == "replay":
        counts = sorted({int(r[rep] or 0) for r in rows if r["policy"] == policy.kernel
                         and int(r["T"]) == policy.tree.verify_positions})
        if counts and counts[-1] > 0:
            most = _select(rows, policy.kernel, widths, rep, counts[-1], flush=0)
            curves = _by_mode(f"kernels/{policy.kernel}.verify@{counts[-1]}", most, "verify_us", extrapolate)
            out["replay"] = (counts[-1], curves) if curves else None
            # A commit that only appends the accepted inputs (no flush this step).
            out["append"] = _by_mode(f"kernels/{policy.kernel}.append", most, "commit_us", extrapolate)
    return {k: v for k, v in out.items() if v}
