"""CUDA-graph dispatch of a step on the GPU, and a lazy cache of captured graphs.

vLLM's rule (FULL for a captured uniform-decode batch, PIECEWISE up to the largest
capture size, EAGER above it) is `sim.pricing.dispatch`, the one place the simulator prices
with; `plan` adds the executor's forced modes (the --mode flag) and the padded request
count a full graph runs over. `GraphCache` captures each (piece, padded size) the first
time a step needs it, all graphs sharing one memory pool, so a replay of many steps
captures only what it uses.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Hashable

from sim.pricing.dispatch import dispatch as vllm_dispatch
from sim.pricing.dispatch import round_up

MODES = ("vllm", "eager", "graph")  # --mode: vLLM's rule, or every step eager, or every step graphed
FULL, PIECEWISE, EAGER = "full", "piecewise", "eager"
FORCED_GRAPH_ROUND = 256  # tokens: --mode graph pads a batch above the capture sizes to a multiple of this


@dataclass(frozen=True)
class Plan:
    kind: str  # sim.pricing.dispatch.STEP_KINDS
    mode: str  # FULL, PIECEWISE or EAGER
    tokens: int  # tokens the launches run over: padded for graphs, the real count when EAGER
    requests: int  # requests a full graph runs over (padded); the real count otherwise


def plan(query_lens: Sequence[int], decoding: Sequence[bool], uniform_query_len: int, sizes: Sequence[int],
         full_graph_ok: bool, mode: str = "vllm") -> Plan:
    """How the executor runs a step: vLLM's dispatch, or every step eager / graphed (--mode)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    d = vllm_dispatch(query_lens, decoding, uniform_query_len, sizes, full_graph_ok)
    n, r = sum(query_lens), len(query_lens)
    how, padded = d.mode, d.padded_tokens
    if mode == "eager":
        how, padded = EAGER, n
    elif mode == "graph" and how == EAGER:
        padded = round_up(n, FORCED_GRAPH_ROUND)
        uniform = d.kind == "uniform_decode" and full_graph_ok
        how, padded = (FULL, round_up(padded, uniform_query_len)) if uniform else (PIECEWISE, padded)
    if how == FULL:
        return Plan(d.kind, FULL, padded, padded // uniform_query_len)
    return Plan(d.kind, how, padded, r)


class GraphCache:
    """Captured CUDA graphs by key, made on first use; one shared memory pool.

    Graphs of one cache replay one after another, never concurrently, so sharing the
    pool is safe; everything a graph hands to the next step lives in static buffers
    allocated outside the graphs.
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.graphs: dict[Hashable, object] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()
        self.capture_s = 0.0  # host seconds spent capturing (warm-up included)

    def replay(self, key: Hashable, fn: Callable[[], None]) -> None:
        """Replay the graph of `key`, capturing `fn` first if this is its first use."""
        g = self.graphs.get(key)
        if g is None:
            g = self.capture(key, fn)
        g.replay()

    def capture(self, key: Hashable, fn: Callable[[], None]) -> object:
        torch = self._torch
        t0 = time.perf_counter()
        # Warm up on a side stream (lazy cuBLAS / Triton initialisation), as torch.cuda.graph requires.
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            fn()
        torch.cuda.current_stream().wait_stream(self.stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
            fn()
        self.graphs[key] = g
        self.capture_s += time.perf_counter() - t0
        return g

    def __len__(self) -> int:
        return len(self.graphs)
