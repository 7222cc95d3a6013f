"""vLLM's CUDA-graph dispatch of one step (docs/vllm.md#execution-modes): the one place for the rule.

The simulator and the GPU step executor both import it, so a traced step is replayed
in the mode the simulator priced it in.

Capture sizes (vLLM 0.17.1, `VllmConfig._set_cudagraph_sizes`): `[1, 2, 4] + range(8, 256, 8)
+ range(256, max + 1, 16)` with `max = min(max_num_seqs x (1 + k) x 2, 512)`, capped at
`max_num_batched_tokens`; `--performance-mode interactivity` replaces `[1, 2, 4]` by every size
from 1 to `min(max, 32)`. With speculative decoding every size is rounded up to a multiple of
1 + k and sizes that then exceed `max` are dropped (`adjust_cudagraph_sizes_for_spec_decode`).

Dispatch: a *uniform decode* batch (every request decoding with exactly 1 + k query
tokens) replays a FULL graph when its padded size was captured; any other batch whose
token count, padded up to the next capture size, is at most the largest capture size
runs PIECEWISE (dense parts as graphs, attention and GDN cores eager); larger batches
run eagerly.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

STEP_KINDS = ("uniform_decode", "mixed_graph", "mixed_eager", "prefill_only")
GRAPH_MODES = ("full", "piecewise", "eager")
CAPTURE_CAP = 512  # tokens: vLLM's largest capture size on SM90 (1024 on SM100)
FINE_GRAINED_MAX = 32  # interactivity mode: a graph at every size up to this


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@lru_cache(maxsize=64)
def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, query_len: int,
                  cap: int = CAPTURE_CAP, performance_mode: str = "balanced") -> tuple[int, ...]:
    """Token counts vLLM captures graphs for; `query_len` = 1 + k (1 without speculation)."""
    top = min(max_num_seqs * query_len * 2, cap, max_num_batched_tokens)
    small = range(1, min(top, FINE_GRAINED_MAX) + 1) if performance_mode == "interactivity" else (1, 2, 4)
    base = [*small, *range(8, 256, 8), *range(256, top + 1, 16)]
    return tuple(sorted({round_up(s, query_len) for s in base if round_up(s, query_len) <= top}))


class Dispatch(NamedTuple):  # built once per step priced: a named tuple is cheap to build
    kind: str  # STEP_KINDS
    mode: str  # GRAPH_MODES
    padded_tokens: int  # tokens the step runs at: the capture size it pads to, or its own count when eager


def dispatch(query_lens: Sequence[int], decoding: Sequence[bool], uniform_query_len: int,
             sizes: Sequence[int], full_graph_ok: bool = True) -> Dispatch:
    """The kind and graph mode of a step from its requests' query tokens.

    `decoding[i]`: request i is past its prompt (verifying a draft or decoding one
    token). `full_graph_ok=False` runs uniform decodes piecewise (a draft tree that
    breaks full-graph capture in the reference implementation).
    """
    if len(query_lens) != len(decoding):
        raise ValueError(f"{len(query_lens)} query lengths for {len(decoding)} decoding flags")
    if not query_lens:
        raise ValueError("a step needs at least one request")
    return dispatch_counts(sum(query_lens), len(query_lens), sum(decoding),
                           all(n == uniform_query_len for n in query_lens), sizes, full_graph_ok)


def dispatch_counts(tokens: int, num_seqs: int, decode_seqs: int, uniform: bool, sizes: Sequence[int],
                    full_graph_ok: bool = True) -> Dispatch:
    """`dispatch` from the step's totals: `uniform` when every request's query length is the
    uniform decode's."""
    i = bisect_left(sizes, tokens)
    padded = sizes[i] if i < len(sizes) else tokens
    fits = i < len(sizes)
    if not decode_seqs:
        return Dispatch("prefill_only", "piecewise" if fits else "eager", padded)
    if decode_seqs == num_seqs and uniform:
        mode = ("full" if full_graph_ok else "piecewise") if fits else "eager"
        return Dispatch("uniform_decode", mode, padded)
    return Dispatch("mixed_graph", "piecewise", padded) if fits else Dispatch("mixed_eager", "eager", padded)
