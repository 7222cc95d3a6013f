"""Block-FP8 kernels (calibrate/kernels/fp8_gemm.py, fused_moe_fp8.py) against their float64
references, on the CPU through Triton's interpreter and on the GPU. Triton 3.9's interpreter
rounds float32 to float8 wrongly (`_convert_float` ORs the rounding carry into the exponent, so a
value that rounds up to a power of two comes out as half of it, and ties round up): the CPU tests
cast through torch's round-to-nearest-even instead (the `rtne_fp8` fixture of tests/conftest.py), which is the GPU's `cvt.rn`."""
from __future__ import annotations

import pytest
import torch

from calibrate.kernels import fp8_gemm as G
from calibrate.kernels import fused_moe_fp8 as M
from calibrate.kernels.naive import fused_moe_ref

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_weight_blocks_round_trip_within_one_fp8_step_per_block():
    w = torch.randn(256, 384, generator=_gen(0)) * torch.logspace(-3, 1, 384)  # blocks of very different scales
    q, s = G.quantize_weight_blocks(w)
    assert q.dtype == G.FP8 and s.shape == (2, 3) and s.dtype == torch.float32
    back = G.dequantize_weight_blocks(q, s)
    # e4m3 keeps 3 mantissa bits: within 1/16 of each value, or of the block's smallest step
    err = (back - w.double()).abs()
    step = s.double().repeat_interleave(128, 0).repeat_interleave(128, 1) * 2 ** -6
    assert bool((err <= w.double().abs() / 16 + step).all())
    # each block's largest magnitude maps to 448 exactly
    blocks = q.float().abs().reshape(2, 128, 3, 128).amax(dim=(1, 3))
    assert torch.equal(blocks, torch.full((2, 3), 448.0))
    with pytest.raises(ValueError, match="multiple of 128"):
        G.quantize_weight_blocks(torch.zeros(100, 128))


def test_group_quant_ref_scales_each_token_group():
    x = torch.randn(5, 256, generator=_gen(1)).bfloat16()
    x[2, 128:] = 0  # an all-zero group: the floor scale, zeros out
    q, s = G.group_quant_ref(x)
    assert s.shape == (5, 2) and s[2, 1] == pytest.approx(G.EPS / G.FP8_MAX)
    assert torch.equal(q[2, 128:].float(), torch.zeros(128))
    back = q.double() * s.double().repeat_interleave(128, 1)
    assert torch.allclose(back, x.double(), rtol=1 / 16, atol=1e-6)


def test_gemm_ref_is_the_dequantised_product():
    a = torch.randn(7, 256, generator=_gen(2)).bfloat16()
    w = torch.randn(384, 256, generator=_gen(3)) * 0.05
    aq, a_s = G.group_quant_ref(a)
    wq, ws = G.quantize_weight_blocks(w)
    out = G.fp8_block_gemm_ref(aq, a_s, wq, ws, torch.float64)
    assert torch.allclose(out, a.double() @ w.double().T, rtol=0.1, atol=0.15)


def _moe_inputs(seed: int, E: int = 8, H: int = 256, I: int = 256, T: int = 6, device: str = "cpu"):
    g = _gen(seed)
    mk = lambda *s: G.quantize_weight_blocks(torch.randn(*s, generator=g) * 0.05)  # noqa: E731
    (w13, w13s), (w2, w2s), (s13, s13s), (s2, s2s) = mk(E, 2 * I, H), mk(E, H, I), mk(2 * I, H), mk(H, I)
    # correlated tokens: a common direction plus noise, so experts repeat across tokens
    x = (torch.randn(1, H, generator=g) + 0.5 * torch.randn(T, H, generator=g)).bfloat16()
    router = (torch.randn(E, H, generator=g) * 0.1).bfloat16()
    gate = (torch.randn(1, H, generator=g) * 0.1).bfloat16()
    t = dict(x=x, router_w=router, w13=w13, w13_s=w13s, w2=w2, w2_s=w2s, shared_w13=s13, shared_w13_s=s13s,
             shared_w2=s2, shared_w2_s=s2s, shared_gate_w=gate)
    return {k: v.to(device) for k, v in t.items()}


def test_moe_ref_is_the_bf16_moe_of_the_dequantised_weights_up_to_activation_rounding():
    t = _moe_inputs(4)
    ref = M.fused_moe_fp8_ref(top_k=2, **t).double()
    d = G.dequantize_weight_blocks
    plain = fused_moe_ref(t["x"].double(), t["router_w"], d(t["w13"], t["w13_s"]), d(t["w2"], t["w2_s"]), 2,
                          d(t["shared_w13"], t["shared_w13_s"]), d(t["shared_w2"], t["shared_w2_s"]), t["shared_gate_w"])
    rel = (ref - plain).norm() / plain.norm()
    assert 1e-4 < rel < 0.08  # fp8 activations: a few percent, never exact


def test_moe_rejects_blocks_that_straddle_scale_groups():
    t = _moe_inputs(5)
    cfg = M.FM.MoEConfig(sorted=False, block_m=16, block_n=256, block_k=128)
    with pytest.raises(ValueError, match="must divide 128"):
        M.fused_moe_fp8(top_k=2, config=cfg, **t)


@pytest.mark.skipif(CUDA, reason="the CPU interpreter's copy of the GPU tests below")
@pytest.mark.parametrize("t,h,per_program", [(5, 384, 16), (37, 256, 16), (37, 256, 1), (3, 128, 4)])
def test_group_quant_kernel_matches_reference_on_cpu(nan_poison, rtne_fp8, t, h, per_program):
    x = (torch.randn(t, h, generator=_gen(t)) * torch.logspace(-2, 2, h)).bfloat16()
    x[t // 2, :128] = 0  # an all-zero group
    q, s = G.group_quant(x, groups_per_program=per_program)
    qr, sr = G.group_quant_ref(x)
    assert torch.equal(s, sr) and torch.equal(q.view(torch.uint8), qr.view(torch.uint8))
    with pytest.raises(ValueError, match="multiple of 128"):
        G.group_quant(torch.zeros(2, 200).bfloat16())


@pytest.mark.skipif(CUDA, reason="the CPU interpreter's copy of the GPU tests below")
@pytest.mark.parametrize("m,config", [(1, None), (33, None), (33, G.VLLM_DEFAULT_GEMM),
                                      (130, G.GemmConfig(16, 32, 64, 4, 2))])
def test_block_gemm_kernel_matches_reference_on_cpu(nan_poison, m, config):
    a = torch.randn(m, 384, generator=_gen(m)).bfloat16()
    q, s = G.group_quant_ref(a)
    wq, ws = G.quantize_weight_blocks(torch.randn(256 + 128, 384, generator=_gen(7)) * 0.02)
    out = G.fp8_block_gemm(q, s, wq, ws, config=config)
    ref = G.fp8_block_gemm_ref(q, s, wq, ws, torch.float64)
    # the interpreter truncates float32 to bf16: within one bf16 step of the largest output
    assert ((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2
    with pytest.raises(ValueError, match="must divide"):
        G.fp8_block_gemm(q, s, wq, ws, config=G.GemmConfig(16, 32, 256, 4, 2))


def test_fp8_moe_default_is_vllms_block_fp8_rule():
    # vLLM's get_default_config for fp8_w8a8 with block_shape [128, 128]
    for t, (bm, gm) in {1: (16, 1), 16: (16, 1), 17: (16, 32), 64: (16, 32), 65: (64, 32), 4096: (64, 32)}.items():
        c = M.default_config(t)
        assert (c.block_m, c.group_m, c.block_k, c.num_warps, c.num_stages) == (bm, gm, 128, 4, 3)
        assert 2 * c.block_n == c.down_block_n == 128 and c.sorted == (t > 16)


@pytest.mark.skipif(CUDA, reason="the CPU interpreter's copy of the GPU tests below")
@pytest.mark.parametrize("T,block_n", [(5, None), (40, None), (40, 128)])
def test_fused_moe_fp8_kernel_matches_reference_on_cpu(nan_poison, rtne_fp8, T, block_n):
    t = _moe_inputs(T, E=8, H=256, I=256, T=T)
    cfg = M.default_config(T)
    if block_n:
        cfg = M.FM.MoEConfig(**{**cfg.__dict__, "block_n": block_n})
    out = M.fused_moe_fp8(top_k=2, config=cfg, **t)
    ref = M.fused_moe_fp8_ref(top_k=2, config=cfg, **t)
    rel = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert rel < 2e-2, rel


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("m,n,k", [(1, 512, 2048), (33, 12288, 2048), (300, 2048, 4096)])
def test_group_quant_and_gemm_kernels_match_references(m, n, k):
    a = torch.randn(m, k, generator=_gen(m)).bfloat16().cuda()
    q, s = G.group_quant(a)
    qr, sr = G.group_quant_ref(a)
    assert torch.equal(s, sr) and torch.equal(q.float(), qr.float())
    wq, ws = G.quantize_weight_blocks(torch.randn(n, k, generator=_gen(n)).cuda() * 0.02)
    out = G.fp8_block_gemm(q, s, wq, ws)
    ref = G.fp8_block_gemm_ref(q, s, wq, ws, torch.float64)
    assert ((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("T", [1, 5, 40, 700])
def test_fused_moe_fp8_kernel_matches_reference(T):
    t = _moe_inputs(T, E=64, H=512, I=256, T=T, device="cuda")
    out = M.fused_moe_fp8(top_k=8, **t)
    ref = M.fused_moe_fp8_ref(top_k=8, **t)
    rel = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert rel < 2e-2, rel


@pytest.mark.parametrize("q_lens,ctxs,splits", [([1, 1, 1], [5, 40, 17], None), ([1, 3, 4], [5, 40, 17], 3)])
def test_paged_attention_reads_an_fp8_cache_with_its_scales(q_lens, ctxs, splits):
    from calibrate.kernels import paged_attention as PA
    from calibrate.kernels.inputs import paged_inputs
    from calibrate.kernels.naive import paged_attention_ref
    x = paged_inputs(q_lens, ctxs, 7, 2, 4, 32, seed=3)
    k_scale, v_scale = 0.5, 2.0
    x["k_cache"] = (x["k_cache"].float() / k_scale).to(G.FP8)  # what vLLM writes: value / scale in fp8
    x["v_cache"] = (x["v_cache"].float() / v_scale).to(G.FP8)
    out = PA.paged_attention(**x, config=PA.AttnConfig(16, 16, num_splits=splits), k_scale=k_scale, v_scale=v_scale)
    ref = paged_attention_ref(**x, k_scale=k_scale, v_scale=v_scale)
    rel = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert rel < 2e-2, rel
    # and the scales matter: without them the result is another one
    plain = paged_attention_ref(**x)
    assert ((plain.double() - ref.double()).norm() / ref.double().norm()).item() > 0.1


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_paged_attention_fp8_cache_on_the_gpu():
    from calibrate.kernels import paged_attention as PA
    from calibrate.kernels.inputs import paged_inputs
    from calibrate.kernels.naive import paged_attention_ref
    x = {k: v.cuda() if isinstance(v, torch.Tensor) else v
         for k, v in paged_inputs([1, 4, 1], [700, 40, 3000], 64, 2, 8, 256, seed=5).items()}
    x["k_cache"], x["v_cache"] = x["k_cache"].to(G.FP8), (x["v_cache"].float() / 2).to(G.FP8)
    out = PA.paged_attention(**x, v_scale=2.0)
    ref = paged_attention_ref(**x, v_scale=2.0)
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 2e-2


def test_bench_variants_are_valid_for_the_35b_at_every_token_count():
    from calibrate.benches import fp8 as fp8_bench
    from core.config import load_model
    m = load_model("qwen3.5-35b-a3b-fp8")
    width = m.moe.expert_width
    for t in fp8_bench.MOE_TOKENS:
        configs = {name: of(t) for name, of in fp8_bench.MOE_VARIANTS.items()}
        assert len(set(configs.values())) == len(configs), t  # three different things timed
        for c in configs.values():
            assert G.GROUP % c.block_k == 0 and G.GROUP % c.block_n == 0 and width % c.block_n == 0
    assert fp8_bench.bf16_tiles(4096).block_m == 128  # the tiles of the 2026-12-02 bench


@pytest.mark.parametrize("m", [1, 5, 16])
def test_torch_block_mm_pads_m_to_four_as_vllm_and_cuts_back(monkeypatch, m):
    # F.scaled_mm stands in for cuBLASLt here: it refuses what cuBLASLt refused (M not a multiple
    # of 4) and otherwise multiplies as its block-wise contract says.
    from calibrate.model import fp8_linear
    import torch.nn.functional as F

    def fake(a, b, scale_a, _ta, scale_b, _tb, output_dtype):
        assert a.shape[0] % 4 == 0 and scale_a.stride() == (1, a.shape[0])
        return G.fp8_block_gemm_ref(a, scale_a, b.t(), scale_b, output_dtype)  # scale_b: the n_by_k layout

    monkeypatch.setattr(F, "ScalingType", type("ST", (), {"BlockWise1x128": 0, "BlockWise128x128": 1}), raising=False)
    monkeypatch.setattr(F, "scaled_mm", fake, raising=False)
    monkeypatch.setattr(fp8_linear, "B_LAYOUT", ["n_by_k"])
    a = torch.randn(m, 256, generator=_gen(m)).bfloat16()
    q, s = G.group_quant_ref(a)
    wq, ws = G.quantize_weight_blocks(torch.randn(384, 256, generator=_gen(9)) * 0.02)
    out = fp8_linear.torch_block_mm(q, s, wq, ws)
    assert out.shape == (m, 384)
    assert torch.equal(out, G.fp8_block_gemm_ref(q, s, wq, ws, torch.bfloat16))
