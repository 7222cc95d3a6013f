"""The host side of an engine step and the two-resource pipeline that joins it to GPU time.

A step is a sequence of ops, each with a host cost (the Python + launch time to ISSUE
it) and a GPU time. The host issues them in order; each op starts on the GPU when it
has been issued and the GPU is free; the step ends when the GPU has finished and the
host has collected the sampled tokens (`step_finish`):

    h = step_prepare;  gpu = 0
    for each op:  h += host;  gpu = max(h, gpu) + gpu_time
    step = max(h, gpu) + step_finish

So an eager op's launch cost is hidden behind GPU work already queued and exposed only
when the GPU runs dry (VLLM_FACTS.md section 1; ANCHORS.md: asynchronous execution took
the sum of GPU times + 1-8%). Under async scheduling (vLLM's default with MTP) the host
prepares step N+1 and processes step N's outputs while the GPU runs: `step_prepare` and
`step_finish` leave the critical path, and the step takes
max(GPU chain issued from t = 0, all host work of the step).

Host costs come from `host.csv` (measured by `specsim calibrate` on the GPU machine,
columns core.tables.HOST_COLUMNS); an op it lacks is priced by ANALYTIC_US below and
labelled 'analytic'.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.interp import Curve1D, from_rows
from core.tables import HOST_COLUMNS, HOST_OPS, TableError, read_rows

# Host cost per op when host.csv does not measure it, microseconds. Assumed lower
# bounds from the H200 anchors, not measurements of this op:
#   - an eager kernel call costs 45-160 us of Python overhead (ANCHORS.md): 45;
#   - fla's varlen chunk call costs 560-1,060 us of host time (ANCHORS.md): 560;
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


class HostCosts:
    """Host cost per (op, n) in microseconds: measured curves over n where host.csv has the op."""

    def __init__(self, curves: dict[str, Curve1D], step_overhead_us: float | None = None, scale: float = 1.0,
                 step_source: str = "analytic") -> None:
        """`step_overhead_us`: prepare + finish where host.csv lacks them (`step_source` says whence)."""
        unknown = sorted(set(curves) - set(HOST_OPS))
        if unknown:
            raise TableError(f"host.csv: unknown ops {unknown}; valid: {', '.join(HOST_OPS)}")
        self.curves = curves
        self.scale = scale
        half = (STEP_OVERHEAD_US if step_overhead_us is None else step_overhead_us) / 2
        self.fixed = {**ANALYTIC_US, "step_prepare": half, "step_finish": half}
        self.sources = {op: "calibrated" if op in curves else step_source if op in STEP_OPS else "analytic"
                        for op in HOST_OPS}

    def us(self, op: str, n: float) -> float:
        c = self.curves.get(op)
        return (c(max(n, 1.0)) if c is not None else self.fixed[op]) * self.scale

    @property
    def source(self) -> str:
        """'calibrated' when host.csv measured every op the pipeline issues, else 'analytic' or 'mixed'."""
        kinds = set(self.sources.values())
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @classmethod
    def load(cls, path: Path, step_overhead_us: float | None = None, scale: float = 1.0,
             step_source: str = "analytic", extrapolate: bool = True) -> "HostCosts":
        """From host.csv where it exists, else every op analytic."""
        if not path.exists():
            return cls({}, step_overhead_us, scale, step_source)
        rows = read_rows(path, HOST_COLUMNS)
        curves = {}
        for op in sorted({str(r["op"]) for r in rows}):
            try:
                curves[op] = from_rows(f"host/{op}", [r for r in rows if r["op"] == op], ("n",), ("log",),
                                       extrapolate=extrapolate).partial()
            except ValueError as e:
                raise TableError(f"{path}: op {op}: {e}") from None
        return cls(curves, step_overhead_us, scale, step_source)


def pipeline(ops: Sequence[tuple[float, float, int, int]], prepare_us: float, finish_us: float,
             async_scheduling: bool = False, cores: Sequence[float] = (0.0,), host_total_us: float | None = None) -> float:
    """Step time (us) of ops issued in order; see the module doc. An op is (host cost, GPU time,
    core, count): its GPU time adds `count` x cores[core], the attention cores that depend on the
    step's contexts (so one op list serves every step of a batch shape). `host_total_us`, the sum
    of the host costs, may be passed precomputed (async scheduling needs it)."""
    h = 0.0 if async_scheduling else prepare_us
    gpu = 0.0
    for host, g, c, k in ops:
        h += host
        gpu = (h if h > gpu else gpu) + g + (k * cores[c] if k else 0.0)
    if async_scheduling:
        total = sum(op[0] for op in ops) if host_total_us is None else host_total_us
        return max(gpu, prepare_us + total + finish_us)
    return max(h, gpu) + finish_us
