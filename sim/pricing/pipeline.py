"""The pipeline pricing of a step (`engine.latency_pricing: pipeline`, the default).

Every op is priced by its GPU time from the graph-mode tables at the token counts the
step really has (dense parts at the padded capture size), and the host is a model of
its own (sim.pricing.host_model): the ops are issued in vLLM's order for the step's dispatch
mode (sim.pricing.dispatch) and run as a two-resource pipeline.
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
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from core.interp import Curve1D
from sim.pricing.calibrated_parts import CalibratedParts
from sim.pricing.host_model import PipelineOp, pipeline, pipeline_many
from sim.pricing.latency import SHAPE_MEMO, STEP_MEMO, TERMS, US, StepBatch, StepTime, StepTimes

FLA_CHUNK = 64  # tokens: fla's chunk size; a varlen call runs each sequence in whole chunks


class PipelineParts(NamedTuple):
    """sim.pricing.host_model.pipeline's arguments for one step, and the GPU time per term."""

    terms_us: dict[str, float]  # GPU us per term, overhead excluded
    ops: list[PipelineOp]
    prepare_us: float
    finish_us: float
    cores_us: list[float]  # the attention cores the ops refer to (PipelineOp.core)


class CorePart(NamedTuple):
    """An attention core's share that the step's contexts set: factor x curve(context)."""

    factor: float  # the derived-hardware factor
    curve: Curve1D  # over the context


class ShapeParts(NamedTuple):
    """What a step's pricing takes from its shape alone (not its contexts): built once per shape."""

    terms_us: dict[str, float]  # context-free GPU us per term
    ops: list[PipelineOp]
    prepare_us: float
    finish_us: float
    # The attention cores, as curves over the contexts: the target's (and the first drafter
    # pass's) decode part over the mean decode context and one per prefill chunk over its own;
    # then one per later drafter pass, over the mean context of all requests.
    decode_core: CorePart | None
    chunk_cores: tuple[CorePart, ...]
    later_cores: tuple[CorePart, ...]


class DrafterPass(NamedTuple):
    """One MTP pass of a step: its tokens, its GPU time without the attention core, its all-reduces."""

    tokens: int
    gpu_us: float
    allreduce_us: float


EAGER_DENSE = {"gdn": "eager_dense_gdn", "attn": "eager_dense_attn"}  # host ops launching each layer's dense part


class PipelinePricing:
    def __init__(self, lat: CalibratedParts) -> None:
        self.lat = lat
        self._shapes: dict[tuple, ShapeParts] = {}
        # A step's shape is seldom seen twice under load (its prefill chunks differ), so its
        # parts are kept by what each depends on: the dense parts by token count (at most
        # max_num_batched_tokens entries), the drafter passes by tokens, requests and depth.
        self._dense: dict[int, tuple[float, float, float, float]] = {}
        self._drafter: dict[tuple[int, int, int], tuple[list[DrafterPass], tuple[int, ...]]] = {}
        self._drafter_pass: dict[tuple[int, int], float] = {}
        self._cores: dict[int | tuple[int, int], CorePart] = {}  # by chunk tokens, or (requests, tokens) of a decode
        # asked every step (properties of the model, which does not change)
        self._attn_layers, self._gdn_layers = lat.model.attn_layers, lat.model.gdn_layers
        # The tokens replay replays change a price only through the roofline of an unmeasured GDN
        # decode kernel (measured kernels run over every cache slot, whatever they hold).
        self._replay_priced = not ("verify" in lat.kernels and "commit" in lat.kernels)

    def step_time(self, b: StepBatch) -> StepTime:
        us, ops, prepare, finish, cores = self.parts(b)
        total = pipeline(ops, prepare, finish, self.lat.async_scheduling, cores)
        us["overhead"] = max(0.0, total - sum(us.values()))
        return StepTime({t: us[t] * US for t in TERMS}, b.graph_mode)

    def parts(self, b: StepBatch) -> PipelineParts:
        """The step's pipeline arguments (calibrate.replay.host_fit re-runs the pipeline with other host scales)."""
        chunks = b.chunks
        built = self._built(b)
        # Core 0: the target's (and the first drafter pass's) attention core; then one per later pass.
        core = 0.0
        dec = built.decode_core
        if dec is not None:
            ctx = (b.context_tokens - sum(c for _, c in chunks)) / b.decode_seqs if chunks else \
                b.context_tokens / b.decode_seqs
            core += dec.factor * dec.curve(ctx)
        for (factor, curve), (_, ctx) in zip(built.chunk_cores, chunks):
            core += factor * curve(ctx)
        cores = [core]
        if built.later_cores:
            ctx = b.context_tokens / b.num_seqs
            cores += [factor * curve(ctx) for factor, curve in built.later_cores]
        us = dict(built.terms_us)
        us["attention"] += self._attn_layers * core
        if b.draft_depth:
            us["drafter"] += sum(cores)
        return PipelineParts(us, built.ops, built.prepare_us, built.finish_us, cores)

    def step_times(self, b: StepBatch, contexts: np.ndarray, replay_tokens: np.ndarray | None = None) -> StepTimes:
        """`step_time` of steps that are the decode batch `b` (no prefill chunk) but for their
        context sums (and replayed tokens, where given): the same floats, each worked out over the
        array in `parts`' and `step_time`'s order."""
        if b.prefill_seqs or not b.decode_seqs:
            raise ValueError("step_times prices decode steps only")
        if replay_tokens is not None and self._replay_priced:
            values, which = np.unique(replay_tokens, return_inverse=True)
            if len(values) > 1:
                parts = [(which == i, self.step_times(b._replace(replay_tokens=int(v)), contexts[which == i]))
                         for i, v in enumerate(values.tolist())]
                out = StepTimes(np.empty((len(contexts), len(TERMS))), np.empty(len(contexts)), parts[0][1].mode)
                for mask, part in parts:
                    out.terms_s[mask], out.total_s[mask] = part.terms_s, part.total_s
                return out
            b = b._replace(replay_tokens=int(values[0]))
        built = self._built(b)
        dec = built.decode_core
        core = dec.factor * dec.curve.many(contexts / b.decode_seqs)
        cores = [core]
        if built.later_cores:
            ctx = contexts / b.num_seqs
            cores += [factor * curve.many(ctx) for factor, curve in built.later_cores]
        us: dict[str, float | np.ndarray] = dict(built.terms_us)
        us["attention"] = us["attention"] + self._attn_layers * core
        if b.draft_depth:
            us["drafter"] = us["drafter"] + sum(cores)
        total = pipeline_many(built.ops, built.prepare_us, built.finish_us, self.lat.async_scheduling, cores)
        over = total - sum(us.values())
        us["overhead"] = np.where(over > 0.0, over, 0.0)
        return StepTimes.of({t: us[t] * US for t in TERMS}, len(contexts), b.graph_mode)

    def _built(self, b: StepBatch) -> ShapeParts:
        """The parts of the step's shape. The attention cores depend on the contexts; everything else
        on the batch shape, so that part (terms, the op list, the cores' curves) is built once per
        distinct shape. (The token count follows from the prefill tokens and the decode counts in the key.)"""
        chunks = b.chunks
        key = (b.graph_mode, b.padded_tokens, b.num_seqs, b.decode_seqs, b.spec_seqs, b.verify_positions,
               b.truncated, b.prefill_tokens, tuple([t for t, _ in chunks]) if chunks else (),
               b.replay_tokens if self._replay_priced else 0, b.flush_seqs, b.draft_depth)
        built = self._shapes.get(key)
        if built is None:
            built = self.shape(b)
            if len(self._shapes) < SHAPE_MEMO:
                self._shapes[key] = built
        return built

    def shape(self, b: StepBatch) -> ShapeParts:
        lat = self.lat
        m, host, g = lat.model, lat.host, "graph"
        mode = b.graph_mode
        n, R, B, P = b.num_tokens, b.num_seqs, b.decode_seqs, b.prefill_seqs
        N = n if mode == "eager" else b.run_tokens  # graphs run at the padded size
        dense_us = self._dense.get(N)
        if dense_us is None:  # the layers' dense parts depend on the token count alone
            dense_us = self._dense[N] = (lat.token_part_us("gdn", g, N), lat.token_part_us("attn_proj", g, N),
                                      lat.moe_us(g, N), 2 * lat.allreduce_s(N) / US)
        gdn_dense, attn_dense, moe, ar = dense_us
        verify, commit = self.gdn_decode_us(b)
        prefill = self._gdn_prefill_us(b)
        rows = b.decode_tokens + P  # logits rows: every verify position, each prefill's last token
        lm = lat.token_part_us("lm_head", g, rows) + lat.sampler_us(rows)
        drafter_key = (N, b.num_seqs, b.draft_depth)
        drafter = self._drafter.get(drafter_key)
        if drafter is None:
            drafter = self._drafter_passes(b, N)
            if len(self._drafter) < STEP_MEMO:
                self._drafter[drafter_key] = drafter
        passes, widths = drafter

        us = dict.fromkeys(TERMS, 0.0)
        us["gdn"] = self._gdn_layers * gdn_dense
        us["gdn_verify"] = self._gdn_layers * (verify + prefill)
        us["gdn_commit"] = self._gdn_layers * commit
        us["attention"] = self._attn_layers * attn_dense  # + the cores, per step
        us["moe"] = m.num_layers * moe
        us["lm_head"] = lm
        us["allreduce"] = m.num_layers * ar + sum([p.allreduce_us for p in passes])
        us["drafter"] = sum([p.gpu_us for p in passes])  # + the cores, per step

        ops: list[PipelineOp] = []
        if mode == "full":
            target = sum(us[t] for t in ("gdn", "gdn_verify", "gdn_commit", "attention", "moe")) + m.num_layers * ar
            # one replay, its attention cores in it
            ops.append(PipelineOp(host.us("full_graph", N), target, 0, self._attn_layers))
        else:
            core: dict[str, list[PipelineOp]] = {"attn": [PipelineOp(host.us("attn_core", R), 0.0, 0, 1)], "gdn": []}
            if B:
                core["gdn"].append(PipelineOp(host.us("gdn_verify", B), verify, 0, 0))
                if not lat.policy.commit_is_index_update():
                    core["gdn"].append(PipelineOp(host.us("gdn_commit", B), commit, 0, 0))
            if P:
                core["gdn"].append(PipelineOp(host.us("gdn_prefill", P), prefill, 0, 0))
            dense = {"gdn": gdn_dense, "attn": attn_dense}
            # Each kind of layer's ops, built once and repeated through the layers
            if mode == "piecewise":
                piece = host.us("piece_graph", N)
                layer = {kind: [PipelineOp(piece, dense[kind] + moe + ar, 0, 0), *cores] for kind, cores in core.items()}
                last = [PipelineOp(piece, 0.0, 0, 0)]  # final norm: the last piece
            else:
                moe_op = PipelineOp(host.us("eager_moe", n), moe + ar / 2, 0, 0)
                layer = {kind: [PipelineOp(host.us(EAGER_DENSE[kind], n), dense[kind] + ar / 2, 0, 0), *cores, moe_op]
                         for kind, cores in core.items()}
                last = []
            ops = [op for kind in lat.layer_pattern for op in layer[kind]] * lat.layer_repeats + last
        ops.append(PipelineOp(host.us("sample", rows), lm, 0, 0))
        ops += [PipelineOp(host.us("drafter_pass", p.tokens), p.gpu_us + p.allreduce_us, i, 1)
                for i, p in enumerate(passes)]
        return ShapeParts(us, ops, host.us("step_prepare", R), host.us("step_finish", R),
                          self._decode_core(B, b.decode_tokens) if B else None,
                          tuple([self._chunk_core(t) for t, _ in b.chunks]),
                          tuple([self._decode_core(R, R * w) for w in widths]))

    def _decode_core(self, seqs: int, tokens: int) -> CorePart:
        """An attention core over `seqs` decoding requests of `tokens` query tokens in all (one
        object per pair, shared by the shapes that have it: a loaded run keeps tens of thousands)."""
        part = self._cores.get((seqs, tokens))
        if part is None:
            lat = self.lat
            per_seq = tokens / seqs
            part = self._cores[(seqs, tokens)] = CorePart(lat.derived_factor(per_seq * lat.q_per_kv),
                                                          lat.tables[("attn_decode", "graph")].partial(seqs, per_seq))
        return part

    def _chunk_core(self, tokens: int) -> CorePart:
        """The attention core of one prefill chunk of `tokens` (shared as `_decode_core`'s)."""
        part = self._cores.get(tokens)
        if part is None:
            lat = self.lat
            part = self._cores[tokens] = CorePart(lat.derived_factor(tokens),
                                                  lat.tables[("attn_prefill", "graph")].partial(tokens))
        return part

    def gdn_decode_us(self, b: StepBatch) -> tuple[float, float]:
        """(verify, commit) GPU time of one GDN layer for the decoding requests."""
        if not b.decode_seqs:
            return 0.0, 0.0
        lat = self.lat
        out = []
        for term, which, price in (("gdn_verify", "verify", lat.verify_us), ("gdn_commit", "commit", lat.commit_us)):
            if which in lat.kernels:
                out.append(lat.derived_factor(0.0) * price("graph", b))
            else:  # the roofline of the decode part alone
                out.append(lat.decode_roofline_us(b, term))
        if lat.decode_conv is not None:  # the core's gating, conv verify/commit and q/k norms
            out[0] += lat.derived_factor(0.0) * lat.decode_conv(b.decode_tokens)
        mixed = lat.mixed_decodes_us(b)
        if mixed is not None:  # vLLM's chunked path for decodes beside a prefill, never below their own kernel
            out[0] = max(out[0], mixed)
        return out[0], out[1]

    def _gdn_prefill_us(self, b: StepBatch) -> float:
        """GPU time of one GDN layer's ONE varlen prefill call over all prefill sequences."""
        if not b.prefill_seqs:
            return 0.0
        lat = self.lat
        varlen = lat.tables.get(("gdn_prefill_varlen", "graph"))
        if varlen is not None:
            return lat.derived_factor(0.0) * varlen(b.prefill_tokens, b.prefill_seqs)
        if ("gdn_prefill", "graph") in lat.curves:
            chunked = sum(-(-t // FLA_CHUNK) * FLA_CHUNK for t, _ in b.chunks)
            # the conv is priced at this GPU's own copy rate: no derived-hardware factor on it
            return (lat.derived_factor(0.0) * lat.curve_us("gdn_prefill", "graph", chunked)
                    + lat.prefill_conv_us(b.prefill_tokens))
        return lat.analytic_prefill_recurrence_s(b.prefill_tokens) / US / self._gdn_layers

    def _drafter_passes(self, b: StepBatch, tokens: int) -> tuple[list[DrafterPass], tuple[int, ...]]:
        """Each MTP pass: all target tokens first, then R x width per depth; and the widths of the
        later passes (their cores are priced per step)."""
        if not b.draft_depth:
            return [], ()
        lat = self.lat
        widths = lat.tree.later_pass_widths(b.draft_depth)
        passes = [(tokens, self._drafter_pass_us(tokens, b.num_seqs))]
        passes += [(b.num_seqs * w, self._drafter_pass_us(b.num_seqs * w, b.num_seqs * w)) for w in widths]
        return [DrafterPass(t, gpu, 2 * lat.allreduce_s(t) / US) for t, gpu in passes], widths

    def _drafter_pass_us(self, tokens: int, rows: int) -> float:
        """One MTP pass over `tokens` with `rows` logits rows, its attention core left out (memoised:
        the later passes depend on the request count alone)."""
        key = (tokens, rows)
        us = self._drafter_pass.get(key)
        if us is None:
            lat, g = self.lat, "graph"
            us = (lat.token_part_us("mtp_fc", g, tokens) + lat.token_part_us("attn_proj", g, tokens)
                  + lat.moe_us(g, tokens) + lat.token_part_us("lm_head", g, rows))
            if len(self._drafter_pass) < STEP_MEMO:
                self._drafter_pass[key] = us
        return us
