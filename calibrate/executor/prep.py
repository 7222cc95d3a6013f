"""The executor's host prep: a step's metadata into pinned host buffers and one upload per dtype, before any launch.

`StepPrep.prepare` is the part of `calibrate.executor.runner.Executor` that vLLM's model runner does
before the forward (vllm/v1/worker/gpu_model_runner.py, `GPUModelRunner._prepare_inputs`): the layout (calibrate.executor.step_layout), the dispatch
(calibrate.device.graphs.plan), positions, slot mapping, block tables, tree parents, the accepted
nodes, the prefills' varlen bounds and the drafter's later positions, all written into two
`Packed` buffers and uploaded with one copy each. It is timed as part of every step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from calibrate.device.graphs import EAGER, FULL, PIECEWISE, Plan, plan
from calibrate.executor.step_layout import (DUMMY_BLOCK, POSITIONS_MAX, Layout, StepRequest, accepted_node, block_tables,
                                   layout, tree_parents)


class Packed:
    """Named int fields in a host buffer (pinned on CUDA) mirrored by one device buffer: one copy
    per step uploads them all, and device views keep fixed addresses for graphs. Two host
    buffers alternate (`flip`), so a step can be prepared while the last one's copy is queued."""

    def __init__(self, sizes: dict[str, int], dtype: torch.dtype, device: torch.device) -> None:
        self.offsets: dict[str, tuple[int, int]] = {}
        o = 0
        for name, n in sizes.items():
            self.offsets[name] = (o, n)
            o += n
        pin = device.type == "cuda"
        self.hosts = [torch.zeros(o, dtype=dtype, pin_memory=pin) for _ in range(2)]
        self.cur = 0
        self.np = self.hosts[0].numpy()
        self.dev = torch.zeros(o, dtype=dtype, device=device)

    def flip(self) -> None:
        self.cur ^= 1
        self.np = self.hosts[self.cur].numpy()

    def h(self, name: str) -> np.ndarray:
        o, n = self.offsets[name]
        return self.np[o:o + n]

    def d(self, name: str, n: int | None = None) -> torch.Tensor:
        o, size = self.offsets[name]
        return self.dev[o:o + (size if n is None else n)]

    def upload(self) -> None:
        self.dev.copy_(self.hosts[self.cur], non_blocking=True)


@dataclass
class Step:
    """One prepared step: its layout, dispatch and the sizes its launches use."""
    lay: Layout
    d: Plan
    n: int  # tokens the cores process (padded in a full graph)
    R: int  # requests (padded in a full graph)
    B: int  # decode requests (padded in a full graph)
    T: int  # verify positions per decode (the widest when ragged)
    P: int  # prefill sequences
    ragged: bool  # decodes of different widths: verify runs on a padded copy
    pf_cu_cpu: torch.Tensor | None
    # The prefills' cu_seqlens on the device: ONE tensor object for every GDN layer of the step.
    # fla memoises its varlen index tensors by the identity of this argument; building them
    # copies host to device synchronously (`.to(cu_seqlens)`), so a fresh view per layer would
    # stall the host on the GPU at every GDN layer. vLLM passes its metadata's tensor to every
    # layer: the copy (and its wait) happens at the step's first GDN prefill call.
    pf_cu: torch.Tensor | None
    n_logits: int
    max_q: int
    flush: bool
    done: object | None  # set by launch: the event after the step's tokens were copied to the host
    out_host: torch.Tensor | None  # set by launch: the pinned buffer they land in
    cols: int  # block-table columns the attention kernel sees (the kernel sizes its key splits by them)
    how: str  # the graphs.MODES rule the step runs under (the drafter's later passes follow it)


class StepPrep:
    """Host prep of calibrate.executor.runner.Executor (a base of it): reads the executor's sizes, pools and
    policy state (block_size, num_blocks, depth, positions, sizes, table_width, rs, ...) and writes
    its `i64` / `i32` Packed buffers."""

    def prepare(self, requests: Sequence[StepRequest], flush: bool = False, mode: str | None = None) -> Step:
        """Everything before the first launch: layout, metadata into the pinned buffers, one upload.
        flush: the replay policy's commit writes the state back this step. mode: override --mode."""
        lay = layout(requests, self.block_size, self.num_blocks, self.depth)
        n, R, B = lay.num_tokens, len(lay.order), lay.num_decodes
        if n > self.max_tokens - 256 or R > self.max_step_requests:
            raise ValueError(f"step of {n} tokens / {R} requests exceeds the executor's sizes")
        if lay.positions_max > POSITIONS_MAX:
            raise ValueError(f"a decode of {lay.positions_max} verify positions exceeds {POSITIONS_MAX}")
        d = plan(lay.q_lens.tolist(), [True] * B + [False] * (R - B), self.positions, self.sizes,
                 self.full_capturable, mode or self.mode)
        if d.mode != EAGER and self.graphs is None:
            raise ValueError("graph modes need a CUDA device and an executor not built with mode='eager'")
        if d.mode == FULL and (self.policy_key, d.tokens, flush) in self.full_failed:
            d = Plan(d.kind, PIECEWISE, d.tokens, R)
        full = d.mode == FULL
        # A full graph also runs its padded requests: dummy decodes on the dummy block.
        Rr, Br, nr = (d.requests, d.requests, d.tokens) if full else (R, B, n)
        T = lay.positions_max or 1
        self.i64.flip()
        self.i32.flip()
        h64, h32 = self.i64.h, self.i32.h
        h32("d_cu")[:Rr + 1] = np.arange(Rr + 1)
        rows = d.tokens if d.mode != EAGER else n
        h64("ids")[:n] = lay.positions * 2654435761 % self.s.vocab  # any valid ids: the weights are random
        h64("ids")[n:rows] = 0
        h64("positions")[:n] = lay.positions
        h64("positions")[n:rows] = 0
        h64("slots")[:n] = lay.slots
        h64("slots")[n:nr] = DUMMY_BLOCK * self.block_size + np.arange(nr - n) % T
        h32("seq_lens")[:Rr] = np.concatenate([lay.seq_lens, np.full(Rr - R, T)])
        h32("cu_q")[:Rr + 1] = np.concatenate([lay.cu_q, n + T * np.arange(1, Rr - R + 1)])
        W = self.table_width
        tables = h32("tables")[:Rr * W].reshape(Rr, W)
        tables[:R] = block_tables(lay, W, self.num_blocks)
        tables[R:] = DUMMY_BLOCK
        if Br:
            # Decodes: tree parents, lengths and the accepted node; padded ones copy the first.
            trees = [tuple(r.tree) for r in lay.order[:B]]
            trees += [trees[0]] * (Br - B)
            par = h32("parent")[:Br * T].reshape(Br, T)
            par[:] = -1
            if len(set(trees)) == 1:
                p = tree_parents(trees[0])
                par[:, :len(p)] = p
                h32("lengths")[:Br] = len(p)
            else:
                for b, t in enumerate(trees):
                    p = tree_parents(t)
                    par[b, :len(p)] = p
                    h32("lengths")[b] = len(p)
            h32("accepted")[:Br] = [accepted_node(t, r.accepted) for t, r in zip(trees, lay.order[:B])] + [0] * (Br - B)
            if self.rs:
                # The replay caches hold what the trace says (`replayed` accepted tokens, at most what
                # leaves room for this step's path): a step repeated for timing must not grow them
                # past their capacity (a cache root past it makes the tree's parents a cycle).
                room = self.rs[next(iter(self.rs))].capacity - (self.tree.depth + 1)
                h32("replayed")[:Br] = np.minimum([r.replayed for r in lay.order[:B]] + [0] * (Br - B), room)
        ragged = B > 0 and not full and not bool((lay.q_lens[:B] == T).all())
        if ragged:
            # Pad each decode to T positions (padding reads its root row), and the way back.
            t = np.arange(T)[None, :]
            h64("dec_rows")[:B * T] = (lay.cu_q[:B, None] + np.where(t < lay.q_lens[:B, None], t, 0)).ravel()
            req_of = np.repeat(np.arange(B), lay.q_lens[:B])
            h64("dec_back")[:lay.decode_tokens] = req_of * T + np.arange(lay.decode_tokens) - lay.cu_q[:B][req_of]
        # Prefills: one varlen call over slots B+1..R; a first chunk starts from a zero state.
        P = R - B
        pf_cu = lay.cu_q[B:] - lay.cu_q[B]
        h64("pf_cu")[:P + 1] = pf_cu
        h64("pf_slots")[:P] = np.arange(B + 1, R + 1)
        h32("pf_init")[:P] = lay.contexts[B:] > 0
        # Sampled rows: every verify position, then each prefill's last token.
        nd = lay.decode_tokens
        h64("logits_rows")[:nd] = np.arange(nd)
        h64("logits_rows")[nd:nd + P] = lay.cu_q[B + 1:] - 1
        h64("last_rows")[:Rr] = np.concatenate([lay.cu_q[1:] - 1, n - 1 + T * np.arange(1, Rr - R + 1)])
        # Drafter passes 2..K: one token per request at the next positions.
        seq_all = np.concatenate([lay.seq_lens, np.full(Rr - R, T)])
        start = np.concatenate([lay.block_start, np.full(Rr - R, DUMMY_BLOCK)])
        usable = self.num_blocks - 1
        for j in range(1, self.depth):
            pos = seq_all - 1 + j
            blk = np.where(start > 0, (start - 1 + pos // self.block_size) % usable + 1, DUMMY_BLOCK)
            h64("d_positions")[(j - 1) * Rr:j * Rr] = pos
            h64("d_slots")[(j - 1) * Rr:j * Rr] = blk * self.block_size + pos % self.block_size
            h32("d_seq_lens")[(j - 1) * Rr:j * Rr] = seq_all + j
        self.i64.upload()
        self.i32.upload()
        return Step(lay=lay, d=d, n=nr if full else n, R=Rr, B=Br, T=T, P=P, ragged=ragged,
                    pf_cu_cpu=torch.from_numpy(pf_cu) if P else None, pf_cu=self.i64.d("pf_cu", P + 1) if P else None,
                    n_logits=nd + P,
                    max_q=T if full else int(lay.q_lens.max()), flush=flush, done=None, out_host=None,
                    # A full graph replays at any context: its table keeps every column.
                    cols=W if full else int(lay.blocks.max()), how=mode or self.mode)
