"""The calibrated tables of one model on one GPU and the pieces both step pricings share.

`CalibratedParts` holds a model's layer tables (sim.pricing.calibration_tables), its policy's
kernel curves (sim.pricing.kernel_rows), which source priced each term, and the pieces: a table
part at a token count, scaled for derived hardware; the feed-forward block; the policy's
verify and commit kernels; the all-reduces. A derived hardware profile (e.g. B200)
scales each calibrated piece by its `scaling` factor, memory- or compute-bound by its
arithmetic intensity against the source GPU's ridge point. Terms with no table come
from the fallback model and are labelled so in `sources`.
"""
from __future__ import annotations

from typing import Any

from core.config import EngineConfig, HardwareConfig, ModelConfig, load_hardware
from core.interp import Curve1D, GridInterpolator
from core.tables import TableError
from policies import CommitPolicy
from sim.pricing.analytic import GDN_FLOPS_PER_STATE_ELEMENT
from sim.pricing.host_model import HostCosts
from sim.pricing.latency import TERMS, US, LatencyModel, LatencySources, StepBatch
from sim.pricing.sampler_cost import SamplerCost

PRICINGS = ("pipeline", "eager_sum")


class CalibratedParts:
    def __init__(self, model: ModelConfig, hw: HardwareConfig, policy: CommitPolicy, engine_cfg: EngineConfig,
                 tables: dict[tuple[str, str], GridInterpolator], kernels: dict[str, Any],
                 overhead_us: float | None, fallback: LatencyModel | None, piecewise: bool = True,
                 host: HostCosts | None = None, decode_conv: Curve1D | None = None,
                 sampler: SamplerCost | None = None, gdn_mixed: GridInterpolator | None = None) -> None:
        self.model, self.hw, self.policy, self.fallback = model, hw, policy, fallback
        self.piecewise = piecewise
        self.pricing = engine_cfg.latency_pricing
        if self.pricing not in PRICINGS:
            raise ValueError(f"engine.latency_pricing must be one of {', '.join(PRICINGS)}, got {self.pricing!r}")
        self.async_scheduling = engine_cfg.async_scheduling
        # The layers repeat one pattern (e.g. three GDN layers, then attention): an op list is
        # one period's ops, repeated.
        self.layer_pattern = tuple(model.layer_pattern)
        self.layer_repeats = model.num_layers // len(model.layer_pattern)
        self.tables = tables
        self.kernels = kernels
        self.decode_conv = decode_conv
        self.tp = model.tensor_parallel
        self.tree = policy.tree
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
        self.hidden_bytes = model.hidden_size * model.conv_dtype_bytes  # activations: the model dtype
        cal = "derived" if hw.derived else "calibrated"
        src = {t: cal for t in TERMS}
        notes: dict[str, str] = {}
        self.conv_channels = (2 * model.gdn.num_k_heads * model.gdn.head_k_dim
                              + model.gdn.num_v_heads * model.gdn.head_v_dim) // self.tp
        if "verify" not in kernels:
            src["gdn_verify"] = "analytic"
        elif not any(k[0] == "gdn_prefill" for k in tables):
            src["gdn_verify"] = "mixed"  # decode verify measured, prefill recurrence by roofline
            notes["gdn_verify"] = "the prefill recurrence by its flops at the matrix rate (no gdn_prefill table)"
        elif ("gdn_prefill_varlen", "graph") not in tables:
            src["gdn_verify"] = "mixed"
            notes["gdn_verify"] = ("the prefill's causal conv by its bytes at the copy rate (the recurrence is "
                                   "gdn_prefill's; no gdn_prefill_varlen table times the conv with it)")
        if "commit" not in kernels:
            src["gdn_commit"] = "analytic"
        self.gdn_mixed = gdn_mixed
        self.sampler = sampler or SamplerCost(None)
        if self.sampler.note:
            src["lm_head"] = "mixed"
            notes["lm_head"] = self.sampler.note
        if self.tp > 1:
            src["allreduce"] = "analytic"
            notes["allreduce"] = f"a ring over NVLink at {hw.nvlink_bandwidth_gbs} GB/s (one GPU measures no NCCL)"
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
            if src["overhead"] != cal:
                missing = sorted(op for op, v in self.host.sources.items() if v != "calibrated")
                notes["overhead"] = f"host costs of {', '.join(missing)}: the documented assumptions (no host.csv row)"
            if "gdn_prefill_varlen" in {k[0] for k in tables}:
                src["gdn_verify"] = cal if "verify" in kernels else "mixed"
                notes.pop("gdn_verify", None)
        if any(v == "analytic" for v in src.values()) and fallback is None:
            missing = [t for t, v in src.items() if v == "analytic" and t != "allreduce"]
            if missing:
                raise TableError(f"{model.name}: no calibration for {missing} and no fallback model given")
        self.sources = LatencySources(src, {t: n for t, n in notes.items() if src[t] != cal})
        # One-axis tables as fast memoised curves; the others slice to curves per call.
        self.curves = {k: g.partial() for k, g in tables.items() if len(g.axes) == 1}

    # ------------------------------------------------------------------ shared pieces
    def curve_us(self, table: str, mode: str, x: float) -> float:
        """A one-axis table at x."""
        return self.curves[(table, mode)](x)

    def derived_factor(self, intensity: float) -> float:
        """Derived-hardware factor of a piece with this arithmetic intensity (flops/byte)."""
        if not self.derived:
            return 1.0
        return self.scale["compute_bound"] if intensity > self.ridge else self.scale["memory_bound"]

    def token_part_us(self, table: str, mode: str, n: float) -> float:
        """A token-proportional layer part (GEMM intensity is about its token count)."""
        return self.curve_us(table, mode, n) * self.derived_factor(n) if n > 0 else 0.0

    def sampler_us(self, rows: float) -> float:
        """What the requests' sampling adds over `rows` logits rows beyond the LM head's argmax
        (memory-bound: every pass reads the rows' logits)."""
        return self.sampler.us(rows) * (self.scale["memory_bound"] if self.derived else 1.0)

    def moe_us(self, mode: str, n: float) -> float:
        """The feed-forward block of one layer over n tokens (the MoE, or a dense model's MLP)."""
        if self.model.dense:
            return self.token_part_us("mlp", mode, n)
        if n <= 0:
            return 0.0
        touched = 1.0 - (1.0 - self.top_k_per_expert) ** n  # fraction of experts touched
        return self.curve_us("moe", mode, n) * self.derived_factor(n * self.top_k_per_expert / touched)

    def allreduce_s(self, tokens: float) -> float:
        """One ring all-reduce of `tokens` hidden vectors across the tensor-parallel GPUs."""
        if self.tp == 1 or tokens <= 0:
            return 0.0
        ring = 2 * (self.tp - 1)
        return ring / self.tp * tokens * self.hidden_bytes / self.nvlink_bw + ring * self.nvlink_lat

    def kernel_us(self, which: str, mode: str, seqs: float) -> float:
        """The policy's `which` kernel (kernels.csv) at `seqs` sequences; a mode not benched takes the other."""
        curves = self.kernels[which].get(mode) or next(iter(self.kernels[which].values()))
        return curves.partial()(seqs)

    def out_of_grid(self) -> dict[str, int]:
        """Queries outside the measured grids so far, by table and side ('attn_decode[graph].B_high': n)."""
        tabs = list(self.tables.values()) + [c for k in ("verify", "commit", "append") if k in self.kernels
                                             for c in self.kernels[k].values()]
        if "replay" in self.kernels:
            tabs += list(self.kernels["replay"][1].values())
        return {f"{t.name}.{side}": n for t in tabs for side, n in t.out_of_grid.items()}

    def prefill_conv_us(self, tokens: int) -> float:
        """One GDN layer's causal conv over `tokens` prefill tokens by its bytes at the copy rate
        (read and write every channel once; memory-bound, where no varlen table times it)."""
        return 2 * tokens * self.conv_channels * self.model.conv_dtype_bytes / (self.hw.hbm_bandwidth_gbs * 1e9) / US

    def analytic_prefill_recurrence_s(self, tokens: int) -> float:
        """Roofline of the chunked prefill recurrence when no gdn_prefill table was measured."""
        g, tp = self.model.gdn, self.tp
        elems = g.num_v_heads // tp * g.head_v_dim * g.head_k_dim
        flops = self.model.gdn_layers * tokens * GDN_FLOPS_PER_STATE_ELEMENT * elems
        return flops / (self.hw.bf16_tflops * 1e12)

    def decode_roofline_us(self, b: StepBatch, term: str) -> float:
        """One GDN layer's `term` for the decoding requests alone, from the fallback (no kernel measured)."""
        dec = b._replace(prefill_tokens=0, prefill_seqs=0, num_seqs=b.decode_seqs, prefill_chunks=())
        return self.fallback.step_time(dec).terms[term] / US / self.model.gdn_layers

    def verify_us(self, mode: str, b: StepBatch) -> float:
        base = self.kernel_us("verify", mode, b.decode_seqs)
        rep = self.kernels.get("replay")
        # Replay's verify runs over every cache slot whatever it holds (fixed shapes), so its cost
        # follows the cache's capacity, not the tokens replayed this step (priced by the tokens,
        # replayed decode steps came out 2-4% short).
        cached = self.policy.cache_slots() if rep else 0
        if cached:
            m_tokens, curves = rep
            c = curves.get(mode) or next(iter(curves.values()))
            base += max(0.0, c.partial()(b.decode_seqs) - base) * cached / m_tokens
        return base

    def mixed_decodes_us(self, b: StepBatch) -> float | None:
        """One GDN layer's GPU time for the decodes of a step that also prefills, where vLLM 0.17.1
        runs them with the prefill through its chunked kernel (no speculation: every request is
        "non-spec", `Qwen3NextGatedDeltaNet._forward_core`); None where that is not the step's path
        or gdn_mixed.csv was not measured. docs/step_model.md#mixed-steps."""
        if self.gdn_mixed is None or not (b.prefill_seqs and b.decode_seqs) or b.spec_seqs:
            return None
        return self.gdn_mixed(b.decode_seqs, b.prefill_tokens) * self.derived_factor(0.0)

    def commit_us(self, mode: str, b: StepBatch) -> float:
        if self.policy.commit_is_index_update():
            return 0.0  # the bench's commit copies the slot only to hand a state back to its caller
        t = self.kernel_us("commit", mode, b.decode_seqs)
        if self.policy.name == "replay":
            # Requests that flush this step write their state back; the others only append.
            f = b.flush_seqs / b.decode_seqs
            append = self.kernel_us("append", mode, b.decode_seqs) if "append" in self.kernels else t
            return f * t + (1.0 - f) * append
        return t
