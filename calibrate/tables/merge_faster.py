"""`specsim calibrate merge --faster-of TABLE`: two measured stand-ins for one vLLM kernel, each
shape priced by the faster.

Where vLLM's kernel cannot run on the measuring machine (FlashAttention 3, vLLM's CUTLASS
block-FP8 GEMM), the calibrator times stand-ins: a packaged kernel (flash-attn-4, cuBLASLt) and
ours. Neither is uniformly faster (flash-attn-4 runs one KV split on SM90, so ours wins small
decode batches over long contexts; cuBLASLt wins large GEMMs, ours the few-token ones), and a
table of the slower one at a shape prices a kernel slower than vLLM's there. So a merged table may
keep, for each shape both runs measured on the same grid, the faster row as measured, with a
`kernel` column naming which stand-in it timed. Nothing is interpolated or edited: every row is a
measured row of one of the two runs.
"""
from __future__ import annotations

from core.errors import ConfigError
from core.tables import TABLES

# Our kernels' names where a run's provenance names no packaged kernel for a table.
OURS = {"attn_decode": "calibrate/kernels/paged_attention.py (Triton)",
        "attn_prefill": "calibrate/kernels/paged_attention.py (Triton)"}


def kernel_label(parts: list[dict], table: str) -> str:
    """The kernel the latest part that measured `table` timed (its `packaged_kernels`, else ours)."""
    for part in reversed(parts):
        if table in part.get("jobs", {}):
            return part.get("packaged_kernels", {}).get(table) or OURS.get(table, "calibrate/kernels (Triton)")
    raise ConfigError(f"--faster-of {table}: no provenance part measured it")


def faster_rows(table: str, current: list[dict], new: list[dict], modes: set[str],
                current_kernel: str, new_kernel: str) -> tuple[list[dict], int]:
    """The current rows with each shape of `modes` taken from whichever side timed it faster; a
    row's `kernel` says which (a current row keeps its own label). Returns the rows and how many
    came from `new`. Both sides must hold the same shapes in those modes."""
    axes = TABLES[table].axes

    def key(r: dict) -> tuple:
        return (r["mode"],) + tuple(float(r[a]) for a in axes)

    old = {key(r): r for r in current if r["mode"] in modes}
    fresh = {key(r): r for r in new if r["mode"] in modes}
    if set(old) != set(fresh):
        only = sorted(set(old) ^ set(fresh))[:3]
        raise ConfigError(f"--faster-of {table}: the two runs' grids differ (e.g. {only}); "
                          "measure both stand-ins on the same grid")
    out, taken = [], 0
    for r in current:
        if r["mode"] not in modes:  # a mode the new run did not measure: as it was
            out.append(r)
        elif float(fresh[key(r)]["us"]) < float(r["us"]):
            out.append({**fresh[key(r)], "kernel": new_kernel})
            taken += 1
        else:
            out.append({**r, "kernel": r.get("kernel") or current_kernel})
    return out, taken
