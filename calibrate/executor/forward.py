"""The executor's forward passes: the target's and the drafter's dense pieces around their cores, and
the attention core.

`Forward` is the part of `calibrate.executor.runner.Executor` that runs a step's layers once the host
prep is uploaded. A dense piece is everything between two cores (a layer's post-core half and
MoE, then the next layer's pre-core half); it runs as a CUDA graph at the padded size under
PIECEWISE dispatch and eagerly otherwise, while the cores (paged attention here, the GDN cores of
calibrate.executor.gdn) launch eagerly between pieces, as vLLM's piecewise graphs leave them.
Under FULL dispatch the whole target forward is one graph (Executor.launch).
"""
from __future__ import annotations

from typing import Callable

import torch

from calibrate.device.graphs import FULL, PIECEWISE, Plan, plan
from calibrate.executor.prep import Step
from calibrate.model import layers as L


class Forward:
    """Forward passes of calibrate.executor.runner.Executor (a base of it): work on the first n rows of the
    executor's static buffers (x, d_hidden, q, k, v, gate, attn_o, cos, sin) with its weights `w`,
    KV pool `kv` and graph cache."""

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

    # -- the attention core (eager between pieces; inside the graph in FULL mode)
    def attn_core(self, cache: int, st: Step, n: int, R: int, max_q: int, slots: torch.Tensor,
                  seq_lens: torch.Tensor, cu_q: torch.Tensor) -> None:
        """Attention layer `cache`'s KV write and one paged-attention launch for all R requests."""
        kc, vc = self.kv[cache]
        self.reshape_and_cache(self.k[:n], self.v[:n], kc, vc, slots)
        W = self.table_width
        self.paged_attention(self.q[:n], kc, vc, self.i32.d("tables", R * W).view(R, W)[:, :st.cols], seq_lens, cu_q,
                             max_q, self.s.head_dim ** -0.5, out=self.attn_o[:n])

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
