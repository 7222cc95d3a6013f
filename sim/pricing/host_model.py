"""The host side of an engine step and the two-resource pipeline that joins it to GPU time.

A step is a sequence of ops, each with a host cost (the Python + launch time to ISSUE
it) and a GPU time. The host issues them in order; each op starts on the GPU when it
has been issued and the GPU is free; the step ends when the GPU has finished and the
host has collected the sampled tokens (`step_finish`):

    h = step_prepare;  gpu = 0
    for each op:  h += host;  gpu = max(h, gpu) + gpu_time
    step = max(h, gpu) + step_finish

So an eager op's launch cost is hidden behind GPU work already queued and exposed only
when the GPU runs dry (docs/vllm.md#execution-modes; docs/notes/2026-11-29-h200-reference-points.md: asynchronous execution took
the sum of GPU times + 1-8%). Under async scheduling (vLLM's default with MTP) the host
prepares step N+1 and processes step N's outputs while the GPU runs: `step_prepare` and
`step_finish` leave the critical path, and the step takes
max(GPU chain issued from t = 0, all host work of the step).

Host costs come from `host.csv` (measured by `specsim calibrate replay` on the GPU
machine, columns core.tables.HOST_COLUMNS); an op it lacks is priced by ANALYTIC_US below
and labelled 'analytic'. Each op is timed alone, issued again and again behind a busy
GPU, in the fastest of several passes, which is not what it costs inside a real step (priced
with those costs as measured, the replay's mixed and prefill-only steps came out 11-22% too
short: `unscaled` in host_fit.json); `host_fit.json` beside host.csv (written by
`specsim calibrate replay --summarize DIR --fit-host`, calibrate.replay.host_fit) holds one scale
per group of ops (HOST_GROUPS) fitted to the replayed whole steps, applied on load.
host.csv is measured under one commit policy; `host_policies.csv` beside it holds the ops a
policy launches itself (core.tables.HOST_POLICY_OPS) for each policy, and a run's own rows
replace host.csv's for those ops.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from core.calibration_files import model_file
from core.interp import Curve1D, from_rows
from core.tables import HOST_COLUMNS, HOST_OPS, HOST_POLICY_COLUMNS, HOST_POLICY_OPS, TableError, read_rows

# Host cost per op when host.csv does not measure it, microseconds. Assumed lower
# bounds from the H200 anchors, not measurements of this op:
#   - an eager kernel call costs 45-160 us of Python overhead (docs/notes/2026-11-29-h200-reference-points.md): 45;
#   - fla's varlen chunk call costs 560-1,060 us of host time (docs/notes/2026-11-29-h200-reference-points.md): 560;
#   - a CUDA-graph replay is one cudaGraphLaunch from Python: assumed 10 (20 for a full
#     forward, whose replay also copies its static inputs);
#   - step_prepare + step_finish share the per-step overhead (STEP_OVERHEAD_US, or the
#     whole-step check's host-minus-GPU time where measured) half and half.
EAGER_CALL_US = 45.0
PIECE_REPLAY_US = 10.0
ANALYTIC_US: dict[str, float] = {
    "full_graph": 2 * PIECE_REPLAY_US,
    "piece_graph": PIECE_REPLAY_US,
    "attn_core": EAGER_CALL_US,
    "gdn_prefill": 560.0,
    "gdn_verify": EAGER_CALL_US,
    "gdn_commit": EAGER_CALL_US,
    "eager_dense_gdn": EAGER_CALL_US,
    "eager_dense_attn": EAGER_CALL_US,
    "eager_moe": EAGER_CALL_US,
    "drafter_pass": 2 * PIECE_REPLAY_US + 2 * EAGER_CALL_US,  # two pieces, attention core, LM head
    "sample": EAGER_CALL_US,
}
STEP_OVERHEAD_US = 400.0  # vLLM v1's step loop: a few hundred microseconds of Python (assumed)
STEP_OPS = ("step_prepare", "step_finish")
# The groups of ops host_fit.json scales together (each group's ops have the same kind of host
# work: a varlen prefill's Python, eager dense launches, graph replays, the cores' few launches).
HOST_GROUPS: dict[str, tuple[str, ...]] = {
    "prefill": ("gdn_prefill",),
    "eager": ("eager_dense_gdn", "eager_dense_attn", "eager_moe"),
    "graph": ("piece_graph", "full_graph", "drafter_pass"),
    "core": ("attn_core", "gdn_verify", "gdn_commit", "sample"),
    "step": STEP_OPS,
}
HOST_FIT = "host_fit.json"
HOST_POLICIES = "host_policies.csv"  # per-policy rows of HOST_POLICY_OPS (core.tables)


class HostCosts:
    """Host cost per (op, n) in microseconds: measured curves over n where host.csv has the op."""

    def __init__(self, curves: dict[str, Curve1D], step_overhead_us: float | None = None, scale: float = 1.0,
                 step_source: str = "analytic", group_scales: dict[str, float] | None = None) -> None:
        """`step_overhead_us`: prepare + finish where host.csv lacks them (`step_source` says whence).
        `group_scales`: a factor per HOST_GROUPS group on the measured curves (host_fit.json)."""
        unknown = sorted(set(curves) - set(HOST_OPS))
        if unknown:
            raise TableError(f"host.csv: unknown ops {unknown}; valid: {', '.join(HOST_OPS)}")
        bad = sorted(set(group_scales or {}) - set(HOST_GROUPS))
        if bad:
            raise TableError(f"{HOST_FIT}: unknown groups {bad}; valid: {', '.join(HOST_GROUPS)}")
        self.curves = curves
        self.scale = scale
        self.group_scales = dict(group_scales or {})
        self.op_scale = {op: self.group_scales.get(g, 1.0) for g, ops in HOST_GROUPS.items() for op in ops
                         if op in curves}
        half = (STEP_OVERHEAD_US if step_overhead_us is None else step_overhead_us) / 2
        self.fixed = {**ANALYTIC_US, "step_prepare": half, "step_finish": half}
        self.sources = {op: "calibrated" if op in curves else step_source if op in STEP_OPS else "analytic"
                        for op in HOST_OPS}

    def us(self, op: str, n: float) -> float:
        c = self.curves.get(op)
        if c is None:
            return self.fixed[op] * self.scale
        return c(max(n, 1.0)) * self.op_scale.get(op, 1.0) * self.scale

    def with_group_scales(self, group_scales: dict[str, float]) -> "HostCosts":
        """The same costs under other HOST_GROUPS scales (calibrate.replay.host_fit tries many)."""
        out = HostCosts(self.curves, None, self.scale, group_scales=group_scales)
        out.fixed, out.sources = self.fixed, self.sources
        return out

    @property
    def source(self) -> str:
        """'calibrated' when host.csv measured every op the pipeline issues, else 'analytic' or 'mixed'."""
        kinds = set(self.sources.values())
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @classmethod
    def load(cls, path: Path, step_overhead_us: float | None = None, scale: float = 1.0,
             step_source: str = "analytic", extrapolate: bool = True, policy: str | None = None) -> "HostCosts":
        """From host.csv where it exists (scaled by host_fit.json beside it, if any), else every op analytic.
        policy: the commit policy's rows of host_policies.csv beside it, where it has them, replace
        host.csv's (measured under one policy) for the ops the policy launches (HOST_POLICY_OPS)."""
        if not path.exists():
            return cls({}, step_overhead_us, scale, step_source)
        fit = model_file(path.parent.parent, path.parent.name, HOST_FIT)
        try:
            groups = json.loads(fit.read_text())["scales"] if fit.exists() else None
        except (ValueError, KeyError, TypeError) as e:
            raise TableError(f"{fit}: {type(e).__name__}: {e} (expected a JSON object with 'scales')") from None
        rows = read_rows(path, HOST_COLUMNS)
        curves = {}
        for op in sorted({str(r["op"]) for r in rows}):
            try:
                curves[op] = from_rows(f"host/{op}", [r for r in rows if r["op"] == op], ("n",), ("log",),
                                       extrapolate=extrapolate).partial()
            except ValueError as e:
                raise TableError(f"{path}: op {op}: {e}") from None
        pol = model_file(path.parent.parent, path.parent.name, HOST_POLICIES)
        if policy and pol.exists():
            rows = read_rows(pol, HOST_POLICY_COLUMNS)
            bad = sorted({str(r["op"]) for r in rows} - set(HOST_POLICY_OPS))
            if bad:
                raise TableError(f"{pol}: ops {bad} are not priced per policy; valid: {', '.join(HOST_POLICY_OPS)}")
            for op in HOST_POLICY_OPS:
                mine = [r for r in rows if r["op"] == op and r["policy"] == policy]
                if mine:
                    try:
                        curves[op] = from_rows(f"host/{policy}/{op}", mine, ("n",), ("log",),
                                               extrapolate=extrapolate).partial()
                    except ValueError as e:
                        raise TableError(f"{pol}: policy {policy} op {op}: {e}") from None
        return cls(curves, step_overhead_us, scale, step_source, groups)


class PipelineOp(NamedTuple):
    """One op of a step: its GPU time adds `count` x cores[core], the attention cores that depend
    on the step's contexts (so one op list serves every step of a batch shape)."""

    host_us: float  # the cost to issue it
    gpu_us: float
    core: int
    count: int


def pipeline(ops: Sequence[PipelineOp], prepare_us: float, finish_us: float,
             async_scheduling: bool = False, cores: Sequence[float] = (0.0,)) -> float:
    """Step time (us) of ops issued in order; see the module doc."""
    h = 0.0 if async_scheduling else prepare_us
    gpu = 0.0
    for host, g, c, k in ops:
        h += host
        gpu = (h if h > gpu else gpu) + g
        if k:
            gpu += k * cores[c]
    if async_scheduling:  # h is then the ops' host costs summed
        return max(gpu, prepare_us + h + finish_us)
    return max(h, gpu) + finish_us


def pipeline_many(ops: Sequence[PipelineOp], prepare_us: float, finish_us: float, async_scheduling: bool,
                  cores: Sequence[np.ndarray]) -> np.ndarray:
    """`pipeline` of several steps that differ only in their attention cores (one array per core,
    one entry per step): the same floats, worked out over the arrays."""
    h = 0.0 if async_scheduling else prepare_us
    gpu: float | np.ndarray = 0.0
    for host, g, c, k in ops:
        h += host
        gpu = np.maximum(h, gpu) + g
        if k:
            gpu = gpu + k * cores[c]
    if async_scheduling:
        return np.maximum(gpu, prepare_us + h + finish_us)
    return np.maximum(h, gpu) + finish_us
