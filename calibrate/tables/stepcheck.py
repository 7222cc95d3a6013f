"""Whole-step check and memory: one layer of each kind stacked to the model's layer counts.

A step is what vLLM runs (docs/vllm.md#gdn-kernel-calls): the MTP drafter (one pass over all target
tokens, then K - 1 one-token passes, each with its LM head), the target forward over
B x P verify tokens (GDN layers run the policy's verify + commit kernels when
policies.kernels is importable), and the target LM head. Its time, measured as one
CUDA graph (and eagerly), is the fidelity anchor for the sum-of-parts latency model.
"""
from __future__ import annotations

import dataclasses
import importlib
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from calibrate.device.timing import capture, time_calls
from calibrate.model import layers as L
from calibrate.tables.measure import Harness

COPIES = 3  # weight copies the stacked layers rotate over (each MoE copy alone exceeds the L2)


@dataclass
class Weights:
    gdn: list[L.GDNWeights]
    attn: list[L.AttnWeights]
    ffn: list[L.FFNWeights]
    head: L.HeadWeights
    embed: torch.Tensor
    mtp: L.MTPWeights
    mtp_attn: L.AttnWeights
    mtp_ffn: L.FFNWeights

    @classmethod
    def build(cls, h: Harness) -> "Weights":
        return cls.of(h, COPIES)

    @classmethod
    def of(cls, h: Harness, copies: int) -> "Weights":
        """Random weights in the checkpoint's form (Harness.weights: bf16, or block-FP8)."""
        s, d = h.shapes, h.device
        return cls([h.weights(L.gdn_weights) for _ in range(copies)],
                   [h.weights(L.attn_weights) for _ in range(copies)],
                   [h.weights(L.ffn_weights) for _ in range(copies)], L.head_weights(s, d),
                   L._w(s.vocab, s.hidden, device=d), h.weights(L.mtp_weights), h.weights(L.attn_weights),
                   h.weights(L.ffn_weights))


def tensor_bytes(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of the tensors a weights object holds, those of its block-FP8 projections included, each once."""
    seen = set() if seen is None else seen
    total = 0
    for t in vars(obj).values():
        if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        elif dataclasses.is_dataclass(t) and not isinstance(t, type):
            total += tensor_bytes(t, seen)
    return total


def load_kernel(policy: str) -> object | None:
    """The policy's verify/commit module from policies/kernels, or None if it is not there yet."""
    try:
        mod = importlib.import_module(f"policies.kernels.{policy}")
    except ImportError:
        return None
    return mod if hasattr(mod, "verify") and hasattr(mod, "commit") else None


class Step:
    """Buffers and the step function for one (B, P, ctx) shape."""

    def __init__(self, h: Harness, w: Weights, b: int, p: int, ctx: int, kernel: object | None) -> None:
        s, d = h.shapes, h.device
        self.h, self.w, self.b, self.p, self.ctx, self.kernel = h, w, b, p, ctx, kernel
        self.n = b * p
        keys = ctx + p
        self.ids = torch.randint(0, s.vocab, (self.n,), device=d)
        self.hidden = h.randn(self.n, s.hidden)
        # KV caches, token-major as vLLM's [slots, kv_heads, head_dim]; the verify tokens'
        # K/V go to the last p slots of each sequence.
        self.caches = [(h.randn(b * keys, s.kv_heads, s.head_dim), h.randn(b * keys, s.kv_heads, s.head_dim))
                       for _ in range(COPIES + 1)]
        base = torch.arange(b, device=d)[:, None] * keys + ctx
        self.slots = (base + torch.arange(p, device=d)[None, :]).flatten()
        self.slots1 = base.flatten()
        pos = torch.full((b, p), ctx, device=d) + torch.arange(p, device=d)
        self.rope_p = L.rope_tables(pos.flatten(), s.rotary_dim)
        self.rope_1 = L.rope_tables(pos[:, 0].contiguous(), s.rotary_dim)
        self.conv = [h.randn(s.conv_kernel - 1, s.gdn_conv_channels) for _ in range(COPIES)]
        if kernel is not None:
            self.states = [torch.randn(b, s.gdn_v_heads, s.head_v_dim, s.head_k_dim, device=d) * 0.1
                           for _ in range(COPIES)]
            self.parent = (torch.arange(p, device=d, dtype=torch.int32) - 1).repeat(b, 1)
            self.accepted = torch.randint(0, p, (b,), device=d, dtype=torch.int32)
        self.tokens_out = torch.empty(self.n, dtype=torch.long, device=d)

    def recurrence(self, i: int) -> L.Recurrence | None:
        if self.kernel is None:
            return None
        s, b, p, state = self.h.shapes, self.b, self.p, self.states[i]

        def run(q, k, v, g, beta):
            o, ctx = self.kernel.verify(q.reshape(b, p, s.gdn_k_heads, s.head_k_dim),
                                        k.reshape(b, p, s.gdn_k_heads, s.head_k_dim),
                                        v.reshape(b, p, s.gdn_v_heads, s.head_v_dim),
                                        g.reshape(b, p, s.gdn_v_heads), beta.reshape(b, p, s.gdn_v_heads),
                                        self.parent, state)
            self.kernel.commit(ctx, self.accepted)
            return o.reshape(b * p, s.gdn_v_heads, s.head_v_dim)
        return run

    def _core(self, cache: tuple[torch.Tensor, torch.Tensor], seqs: int, queries: int) -> L.AttnCore:
        s, keys = self.h.shapes, self.ctx + self.p

        def core(q, k, v):
            kc = cache[0].view(seqs, keys, s.kv_heads, s.head_dim).transpose(1, 2)
            vc = cache[1].view(seqs, keys, s.kv_heads, s.head_dim).transpose(1, 2)
            qq = q.view(seqs, queries, s.q_heads, s.head_dim).transpose(1, 2)
            return L.decode_core(qq, kc, vc).transpose(1, 2).reshape(seqs * queries, s.q_heads, s.head_dim)
        return core

    def drafter(self) -> None:
        s, w = self.h.shapes, self.w
        cache = self.caches[COPIES]
        x = L.mtp_fc_forward(w.embed.index_select(0, self.ids), self.hidden, w.mtp, s)
        x = L.attn_forward(x, w.mtp_attn, s, *self.rope_p, self.slots, *cache, self._core(cache, self.b, self.p))
        x = L.ffn_forward(x, w.mtp_ffn, s)
        last = x.view(self.b, self.p, s.hidden)[:, -1]
        tok = L.lm_head_forward(last, w.head, s)
        for _ in range(s.mtp_depth - 1):
            x = L.mtp_fc_forward(w.embed.index_select(0, tok), last, w.mtp, s)
            x = L.attn_forward(x, w.mtp_attn, s, *self.rope_1, self.slots1, *cache, self._core(cache, self.b, 1))
            last = L.ffn_forward(x, w.mtp_ffn, s)
            tok = L.lm_head_forward(last, w.head, s)

    def target(self) -> None:
        s, w = self.h.shapes, self.w
        x = w.embed.index_select(0, self.ids)
        gi = ai = 0
        for layer in range(s.gdn_layers + s.attn_layers):
            if layer % 4 == 3:  # Qwen3.5's pattern: three GDN layers, then attention
                c = ai % COPIES
                x = L.attn_forward(x, w.attn[c], s, *self.rope_p, self.slots, *self.caches[c],
                                   self._core(self.caches[c], self.b, self.p))
                ai += 1
            else:
                c = gi % COPIES
                x = L.gdn_forward(x, w.gdn[c], s, self.conv[c], self.recurrence(c))
                gi += 1
            x = L.ffn_forward(x, w.ffn[layer % COPIES], s)
        self.tokens_out.copy_(L.lm_head_forward(x, w.head, s))

    def __call__(self) -> None:
        self.drafter()
        self.target()


def _host_step_us(h: Harness, launch: Callable[[], None], step: Step, reps: int) -> float:
    """Wall time of a step as an engine loop sees it: upload ids, run, download tokens, sync."""
    ids_host = step.ids.cpu().pin_memory()
    out_host = torch.empty_like(step.tokens_out, device="cpu").pin_memory()
    out = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        step.ids.copy_(ids_host, non_blocking=True)
        launch()
        out_host.copy_(step.tokens_out, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out[2:])


def step_check(h: Harness, policy: str = "store_all") -> list[dict]:
    kernel = load_kernel(policy)
    h.log(f"  step check: GDN recurrence {'policies.kernels.' + policy if kernel else 'absent (policies.kernels not importable)'}")
    w = Weights.build(h)
    rows = []
    for b, p, ctx in h.grid.step_shapes:
        step = Step(h, w, b, p, ctx, kernel)
        name = policy if kernel is not None else "none"
        kernel_us = 0.0
        if kernel is not None:
            try:
                kernel_us = time_calls([lambda i=i: step.recurrence(i)(*_rec_inputs(h, step)) for i in range(COPIES)],
                                       h.modes[0], h.device).us
            except Exception as e:  # a kernel that cannot be captured: run the step without it
                h.log(f"  step check: kernel not usable in {h.modes[0]} mode ({type(e).__name__}: {e}); timing without it")
                step = Step(h, w, b, p, ctx, None)
                name, kernel_us = "none", 0.0
        for mode in h.modes:
            # Eager steps are bound by Python launches and vary more: more samples.
            t = time_calls([step], mode, h.device, budget_s=0.5, min_reps=5 if mode == "graph" else 10, max_reps=20)
            if h.device.type == "cuda":
                g = capture([step]) if mode == "graph" else None
                host = _host_step_us(h, g.replay if g else step, step, reps=10)
                del g
            else:
                host = t.us
            rows.append({"mode": mode, "B": b, "P": p, "ctx": ctx, "kernel": name, "step_us": round(t.us, 2),
                         "host_step_us": round(host, 2), "kernel_us": round(kernel_us, 3), "reps": t.reps})
            h.log(f"  step B={b} P={p} ctx={ctx} {mode}: {t.us:.0f} us (host loop {host:.0f} us), kernel {kernel_us:.1f} us/layer")
        del step
    return rows


def _rec_inputs(h: Harness, step: Step) -> tuple[torch.Tensor, ...]:
    s, n = h.shapes, step.n
    if not hasattr(step, "_rec_cache"):
        q = torch.nn.functional.normalize(h.randn(n, s.gdn_k_heads, s.head_k_dim), dim=-1)
        k = torch.nn.functional.normalize(h.randn(n, s.gdn_k_heads, s.head_k_dim), dim=-1)
        v = h.randn(n, s.gdn_v_heads, s.head_v_dim)
        g = -torch.rand(n, s.gdn_v_heads, device=h.device)
        beta = torch.rand(n, s.gdn_v_heads, device=h.device)
        step._rec_cache = (q, k, v, g, beta)
    return step._rec_cache


def memory_report(h: Harness, model: object, max_seqs: int) -> dict:
    """Activation peak of a max-token forward per GPU, weights per GPU, state/KV bytes per request."""
    s, d = h.shapes, h.device
    one = Weights.of(h, 1)
    layers = s.gdn_layers + s.attn_layers
    weights = (s.gdn_layers * tensor_bytes(one.gdn[0]) + s.attn_layers * tensor_bytes(one.attn[0])
               + layers * tensor_bytes(one.ffn[0]) + tensor_bytes(one.head) + one.embed.numel() * 2
               + tensor_bytes(one.mtp) + tensor_bytes(one.mtp_attn) + tensor_bytes(one.mtp_ffn))
    peaks = {}
    for t in h.grid.activation_tokens:
        kc, vc = h.randn(t, s.kv_heads, s.head_dim), h.randn(t, s.kv_heads, s.head_dim)
        conv = h.randn(s.conv_kernel - 1, s.gdn_conv_channels)
        slots = torch.arange(t, device=d)
        cos, sin = L.rope_tables(slots, s.rotary_dim)
        ids = torch.randint(0, s.vocab, (t,), device=d)

        def causal(q, k, v):
            return L.prefill_core(q.transpose(0, 1)[None], None, None, k.transpose(0, 1)[None],
                                  v.transpose(0, 1)[None])[0].transpose(0, 1)
        if d.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        x = one.embed.index_select(0, ids)
        x = L.ffn_forward(L.gdn_forward(x, one.gdn[0], s, conv), one.ffn[0], s)
        x = L.ffn_forward(L.attn_forward(x, one.attn[0], s, cos, sin, slots, kc, vc, causal), one.ffn[0], s)
        # vLLM's profiling run also samples max_num_seqs dummy rows.
        L.lm_head_forward(x[:max_seqs] if t >= max_seqs else x.repeat(-(-max_seqs // t), 1)[:max_seqs], one.head, s)
        if d.type == "cuda":
            torch.cuda.synchronize()
            peaks[str(t)] = int(torch.cuda.max_memory_allocated() - base)
        del x, kc, vc
        h.log(f"  activation peak at {t} tokens: {peaks.get(str(t), 0) / 2**20:.0f} MiB")
    state_per_layer = s.gdn_v_heads * s.head_v_dim * s.head_k_dim * model.state_dtype_bytes
    conv_per_layer = s.gdn_conv_channels * (s.conv_kernel - 1 + s.mtp_depth) * model.conv_dtype_bytes
    kv_per_token = s.attn_layers * 2 * s.kv_heads * s.head_dim * model.kv_dtype_bytes
    checks = {
        "weights_per_gpu_bytes": {"measured_tensors": weights, "config": model.weight_bytes_per_gpu},
        "gdn_page_bytes_per_seq_per_layer": {"measured_tensors": state_per_layer + conv_per_layer,
                                              "config": model.gdn_page_bytes_per_gpu(model.mtp_depth)},
        "kv_bytes_per_token_per_gpu": {"measured_tensors": kv_per_token,
                                       "config": s.attn_layers * model.attn_page_bytes_per_token_per_gpu},
    }
    return {"activation_peak_bytes": peaks, "max_num_seqs_sampled": max_seqs,
            "activation_note": "peak allocated minus weights/caches of an eager forward of one GDN layer (no "
                               "recurrence kernel), one attention layer, two feed-forward (MoE or MLP) blocks, and the LM head over "
                               "max_num_seqs rows, per GPU",
            "checks": checks}
