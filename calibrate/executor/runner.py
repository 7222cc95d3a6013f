"""The whole model on one GPU at real shapes (random bf16 weights), running steps the way vLLM does.

A step is a list of requests (`prefill` tokens after `context` cached ones, or a decode
verifying a draft `tree` of which `accepted` positions are kept). `Executor.run` does
what vLLM's engine loop does for it, with no synchronisation until the sampled tokens
reach the host:
  host prep   positions, block tables and slot mapping from a paged pool laid out as
              `specsim memory` lays it out (sim.engine.budget: attention block size), GDN state
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
Dense pieces run as CUDA graphs per calibrate.device.graphs' dispatch (FULL / PIECEWISE /
EAGER). Requests of a step take consecutive pool blocks and state slots (decodes
first, then prefills, as vLLM orders a batch): the contents are random, only the
memory traffic and launches are real.

The executor is one object made of four parts, one file each: host prep
(calibrate.executor.prep: `prepare`, the `Step` it returns), the forward passes
(calibrate.executor.forward: dense pieces, attention core, target and drafter), the GDN
cores (calibrate.executor.gdn: gating, the policy's verify and commit, varlen prefill),
and here its buffers, policy switching, the launch of a whole step and its outputs, and
the checks' state snapshots. The layout is calibrate.executor.step_layout's, the weights
calibrate.model.weights'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from calibrate.device.graphs import FULL, PIECEWISE, GraphCache, Plan
from calibrate.executor.forward import Forward
from calibrate.executor.gdn import GDNCores, load_policy_kernels
from calibrate.executor.prep import Packed, Step, StepPrep
from calibrate.executor.step_layout import POSITIONS_MAX, StepRequest
from calibrate.model import layers as L
from calibrate.model.fla import load_fla_conv
from calibrate.model.gdn_prefill_kernel import load_gdn_prefill
from calibrate.model.shapes import LayerShapes
from calibrate.model.weights import Weights
from core.config import ModelConfig, PolicyConfig
from policies import make_policy
from policies.tree import DraftTree
from sim.engine.step_trace import step_shape


@dataclass
class StepOutput:
    tokens: list[int]  # sampled target tokens (every verify position, each prefill's last token)
    accepted: list[int]  # greedy acceptance per decode request (random weights: not the traced one)
    drafts: list[list[int]]  # per drafter pass, one token per request
    kind: str  # sim.pricing.dispatch.STEP_KINDS, as vLLM's rule classifies the step
    mode: str  # FULL, PIECEWISE or EAGER
    padded_tokens: int


class Executor(StepPrep, Forward, GDNCores):
    """Buffers, pools and the step function of one model under one policy on one device."""

    def __init__(self, model: ModelConfig, policy: PolicyConfig, *, device: torch.device, max_requests: int,
                 max_context: int, max_num_seqs: int, max_num_batched_tokens: int, block_size: int,
                 kv_pool_bytes: int, mode: str = "vllm", kinds: list[str] | None = None,
                 shapes: LayerShapes | None = None, weights: Weights | None = None,
                 log: Callable[[str], None] = print, performance_mode: str = "balanced") -> None:
        s = self.s = shapes or LayerShapes.from_model(model)
        self.device, self.log, self.model = device, log, model
        self.graphs = GraphCache() if device.type == "cuda" and mode != "eager" else None
        self.mode = mode if self.graphs is not None else "eager"
        self.kinds = kinds or model.layer_pattern * (model.num_layers // len(model.layer_pattern))
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.performance_mode = performance_mode  # the traced run's: it sets the capture sizes
        # Uniform-decode query length, drafter passes, capture sizes: what the simulator dispatched
        # the traced steps with (a policy of another shape needs another executor).
        self.positions, self.depth, self.sizes, _ = step_shape(model, make_policy(model, policy), max_num_seqs,
                                                               max_num_batched_tokens, performance_mode)
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
                           self.max_num_batched_tokens, self.performance_mode)
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


    def kernel_sources(self) -> dict[str, str]:
        """Which implementation each core runs (a reference instead of a kernel makes timings moot)."""
        def name(f: object) -> str:
            return f"{getattr(f, '__module__', '?')}.{getattr(f, '__name__', type(f).__name__)}" if f else "none"
        return {"paged_attention": name(self.paged_attention), "gdn_prefill": self.gdn_prefill_kernel or "none",
                "gdn_prefill_conv": name(self.fla_conv), "verify": self.verify_mod.__name__,
                "ffn": name(L.mlp_forward if self.s.dense else L.moe_forward)}

    def kv_pool_bytes(self) -> int:
        return sum(2 * t[0].numel() * t[0].element_size() for t in self.kv)

    # -- a whole step
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
