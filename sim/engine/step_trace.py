"""The per-step trace of a simulator run (`specsim run --trace-steps` -> RUN/steps.csv).

It records everything a real GPU needs to execute each step again (the replay,
`specsim calibrate replay`): per scheduled request its prefill chunk and context, or
the draft tree it verifies and how many positions were accepted, plus the kind the
simulator dispatched the step as (`sim.pricing.dispatch`) and the per-term prediction.

File format (one file, written atomically):
  line 1   `# specsim-steps v1 {json}`: the resolved RunConfig the run used
  line 2   CSV header: step, time_s, kind, num_seqs, num_tokens, prefill_tokens,
           predicted_us, one `us_<term>` column per predicted term, requests
  then     one row per step; `requests` is a JSON list with one list per request in
           REQUEST_FIELDS order (compact: a loaded server schedules ~100 per step).

`batch_of_totals` is the one place that turns a step's requests, summed into BatchTotals,
into the StepBatch the latency model prices: the engine sums the batch gathered into
columns (`column_totals`) and `batch_of` a traced step's rows (`assemble_batch`), so a
replayed step is priced exactly as the simulator priced it.
"""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import Any, NamedTuple

from core.config import EngineConfig, ModelConfig
from core.files import atomic_write_text
from policies import CommitPolicy
from sim.pricing.dispatch import STEP_KINDS, capture_sizes, dispatch_counts
from sim.pricing.latency import StepBatch

MAGIC = "# specsim-steps v1 "
REQUEST_FIELDS = ("rid", "prefill", "context", "tree", "accepted", "replayed", "flush")
HEAD = ("step", "time_s", "kind", "num_seqs", "num_tokens", "prefill_tokens", "predicted_us")
TERM_PREFIX = "us_"

__all__ = ["STEP_KINDS", "BatchColumns", "BatchRequest", "BatchTotals", "StepTraceError", "TracedRequest", "TracedStep",
           "add_totals", "assemble_batch", "assemble_columns", "batch_of", "batch_of_totals", "column_totals",
           "read_steps", "write_steps"]


class StepTraceError(ValueError):
    """A steps.csv that cannot be read back: the message names the file, line and field."""


@dataclass(frozen=True)
class TracedRequest:
    rid: int
    prefill: int  # prompt tokens scheduled this step (0 while decoding)
    context: int  # tokens already in the KV cache before this step
    tree: tuple[int, ...]  # draft-tree widths verified this step; () = no speculation (prefill chunk or 1-token decode)
    accepted: int  # verify positions accepted this step incl. the bonus token (0 for a prefill chunk)
    replayed: int = 0  # replay policy: cached accepted tokens replayed before the tree
    flush: bool = True  # replay policy: the commit writes the state back this step (other policies: always)

    @property
    def query_tokens(self) -> int:
        """Target tokens this request puts into the forward."""
        if self.prefill:
            return self.prefill
        nodes, n = 0, 1
        for w in self.tree:
            n *= w
            nodes += n
        return 1 + nodes


@dataclass(frozen=True)
class TracedStep:
    step: int
    time_s: float
    kind: str  # one of STEP_KINDS, as the simulator dispatched it (vLLM's rules, docs/vllm.md#execution-modes)
    requests: tuple[TracedRequest, ...]
    predicted_us: float
    terms_us: dict[str, float]  # the per-term prediction


# --------------------------------------------------------------------- batches
class BatchRequest(NamedTuple):
    """One scheduled request as the latency model sees it."""

    query_tokens: int
    context: int  # tokens already in the KV cache
    decoding: bool  # a decode (verify or 1 token), not a prompt chunk
    spec: bool  # verifies a draft tree
    replayed: int  # replay policy: cached tokens replayed before the tree
    flush: bool  # the commit writes the state back (other policies: always)


def assemble_batch(reqs: Iterable[BatchRequest], *, verify_positions: int, draft_depth: int,
                   sizes: Sequence[int], full_graph_ok: bool,
                   requests: tuple[TracedRequest, ...] = ()) -> StepBatch:
    """The StepBatch of one step's scheduled requests, dispatched by vLLM's rules
    (`requests`: the same requests in detail, kept in the batch when tracing)."""
    rows = list(reqs)
    decoding = [r[2] for r in rows]
    spec = [r[3] and r[2] for r in rows]  # a prompt chunk verifies nothing
    return assemble_columns(BatchColumns([r[0] for r in rows], [r[1] for r in rows], decoding, spec,
                                         [r[4] for r in rows], [r[5] for r in rows]),
                            verify_positions=verify_positions, draft_depth=draft_depth, sizes=sizes,
                            full_graph_ok=full_graph_ok, requests=requests)


class BatchColumns(NamedTuple):
    """A step's scheduled requests as columns, one entry per request in scheduling order
    (the engine gathers them over the batch; a request that verifies a draft also decodes)."""

    tokens: list[int]  # query tokens
    contexts: list[int]  # tokens already in the KV cache
    decoding: list[bool]  # a decode (verify or 1 token), not a prompt chunk
    spec: list[bool]  # verifies a draft tree
    replayed: list[int] | None = None  # replay policy: cached tokens replayed before the tree (None: none)
    flush: list[bool] | None = None  # the commit writes the state back (None: every commit does)


class BatchTotals(NamedTuple):
    """A step's scheduled requests summed over the batch: with the run's constants (verify
    positions, drafter passes, capture sizes, whether full graphs are allowed) they fix the
    StepBatch, so two steps with equal totals are the same batch to the latency model."""

    num_seqs: int
    tokens: int  # query tokens, all requests
    decode_seqs: int
    uniform: bool  # every request decodes with the uniform decode's query length (sim.pricing.dispatch)
    spec_seqs: int
    truncated: int  # verify positions cut from chains by the token budget
    replay_tokens: int
    flush_seqs: int
    context_tokens: int
    max_context: int
    chunks: tuple[tuple[int, int], ...]  # (tokens, context) per prompt chunk, in scheduling order


def column_totals(c: BatchColumns, *, verify_positions: int, draft_depth: int) -> BatchTotals:
    """The totals of a step gathered as columns: sums over the batch, no object per request."""
    tokens, contexts, decoding, spec = c.tokens, c.contexts, c.decoding, c.spec
    num_seqs = len(tokens)
    if not num_seqs:
        raise ValueError("a step needs at least one request")
    uniform_len = verify_positions if draft_depth else 1  # the uniform decode's query length
    if all(decoding):
        chunks: tuple[tuple[int, int], ...] = ()
        uniform = tokens.count(uniform_len) == num_seqs  # every decoding request runs it
    else:
        chunks = tuple([(n, ctx) for n, ctx, dec in zip(tokens, contexts, decoding) if not dec])
        uniform = False  # a batch with prompt chunks is never a uniform decode (sim.pricing.dispatch)
    spec_seqs = spec.count(True)
    total = sum(tokens)
    verify_tokens = total if spec_seqs == num_seqs else sum(compress(tokens, spec))
    replay_tokens = sum(compress(c.replayed, spec)) if c.replayed is not None else 0
    flush_seqs = sum(map(bool, compress(c.flush, spec))) if c.flush is not None else spec_seqs
    return BatchTotals(num_seqs, total, num_seqs - len(chunks), uniform, spec_seqs,
                       verify_positions * spec_seqs - verify_tokens, replay_tokens, flush_seqs, sum(contexts),
                       max(contexts), chunks)


def add_totals(a: BatchTotals, b: BatchTotals) -> BatchTotals:
    """The totals of two parts of one step's batch (`a` first in scheduling order)."""
    return BatchTotals(a.num_seqs + b.num_seqs, a.tokens + b.tokens, a.decode_seqs + b.decode_seqs,
                       a.uniform and b.uniform, a.spec_seqs + b.spec_seqs, a.truncated + b.truncated,
                       a.replay_tokens + b.replay_tokens, a.flush_seqs + b.flush_seqs,
                       a.context_tokens + b.context_tokens, max(a.max_context, b.max_context), a.chunks + b.chunks)


def batch_of_totals(t: BatchTotals, *, verify_positions: int, draft_depth: int, sizes: Sequence[int],
                    full_graph_ok: bool, requests: tuple[TracedRequest, ...] = ()) -> StepBatch:
    """The StepBatch of a step's totals, dispatched by vLLM's rules (`requests`: the step's
    requests in detail, kept in the batch when tracing)."""
    d = dispatch_counts(t.tokens, t.num_seqs, t.decode_seqs, t.uniform, sizes, full_graph_ok)
    return StepBatch(
        num_seqs=t.num_seqs, prefill_tokens=sum(n for n, _ in t.chunks) if t.chunks else 0, prefill_seqs=len(t.chunks), decode_seqs=t.decode_seqs, spec_seqs=t.spec_seqs,
        verify_positions=verify_positions, context_tokens=t.context_tokens, max_context=t.max_context,
        eager=d.mode != "full", replay_tokens=t.replay_tokens, flush_seqs=t.flush_seqs, draft_depth=draft_depth,
        truncated=t.truncated, kind=d.kind, mode=d.mode, padded_tokens=d.padded_tokens, prefill_chunks=t.chunks,
        requests=requests,
    )


def assemble_columns(c: BatchColumns, *, verify_positions: int, draft_depth: int, sizes: Sequence[int],
                     full_graph_ok: bool, requests: tuple[TracedRequest, ...] = ()) -> StepBatch:
    """`assemble_batch` over columns."""
    return batch_of_totals(column_totals(c, verify_positions=verify_positions, draft_depth=draft_depth),
                           verify_positions=verify_positions, draft_depth=draft_depth, sizes=sizes,
                           full_graph_ok=full_graph_ok, requests=requests)


def step_shape(model: ModelConfig, policy: CommitPolicy, max_num_seqs: int, max_num_batched_tokens: int,
               performance_mode: str = "balanced") -> tuple[int, int, tuple[int, ...], bool]:
    """(verify positions, drafter passes, capture sizes, full graphs allowed) of a run: what
    `assemble_batch` needs beyond the requests."""
    spec_on = model.mtp_depth > 0 and policy.verify_positions > 1
    vp = policy.verify_positions if spec_on else 1
    sizes = capture_sizes(max_num_seqs, max_num_batched_tokens, vp, performance_mode=performance_mode)
    return vp, model.mtp_depth if spec_on else 0, sizes, not policy.forces_eager()


def batch_of(step: TracedStep, model: ModelConfig, policy: CommitPolicy, engine: EngineConfig) -> StepBatch:
    """The StepBatch the simulator priced for a traced step (`engine` as resolved in the file's meta)."""
    if engine.max_num_seqs is None or engine.max_num_batched_tokens is None:
        raise StepTraceError("batch_of needs engine.max_num_seqs and engine.max_num_batched_tokens resolved "
                             "(read them from the steps file's meta, not EngineConfig defaults)")
    vp, depth, sizes, full_ok = step_shape(model, policy, engine.max_num_seqs, engine.max_num_batched_tokens,
                                           engine.performance_mode)
    return assemble_batch((BatchRequest(r.query_tokens, r.context, r.prefill == 0, bool(r.tree), r.replayed, r.flush)
                           for r in step.requests), verify_positions=vp, draft_depth=depth, sizes=sizes,
                          full_graph_ok=full_ok, requests=step.requests)


# ------------------------------------------------------------------------ files
def write_steps(path: Path, meta: dict[str, Any], steps: Iterable[TracedStep]) -> None:
    """Write steps.csv atomically; `meta` is the resolved RunConfig (JSON-serialisable)."""
    steps = list(steps)
    terms = list(steps[0].terms_us) if steps else []
    buf = io.StringIO()
    buf.write(MAGIC + json.dumps(meta, sort_keys=True) + "\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*HEAD, *(TERM_PREFIX + t for t in terms), "requests"])
    for s in steps:
        if s.kind not in STEP_KINDS:
            raise ValueError(f"step {s.step}: kind {s.kind!r} is not one of {STEP_KINDS}")
        if list(s.terms_us) != terms:
            raise ValueError(f"step {s.step}: terms {list(s.terms_us)} differ from the first step's {terms}")
        reqs = [[r.rid, r.prefill, r.context, list(r.tree), r.accepted, r.replayed, int(r.flush)] for r in s.requests]
        w.writerow([s.step, repr(s.time_s), s.kind, len(s.requests), sum(r.query_tokens for r in s.requests),
                    sum(r.prefill for r in s.requests), repr(s.predicted_us), *(repr(v) for v in s.terms_us.values()),
                    json.dumps(reqs, separators=(",", ":"))])
    atomic_write_text(Path(path), buf.getvalue())


def read_steps(path: Path) -> tuple[dict[str, Any], list[TracedStep]]:
    """(meta, steps) of a steps.csv; StepTraceError naming the file, line and field on a bad file."""
    path = Path(path)
    if not path.exists():
        raise StepTraceError(f"{path}: no such steps file (write one with `specsim run --trace-steps --out DIR`)")
    with path.open(newline="") as f:
        first = f.readline()
        if not first.startswith(MAGIC):
            raise StepTraceError(f"{path}: line 1 must start with {MAGIC.strip()!r}: not a steps file from "
                                 f"`specsim run --trace-steps`, or an older format")
        try:
            meta = json.loads(first[len(MAGIC):])
        except json.JSONDecodeError as e:
            raise StepTraceError(f"{path}: line 1: meta is not valid JSON ({e})") from None
        if not isinstance(meta, dict):
            raise StepTraceError(f"{path}: line 1: meta must be a JSON object, got {type(meta).__name__}")
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        missing = [c for c in (*HEAD, "requests") if c not in cols]
        if missing:
            raise StepTraceError(f"{path}: line 2: missing columns {missing}; has {cols}")
        terms = [c for c in cols if c.startswith(TERM_PREFIX)]
        steps = [_parse_row(path, i + 3, row, terms) for i, row in enumerate(reader)]
    return meta, steps


def _parse_row(path: Path, line: int, row: dict[str, str], terms: list[str]) -> TracedStep:
    where = f"{path}: line {line}"
    field = "step"
    try:
        step = int(row["step"])
        field = "time_s"
        time_s = float(row["time_s"])
        field = "predicted_us"
        predicted = float(row["predicted_us"])
        terms_us = {}
        for c in terms:
            field = c
            terms_us[c[len(TERM_PREFIX):]] = float(row[c])
        field = "requests"
        reqs = tuple(_parse_request(r) for r in json.loads(row["requests"]))
    except (TypeError, ValueError, KeyError) as e:
        raise StepTraceError(f"{where}: bad {field} ({row.get(field)!r}): {e}") from None
    kind = row["kind"]
    if kind not in STEP_KINDS:
        raise StepTraceError(f"{where}: kind {kind!r} is not one of {', '.join(STEP_KINDS)}")
    if not reqs:
        raise StepTraceError(f"{where}: a step needs at least one request")
    for c, value in (("num_seqs", len(reqs)), ("num_tokens", sum(r.query_tokens for r in reqs)),
                     ("prefill_tokens", sum(r.prefill for r in reqs))):
        if row[c] != str(value):
            raise StepTraceError(f"{where}: {c} is {row[c]!r} but the requests add up to {value}")
    return TracedStep(step, time_s, kind, reqs, predicted, terms_us)


def _parse_request(item: Any) -> TracedRequest:
    if not isinstance(item, list) or len(item) != len(REQUEST_FIELDS):
        raise ValueError(f"each request must be a list of {len(REQUEST_FIELDS)} values {REQUEST_FIELDS}, got {item!r}")
    rid, prefill, context, tree, accepted, replayed, flush = item
    ints = {"rid": rid, "prefill": prefill, "context": context, "accepted": accepted, "replayed": replayed,
            "flush": flush}
    for name, v in ints.items():
        if not isinstance(v, int) or isinstance(v, bool) or (v < 0 and name != "rid"):
            raise ValueError(f"request field {name!r} must be a non-negative integer, got {v!r}")
    if not isinstance(tree, list) or any(not isinstance(w, int) or w < 1 for w in tree):
        raise ValueError(f"request field 'tree' must be a list of positive widths, got {tree!r}")
    if prefill and tree:
        raise ValueError(f"request {rid}: a prefill chunk ({prefill} tokens) verifies no tree, got {tree!r}")
    return TracedRequest(rid, prefill, context, tuple(tree), accepted, replayed, bool(flush))
