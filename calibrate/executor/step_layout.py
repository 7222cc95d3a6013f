"""Where a step's requests and tokens go in the paged pool: the executor's host-side layout (numpy, no torch).

Batch order is vLLM's: decodes first, then prefills. Each request takes consecutive pool
blocks (block 0 is the dummy block that a full graph's padded requests point at); a decode's
query tokens are the root plus every draft node of its tree (`verify_positions`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from policies.base import TREEWY_MAX_POSITIONS
from policies.tree import DraftTree

DUMMY_BLOCK = 0  # pool block that padded requests of a full graph point at (never given to a request)
POSITIONS_MAX = TREEWY_MAX_POSITIONS  # verify positions of one request, replayed history included


class StepRequest(Protocol):
    """One request of a step (sim.engine.step_trace.TracedRequest has these fields)."""
    rid: int
    prefill: int
    context: int
    tree: tuple[int, ...]
    accepted: int


@functools.lru_cache(maxsize=None)
def verify_positions(tree: tuple[int, ...]) -> int:
    """Query tokens of a decode request: the root plus every draft node (1 without a tree)."""
    return DraftTree(tuple(tree)).verify_positions if tree else 1


@functools.lru_cache(maxsize=None)
def accepted_node(tree: tuple[int, ...], accepted: int) -> int:
    """Index (BFS order) of the deepest accepted node when `accepted` positions (bonus token
    included) are kept along the first path of the tree: the first node of depth accepted - 1."""
    depth = max(0, accepted - 1)
    if not tree:
        return 0
    per = DraftTree(tuple(tree)).nodes_per_depth
    depth = min(depth, len(per))
    return 0 if depth == 0 else 1 + sum(per[:depth - 1])


@functools.lru_cache(maxsize=None)
def tree_parents(tree: tuple[int, ...]) -> tuple[int, ...]:
    return DraftTree(tuple(tree)).parents if tree else (-1,)


@dataclass
class Layout:
    """Where one step's requests and tokens go (numpy, no torch): batch order is decodes first."""
    order: list  # the requests, decodes then prefills
    num_decodes: int
    q_lens: np.ndarray  # query tokens per request
    contexts: np.ndarray
    seq_lens: np.ndarray  # keys each request attends to this step (its own tokens included)
    cu_q: np.ndarray  # [R + 1]
    positions: np.ndarray  # [n] per token
    block_start: np.ndarray  # [R] first pool block of each request (its blocks are consecutive)
    blocks: np.ndarray  # [R] blocks each request holds
    slots: np.ndarray  # [n] KV slot of each token
    positions_max: int  # widest decode (verify positions); 0 without decodes

    @property
    def num_tokens(self) -> int:
        return int(self.cu_q[-1])

    @property
    def decode_tokens(self) -> int:
        return int(self.cu_q[self.num_decodes])


def layout(requests: Sequence[StepRequest], block_size: int, num_blocks: int, lookahead: int) -> Layout:
    """Block tables and slots for one step. Each request takes ceil((seq_len + lookahead) /
    block_size) consecutive blocks from block 1 on (the drafter writes `lookahead` tokens
    past the step); ids wrap around the pool (blocks 1..num_blocks-1) if a step needs more."""
    if not requests:
        raise ValueError("a step needs at least one request")
    for r in requests:
        if r.prefill < 0 or r.context < 0:
            raise ValueError(f"request {r.rid}: prefill and context must be >= 0, got {r.prefill}, {r.context}")
    order = [r for r in requests if r.prefill == 0] + [r for r in requests if r.prefill > 0]
    nd = sum(1 for r in requests if r.prefill == 0)
    q = np.array([verify_positions(tuple(r.tree)) if r.prefill == 0 else r.prefill for r in order], dtype=np.int64)
    ctx = np.array([r.context for r in order], dtype=np.int64)
    seq = ctx + q
    cu = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(q, out=cu[1:])
    n = int(cu[-1])
    req_of = np.repeat(np.arange(len(order)), q)
    pos = ctx[req_of] + np.arange(n) - cu[:-1][req_of]
    blocks = -(-(seq + lookahead) // block_size)
    usable = num_blocks - 1
    if usable < 1:
        raise ValueError(f"the KV pool needs at least 2 blocks, has {num_blocks}")
    start = np.zeros(len(order), dtype=np.int64)
    np.cumsum(blocks[:-1], out=start[1:])
    slots = ((start[req_of] + pos // block_size) % usable + 1) * block_size + pos % block_size
    widest = int(q[:nd].max()) if nd else 0
    return Layout(order, nd, q, ctx, seq, cu, pos, start % usable + 1, blocks, slots, widest)


def block_tables(lay: Layout, width: int, num_blocks: int) -> np.ndarray:
    """[R, width] block ids per request, padded with the dummy block."""
    if int(lay.blocks.max()) > width:
        raise ValueError(f"a request needs {int(lay.blocks.max())} blocks, the table holds {width}")
    col = np.arange(width)[None, :]
    ids = (lay.block_start[:, None] - 1 + col) % (num_blocks - 1) + 1
    return np.where(col < lay.blocks[:, None], ids, DUMMY_BLOCK)


def query_tokens(r: StepRequest) -> int:
    """Tokens a request puts through the model this step: its prefill chunk, or a decode's verify positions."""
    return r.prefill or verify_positions(tuple(r.tree))
