"""The executor's GDN cores: gating, the policy's conv verify + verify kernel and commits for the decodes,
one varlen conv + chunked-rule call for the prefills, and each policy's per-slot state.

`GDNCores` is the part of `calibrate.executor.runner.Executor` that runs a GDN layer's core between its
dense halves, making vLLM's calls (docs/vllm.md, "GDN kernel calls"): one launch of the
gating for the step's tokens, then one verify call for all decoding requests with their commits,
and one varlen call for all prefill sequences. The policy's kernels come from policies.kernels
(`load_policy_kernels`); replay's caches and reconstruct_deferred's pending commit sit beside the
pools (`_replay_states`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from calibrate.executor.prep import Step
from calibrate.model import layers as L

CONV_OF = {"reconstruct_deferred": "reconstruct"}  # its conv window is rebuilt from the path, as reconstruct's


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


def load_policy_kernels(policy: str) -> tuple[object, Callable, Callable]:
    """The policy's SSM verify/commit module and its conv verify/commit (policies.kernels)."""
    import importlib

    from policies.kernels import conv

    mod = importlib.import_module(f"policies.kernels.{policy}")
    c = CONV_OF.get(policy, policy)
    return mod, getattr(conv, f"{c}_verify"), getattr(conv, f"{c}_commit")


class GDNCores:
    """GDN cores of calibrate.executor.runner.Executor (a base of it): run on the executor's buffers
    (gdn_proj, g, beta, gdn_o), pools (ssm, conv_pool) and policy kernels (verify_mod, conv_verify,
    conv_commit, rs / rcs / ds), which its __init__ and use_policy set."""

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
