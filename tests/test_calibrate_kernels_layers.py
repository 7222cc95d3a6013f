"""The calibrator's layers on the fused kernels (CPU interpreter): MoE and paged attention layers
against the same layer built from the plain-PyTorch references."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from calibrate.kernels.inputs import paged_inputs
from calibrate.kernels.naive import fused_moe_ref, paged_attention_ref
from calibrate.model import layers as L
from calibrate.model.shapes import LayerShapes
from policies.kernels.inputs import rel_err

pytestmark = pytest.mark.usefixtures("nan_poison")
TINY = LayerShapes(model="tiny", tp=1, hidden=64, gdn_k_heads=1, gdn_v_heads=2, head_k_dim=16, head_v_dim=16,
                   conv_kernel=4, q_heads=4, kv_heads=2, head_dim=32, num_experts=6, top_k=2, expert_width=24,
                   shared_width=24, vocab=64, gdn_layers=3, attn_layers=1, mtp_depth=1)
TOL = 2e-2


def test_moe_forward_is_norm_fused_moe_residual():
    w = L.moe_weights(TINY, torch.device("cpu"))
    x = torch.randn(9, TINY.hidden).to(torch.bfloat16)
    h = F.rms_norm(x, (TINY.hidden,), w.norm, L.EPS)
    moe = fused_moe_ref(h, w.router, w.w13, w.w2, TINY.top_k, w.shared13, w.shared2, w.shared_gate).double()
    # The MoE part alone (the residual would hide a wrong MoE).
    assert rel_err(L.moe_forward(x, w, TINY).double() - x.double(), moe) < TOL


def test_mlp_forward_is_norm_swiglu_residual():
    s = dataclasses.replace(TINY, num_experts=0, top_k=0, expert_width=0, shared_width=0, mlp_width=40)
    w = L.ffn_weights(s, torch.device("cpu"))
    assert isinstance(w, L.MLPWeights) and w.w13.shape == (80, s.hidden) and w.w2.shape == (s.hidden, 40)
    x = torch.randn(7, s.hidden).to(torch.bfloat16)
    h = F.rms_norm(x.double(), (s.hidden,), w.norm.double(), L.EPS)
    gate, up = (h @ w.w13.double().t()).chunk(2, -1)
    mlp = (F.silu(gate) * up) @ w.w2.double().t()
    assert rel_err(L.ffn_forward(x, w, s).double() - x.double(), mlp) < TOL  # the MLP alone, not the residual
    out = torch.empty_like(x)
    assert L.ffn_forward(x, w, s, out=out) is out


def test_paged_attn_forward_matches_dense_layer_with_reference_core():
    """Same weights and pool: paged_attn_forward (reshape_and_cache + Triton kernel) against
    attn_forward writing the flat pool and calling the float64 reference as its core."""
    s = TINY
    x = paged_inputs([3, 1, 5], [4, 20, 0], 7, s.kv_heads, s.q_heads // s.kv_heads, s.head_dim)
    bs = x["k_cache"].shape[1]
    q_lens = (x["cu_seqlens_q"][1:] - x["cu_seqlens_q"][:-1]).tolist()
    pos = torch.cat([torch.arange(n - q, n) for n, q in zip(x["seq_lens"].tolist(), q_lens)])
    req = torch.repeat_interleave(torch.arange(len(q_lens)), torch.tensor(q_lens))
    slots = x["block_tables"][req, pos // bs].long() * bs + pos % bs
    w = L.attn_weights(s, torch.device("cpu"))
    h = torch.randn(int(pos.numel()), s.hidden).to(torch.bfloat16)
    cos, sin = L.rope_tables(pos, s.rotary_dim)
    batch = L.PagedBatch(x["k_cache"].clone(), x["v_cache"].clone(), slots, x["block_tables"], x["seq_lens"],
                         x["cu_seqlens_q"], x["max_seqlen_q"])
    out = L.paged_attn_forward(h, w, s, cos, sin, batch)

    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()

    def core(q, k, v):
        return paged_attention_ref(q, kc, vc, x["block_tables"], x["seq_lens"], x["cu_seqlens_q"],
                                   x["max_seqlen_q"], s.head_dim ** -0.5)
    flat = (-1, s.kv_heads, s.head_dim)
    ref = L.attn_forward(h, w, s, cos, sin, slots, kc.view(flat), vc.view(flat), core)
    assert torch.equal(batch.k_cache, kc) and torch.equal(batch.v_cache, vc)
    assert rel_err(out, ref) < TOL


def test_shared_width_must_match_expert_width():
    s = dataclasses.replace(TINY, shared_width=48)
    w = L.moe_weights(s, torch.device("cpu"))
    with pytest.raises(ValueError, match="shared"):
        L.moe_forward(torch.randn(2, s.hidden).to(torch.bfloat16), w, s)
