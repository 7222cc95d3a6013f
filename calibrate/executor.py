"""The whole model on one GPU at real shapes (random bf16 weights), running steps the way vLLM does.

A step is a list of requests (`prefill` tokens after `context` cached ones, or a decode
verifying a draft `tree` of which `accepted` positions are kept). `Executor.run` does
what vLLM's engine loop does for it, with no synchronisation until the sampled tokens
reach the host:
  host prep   positions, block tables and slot mapping from a paged pool laid out as
              `specsim memory` lays it out (sim.budget: attention block size), GDN state
              slots; one pinned host-to-device copy per dtype;
  target      embedding, then per layer a dense piece and a core: attention cores are one
              paged-attention launch for all requests (KV write included); GDN cores are
              the conv + ONE varlen `chunk_gated_delta_rule` call (FlashInfer's or fla's) for all prefill
              sequences, and the policy's conv verify + verify kernel for all decoding
              requests in one call each, then their commits with the step's accepted
              lengths; MoE (a dense model: an MLP) after every layer;
  sampling    LM head on the sampled rows (every verify position, each prefill's last
              token), greedy acceptance against the drafts on the GPU;
  drafter     the MTP layer's K passes (the first over all target tokens, then one token
              per request) with their LM-head rows;
  finish      sampled tokens, accepted counts and drafts copied to the host.
Dense pieces run as CUDA graphs per calibrate.graphs' dispatch (FULL / PIECEWISE /
EAGER). Requests of a step take consecutive pool blocks and state slots (decodes
first, then prefills, as vLLM orders a batch): the contents are random, only the
memory traffic and launches are real.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from calibrate import layers as L
from calibrate.fla import load_fla_conv
from calibrate.gdn_prefill_kernel import load_gdn_prefill
from calibrate.graphs import EAGER, FULL, PIECEWISE, GraphCache, Plan, plan
from calibrate.shapes import LayerShapes
from core.config import ModelConfig, PolicyConfig
from policies import make_policy
from policies.tree import DraftTree
from sim.step_trace import step_shape

DUMMY_BLOCK = 0  # pool block that padded requests of a full graph point at (never given to a request)
POSITIONS_MAX = 128  # verify positions of one request, replayed history included (treewy.MAX_POSITIONS)


class StepRequest(Protocol):
    """One request of a step (sim.step_trace.TracedRequest has these fields)."""
    rid: int
    prefill: int
    context: int
    tree: tuple[int, ...]
    accepted: int


# ------------------------------------------------------------------ host-side layout
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


# ------------------------------------------------------------------ GDN gating
@triton.jit
def _gating_kernel(proj_ptr, stride_t, col_b, col_a, dt_bias_ptr, neg_a_ptr, g_ptr, beta_ptr, total,
                   HV: tl.constexpr, BLOCK: tl.constexpr):
    o_i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_i = o_i < total
    t, h = o_i // HV, o_i % HV
    b_a = tl.load(proj_ptr + t * stride_t + col_a + h, mask=m_i, other=0.0).to(tl.float32)
    b_b = tl.load(proj_ptr + t * stride_t + col_b + h, mask=m_i, other=0.0).to(tl.float32)
    b_x = b_a + tl.load(dt_bias_ptr + h, mask=m_i, other=0.0)
    b_sp = tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(b_x)))  # softplus
    tl.store(g_ptr + o_i, b_sp * tl.load(neg_a_ptr + h, mask=m_i, other=0.0), mask=m_i)
    tl.store(beta_ptr + o_i, 1.0 / (1.0 + tl.exp(-b_b)), mask=m_i)


def gdn_gating(proj: torch.Tensor, col_b: int, dt_bias: torch.Tensor, neg_a: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor) -> None:
    """g = softplus(a + dt_bias) * -exp(A_log) and beta = sigmoid(b) (float32 [n, Hv]) in one launch,
    as vLLM's fused_gdn_gating: b and a are the Hv columns of proj from col_b and col_b + Hv."""
    n, hv = g.shape
    if n:
        BLOCK = 1024
        _gating_kernel[(triton.cdiv(n * hv, BLOCK),)](proj, proj.stride(0), col_b, col_b + hv, dt_bias, neg_a, g, beta,
                                                      n * hv, HV=hv, BLOCK=BLOCK)


# ------------------------------------------------------------------ packed metadata
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


# ------------------------------------------------------------------ weights
@dataclass
class Weights:
    embed: torch.Tensor
    head: L.HeadWeights
    layers: list  # per layer: L.GDNWeights or L.AttnWeights
    conv: list  # per layer: the GDN conv weight as [channels, kernel] (the kernels' layout), or None
    ffn: list[L.FFNWeights]  # per layer: its MoE, or a dense model's MLP
    mtp: L.MTPWeights
    mtp_attn: L.AttnWeights
    mtp_ffn: L.FFNWeights

    @classmethod
    def build(cls, s: LayerShapes, kinds: list[str], device: torch.device) -> "Weights":
        """Random bf16 weights made on the device (never on the host): 70 GB for 35B-A3B."""
        layers, conv = [], []
        for kind in kinds:
            if kind == "gdn":
                w = L.gdn_weights(s, device)
                layers.append(w)
                conv.append(w.conv.t().contiguous())
            else:
                layers.append(L.attn_weights(s, device))
                conv.append(None)
        return cls(embed=L._w(s.vocab, s.hidden, device=device), head=L.head_weights(s, device), layers=layers,
                   conv=conv, ffn=[L.ffn_weights(s, device) for _ in kinds], mtp=L.mtp_weights(s, device),
                   mtp_attn=L.attn_weights(s, device), mtp_ffn=L.ffn_weights(s, device))


# ------------------------------------------------------------------ GDN kernels
CONV_OF = {"reconstruct_deferred": "reconstruct"}  # its conv window is rebuilt from the path, as reconstruct's


def load_policy_kernels(policy: str) -> tuple[object, Callable, Callable]:
    """The policy's SSM verify/commit module and its conv verify/commit (policies.kernels)."""
    import importlib

    from policies.kernels import conv

    mod = importlib.import_module(f"policies.kernels.{policy}")
    c = CONV_OF.get(policy, policy)
    return mod, getattr(conv, f"{c}_verify"), getattr(conv, f"{c}_commit")


# ------------------------------------------------------------------ the executor
@dataclass
class StepOutput:
    tokens: list[int]  # sampled target tokens (every verify position, each prefill's last token)
    accepted: list[int]  # greedy acceptance per decode request (random weights: not the traced one)
    drafts: list[list[int]]  # per drafter pass, one token per request
    kind: str  # sim.dispatch.STEP_KINDS, as vLLM's rule classifies the step
    mode: str  # FULL, PIECEWISE or EAGER
    padded_tokens: int


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


class Executor:
    """Buffers, pools and the step function of one model under one policy on one device."""

    def __init__(self, model: ModelConfig, policy: PolicyConfig, *, device: torch.device, max_requests: int,
                 max_context: int, max_num_seqs: int, max_num_batched_tokens: int, block_size: int,
                 kv_pool_bytes: int, mode: str = "vllm", kinds: list[str] | None = None,
                 shapes: LayerShapes | None = None, weights: Weights | None = None,
                 log: Callable[[str], None] = print) -> None:
        s = self.s = shapes or LayerShapes.from_model(model)
        self.device, self.log, self.model = device, log, model
        self.graphs = GraphCache() if device.type == "cuda" and mode != "eager" else None
        self.mode = mode if self.graphs is not None else "eager"
        self.kinds = kinds or model.layer_pattern * (model.num_layers // len(model.layer_pattern))
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        # Uniform-decode query length, drafter passes, capture sizes: what the simulator dispatched
        # the traced steps with (a policy of another shape needs another executor).
        self.positions, self.depth, self.sizes, _ = step_shape(model, make_policy(model, policy), max_num_seqs,
                                                               max_num_batched_tokens)
        cap = self.sizes[-1] if self.sizes else 0
        self.max_tokens = max(max_num_batched_tokens, cap) + 256  # room for --mode graph padding
        # A full graph pads requests: up to cap / positions, and under --mode graph up to 256 tokens more.
        pad = 256 // self.positions + 1 if mode == "graph" else 0
        self.max_requests = max(max_requests + pad, cap // self.positions)
        self.max_step_requests = self.max_requests - pad  # real requests of one step
        self.block_size = block_size
        self.state_dtype = torch.float32 if model.state_dtype_bytes == 4 else L.BF16
        self.w = weights or Weights.build(s, self.kinds, device)
        self._buffers(max_context, kv_pool_bytes)
        self.policy_states: dict[str, tuple[dict, dict, dict]] = {}
        self.use_policy(policy)
        # vLLM's GDN prefill kernel for this GPU (FlashInfer's on SM90+, else fla's), with fla's signature.
        self.gdn_prefill_kernel, self.chunk_fn = load_gdn_prefill()
        self.fla_conv = load_fla_conv()
        from calibrate.kernels.paged_attention import paged_attention, reshape_and_cache
        self.paged_attention, self.reshape_and_cache = paged_attention, reshape_and_cache
        self.full_failed: set[tuple] = set()  # full-graph keys whose capture failed: run piecewise

    # -- setup
    def _buffers(self, max_context: int, kv_pool_bytes: int) -> None:
        s, d, N, R = self.s, self.device, self.max_tokens, self.max_requests
        T = POSITIONS_MAX
        self.table_width = -(-(max_context + self.depth + POSITIONS_MAX) // self.block_size) + 1
        k = max(1, self.depth)
        self.i64 = Packed({"ids": N, "positions": N, "slots": N, "logits_rows": N, "last_rows": R,
                           "dec_rows": R * T, "dec_back": N, "pf_cu": R + 1, "pf_slots": R,
                           "d_positions": k * R, "d_slots": k * R}, torch.int64, d)
        self.i32 = Packed({"seq_lens": R, "cu_q": R + 1, "tables": R * self.table_width, "parent": R * T,
                           "lengths": R, "accepted": R, "replayed": R, "pf_init": R, "d_seq_lens": k * R, "d_cu": R + 1},
                          torch.int32, d)
        z = dict(device=d, dtype=L.BF16)
        self.x = torch.zeros(N, s.hidden, **z)  # the target's residual stream
        self.gdn_proj = torch.zeros(N, s.gdn_in_features, **z)
        self.gdn_o = torch.zeros(N, s.gdn_v_channels, **z)
        self.g = torch.zeros(N, s.gdn_v_heads, device=d)  # float32 log-decays and betas of the GDN core
        self.beta = torch.zeros(N, s.gdn_v_heads, device=d)
        self.q = torch.zeros(N, s.q_heads, s.head_dim, **z)
        self.gate = torch.zeros(N, s.q_heads * s.head_dim, **z)
        self.k = torch.zeros(N, s.kv_heads, s.head_dim, **z)
        self.v = torch.zeros(N, s.kv_heads, s.head_dim, **z)
        self.attn_o = torch.zeros(N, s.q_heads, s.head_dim, **z)
        self.cos = torch.zeros(N, 1, s.rotary_dim // 2, **z)
        self.sin = torch.zeros(N, 1, s.rotary_dim // 2, **z)
        self.arange = torch.arange(R, device=d)
        self.d_ids = torch.zeros(N, dtype=torch.int64, device=d)  # the drafter's inputs, one pass at a time
        self.d_pos = torch.zeros(N, dtype=torch.int64, device=d)
        self.d_hidden = torch.zeros(N, s.hidden, **z)  # the drafter's residual stream
        self.out = torch.zeros(N + R + k * R, dtype=torch.int64, device=d)  # tokens | accepted | drafts
        # Two host copies of `out`, alternating: a step's tokens land while the next one is launched.
        self.out_hosts = [torch.zeros(self.out.shape, dtype=torch.int64, pin_memory=d.type == "cuda")
                          for _ in range(2)]
        self.out_cur = 0
        # Paged KV pool: every attention layer plus the MTP layer, [blocks, block_size, kv_heads, D].
        n_attn = self.kinds.count("attn") + 1
        self.num_blocks = max(2, kv_pool_bytes // (n_attn * self.block_size * s.kv_bytes_per_token))
        shape = (self.num_blocks, self.block_size, s.kv_heads, s.head_dim)
        self.kv = [(torch.zeros(shape, **z), torch.zeros(shape, **z)) for _ in range(n_attn)]
        # GDN pools, one state and conv window per slot and layer; requests take slots 1..
        n_slots = R + 1
        self.ssm = [torch.randn(n_slots, s.gdn_v_heads, s.head_v_dim, s.head_k_dim, device=d).mul_(0.1)
                    .to(self.state_dtype) if kind == "gdn" else None for kind in self.kinds]
        self.conv_pool = [torch.randn(n_slots, s.gdn_conv_channels, s.conv_kernel - 1, device=d).to(L.BF16)
                          if kind == "gdn" else None for kind in self.kinds]

    def use_policy(self, policy: PolicyConfig) -> None:
        """Run the GDN cores with this policy's kernels from now on. The dense pieces' graphs are
        kept (they do not depend on the policy); full graphs are keyed by policy."""
        shape = step_shape(self.model, make_policy(self.model, policy), self.max_num_seqs,
                           self.max_num_batched_tokens)
        if shape[:3] != (self.positions, self.depth, self.sizes):
            raise ValueError(f"policy {policy.name}: verify positions / drafter passes / capture sizes {shape[:3]} "
                             f"differ from this executor's {(self.positions, self.depth, self.sizes)}")
        self.policy = policy
        self.policy_key = policy.model_dump_json()  # full graphs are captured per policy
        self.tree = DraftTree(tuple(policy.draft_tree_widths))
        # The fixed-tree kernels replay inside a full graph; a real tree without
        # graph_capturable_tree breaks it (the step then runs piecewise).
        self.full_capturable = shape[3]
        self.verify_mod, self.conv_verify, self.conv_commit = load_policy_kernels(policy.mamba_state_commit)
        # Kept per policy: its full graphs hold the addresses of these tensors, and a graph of the
        # policy captured before (the correctness check) replays on them when the policy returns.
        if self.policy_key not in self.policy_states:
            self.policy_states[self.policy_key] = self._replay_states()
        self.rs, self.rcs, self.ds = self.policy_states[self.policy_key]

    def _replay_states(self) -> tuple[dict, dict, dict]:
        """Per-slot state beside the pools: replay's caches of accepted inputs (state and conv),
        reconstruct_deferred's pending commit (policies.kernels)."""
        rs, rcs, ds = {}, {}, {}
        commit, path = self.policy.mamba_state_commit, self.tree.depth + 1
        gdn = [i for i, kind in enumerate(self.kinds) if kind == "gdn"]
        if commit == "replay":
            from policies.kernels.conv import ReplayConvState
            from policies.kernels.replay import ReplayState

            fi = self.policy.flush_interval
            for i in gdn:
                rs[i] = ReplayState.start(self.ssm[i], fi, path, self.s.gdn_k_heads)
                rcs[i] = ReplayConvState.start(self.conv_pool[i], fi, path, L.BF16)
        elif commit == "reconstruct_deferred":
            from policies.kernels.reconstruct_deferred import DeferredState

            for i in gdn:
                ds[i] = DeferredState.start(self.ssm[i], path, self.s.gdn_k_heads)
        return rs, rcs, ds

    def kernel_sources(self) -> dict[str, str]:
        """Which implementation each core runs (a reference instead of a kernel makes timings moot)."""
        def name(f: object) -> str:
            return f"{getattr(f, '__module__', '?')}.{getattr(f, '__name__', type(f).__name__)}" if f else "none"
        return {"paged_attention": name(self.paged_attention), "gdn_prefill": self.gdn_prefill_kernel or "none",
                "gdn_prefill_conv": name(self.fla_conv), "verify": self.verify_mod.__name__,
                "ffn": name(L.mlp_forward if self.s.dense else L.moe_forward)}

    def kv_pool_bytes(self) -> int:
        return sum(2 * t[0].numel() * t[0].element_size() for t in self.kv)

    # -- host prep
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

    # -- dense pieces (each works on the first n rows of the static buffers)
    def _rope(self, positions: torch.Tensor, n: int) -> None:
        cos, sin = L.rope_tables(positions[:n], self.s.rotary_dim)
        self.cos[:n].copy_(cos)
        self.sin[:n].copy_(sin)

    def pre(self, i: int, n: int, x: torch.Tensor) -> None:
        """Layer i's half before its core (i = -1: the MTP layer's attention)."""
        s = self.s
        w = self.w.layers[i] if i >= 0 else self.w.mtp_attn
        if i >= 0 and self.kinds[i] == "gdn":
            L.gdn_in(x[:n], w, s, out=self.gdn_proj[:n])
            return
        q, gate, k, v = L._attn_in(x[:n], w, s, self.cos[:n], self.sin[:n])
        self.q[:n].copy_(q)
        self.k[:n].copy_(k)
        self.v[:n].copy_(v)
        self.gate[:n].copy_(gate)

    def _post(self, i: int, n: int, x: torch.Tensor) -> None:
        """Layer i's half after its core, then its feed-forward block."""
        self.post_core(i, n, x)
        self.ffn(i, n, x)

    def post_core(self, i: int, n: int, x: torch.Tensor) -> None:
        """Layer i's output gate/norm and projection into the residual (i = -1: the MTP attention)."""
        s = self.s
        if i >= 0 and self.kinds[i] == "gdn":
            w = self.w.layers[i]
            z = self.gdn_proj[:n, s.gdn_conv_channels:s.gdn_conv_channels + s.gdn_v_channels]
            x[:n] += L.gdn_out(self.gdn_o[:n], z, w, s)
        else:
            w = self.w.layers[i] if i >= 0 else self.w.mtp_attn
            x[:n] += L.attn_out_proj(self.attn_o[:n], self.gate[:n], w, s)

    def ffn(self, i: int, n: int, x: torch.Tensor) -> None:
        """Layer i's MoE (a dense model's MLP) into the residual; i = -1: the MTP layer's."""
        L.ffn_forward(x[:n], self.w.ffn[i] if i >= 0 else self.w.mtp_ffn, self.s, out=x[:n])

    def target_piece(self, j: int, n: int) -> None:
        """Piece j of the target forward: the embedding (j = 0) or layer j-1's post-core half
        and MoE, then layer j's pre-core half (up to its attention or GDN core)."""
        if j == 0:
            torch.index_select(self.w.embed, 0, self.i64.d("ids", n), out=self.x[:n])
            self._rope(self.i64.d("positions"), n)
        else:
            self._post(j - 1, n, self.x)
        if j < len(self.kinds):
            self.pre(j, n, self.x)

    def drafter_piece(self, j: int, n: int) -> None:
        """The MTP layer over d_ids / d_pos / d_hidden: fc(embedding, hidden) and its attention's
        pre-core half (j = 0); the post-core half and its MoE (j = 1)."""
        s, x = self.s, self.d_hidden
        if j == 0:
            emb = self.w.embed.index_select(0, self.d_ids[:n])
            x[:n].copy_(L.mtp_fc_forward(emb, x[:n], self.w.mtp, s))
            self._rope(self.d_pos, n)
            self.pre(-1, n, x)
        else:
            self._post(-1, n, x)

    # -- cores (eager between pieces; inside the graph in FULL mode)
    def attn_core(self, cache: int, st: Step, n: int, R: int, max_q: int, slots: torch.Tensor,
                  seq_lens: torch.Tensor, cu_q: torch.Tensor) -> None:
        """Attention layer `cache`'s KV write and one paged-attention launch for all R requests."""
        kc, vc = self.kv[cache]
        self.reshape_and_cache(self.k[:n], self.v[:n], kc, vc, slots)
        W = self.table_width
        self.paged_attention(self.q[:n], kc, vc, self.i32.d("tables", R * W).view(R, W)[:, :st.cols], seq_lens, cu_q,
                             max_q, self.s.head_dim ** -0.5, out=self.attn_o[:n])

    def gdn_core(self, i: int, st: Step) -> None:
        """Layer i's conv and recurrence: one verify call for the decodes (then their commits),
        one varlen call for the prefills."""
        qkv, g, beta, nd = self.gdn_inputs(i, st)
        if st.B:
            self.commit(i, st, self.verify(i, st, qkv[:nd], g[:nd], beta[:nd]))
        if st.P:
            self.prefill(i, st, qkv[nd:st.n], g[nd:st.n], beta[nd:st.n])

    def gdn_inputs(self, i: int, st: Step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The core's inputs from the projection: conv input, log-decay g, beta; decode tokens first."""
        s, n = self.s, st.n
        w = self.w.layers[i]
        g, beta = self.g[:n], self.beta[:n]
        gdn_gating(self.gdn_proj[:n], s.gdn_conv_channels + s.gdn_v_channels, w.dt_bias, w.neg_a, g, beta)
        return (self.gdn_proj[:n, :s.gdn_conv_channels], g, beta,
                st.B * st.T if not st.ragged else st.lay.decode_tokens)

    def _split_qkv(self, y: torch.Tensor, lead: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.s
        qk, v = y.split([2 * s.gdn_qk_channels, s.gdn_v_channels], -1)
        q, k = qk.reshape(*lead, 2 * s.gdn_k_heads, s.head_k_dim).chunk(2, -2)
        return q, k, v.reshape(*lead, s.gdn_v_heads, s.head_v_dim)

    def verify(self, i: int, st: Step, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> tuple:
        """The policy's conv verify and verify kernel over all decodes; returns their contexts for commit."""
        args, conv_ctx = self.verify_inputs(i, st, qkv, g, beta)
        o, ctx = self.verify_mod.verify(*args, check=False)
        self.verify_output(st, o)
        return ctx, conv_ctx

    def verify_inputs(self, i: int, st: Step, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
                      ) -> tuple[tuple, object]:
        """The verify kernel's arguments (q, k, v, g, beta, parent, state, lengths) after the policy's
        conv verify (with the q/k norms), and the conv's context for its commit."""
        s, B, T = self.s, st.B, st.T
        if st.ragged:
            rows = self.i64.d("dec_rows", B * T)
            qkv, g, beta = qkv.index_select(0, rows), g.index_select(0, rows), beta.index_select(0, rows)
        parent = self.i32.d("parent", B * T).view(B, T)
        lengths = self.i32.d("lengths", B)
        if self.rs:
            # The kernel flushes on the flush_interval-th commit; the step's flush flag decides.
            steps = self.policy.flush_interval - 1 if st.flush else 0
            rs, rcs = self.rs[i], self.rcs[i]
            replayed = self.i32.d("replayed", B)
            rs.count[1:B + 1].copy_(replayed)
            rcs.count[1:B + 1].copy_(replayed)
            state = replace(rs, state=rs.state[1:B + 1], k=rs.k[1:B + 1], v=rs.v[1:B + 1], g=rs.g[1:B + 1],
                            beta=rs.beta[1:B + 1], count=rs.count[1:B + 1], steps=steps)
            conv_state = replace(rcs, conv_state=rcs.conv_state[1:B + 1], x=rcs.x[1:B + 1],
                                 count=rcs.count[1:B + 1], steps=steps)
        elif self.ds:
            p = self.ds[i].pending
            state = replace(self.ds[i], state=self.ssm[i][1:B + 1],
                            pending=replace(p, pu=p.pu[1:B + 1], pk=p.pk[1:B + 1], pg=p.pg[1:B + 1], pn=p.pn[1:B + 1]))
            conv_state = self.conv_pool[i][1:B + 1]
        else:
            state, conv_state = self.ssm[i][1:B + 1], self.conv_pool[i][1:B + 1]
        # One launch, as vLLM's causal_conv1d_update with the q/k L2 norms it fuses into the
        # recurrence: the projection's rows read in place, q and k normalised, q, k, v contiguous.
        qk = s.gdn_qk_channels
        (q, k, v), conv_ctx = self.conv_verify(qkv.reshape(B, T, -1), self.w.conv[i], parent, conv_state, lengths,
                                               norm_channels=2 * qk, norm_dim=s.head_k_dim, split=(qk, 2 * qk))
        q, k = (t.view(B, T, s.gdn_k_heads, s.head_k_dim) for t in (q, k))
        v = v.view(B, T, s.gdn_v_heads, s.head_v_dim)
        return (q, k, v, g.view(B, T, -1), beta.view(B, T, -1), parent, state, lengths), conv_ctx

    def verify_output(self, st: Step, o: torch.Tensor) -> None:
        """The verify kernel's output into the layer's core output rows (ragged decodes unpadded)."""
        o = o.reshape(st.B * st.T, self.s.gdn_v_channels)
        if st.ragged:
            o = o.index_select(0, self.i64.d("dec_back", st.lay.decode_tokens))
        self.gdn_o[:o.shape[0]].copy_(o)

    def commit(self, i: int, st: Step, ctxs: tuple) -> None:
        """The policy's commits (state and conv window) with the step's accepted nodes."""
        accepted = self.i32.d("accepted", st.B)
        self.verify_mod.commit(ctxs[0], accepted, check=False)
        self.conv_commit(ctxs[1], accepted, check=False)

    def prefill(self, i: int, st: Step, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> None:
        """All prefill chunks of the step as vLLM runs them: gather their states from the pool (zero
        for first chunks), one varlen conv and one varlen chunked-rule call, scatter the states back."""
        s, P, m = self.s, st.P, qkv.shape[0]
        nd = st.n - m
        slots, cu, has_init = self.i64.d("pf_slots", P), st.pf_cu, self.i32.d("pf_init", P)
        cw = self.w.conv[i]
        conv0 = self.conv_pool[i].index_select(0, slots)
        conv0.mul_(has_init.view(P, 1, 1))
        state0 = self.ssm[i].index_select(0, slots)
        state0.mul_(has_init.view(P, 1, 1, 1))
        if self.chunk_fn is None:
            self._prefill_ref(i, st, qkv, g, beta, conv0, state0)
            return
        y = None
        if self.fla_conv is not None:
            try:
                y, conv_final = self.fla_conv(qkv[None], cw, initial_state=F.pad(conv0, (1, 0)),
                                              output_final_state=True, activation="silu", cu_seqlens=cu,
                                              cu_seqlens_cpu=st.pf_cu_cpu)
                y = y[0]
                self.conv_pool[i].index_copy_(0, slots, conv_final[..., 1:].to(L.BF16))
            except Exception as e:  # API drift: keep timing with the stand-in below
                self.log(f"fla causal_conv1d failed ({type(e).__name__}: {e}); using policies' tree_conv stand-in")
                self.fla_conv = None
        if y is None:
            # Stand-in with the same work (not the same boundaries): the policies' Triton conv
            # over all prefill tokens as one chain.
            from policies.kernels.conv import tree_conv

            chain = (torch.arange(m, dtype=torch.int32, device=qkv.device) - 1)[None]
            y = tree_conv(qkv[None], cw, chain, conv0[:1].contiguous())[0][0]
        q, k, v = self._split_qkv(y, (m,))
        o, final = self.chunk_fn(q[None], k[None], v[None], g[None], beta[None], initial_state=state0,
                                 output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True,
                                 cu_seqlens=cu, cu_seqlens_cpu=st.pf_cu_cpu)
        self.ssm[i].index_copy_(0, slots, final.to(self.state_dtype))
        self.gdn_o[nd:nd + m].copy_(o[0].reshape(m, s.gdn_v_channels))

    def _prefill_ref(self, i: int, st: Step, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     conv0: torch.Tensor, state0: torch.Tensor) -> None:
        """Without fla (CPU tests): the float64 references, one sequence at a time (host syncs)."""
        from policies.kernels import reference as ref

        s, w, nd = self.s, self.w.layers[i], st.n - qkv.shape[0]
        bounds = st.pf_cu_cpu.tolist()
        slots = self.i64.d("pf_slots", st.P).tolist()
        for p in range(st.P):
            a, b = bounds[p], bounds[p + 1]
            chain = (torch.arange(b - a, dtype=torch.int32, device=qkv.device) - 1)[None]
            y, windows = ref.tree_conv(qkv[None, a:b], self.w.conv[i], chain, conv0[p:p + 1])
            q, k, v = self._split_qkv(y.to(L.BF16), (1, b - a))
            q, k = (F.rms_norm(t, (s.head_k_dim,), w.qk_scale, L.EPS) for t in (q, k))
            o, states = ref.recurrence(q, k, v, g[None, a:b], beta[None, a:b], chain, state0[p:p + 1])
            self.conv_pool[i][slots[p]].copy_(windows[0, -1])
            self.ssm[i][slots[p]].copy_(states[0, -1])
            self.gdn_o[nd + a:nd + b].copy_(o[0].reshape(b - a, s.gdn_v_channels))

    # -- forward passes
    def _piece(self, key: tuple, fn: Callable[[int], None], d: Plan, n: int) -> None:
        """A dense piece: replayed as a graph at the padded size (PIECEWISE), else launched over n rows."""
        if d.mode == PIECEWISE:
            self.graphs.replay(key + (d.tokens,), lambda: fn(d.tokens))
        else:
            fn(n)

    def _target(self, st: Step) -> None:
        n, R = st.n, st.R
        slots, seq_lens, cu_q = self.i64.d("slots", n), self.i32.d("seq_lens", R), self.i32.d("cu_q", R + 1)
        attn = 0
        for j, kind in enumerate(self.kinds):
            self._piece(("t", j), lambda m, j=j: self.target_piece(j, m), st.d, n)
            if kind == "gdn":
                self.gdn_core(j, st)
            else:
                self.attn_core(attn, st, n, R, st.max_q, slots, seq_lens, cu_q)
                attn += 1
        self._piece(("t", len(self.kinds)), lambda m: self.target_piece(len(self.kinds), m), st.d, n)

    def _drafter(self, st: Step) -> torch.Tensor:
        """The MTP layer's K passes: the first over all target tokens, then one token per request.
        Returns the drafts [K, requests] (real requests only)."""
        drafts: list[torch.Tensor] = []
        for j in range(self.depth):
            drafts.append(self.draft_pass(st, j, drafts[-1] if drafts else None))
        return torch.stack(drafts)

    def draft_pass(self, st: Step, j: int, prev: torch.Tensor | None) -> torch.Tensor:
        """Drafter pass j: over all target tokens (j = 0) or one token per request (the
        previous pass's drafts `prev`); returns one draft per real request."""
        R, Rreal = st.R, len(st.lay.order)
        last = self.i64.d("last_rows", R)
        if j == 0:
            n = st.n
            self.d_ids[:n].copy_(self.i64.d("ids", n))
            self.d_pos[:n].copy_(self.i64.d("positions", n))
            self.d_hidden[:n].copy_(self.x[:n])
            slots, seq_lens, cu_q, max_q = (self.i64.d("slots", n), self.i32.d("seq_lens", R),
                                            self.i32.d("cu_q", R + 1), st.max_q)
            # vLLM runs the drafter piecewise (attention eager) up to the largest capture size.
            d = st.d if st.d.mode != FULL else Plan(st.d.kind, PIECEWISE, st.d.tokens, R)
        else:
            n = R
            o64, o32 = self.i64.offsets, self.i32.offsets
            self.d_ids[:Rreal].copy_(prev)
            self.d_pos[:n].copy_(self.i64.dev[o64["d_positions"][0] + (j - 1) * R:][:n])
            if j == 1:
                self.d_hidden[:n].copy_(self.d_hidden.index_select(0, last))
            slots = self.i64.dev[o64["d_slots"][0] + (j - 1) * R:][:n]
            seq_lens = self.i32.dev[o32["d_seq_lens"][0] + (j - 1) * R:][:n]
            cu_q, max_q = self.i32.d("d_cu", R + 1), 1
            d = plan([1] * n, [True] * n, self.positions, self.sizes, False, st.how)
        self._piece(("d", 0), lambda m: self.drafter_piece(0, m), d, n)
        self.attn_core(len(self.kv) - 1, st, n, R, max_q, slots, seq_lens, cu_q)
        self._piece(("d", 1), lambda m: self.drafter_piece(1, m), d, n)
        rows = last[:Rreal] if j == 0 else self.arange[:Rreal]
        return L.lm_head_forward(self.d_hidden.index_select(0, rows), self.w.head, self.s)

    def launch(self, st: Step) -> None:
        """Every GPU launch of the step and the copy of its results to a pinned host buffer; no sync."""
        if st.d.mode == FULL:
            key = (self.policy_key, st.d.tokens, st.flush)
            try:
                self.graphs.replay(("full",) + key, lambda: self._target(st))
            except Exception as e:  # e.g. a core that syncs: this size runs piecewise from now on
                self.log(f"full graph at {st.d.tokens} tokens failed ({type(e).__name__}: {e}); piecewise instead")
                self.full_failed.add(key)
                st.d = Plan(st.d.kind, PIECEWISE, st.d.tokens, st.d.requests)
                self._target(st)
        else:
            self._target(st)
        self.sample(st)
        if self.depth:
            drafts = self._drafter(st)
            o = self.max_tokens + self.max_requests
            self.out[o:o + drafts.numel()].copy_(drafts.flatten())
        self.out_cur ^= 1
        st.out_host = self.out_hosts[self.out_cur]
        st.out_host.copy_(self.out, non_blocking=True)
        if self.device.type == "cuda":
            st.done = torch.cuda.Event()
            st.done.record()

    def sample(self, st: Step) -> None:
        """LM head on the sampled rows, greedy tokens and acceptance, into self.out."""
        tokens = L.lm_head_forward(self.x.index_select(0, self.i64.d("logits_rows", st.n_logits)), self.w.head, self.s)
        self.out[:st.n_logits].copy_(tokens)
        N = self.max_tokens
        B = st.lay.num_decodes
        if B:
            # Greedy acceptance: each decode's drafts (its input ids after the root) against the
            # target's argmax, kept while they match, plus the bonus token.
            T, nd = st.T, st.lay.decode_tokens
            if st.ragged:
                idx = self.i64.d("dec_rows", B * T)
                tgt, ids = tokens[:nd].index_select(0, idx), self.i64.d("ids", nd).index_select(0, idx)
            else:
                tgt, ids = tokens[:B * T], self.i64.d("ids", B * T)
            tgt, ids = tgt.view(B, T), ids.view(B, T)
            match = (tgt[:, :-1] == ids[:, 1:]).int().cumprod(1)
            self.out[N:N + B].copy_(match.sum(1) + 1)

    def finish(self, st: Step) -> StepOutput:
        """Wait for the step's tokens on the host (its only synchronisation), then Python lists."""
        if st.done is not None:
            st.done.synchronize()
        N, o = self.max_tokens, self.max_tokens + self.max_requests
        Rreal, B = len(st.lay.order), st.lay.num_decodes
        out = st.out_host
        return StepOutput(tokens=out[:st.n_logits].tolist(), accepted=out[N:N + B].tolist(),
                          drafts=out[o:o + self.depth * Rreal].view(self.depth, Rreal).tolist(),
                          kind=st.d.kind, mode=st.d.mode, padded_tokens=st.d.tokens)

    def run(self, requests: Sequence[StepRequest], flush: bool = False, mode: str | None = None) -> StepOutput:
        st = self.prepare(requests, flush, mode)
        self.launch(st)
        return self.finish(st)

    # -- checks
    def _pool_views(self, slots: int) -> list[torch.Tensor]:
        ts = [t[:slots] for t in self.ssm + self.conv_pool if t is not None]
        for rs in self.rs.values():
            ts += [rs.k[:slots], rs.v[:slots], rs.g[:slots], rs.beta[:slots], rs.count[:slots]]
        for rcs in self.rcs.values():
            ts += [rcs.x[:slots], rcs.count[:slots]]
        for ds in self.ds.values():
            p = ds.pending
            ts += [p.pu[:slots], p.pk[:slots], p.pg[:slots], p.pn[:slots]]
        return ts

    def snapshot(self, slots: int) -> list[torch.Tensor]:
        """Copies of the GDN pools' first `slots` slots (replay caches included), to rerun a step."""
        return [t.clone() for t in self._pool_views(slots)]

    def restore(self, saved: list[torch.Tensor]) -> None:
        for t, c in zip(self._pool_views(saved[0].shape[0]), saved):
            t.copy_(c)

    def poison(self, rows: int) -> None:
        """NaN in the first `rows` rows of every activation buffer: a row of a step of `rows` tokens
        that should have been written but was not shows up. Rows past them (graph padding) stay
        finite: the router would pick experts from NaN logits."""
        for t in (self.x, self.gdn_proj, self.gdn_o, self.q, self.gate, self.k, self.v, self.attn_o, self.d_hidden):
            t[:rows].fill_(math.nan)
