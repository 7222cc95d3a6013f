"""The eager-sum pricing of a step (`engine.latency_pricing: eager_sum`, the old pricing, kept to compare).

The step time is the sum of the measured parts below, per GPU:
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
ones) unless `piecewise=False`. `context` is the batch's mean context per scheduled request.
"""
from __future__ import annotations

from typing import NamedTuple

from core.interp import Curve1D
from sim.pricing.calibrated_parts import CalibratedParts
from sim.pricing.latency import SHAPE_MEMO, TERMS, US, StepBatch, StepTime



class ContextPart(NamedTuple):
    """An attention core's share of a term: coef x curve(mean context)."""

    term: str
    coef: float
    curve: Curve1D


class EagerSumShape(NamedTuple):
    fixed_us: dict[str, float]  # context-free microseconds per term
    context_parts: list[ContextPart]
    fallback_terms: tuple[str, ...]  # terms priced by the fallback model


class EagerSumPricing:
    def __init__(self, lat: CalibratedParts) -> None:
        self.lat = lat
        self._steps: dict[tuple, EagerSumShape] = {}

    def step_time(self, b: StepBatch) -> StepTime:
        # Everything but the attention core depends on integer batch fields only, so that
        # part is built once per distinct shape; the core is a curve in the mean context.
        key = (b.eager, b.num_seqs, b.prefill_tokens, b.prefill_seqs, b.decode_seqs, b.spec_seqs,
               b.verify_positions, b.replay_tokens, b.flush_seqs, b.draft_depth)
        built = self._steps.get(key)
        if built is None:
            built = self.shape(b)
            if len(self._steps) < SHAPE_MEMO:
                self._steps[key] = built
        fixed, ctx_parts, needs_fallback = built
        us = dict(fixed)
        ctx = b.context_tokens / b.num_seqs if b.num_seqs else 0.0
        for term, coef, curve in ctx_parts:
            us[term] += coef * curve(ctx)
        if needs_fallback:
            fb = self.lat.fallback.step_time(b).terms
            for term in needs_fallback:
                us[term] = fb[term] / US
        return StepTime({t: us[t] * US for t in TERMS}, "eager" if b.eager else "graph")

    def shape(self, b: StepBatch) -> EagerSumShape:
        lat = self.lat
        mode = "eager" if b.eager else "graph"
        # vLLM runs an eager step piecewise: the dense parts between the attention and
        # GDN cores replay as CUDA graphs, the cores launch eagerly.
        dense = "graph" if lat.piecewise else mode
        n = b.num_tokens
        m = lat.model
        tok, moe, ar = lat.token_part_us, lat.moe_us, lat.allreduce_s
        us: dict[str, float] = dict.fromkeys(TERMS, 0.0)
        parts: list[ContextPart] = []

        def add(term: str, part: tuple[float, Curve1D] | None) -> None:
            if part is not None:
                parts.append(ContextPart(term, *part))

        dec_tok = b.decode_tokens
        per_seq = dec_tok / b.decode_seqs if b.decode_seqs else 0.0
        us["gdn"] = m.gdn_layers * tok("gdn", dense, n)
        us["attention"] = m.attn_layers * tok("attn_proj", dense, n)
        for term, coef in (("attention", m.attn_layers), ("drafter", 1.0 if b.draft_depth and b.spec_seqs else 0.0)):
            if coef:
                add(term, self._decode_curve(mode, b.decode_seqs, per_seq, coef))
                add(term, self._prefill_curve(mode, b.prefill_seqs, b.prefill_tokens, coef))
        us["moe"] = m.num_layers * moe(dense, n)
        us["lm_head"] = tok("lm_head", dense, dec_tok + b.prefill_seqs) + lat.sampler_us(dec_tok + b.prefill_seqs)
        allreduce = 2 * m.num_layers * ar(n)

        if b.draft_depth and b.spec_seqs:
            d = tok("mtp_fc", dense, n) + tok("attn_proj", dense, n) + moe(dense, n) + tok("lm_head", dense, b.spec_seqs)
            allreduce += 2 * ar(n)
            for width in lat.tree.later_pass_widths(b.draft_depth):
                r = b.spec_seqs * width
                d += tok("mtp_fc", dense, r) + tok("attn_proj", dense, r) + moe(dense, r) + tok("lm_head", dense, r)
                add("drafter", self._decode_curve(mode, b.spec_seqs, width, 1.0))
                allreduce += 2 * ar(r)
            us["drafter"] = d

        fallback: list[str] = []
        if b.decode_seqs:
            for term, which, price in (("gdn_verify", "verify", lat.verify_us), ("gdn_commit", "commit", lat.commit_us)):
                if which in lat.kernels:
                    us[term] = m.gdn_layers * lat.derived_factor(0.0) * price(mode, b)
                else:
                    fallback.append(term)
            if lat.decode_conv is not None:  # measured as GPU time only: both modes price it so
                us["gdn_verify"] += m.gdn_layers * lat.derived_factor(0.0) * lat.decode_conv(b.decode_tokens)
        if b.prefill_tokens:
            if ("gdn_prefill", mode) in lat.curves:
                us["gdn_verify"] += m.gdn_layers * (b.prefill_seqs * lat.derived_factor(0.0) *
                                                    lat.curve_us("gdn_prefill", mode, b.prefill_tokens / b.prefill_seqs)
                                                    + lat.prefill_conv_us(b.prefill_tokens))
            elif "gdn_verify" not in fallback:
                us["gdn_verify"] += lat.analytic_prefill_recurrence_s(b.prefill_tokens) / US

        if lat.tp > 1:
            us["allreduce"] = allreduce / US
        if lat.sources.by_term["overhead"] == "analytic":
            fallback.append("overhead")
        else:
            us["overhead"] = lat.overhead_us
        return EagerSumShape(us, parts, tuple(fallback))

    def _decode_curve(self, mode: str, seqs: float, per_seq: float, coef: float) -> tuple[float, Curve1D] | None:
        """(coefficient, curve over context) of the decode attention core, or None without decodes."""
        if seqs <= 0:
            return None
        lat = self.lat
        return coef * lat.derived_factor(per_seq * lat.q_per_kv), \
            lat.tables[("attn_decode", mode)].partial(seqs, per_seq)

    def _prefill_curve(self, mode: str, seqs: int, tokens: int, coef: float) -> tuple[float, Curve1D] | None:
        if seqs <= 0:
            return None
        per_seq = tokens / seqs
        return coef * seqs * self.lat.derived_factor(per_seq), self.lat.tables[("attn_prefill", mode)].partial(per_seq)
