"""Step latency from the GPU calibration tables (`results/calibration/<gpu>/<model>/`).

Two pricings (`engine.latency_pricing`):

pipeline (default): every op is priced by its GPU time from the graph-mode tables at
the token counts the step really has (dense parts at the padded capture size), and
the host is a model of its own (sim.host_model): the ops are issued in vLLM's order
for the step's dispatch mode (sim.dispatch) and run as a two-resource pipeline.
  FULL       step_prepare, one full-graph replay (every target layer), sampling, the
             drafter passes, step_finish;
  PIECEWISE  per layer a graph piece (its dense part and MoE) then its eager core:
             attention = one paged-attention call over all requests (decode contexts,
             each prefill chunk with its own context); GDN = the verify call and the
             commit for the decoding requests (the policy's kernels, kernels.csv, plus
             the core's gating, conv verify/commit and q/k norms over the decode tokens,
             `gdn_decode_conv` of the run's policy where measured), ONE varlen prefill
             call for all prefill sequences (`gdn_prefill_varlen` [tokens, seqs] where
             measured, else the one-sequence `gdn_prefill` curve at the chunk-rounded
             token total); `gdn` holds only the layer's dense halves around its core;
  EAGER      as PIECEWISE with the dense parts launched eagerly (above the largest
             capture size).
The drafter runs K passes whenever the step drafts: the first over all target
tokens, then one over R x width tokens per depth (vLLM drafts for every request).
Terms are GPU times; `overhead` is what the host adds on top (step_prepare,
step_finish and launch stalls), so the terms still sum to the step time.

eager_sum (the old pricing, kept to compare): the sum of the measured parts below.
  gdn        = GDN layers x gdn(tokens)
  gdn_verify = GDN layers x the policy's verify kernel at (decoding requests, tree)
               [kernels.csv], plus prefill requests x gdn_prefill(chunk): fla's
               chunked kernel, vLLM's GDN prefill (roofline if it was not measured)
  gdn_commit = GDN layers x the policy's commit kernel [kernels.csv]
  attention  = attention layers x (attn_proj(tokens) + attn_decode(B, P, context)
               + prefill requests x attn_prefill(chunk, context))
  moe        = all layers x moe(tokens);  lm_head = lm_head(rows that are sampled)
  drafter    = MTP passes, each mtp_fc + attn_proj + attention core + moe + lm_head
  allreduce  = two ring all-reduces per layer (and per drafter pass) at TP > 1, from
               the hardware's stated NVLink bandwidth and latency (not measured: only
               one-GPU machines were lent)
  overhead   = host time of a real step beyond its GPU time (input upload, graph
               launch, token download, sync), from the whole-step check
Graph or eager tables are chosen by `batch.eager`; an eager step is vLLM's piecewise
mode (dense parts from graph tables, attention/GDN cores and kernels from eager
ones) unless `piecewise=False`. `context` is the batch's mean
context per scheduled request. A derived hardware profile (e.g. B200) scales each
calibrated piece by its `scaling` factor, memory- or compute-bound by its arithmetic
intensity against the source GPU's ridge point. Terms with no table come from the
fallback model and are labelled so in `sources`.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from core.calibration_files import gpu_file, model_file
from core.config import REPO_ROOT, EngineConfig, HardwareConfig, ModelConfig, PolicyConfig, load_hardware
from core.interp import Curve1D, GridInterpolator, from_rows
from core.tables import DECODE_CONV, DECODE_CONV_COLUMNS, STEP_COLUMNS, TABLES, TableError, read_rows
from policies import CommitPolicy, make_policy
from sim.host_model import HostCosts, pipeline
from sim.latency import TERMS, LatencyModel, LatencySources, StepBatch, StepTime
from sim.latency_analytic import GDN_FLOPS_PER_STATE_ELEMENT

MODES = ("graph", "eager")
KERNEL_COLUMNS = ("model", "policy", "B", "T", "verify_us", "commit_us", "mode")
REPLAY_COLUMNS = ("replay_tokens", "replayed_tokens", "cached_tokens")  # the kernels bench's name for it
US = 1e-6
STEP_MEMO = 200_000  # distinct batch shapes whose context-free part is kept
FLA_CHUNK = 64  # tokens: fla's chunk size; a varlen call runs each sequence in whole chunks
PRICINGS = ("pipeline", "eager_sum")
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # kernels.csv `state_dtype`


def _tree_key(text: Any) -> tuple[int, ...] | None:
    nums = tuple(int(x) for x in re.findall(r"\d+", str(text)))
    return nums or None


class CalibratedLatencyModel:
    def __init__(self, model: ModelConfig, hw: HardwareConfig, policy: CommitPolicy, engine_cfg: EngineConfig,
                 tables: dict[tuple[str, str], GridInterpolator], kernels: dict[str, Any],
                 overhead_us: float | None, fallback: LatencyModel | None, piecewise: bool = True,
                 host: HostCosts | None = None, decode_conv: Curve1D | None = None) -> None:
        self.model, self.hw, self.policy, self.fallback = model, hw, policy, fallback
        self.piecewise = piecewise
        self.pricing = engine_cfg.latency_pricing
        if self.pricing not in PRICINGS:
            raise ValueError(f"engine.latency_pricing must be one of {', '.join(PRICINGS)}, got {self.pricing!r}")
        self.async_scheduling = engine_cfg.async_scheduling
        self.layer_kinds = tuple(model.layer_pattern) * (model.num_layers // len(model.layer_pattern))
        self.tables = tables
        self.kernels = kernels
        self.decode_conv = decode_conv
        self.tp = model.tensor_parallel
        self.nodes_per_depth = policy.tree.nodes_per_depth
        self.derived = hw.derived
        if hw.derived:
            base = load_hardware(hw.derived_from)
            self.ridge = base.bf16_tflops * 1e12 / (base.hbm_bandwidth_gbs * 1e9)  # flops per byte
            self.scale = {k: float(v) for k, v in hw.scaling.items()}
            for kind in ("memory_bound", "compute_bound", "overhead"):
                if kind not in self.scale:
                    raise TableError(f"hardware {hw.name}: derived profile lacks scaling.{kind}")
        # The feed-forward table: a dense model's MLP (every weight read at any token count) or the MoE.
        ffn = "mlp" if model.dense else "moe"
        if (ffn, "graph") not in tables:
            raise TableError(f"{model.name}: no {ffn}.csv among its tables (a "
                             f"{'dense' if model.dense else 'MoE'} model's feed-forward block)")
        self.top_k_per_expert = 0.0 if model.dense else model.moe.top_k / model.moe.num_experts
        self.q_per_kv = model.attention.num_q_heads // model.tensor_parallel / model.kv_heads_per_gpu
        self.nvlink_bw = hw.nvlink_bandwidth_gbs * 1e9
        self.nvlink_lat = hw.nvlink_latency_us * US
        self.hidden_bytes = model.hidden_size * model.weight_dtype_bytes
        cal = "derived" if hw.derived else "calibrated"
        src = {t: cal for t in TERMS}
        if "verify" not in kernels:
            src["gdn_verify"] = "analytic"
        elif not any(k[0] == "gdn_prefill" for k in tables):
            src["gdn_verify"] = "mixed"  # decode verify measured, prefill recurrence by roofline
        if "commit" not in kernels:
            src["gdn_commit"] = "analytic"
        if self.tp > 1:
            src["allreduce"] = "analytic"
        if engine_cfg.step_overhead_us is not None:
            src["overhead"] = "config"
            overhead_us = engine_cfg.step_overhead_us
        elif overhead_us is None:
            src["overhead"] = "analytic"
        elif hw.derived:
            overhead_us *= self.scale.get("overhead", 1.0)
        self.overhead_us = overhead_us
        if self.pricing == "pipeline":
            # prepare + finish: engine.step_overhead_us, else the whole-step check's host time.
            self.host = host or HostCosts({}, overhead_us, self.scale["overhead"] if hw.derived else 1.0,
                                          step_source=src["overhead"])
            src["overhead"] = self.host.source
            if "gdn_prefill_varlen" in {k[0] for k in tables}:
                src["gdn_verify"] = cal if "verify" in kernels else "mixed"
        if any(v == "analytic" for v in src.values()) and fallback is None:
            missing = [t for t, v in src.items() if v == "analytic" and t != "allreduce"]
            if missing:
                raise TableError(f"{model.name}: no calibration for {missing} and no fallback model given")
        self.sources = LatencySources(src)
        # One-axis tables as fast memoised curves; the others slice to curves per call.
        self.curves = {k: g.partial() for k, g in tables.items() if len(g.axes) == 1}
        self._steps: dict[tuple, tuple] = {}
        self._shapes: dict[tuple, tuple] = {}

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, model: ModelConfig, hw: HardwareConfig, policy: CommitPolicy | PolicyConfig,
             engine_cfg: EngineConfig, fallback: LatencyModel | None = None, *,
             extrapolate: bool = True, piecewise: bool = True) -> "CalibratedLatencyModel | None":
        """The model for these tables, or None when hw has no calibration for this model.

        piecewise=False prices an eager step as fully eager (every layer from the eager
        tables), as the harness's whole-step check runs it.
        """
        if not hw.calibration_dir:
            return None
        root = REPO_ROOT / hw.calibration_dir
        mdir = root / model.name
        if not mdir.is_dir() or not any(mdir.glob("*.csv")):
            return None
        if isinstance(policy, PolicyConfig):
            policy = make_policy(model, policy)
        tables = load_tables(mdir, extrapolate=extrapolate)
        # The model's own kernel bench (calibrate measure's kernels job) before the GPU's shared table.
        own = model_file(root, model.name, "kernels.csv")
        kernels = load_kernels(own if own.exists() else gpu_file(root, "kernels.csv"), model, policy,
                               extrapolate=extrapolate)
        overhead = load_overhead(mdir)
        host = None
        if engine_cfg.latency_pricing == "pipeline":
            step_us, step_source = ((engine_cfg.step_overhead_us, "config") if engine_cfg.step_overhead_us is not None
                                    else (overhead, "calibrated" if overhead is not None else "analytic"))
            host = HostCosts.load(mdir / "host.csv", step_us, _derived_scale(hw, "overhead"), step_source,
                                  extrapolate=extrapolate, policy=policy.name)
        decode_conv = load_decode_conv(mdir, policy.name, extrapolate=extrapolate)
        return cls(model, hw, policy, engine_cfg, tables, kernels, overhead, fallback, piecewise, host, decode_conv)

    # ------------------------------------------------------------------ helpers
    def _t(self, table: str, mode: str, x: float) -> float:
        return self.curves[(table, mode)](x)

    def _f(self, intensity: float) -> float:
        """Derived-hardware factor of a piece with this arithmetic intensity (flops/byte)."""
        if not self.derived:
            return 1.0
        return self.scale["compute_bound"] if intensity > self.ridge else self.scale["memory_bound"]

    def _tok(self, table: str, mode: str, n: float) -> float:
        """A token-proportional layer part (GEMM intensity is about its token count)."""
        return self._t(table, mode, n) * self._f(n) if n > 0 else 0.0

    def _moe(self, mode: str, n: float) -> float:
        """The feed-forward block of one layer over n tokens (the MoE, or a dense model's MLP)."""
        if self.model.dense:
            return self._tok("mlp", mode, n)
        if n <= 0:
            return 0.0
        touched = 1.0 - (1.0 - self.top_k_per_expert) ** n  # fraction of experts touched
        return self._t("moe", mode, n) * self._f(n * self.top_k_per_expert / touched)

    def _decode_curve(self, mode: str, seqs: float, per_seq: float, coef: float) -> tuple[float, Curve1D] | None:
        """(coefficient, curve over context) of the decode attention core, or None without decodes."""
        if seqs <= 0:
            return None
        return coef * self._f(per_seq * self.q_per_kv), self.tables[("attn_decode", mode)].partial(seqs, per_seq)

    def _prefill_curve(self, mode: str, seqs: int, tokens: int, coef: float) -> tuple[float, Curve1D] | None:
        if seqs <= 0:
            return None
        per_seq = tokens / seqs
        return coef * seqs * self._f(per_seq), self.tables[("attn_prefill", mode)].partial(per_seq)

    def _allreduce(self, tokens: float) -> float:
        if self.tp == 1 or tokens <= 0:
            return 0.0
        ring = 2 * (self.tp - 1)
        return ring / self.tp * tokens * self.hidden_bytes / self.nvlink_bw + ring * self.nvlink_lat

    def _kernel(self, which: str, mode: str, seqs: float) -> float:
        curves = self.kernels[which].get(mode) or next(iter(self.kernels[which].values()))
        return curves.partial()(seqs)

    def out_of_grid(self) -> dict[str, int]:
        """Queries outside the measured grids so far, by table and side ('attn_decode[graph].B_high': n)."""
        tabs = list(self.tables.values()) + [c for k in ("verify", "commit", "append") if k in self.kernels
                                             for c in self.kernels[k].values()]
        if "replay" in self.kernels:
            tabs += list(self.kernels["replay"][1].values())
        return {f"{t.name}.{side}": n for t in tabs for side, n in t.out_of_grid.items()}

    # ------------------------------------------------------------------ the step
    def step_time(self, b: StepBatch) -> StepTime:
        if self.pricing == "pipeline":
            return self._pipeline(b)
        return self._eager_sum(b)

    def _eager_sum(self, b: StepBatch) -> StepTime:
        # Everything but the attention core depends on integer batch fields only, so that
        # part is built once per distinct shape; the core is a curve in the mean context.
        key = (b.eager, b.num_seqs, b.prefill_tokens, b.prefill_seqs, b.decode_seqs, b.spec_seqs,
               b.verify_positions, b.replay_tokens, b.flush_seqs, b.draft_depth)
        built = self._steps.get(key)
        if built is None:
            built = self._build(b)
            if len(self._steps) < STEP_MEMO:
                self._steps[key] = built
        fixed, ctx_parts, needs_fallback = built
        us = dict(fixed)
        ctx = b.context_tokens / b.num_seqs if b.num_seqs else 0.0
        for term, coef, curve in ctx_parts:
            us[term] += coef * curve(ctx)
        if needs_fallback:
            fb = self.fallback.step_time(b).terms
            for term in needs_fallback:
                us[term] = fb[term] / US
        return StepTime({t: us[t] * US for t in TERMS}, "eager" if b.eager else "graph")

    def _build(self, b: StepBatch) -> tuple[dict[str, float], list[tuple[str, float, Curve1D]], tuple[str, ...]]:
        """Context-free microseconds per term, context-dependent parts, terms left to the fallback."""
        mode = "eager" if b.eager else "graph"
        # vLLM runs an eager step piecewise: the dense parts between the attention and
        # GDN cores replay as CUDA graphs, the cores launch eagerly.
        dense = "graph" if self.piecewise else mode
        n = b.num_tokens
        m = self.model
        us: dict[str, float] = dict.fromkeys(TERMS, 0.0)
        parts: list[tuple[str, float, Curve1D]] = []

        def add(term: str, part: tuple[float, Curve1D] | None) -> None:
            if part is not None:
                parts.append((term, *part))

        dec_tok = b.decode_tokens
        per_seq = dec_tok / b.decode_seqs if b.decode_seqs else 0.0
        us["gdn"] = m.gdn_layers * self._tok("gdn", dense, n)
        us["attention"] = m.attn_layers * self._tok("attn_proj", dense, n)
        for term, coef in (("attention", m.attn_layers), ("drafter", 1.0 if b.draft_depth and b.spec_seqs else 0.0)):
            if coef:
                add(term, self._decode_curve(mode, b.decode_seqs, per_seq, coef))
                add(term, self._prefill_curve(mode, b.prefill_seqs, b.prefill_tokens, coef))
        us["moe"] = m.num_layers * self._moe(dense, n)
        us["lm_head"] = self._tok("lm_head", dense, dec_tok + b.prefill_seqs)
        allreduce = 2 * m.num_layers * self._allreduce(n)

        if b.draft_depth and b.spec_seqs:
            d = self._tok("mtp_fc", dense, n) + self._tok("attn_proj", dense, n) + self._moe(dense, n) \
                + self._tok("lm_head", dense, b.spec_seqs)
            allreduce += 2 * self._allreduce(n)
            for depth in range(1, b.draft_depth):
                width = self.nodes_per_depth[min(depth, len(self.nodes_per_depth)) - 1]
                r = b.spec_seqs * width
                d += (self._tok("mtp_fc", dense, r) + self._tok("attn_proj", dense, r) + self._moe(dense, r)
                      + self._tok("lm_head", dense, r))
                add("drafter", self._decode_curve(mode, b.spec_seqs, width, 1.0))
                allreduce += 2 * self._allreduce(r)
            us["drafter"] = d

        fallback: list[str] = []
        if b.decode_seqs:
            for term, which, price in (("gdn_verify", "verify", self._verify_us), ("gdn_commit", "commit", self._commit_us)):
                if which in self.kernels:
                    us[term] = m.gdn_layers * self._f(0.0) * price(mode, b)
                else:
                    fallback.append(term)
            if self.decode_conv is not None:  # measured as GPU time only: both modes price it so
                us["gdn_verify"] += m.gdn_layers * self._f(0.0) * self.decode_conv(b.decode_tokens)
        if b.prefill_tokens:
            if ("gdn_prefill", mode) in self.curves:
                us["gdn_verify"] += m.gdn_layers * b.prefill_seqs * self._f(0.0) * \
                    self._t("gdn_prefill", mode, b.prefill_tokens / b.prefill_seqs)
            elif "gdn_verify" not in fallback:
                us["gdn_verify"] += self._analytic_prefill_recurrence_s(b.prefill_tokens) / US

        if self.tp > 1:
            us["allreduce"] = allreduce / US
        if self.sources.by_term["overhead"] == "analytic":
            fallback.append("overhead")
        else:
            us["overhead"] = self.overhead_us
        return us, parts, tuple(fallback)

    def _analytic_prefill_recurrence_s(self, tokens: int) -> float:
        """Roofline of the chunked prefill recurrence when no gdn_prefill table was measured."""
        g, tp = self.model.gdn, self.tp
        elems = g.num_v_heads // tp * g.head_v_dim * g.head_k_dim
        flops = self.model.gdn_layers * tokens * GDN_FLOPS_PER_STATE_ELEMENT * elems
        return flops / (self.hw.bf16_tflops * 1e12)

    def _verify_us(self, mode: str, b: StepBatch) -> float:
        base = self._kernel("verify", mode, b.decode_seqs)
        rep = self.kernels.get("replay")
        # Replay's verify runs over every cache slot whatever it holds (fixed shapes), so its cost
        # follows the cache's capacity, not the tokens replayed this step (session 14's replay:
        # priced by the tokens, its decode steps came out 2-4% short).
        cached = self.policy.cache_slots() if rep else 0
        if cached:
            m_tokens, curves = rep
            c = curves.get(mode) or next(iter(curves.values()))
            base += max(0.0, c.partial()(b.decode_seqs) - base) * cached / m_tokens
        return base

    def _commit_us(self, mode: str, b: StepBatch) -> float:
        if self.policy.commit_is_index_update():
            return 0.0  # the bench's commit copies the slot only to hand a state back to its caller
        t = self._kernel("commit", mode, b.decode_seqs)
        if self.policy.name == "replay":
            # Requests that flush this step write their state back; the others only append.
            f = b.flush_seqs / b.decode_seqs
            append = self._kernel("append", mode, b.decode_seqs) if "append" in self.kernels else t
            return f * t + (1.0 - f) * append
        return t


    # ------------------------------------------------------------ pipeline pricing
    def _pipeline(self, b: StepBatch) -> StepTime:
        us, ops, prepare, finish, cores, host_total = self.pipeline_parts(b)
        total = pipeline(ops, prepare, finish, self.async_scheduling, cores, host_total)
        us["overhead"] = max(0.0, total - sum(us.values()))
        return StepTime({t: us[t] * US for t in TERMS}, b.graph_mode)

    def pipeline_parts(self, b: StepBatch) -> tuple[dict[str, float], list[tuple[float, float, int, int]], float,
                                                     float, list[float], float]:
        """GPU us per term (overhead excluded), the ops, prepare and finish host us, the attention
        cores' us and the ops' host total: sim.host_model.pipeline's arguments (calibrate.host_fit
        re-runs the pipeline with other host scales)."""
        # The attention cores depend on the contexts; everything else on the batch shape,
        # so that part (terms and the op list) is built once per distinct shape.
        key = (b.graph_mode, b.num_tokens, b.padded_tokens, b.num_seqs, b.decode_seqs, b.spec_seqs,
               b.verify_positions, b.truncated, b.prefill_tokens, tuple(t for t, _ in b.chunks), b.replay_tokens,
               b.flush_seqs, b.draft_depth)
        built = self._shapes.get(key)
        if built is None:
            built = self._pipeline_shape(b)
            if len(self._shapes) < STEP_MEMO:
                self._shapes[key] = built
        fixed, ops, host_total, widths, prepare, finish = built
        # Core 0: the target's (and the first drafter pass's) attention core; then one per later pass.
        cores = [self._attention_core_us(b, b.decode_seqs, b.decode_tokens, b.chunks)]
        cores += [self._attention_core_us(b, b.num_seqs, b.num_seqs * w, ()) for w in widths]
        us = dict(fixed)
        us["attention"] += self.model.attn_layers * cores[0]
        if b.draft_depth:
            us["drafter"] += sum(cores)
        return us, ops, prepare, finish, cores, host_total

    def _pipeline_shape(self, b: StepBatch) -> tuple[dict[str, float], list[tuple[float, float, int, int]], float,
                                                       tuple[int, ...], float, float]:
        """Context-free GPU us per term; the ops as (host us, GPU us, attention core, how many of it:
        sim.host_model.pipeline) and their total host us; the drafter's later-pass widths;
        step_prepare and step_finish us."""
        m, host, g = self.model, self.host, "graph"
        mode = b.graph_mode
        n, R, B, P = b.num_tokens, b.num_seqs, b.decode_seqs, b.prefill_seqs
        N = n if mode == "eager" else b.run_tokens  # graphs run at the padded size
        gdn_dense, attn_dense, moe = self._tok("gdn", g, N), self._tok("attn_proj", g, N), self._moe(g, N)
        ar = 2 * self._allreduce(N) / US
        verify, commit = self._gdn_decode_us(b)
        prefill = self._gdn_prefill_us(b)
        rows = b.decode_tokens + P  # logits rows: every verify position, each prefill's last token
        lm = self._tok("lm_head", g, rows)
        passes, widths = self._drafter_passes(b, N)

        us = dict.fromkeys(TERMS, 0.0)
        us["gdn"] = m.gdn_layers * gdn_dense
        us["gdn_verify"] = m.gdn_layers * (verify + prefill)
        us["gdn_commit"] = m.gdn_layers * commit
        us["attention"] = m.attn_layers * attn_dense  # + the cores, per step
        us["moe"] = m.num_layers * moe
        us["lm_head"] = lm
        us["allreduce"] = m.num_layers * ar + sum(2 * self._allreduce(t) / US for t, _ in passes)
        us["drafter"] = sum(gpu for _, gpu in passes)  # + the cores, per step

        ops: list[tuple[float, float, int, int]] = []
        if mode == "full":
            target = sum(us[t] for t in ("gdn", "gdn_verify", "gdn_commit", "attention", "moe")) + m.num_layers * ar
            ops.append((host.us("full_graph", N), target, 0, m.attn_layers))  # one replay, its attention cores in it
        else:
            core = {"attn": [(host.us("attn_core", R), 0.0, 0, 1)], "gdn": []}
            if B:
                core["gdn"].append((host.us("gdn_verify", B), verify, 0, 0))
                if not self.policy.commit_is_index_update():
                    core["gdn"].append((host.us("gdn_commit", B), commit, 0, 0))
            if P:
                core["gdn"].append((host.us("gdn_prefill", P), prefill, 0, 0))
            dense = {"gdn": gdn_dense, "attn": attn_dense}
            if mode == "piecewise":
                piece = host.us("piece_graph", N)
                for kind in self.layer_kinds:
                    ops.append((piece, dense[kind] + moe + ar, 0, 0))
                    ops += core[kind]
                ops.append((piece, 0.0, 0, 0))  # final norm: the last piece
            else:
                issue = {"gdn": host.us("eager_dense_gdn", n), "attn": host.us("eager_dense_attn", n)}
                moe_issue = host.us("eager_moe", n)
                for kind in self.layer_kinds:
                    ops.append((issue[kind], dense[kind] + ar / 2, 0, 0))
                    ops += core[kind]
                    ops.append((moe_issue, moe + ar / 2, 0, 0))
        ops.append((host.us("sample", rows), lm, 0, 0))
        ops += [(host.us("drafter_pass", t), gpu + 2 * self._allreduce(t) / US, i, 1) for i, (t, gpu) in enumerate(passes)]
        return us, ops, sum(op[0] for op in ops), widths, host.us("step_prepare", R), host.us("step_finish", R)

    def _attention_core_us(self, b: StepBatch, seqs: int, dec_tokens: int,
                           chunks: tuple[tuple[int, int], ...]) -> float:
        """One attention core over the decoding requests (at their mean context) and each prefill chunk."""
        t = 0.0
        if seqs:
            ctx = (b.context_tokens - sum(c for _, c in chunks)) / seqs
            per_seq = dec_tokens / seqs
            t += self._f(per_seq * self.q_per_kv) * self.tables[("attn_decode", "graph")].partial(seqs, per_seq)(ctx)
        prefill = self.tables[("attn_prefill", "graph")]
        for tokens, ctx in chunks:  # chunk sizes repeat (the budget): their context curves are memoised
            t += self._f(tokens) * prefill.partial(tokens)(ctx)
        return t

    def _gdn_decode_us(self, b: StepBatch) -> tuple[float, float]:
        """(verify, commit) GPU time of one GDN layer for the decoding requests."""
        if not b.decode_seqs:
            return 0.0, 0.0
        out = []
        for term, which, price in (("gdn_verify", "verify", self._verify_us), ("gdn_commit", "commit", self._commit_us)):
            if which in self.kernels:
                out.append(self._f(0.0) * price("graph", b))
            else:  # the roofline of the decode part alone
                dec = replace(b, prefill_tokens=0, prefill_seqs=0, num_seqs=b.decode_seqs, prefill_chunks=())
                out.append(self.fallback.step_time(dec).terms[term] / US / self.model.gdn_layers)
        if self.decode_conv is not None:  # the core's gating, conv verify/commit and q/k norms
            out[0] += self._f(0.0) * self.decode_conv(b.decode_tokens)
        return out[0], out[1]

    def _gdn_prefill_us(self, b: StepBatch) -> float:
        """GPU time of one GDN layer's ONE varlen prefill call over all prefill sequences."""
        if not b.prefill_seqs:
            return 0.0
        varlen = self.tables.get(("gdn_prefill_varlen", "graph"))
        if varlen is not None:
            return self._f(0.0) * varlen(b.prefill_tokens, b.prefill_seqs)
        if ("gdn_prefill", "graph") in self.curves:
            chunked = sum(-(-t // FLA_CHUNK) * FLA_CHUNK for t, _ in b.chunks)
            return self._f(0.0) * self._t("gdn_prefill", "graph", chunked)
        return self._analytic_prefill_recurrence_s(b.prefill_tokens) / US / self.model.gdn_layers

    def _drafter_passes(self, b: StepBatch, tokens: int) -> tuple[list[tuple[int, float]], tuple[int, ...]]:
        """(tokens, GPU us without the attention core) of each MTP pass: all target tokens first,
        then R x width per depth; and the widths of the later passes (their cores are per step)."""
        if not b.draft_depth:
            return [], ()
        g = "graph"

        def one(t: int, rows: int) -> float:
            return (self._tok("mtp_fc", g, t) + self._tok("attn_proj", g, t) + self._moe(g, t)
                    + self._tok("lm_head", g, rows))

        widths = tuple(self.nodes_per_depth[min(d, len(self.nodes_per_depth)) - 1] for d in range(1, b.draft_depth))
        passes = [(tokens, one(tokens, b.num_seqs))]
        passes += [(b.num_seqs * w, one(b.num_seqs * w, b.num_seqs * w)) for w in widths]
        return passes, widths


# ---------------------------------------------------------------------- loaders
def load_tables(mdir: Path, *, extrapolate: bool = True) -> dict[tuple[str, str], GridInterpolator]:
    """Every layer table in TABLES, both modes; a missing required or partial table is an error."""
    out = {}
    for name, spec in TABLES.items():
        if not spec.required and not (mdir / f"{name}.csv").exists():
            continue
        rows = read_rows(mdir / f"{name}.csv")
        for mode in MODES:
            sel = [r for r in rows if r["mode"] == mode]
            if not sel and not spec.required:  # e.g. a kernel that could not be graph-captured
                sel = [r for r in rows if r["mode"] != mode]
            if not sel:
                raise TableError(f"{mdir / name}.csv: no rows with mode={mode!r}")
            try:
                out[(name, mode)] = from_rows(f"{mdir.name}/{name}[{mode}]", sel, spec.axes, spec.scales,
                                              fill_low=spec.fill_low, extrapolate=extrapolate)
            except ValueError as e:
                raise TableError(f"{mdir / name}.csv: {e}") from None
    return out


def load_decode_conv(mdir: Path, policy: str, *, extrapolate: bool = True) -> Curve1D | None:
    """The GPU time of one GDN layer's decode core outside the policy's kernels (gdn_decode_conv.csv,
    the policy's graph rows) over decode tokens; None where it was not measured."""
    path = mdir / f"{DECODE_CONV}.csv"
    if not path.exists():
        return None
    rows = [r for r in read_rows(path, DECODE_CONV_COLUMNS) if r["policy"] == policy and r["mode"] == "graph"]
    if not rows:
        return None
    try:
        return from_rows(f"{mdir.name}/{DECODE_CONV}[{policy}]", rows, ("tokens",), ("log",),
                         extrapolate=extrapolate).partial()
    except ValueError as e:
        raise TableError(f"{path}: {e}") from None


def _derived_scale(hw: HardwareConfig, kind: str) -> float:
    return float(hw.scaling[kind]) if hw.derived else 1.0


def load_overhead(mdir: Path) -> float | None:
    """Median host overhead per step (host loop time minus GPU time), from step_check.csv.

    Graph-mode rows only: there the GPU time is exact, and what remains is the upload,
    launch, download and sync that every step pays. Eager rows already carry the
    launch cost in the eager tables, and their host/GPU difference is launch jitter.
    """
    path = mdir / "step_check.csv"
    if not path.exists():
        return None
    rows = [r for r in read_rows(path, STEP_COLUMNS) if r["mode"] == "graph"]
    return statistics.median(max(0.0, r["host_step_us"] - r["step_us"]) for r in rows) if rows else None


def _by_mode(name: str, rows: list[dict], value: str, extrapolate: bool) -> dict[str, GridInterpolator]:
    """One curve over B per mode; a mode whose rows repeat a B is left out (ambiguous)."""
    out = {}
    for mode in MODES:
        sel = [r for r in rows if r["mode"] == mode]
        if sel and len({r["B"] for r in sel}) == len(sel) and all(float(r[value]) > 0 for r in sel):
            out[mode] = from_rows(f"{name}[{mode}]", sel, ("B",), ("log",), value=value, extrapolate=extrapolate)
    return out


def _select(rows: list[dict], policy: str, widths: tuple[int, ...], replay_col: str | None,
            replayed: int = 0, flush: int | None = None) -> list[dict]:
    """Rows of one policy at this tree (T = verify positions), replayed-token count and flush flag."""
    t = 1 + sum(_nodes(widths))
    sel = [r for r in rows if r["policy"] == policy and int(r["T"]) == t
           and (replay_col is None or int(r[replay_col] or 0) == replayed)
           and (flush is None or "flush" not in r or int(r["flush"]) == flush)]
    if not sel or "tree" not in sel[0]:
        return sel
    exact = [r for r in sel if _tree_key(r["tree"]) == widths]
    if exact or any(w != 1 for w in widths):
        return exact
    # A chain may be written as widths, as its length, or by name.
    return [r for r in sel if _tree_key(r["tree"]) in (None, (t - 1,), (t,))]


def _chain_between(rows: list[dict], policy: str, t: int, replay_col: str | None) -> list[dict]:
    """A chain of t positions that was not benchmarked: per (B, mode), log-log between the
    nearest measured chains below and above t (kernel time grows smoothly with chain length)."""
    measured = {}
    for T in sorted({int(r["T"]) for r in rows if r["policy"] == policy and int(r["T"]) >= 2}):
        sel = _select(rows, policy, (1,) * (T - 1), replay_col, flush=1)
        if sel:
            measured[T] = {(r["B"], r["mode"]): r for r in sel}
    lo = max((T for T in measured if T < t), default=None)
    hi = min((T for T in measured if T > t), default=None)
    if lo is None or hi is None:
        return []
    w = math.log(t / lo) / math.log(hi / lo)
    out = []
    for key, r in measured[lo].items():
        h = measured[hi].get(key)
        if h is None:
            continue
        out.append({**r, "T": t, "tree": f"chain {t} (between {lo} and {hi})",
                    **{c: float(r[c]) ** (1 - w) * float(h[c]) ** w for c in ("verify_us", "commit_us")}})
    return out


def _nodes(widths: tuple[int, ...]) -> list[int]:
    out, n = [], 1
    for w in widths:
        n *= w
        out.append(n)
    return out


def load_kernels(path: Path, model: ModelConfig, policy: CommitPolicy, *, extrapolate: bool = True) -> dict[str, Any]:
    """The policy's verify/commit curves over B for its tree, from the kernels bench.

    Rows are the model's and, where kernels.csv has a `state_dtype` column, its SSM-state
    dtype's; the policy's rows are found by its kernel name (e.g. reconstruct_deferred).
    Returns {} when kernels.csv is absent or has no such rows. Keys, where measured: 'verify' and 'commit'
    (mode -> curve over B, microseconds per GDN layer; replay's commit with a flush),
    'replay' ((most replayed tokens measured, verify curves at that count)) and
    'append' (replay's commit without a flush).
    """
    if not path.exists():
        return {}
    rows = [r for r in read_rows(path, KERNEL_COLUMNS) if r["model"] == model.name]
    if rows and "state_dtype" in rows[0]:
        # Kernels benched at the model's SSM-state dtype only (fp32 states move twice the bytes);
        # a table without the column predates it: bf16 states.
        rows = [r for r in rows if STATE_DTYPE_BYTES.get(str(r["state_dtype"])) == model.state_dtype_bytes]
    if not rows:
        return {}
    rep = next((c for c in REPLAY_COLUMNS if c in rows[0]), None)
    widths = policy.tree.widths
    out: dict[str, Any] = {}
    # Rows without replayed tokens commit with a flush (the state written back).
    sel = _select(rows, policy.kernel, widths, rep, flush=1)
    if not sel and policy.tree.is_chain:
        sel = _chain_between(rows, policy.kernel, policy.tree.verify_positions, rep)
    out["verify"] = _by_mode(f"kernels/{policy.kernel}.verify", sel, "verify_us", extrapolate)
    out["commit"] = _by_mode(f"kernels/{policy.kernel}.commit", sel, "commit_us", extrapolate)
    if rep and policy.name == "replay":
        counts = sorted({int(r[rep] or 0) for r in rows if r["policy"] == policy.kernel
                         and int(r["T"]) == policy.tree.verify_positions})
        if counts and counts[-1] > 0:
            most = _select(rows, policy.kernel, widths, rep, counts[-1], flush=0)
            curves = _by_mode(f"kernels/{policy.kernel}.verify@{counts[-1]}", most, "verify_us", extrapolate)
            out["replay"] = (counts[-1], curves) if curves else None
            # A commit that only appends the accepted inputs (no flush this step).
            out["append"] = _by_mode(f"kernels/{policy.kernel}.append", most, "commit_us", extrapolate)
    return {k: v for k, v in out.items() if v}
