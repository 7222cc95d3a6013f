"""Roofline step latency: the fallback wherever no calibration table exists.

Every term is max(bytes / HBM bandwidth, flops / bf16 rate) on one GPU (tensor-parallel
shards), with bytes and flops written out from the model's shapes:
  - weights are read once per step; routed experts only for the experts the step's
    tokens touch: with T tokens each routed to k of E experts, E (1 - (1 - k/E)^T)
    distinct experts in expectation;
  - attention reads the KV cache of every scheduled request (its context) and writes
    the new tokens' KV;
  - the GDN recurrence moves states per policy: store_all reads one state and writes
    one per verify position; reconstruct reads one and writes float32 pseudo-values,
    then its commit reads and writes one state; replay reads one state plus the cached
    inputs it replays, and writes the state back only at a flush;
  - tensor parallelism adds two ring all-reduces per layer over NVLink;
  - piecewise (eager) execution launches at least one Python-level kernel call per
    layer; the CPU time that exceeds the GPU work of the step is added to `overhead`.
"""
from __future__ import annotations

from core.config import EngineConfig, HardwareConfig, ModelConfig
from policies import CommitPolicy
from sim.pricing.latency import TERMS, LatencySources, StepBatch, StepTime

# Fixed CPU time per engine step (scheduling, input preparation, sampling
# bookkeeping, output processing), seconds. Assumed, not measured: vLLM v1's step
# loop costs a few hundred microseconds of Python per step; replaced by the
# calibrated overhead when a table exists or by engine.step_overhead_us.
STEP_OVERHEAD_S = 400e-6
# CPU cost of one eager kernel call, seconds: docs/notes/2026-11-29-h200-reference-points.md measured 45-160 us of Python
# overhead per eager call; piecewise mode makes at least one such call per layer.
EAGER_CALL_S = 45e-6
# Fraction of copy bandwidth the GDN recurrent kernels reach: docs/notes/2026-11-29-h200-reference-points.md measured
# 46-53% for fla's fused recurrent kernel at B >= 32 (per-token work, not bytes, bounds it).
GDN_KERNEL_EFFICIENCY = 0.5
FP32_BYTES = 4  # pseudo-values, gates and logits are float32
# Elementwise flops per token per head-state element of the delta rule (S k, the
# rank-one update, the decay, S q): 2 multiply-adds for each of 3 matrix-vector products.
GDN_FLOPS_PER_STATE_ELEMENT = 6
STATIC_CACHE_SIZE = 100_000  # batch shapes whose context-free terms are kept (a few hundred bytes each)


class AnalyticLatencyModel:
    def __init__(self, model: ModelConfig, hw: HardwareConfig, policy: CommitPolicy, engine_cfg: EngineConfig) -> None:
        self.model, self.hw, self.policy = model, hw, policy
        tp = model.tensor_parallel
        self.tp = tp
        self.bw = hw.hbm_bandwidth_gbs * 1e9  # bytes/s
        self.rate = hw.bf16_tflops * 1e12  # flops/s
        wb = model.projection_weight_bytes
        h = model.hidden_size
        g, a, moe = model.gdn, model.attention, model.moe
        self.gdn_layers, self.attn_layers, self.layers = model.gdn_layers, model.attn_layers, model.num_layers

        # Parameters per layer per GPU.
        gdn_proj = (h * (2 * g.num_k_heads * g.head_k_dim + 2 * g.num_v_heads * g.head_v_dim + 2 * g.num_v_heads)
                    + g.num_v_heads * g.head_v_dim * h) / tp  # q, k, v, output gate z, a, b; out proj
        attn_proj = (h * (2 * a.num_q_heads * a.head_dim + 2 * a.num_kv_heads * a.head_dim)
                     + a.num_q_heads * a.head_dim * h) / tp  # gated q (query + gate), k, v; out proj
        if moe is not None:
            self.expert_params = 3 * h * moe.expert_width / tp  # gate, up, down
            self.shared_params = moe.shared_width / moe.expert_width * self.expert_params
            self.dense_ffn = self.shared_params + h * moe.num_experts / tp  # every token's: shared experts + router
            self.experts, self.top_k = moe.num_experts, moe.top_k
        else:  # a dense MLP: no routed experts, every token through the whole MLP
            self.expert_params, self.experts, self.top_k = 0.0, 1, 0
            self.dense_ffn = self.shared_params = 3 * h * model.mlp.intermediate_size / tp
        self.active_ffn_params = (self.top_k + self.shared_params / self.expert_params) * self.expert_params \
            if moe is not None else self.shared_params  # what one token multiplies by
        self.gdn_proj, self.attn_proj = gdn_proj, attn_proj
        self.lm_head = model.vocab_size * h / tp
        self.mtp_extra = 2 * h * h / tp  # MTP's fusion projection of [embedding, hidden]
        self.wb = wb
        self.lm_wb = model.weight_dtype_bytes  # the LM head stays unquantised in an FP8 checkpoint

        self.state_bytes = g.num_v_heads // tp * g.head_v_dim * g.head_k_dim * model.state_dtype_bytes  # per layer, seq
        self.state_elems = g.num_v_heads // tp * g.head_v_dim * g.head_k_dim
        # q, k, v inputs of the recurrence, bf16, per token per layer
        self.gdn_io_per_token = (2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim) // tp * 2
        self.pseudo_value_bytes = g.num_v_heads // tp * g.head_v_dim * FP32_BYTES  # one position's u, per layer
        self.cached_token_bytes = (policy.cached_input_bytes_per_token_per_layer() // tp
                                   if policy.name == "replay" else 0)  # replay's cached k, v, g, beta
        self.kv_token_bytes = model.attn_page_bytes_per_token_per_gpu  # one attention layer
        self.attn_flops_per_pair = 4 * a.num_q_heads / tp * a.head_dim  # QK^T + PV per (query, key), one layer
        self.hidden_act_bytes = h * 2  # one bf16 activation row
        self.tree = policy.tree
        self.overhead_s = (engine_cfg.step_overhead_us * 1e-6 if engine_cfg.step_overhead_us is not None
                           else STEP_OVERHEAD_S)
        self.nvlink_bw = hw.nvlink_bandwidth_gbs * 1e9
        self.nvlink_lat = hw.nvlink_latency_us * 1e-6
        self._static: dict[tuple, tuple] = {}
        self.sources = LatencySources({t: "analytic" for t in TERMS})
        if engine_cfg.step_overhead_us is not None:
            self.sources.by_term["overhead"] = "config"

    # -------------------------------------------------------------- helpers
    def _roof(self, nbytes: float, flops: float) -> float:
        return max(nbytes / self.bw, flops / self.rate)

    def _distinct_experts(self, tokens: float) -> float:
        e = self.experts
        return e * (1.0 - (1.0 - self.top_k / e) ** tokens)

    def _moe_layer(self, tokens: float) -> tuple[float, float]:
        """The feed-forward block (MoE or dense MLP) of one layer: (bytes, flops)."""
        params = self._distinct_experts(tokens) * self.expert_params + self.dense_ffn
        flops = 2 * tokens * self.active_ffn_params
        return params * self.wb + tokens * self.hidden_act_bytes * 2, flops

    def _attn_layer(self, tokens: float, seqs: int, prefill_tokens: int,
                    prefill_seqs: int) -> tuple[float, float, float, float]:
        """One attention layer as bytes and flops linear in the batch's context tokens:
        (bytes, flops, bytes per context token, flops per context token)."""
        nbytes = self.attn_proj * self.wb + tokens * self.kv_token_bytes
        causal = prefill_tokens * prefill_tokens / (2 * prefill_seqs) if prefill_seqs else 0.0
        flops = 2 * tokens * self.attn_proj + self.attn_flops_per_pair * causal
        per_seq = tokens / seqs if seqs else 0.0
        return nbytes, flops, self.kv_token_bytes, self.attn_flops_per_pair * per_seq

    # -------------------------------------------------------------- the step
    def step_time(self, b: StepBatch) -> StepTime:
        # Everything but the context-dependent attention is a function of the batch shape:
        # cache it (shapes repeat across steps; the context grows every step).
        key = (b.num_seqs, b.prefill_tokens, b.prefill_seqs, b.decode_seqs, b.spec_seqs, b.verify_positions,
               b.replay_tokens, b.flush_seqs, b.draft_depth)
        static = self._static.get(key)
        if static is None:
            if len(self._static) >= STATIC_CACHE_SIZE:
                self._static.clear()
            static = self._static[key] = self._shape_terms(b)
        terms, context_parts = static
        t = dict(terms)
        ctx = b.context_tokens
        bw, rate = self.bw, self.rate
        for name, mult, b0, f0, b_ctx, f_ctx in context_parts:
            mem, comp = (b0 + b_ctx * ctx) / bw, (f0 + f_ctx * ctx) / rate
            t[name] += mult * (mem if mem > comp else comp)
        overhead = self.overhead_s
        if b.eager:
            gpu = sum(t.values())
            launches = (self.layers + 1 + b.draft_depth) * EAGER_CALL_S  # layers + LM head + drafter passes
            overhead += max(0.0, launches - gpu)
        t["overhead"] = overhead
        return StepTime(t, "eager" if b.eager else "graph")

    def _shape_terms(self, b: StepBatch) -> tuple[dict[str, float], list[tuple[str, int, float, float, float, float]]]:
        """All terms that do not depend on context length, and the context-linear roofline parts."""
        T = b.num_tokens
        sampled = b.decode_tokens + b.prefill_seqs  # rows whose logits are needed
        t = dict.fromkeys(TERMS, 0.0)

        # GDN layers: projections (+ chunked prefill recurrence: a state read and write per prefill seq).
        nbytes = self.gdn_layers * (self.gdn_proj * self.wb + b.prefill_seqs * 2 * self.state_bytes)
        flops = self.gdn_layers * (2 * T * self.gdn_proj
                                   + b.prefill_tokens * GDN_FLOPS_PER_STATE_ELEMENT * self.state_elems)
        t["gdn"] = self._roof(nbytes, flops)

        # The policy's verify and commit kernels, over decoding requests.
        plain = b.decode_seqs - b.spec_seqs  # 1-token steps: read and write one state, any policy
        vp = b.verify_positions
        S = self.state_bytes
        verify = plain * (2 * S + self.gdn_io_per_token)
        commit = 0.0
        name = self.policy.name
        if b.spec_seqs:
            io = b.spec_seqs * vp * self.gdn_io_per_token
            if name == "store_all":
                verify += b.spec_seqs * (1 + vp) * S + io
                # commit: the next step reads the accepted slot directly (an index update, no copy)
            elif name == "reconstruct":
                verify += b.spec_seqs * (S + vp * self.pseudo_value_bytes) + io
                commit = b.spec_seqs * (2 * S + (self.policy.tree.depth + 1) * self.pseudo_value_bytes)
            else:  # replay
                verify += b.spec_seqs * S + b.replay_tokens * self.cached_token_bytes + io
                cached_per_seq = b.replay_tokens / b.spec_seqs
                commit = b.flush_seqs * (2 * S + cached_per_seq * self.cached_token_bytes)
        eff_bw = self.bw * GDN_KERNEL_EFFICIENCY
        recur_flops = (b.decode_tokens + b.replay_tokens) * GDN_FLOPS_PER_STATE_ELEMENT * self.state_elems
        t["gdn_verify"] = self.gdn_layers * max(verify / eff_bw, recur_flops / self.rate)
        t["gdn_commit"] = self.gdn_layers * commit / eff_bw

        parts = [("attention", self.attn_layers, *self._attn_layer(T, b.num_seqs, b.prefill_tokens, b.prefill_seqs))]

        nbytes, flops = self._moe_layer(T)
        t["moe"] = self.layers * self._roof(nbytes, flops)

        t["lm_head"] = self._roof(self.lm_head * self.lm_wb + sampled * self.model.vocab_size / self.tp * FP32_BYTES,
                                  2 * sampled * self.lm_head)

        # MTP drafter: one pass over all scheduled tokens, then one pass per further depth
        # over the nodes of the previous depth of each speculating request. Each pass is one
        # roofline over its attention, MoE, fusion projection and LM head.
        if b.draft_depth:
            passes = [(T, b.num_seqs, sampled)]
            for width in self.tree.later_pass_widths(b.draft_depth):
                nodes = b.spec_seqs * width
                if nodes:
                    passes.append((nodes, b.spec_seqs, nodes))
            for tokens, seqs, rows in passes:
                ab, af, ab_ctx, af_ctx = self._attn_layer(tokens, seqs, 0, 0)
                mb, mf = self._moe_layer(tokens)
                nbytes = ab + mb + self.mtp_extra * self.wb + self.lm_head * self.lm_wb
                flops = af + mf + 2 * tokens * self.mtp_extra + 2 * rows * self.lm_head
                parts.append(("drafter", 1, nbytes, flops, ab_ctx, af_ctx))

        if self.tp > 1:
            msg = T * self.hidden_act_bytes
            ring = 2 * (self.tp - 1)
            t["allreduce"] = 2 * self.layers * (ring / self.tp * msg / self.nvlink_bw + ring * self.nvlink_lat)
        return t, parts
