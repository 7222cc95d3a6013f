"""Calibration table schema and CSV I/O (pure Python: the simulator reads these).

One CSV per table at `results/calibration/<gpu>/<model>/<table>.csv`, one row per
(mode, shape). `us` is the median time of one call in microseconds; the axes a table
is interpolated over are listed in TABLES with their interpolation scale.
"""
from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

from core.files import atomic_write_text

MODES = ("graph", "eager")
COLUMNS = ("mode", "B", "P", "ctx", "tokens", "us", "us_p10", "us_p90", "reps", "copies",
           "flops", "bytes", "pct_bw", "pct_flops")
STEP_COLUMNS = ("mode", "B", "P", "ctx", "kernel", "step_us", "host_step_us", "kernel_us", "reps")
SEQS_COLUMNS = (*COLUMNS, "seqs")  # tables with a `seqs` axis (gdn_prefill_varlen)
# gdn_decode_conv.csv: per policy (mamba_state_commit) over decode tokens (calibrate.tables.decode_conv);
# not in TABLES: the simulator reads the rows of its run's policy only.
DECODE_CONV = "gdn_decode_conv"
DECODE_CONV_COLUMNS = ("policy", *COLUMNS)


@dataclass(frozen=True)
class TableSpec:
    axes: tuple[str, ...]  # columns the time is interpolated over
    scales: tuple[str, ...]  # "log" or "linear" per axis
    what: str
    required: bool = True  # optional: a package the GPU image may lack (fla), or one model kind's (moe, mlp)
    # An axis along which a table may lack its low cells (gdn_prefill_varlen measures `seqs`
    # sequences only from 8 x seqs tokens on): each missing cell takes the first measured value
    # above it along that axis, the module's out-of-grid rule for a value below an axis.
    fill_low: str | None = None


TABLES: dict[str, TableSpec] = {
    "gdn": TableSpec(("tokens",), ("log",), "GDN layer's dense halves around its core: norm, in_proj; gated RMSNorm, out_proj (the conv, gating and q/k norms are the core's: gdn_decode_conv, gdn_prefill_varlen)"),
    "attn_proj": TableSpec(("tokens",), ("log",), "attention layer without the core: norm, QKV proj, q/k norm, RoPE, KV write, gate, o_proj"),
    "attn_decode": TableSpec(("B", "P", "ctx"), ("log", "log", "linear"), "attention core: B sequences x P verify queries over ctx cached tokens"),
    "attn_prefill": TableSpec(("tokens", "ctx"), ("log", "linear"), "attention core: one prefill chunk of `tokens` after ctx cached tokens"),
    "moe": TableSpec(("tokens",), ("log",), "MoE block: norm, router, top-k, grouped expert GEMMs, shared expert", required=False),
    "mlp": TableSpec(("tokens",), ("log",), "a dense model's MLP block: norm, gate_up GEMM, SiLU x up, down GEMM", required=False),
    "lm_head": TableSpec(("tokens",), ("log",), "final norm, LM head and greedy sampling over `tokens` rows"),
    "gdn_prefill": TableSpec(("tokens",), ("log",), "GDN prefill recurrence of one `tokens` chunk: fla's chunk_gated_delta_rule as vLLM calls it", required=False),
    "mtp_fc": TableSpec(("tokens",), ("log",), "MTP drafter input: two norms, concat, fc (the rest of the MTP layer is an attention layer + MoE)"),
    "gdn_prefill_varlen": TableSpec(("tokens", "seqs"), ("log", "log"), "GDN prefill of one step: ONE varlen conv + fla chunk call over `tokens` prompt tokens of `seqs` sequences (cu_seqlens), as vLLM makes it per layer", required=False, fill_low="tokens"),
}

# Host time to ISSUE one op with the GPU kept busy (Python + launch, not GPU time), measured
# by the step executor: results/calibration/<gpu>/<model>/host.csv, one row per (op, n).
HOST_COLUMNS = ("op", "n", "us", "us_p10", "us_p90", "reps")
# host_policies.csv: the ops whose launches the commit policy decides, measured per policy
# (replay's verify concatenates its caches and builds the combined tree: ~2x store_all's launches).
HOST_POLICY_COLUMNS = ("policy",) + HOST_COLUMNS
HOST_POLICY_OPS = ("gdn_verify", "gdn_commit")
HOST_OPS: dict[str, str] = {
    "step_prepare": "requests: input/metadata prep and host-to-device copies before the first launch",
    "step_finish": "requests: sampled tokens to the host and bookkeeping after the GPU is done",
    "full_graph": "padded tokens: one full-graph replay",
    "piece_graph": "padded tokens: one piecewise graph piece replay",
    "attn_core": "requests: one eager paged-attention call incl. its KV write",
    "gdn_prefill": "sequences: one varlen conv + fla chunk call",
    "gdn_verify": "requests: conv update + the policy's verify kernel",
    "gdn_commit": "requests: the policy's commit",
    "eager_dense_gdn": "tokens: the dense parts of one GDN layer launched eagerly (above the largest capture size)",
    "eager_dense_attn": "tokens: the dense parts of one attention layer launched eagerly",
    "eager_moe": "tokens: one MoE block launched eagerly",
    "drafter_pass": "tokens: one MTP drafter pass with its LM head",
    "sample": "rows: LM head, greedy sampling and acceptance launches after the target forward",
}


# sampler.csv (beside the model folders; calibrate.benches.sampler): what vLLM's sampler costs beyond
# the lm_head table's greedy argmax, per sampling path, vocabulary, logits distribution and rows.
SAMPLER_COLUMNS = ("sampling", "vocab", "dist", "rows", "mode", "path", "greedy_us", "sampled_us", "extra_us",
                   "greedy_us_p90", "sampled_us_p90", "reps", "pct_copy")


# gdn_mixed.csv (per model; calibrate.benches.gdn_mixed): one GDN layer's core in a step of B one-token
# decodes and one `tokens`-token prefill as vLLM runs it (all through the chunked prefill kernel, their
# states gathered and scattered), the prefill alone, and the difference: what the decodes cost there.
GDN_MIXED_COLUMNS = ("model", "mode", "B", "tokens", "us", "us_p10", "us_p90", "reps", "prefill_alone_us", "extra_us",
                     "state_bytes_moved", "pct_copy")


class TableError(ValueError):
    """A calibration table is missing, malformed or incomplete."""


def table_path(root: Path, model: str, table: str) -> Path:
    return root / model / f"{table}.csv"


def write_rows(path: Path, rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> None:
    """Whole or not at all (a temporary name, then a rename): a measurement cut off keeps the last table."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise")
    w.writeheader()
    for r in rows:
        w.writerow({c: r[c] for c in columns})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())


# Parsed tables by their bytes' digest and the columns asked for: a sweep's worker runs many
# points on the same tables, and parsing them was a fifth of a second of every point.
_PARSED: dict[tuple[bytes, tuple[str, ...]], list[dict]] = {}


def read_rows(path: Path, required: tuple[str, ...] = COLUMNS) -> list[dict]:
    """Rows as dicts with numeric fields converted; raises TableError naming missing columns.
    Each call returns its own dicts (a file whose bytes were parsed before is not parsed again)."""
    if not path.exists():
        raise TableError(f"{path}: no such calibration table")
    data = path.read_bytes()
    key = (hashlib.sha256(data).digest(), tuple(required))
    rows = _PARSED.get(key)
    if rows is None:
        reader = csv.DictReader(io.StringIO(data.decode(), newline=""))
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TableError(f"{path}: missing columns {missing}; has {reader.fieldnames}")
        rows = [{k: _number(v) for k, v in r.items()} for r in reader]
        if not rows:
            raise TableError(f"{path}: no rows")
        _PARSED[key] = rows
    return [dict(r) for r in rows]


def _number(v: str) -> object:
    for cast in (int, float):
        try:
            return cast(v)
        except (TypeError, ValueError):
            pass
    return v
