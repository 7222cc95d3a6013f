"""Fused MoE (Triton, CPU interpreter) against the float64 plain-PyTorch reference."""
import pytest
import torch

from calibrate.kernels import fused_moe as FM
from calibrate.kernels.inputs import moe_inputs
from calibrate.kernels.naive import fused_moe_ref, route_ref
from policies.kernels.inputs import rel_err

pytestmark = pytest.mark.usefixtures("nan_poison")
BF16_TOL = 2e-2  # bf16 intermediate (SiLU product, per-pair rows) and output
UNSORTED = FM.MoEConfig(sorted=False, block_m=16, block_n=16, block_k=32)
SORTED = FM.MoEConfig(sorted=True, block_m=16, block_n=16, block_k=32, group_m=2)
SORTED_WIDE = FM.MoEConfig(sorted=True, block_m=32, block_n=32, block_k=16, group_m=3, down_block_n=16)

CASES = {
    # name: (tokens, hidden, experts, width, top_k, shared, config)
    "T1-H48-E10-I24-k3-shared-unsorted": (1, 48, 10, 24, 3, True, UNSORTED),
    "T5-H40-E7-I20-k2-unsorted": (5, 40, 7, 20, 2, False, UNSORTED),
    "T37-H48-E10-I24-k3-shared-sorted": (37, 48, 10, 24, 3, True, SORTED),
    "T37-H48-E10-I24-k3-sorted": (37, 48, 10, 24, 3, False, SORTED),
    "T29-H40-E17-I40-k4-shared-sorted-wide": (29, 40, 17, 40, 4, True, SORTED_WIDE),
    "T19-H32-E4-I16-k4-all-experts": (19, 32, 4, 16, 4, True, SORTED),
    "T70-H40-E6-I16-k2-shared-wide-router-tiles": (70, 40, 6, 16, 2, True, SORTED),
}


@pytest.mark.parametrize("case", CASES)
def test_against_reference(case):
    tokens, hidden, experts, width, top_k, shared, cfg = CASES[case]
    x = moe_inputs(tokens, hidden, experts, width, top_k, shared, seed=tokens)
    out = FM.fused_moe(**x, config=cfg)
    assert out.shape == (tokens, hidden) and out.dtype == torch.bfloat16
    err = rel_err(out, fused_moe_ref(**x))
    assert err < BF16_TOL, f"{case}: relative error {err:.2e}"


@pytest.mark.parametrize("cfg", [UNSORTED, SORTED], ids=["unsorted", "sorted"])
def test_residual_is_added_in_the_reduction(cfg):
    x = moe_inputs(7, 40, 6, 16, 2, True, seed=7)
    res = torch.randn(7, 40).to(torch.bfloat16)
    out = FM.fused_moe(**x, config=cfg, residual=res)
    assert rel_err(out.double() - res.double(), fused_moe_ref(**x)) < BF16_TOL
    # in place (the executor's residual stream): out is the residual itself, same result
    stream = res.clone()
    got = FM.fused_moe(**x, config=cfg, residual=stream, out=stream)
    assert got is stream and torch.equal(stream, out)


def test_sorted_and_unsorted_agree_bitwise():
    """Each output row depends only on its own pairs: grouping by expert changes no bit."""
    x = moe_inputs(13, 48, 9, 24, 3, True, seed=3)
    a = FM.fused_moe(**x, config=UNSORTED)
    b = FM.fused_moe(**x, config=SORTED)
    assert torch.equal(a, b)


def test_routing_matches_reference():
    """Top-k ids (as sets) and renormalised weights, plus the shared expert's sigmoid gate."""
    x = moe_inputs(21, 48, 12, 16, 4, True, seed=5)
    T, E, k = 21, 12, 4
    logits = torch.empty(T, E + 1)
    FM._logits_kernel[(2, 1)](x["x"], x["router_w"], x["shared_gate_w"], logits, T, 48, 48, E + 1,
                              E=E, HAS_GATE=True, BLOCK_T=16, BLOCK_E=16, BLOCK_H=32)
    ids = torch.empty(T, k + 1, dtype=torch.int32)
    w = torch.empty(T, k + 1)
    FM._topk_kernel[(2,)](logits, ids, w, ids, T, E + 1, E=E, TOP_K=k, HAS_SHARED=True, COUNT=False,
                          BLOCK_T=16, BLOCK_E=16, BLOCK_P=8, BINS=16)
    w_ref, ids_ref = route_ref(x["x"], x["router_w"], k)
    assert torch.equal(ids[:, :k].sort(-1).values, ids_ref.int().sort(-1).values)
    assert torch.allclose(w[:, :k].double(), w_ref, atol=1e-5)
    assert (ids[:, k] == E).all()
    gate = torch.sigmoid(x["x"].double() @ x["shared_gate_w"].double().T)[:, 0]
    assert torch.allclose(w[:, k].double(), gate, atol=1e-5)


def test_default_configs_cover_every_batch():
    for tokens in (1, 16, 17, 256, 257, 2048, 2049, 16384):
        cfg = FM.default_config(tokens)
        assert cfg.block_m >= 16 and cfg.block_n >= 16 and cfg.block_k >= 16


@pytest.mark.parametrize("bad", ["top_k", "shared_partial", "shared_width"])
def test_bad_input_names_the_field(bad):
    x = moe_inputs(3, 32, 4, 16, 2, True)
    if bad == "top_k":
        x["top_k"] = 5
    elif bad == "shared_partial":
        x["shared_w2"] = None
    else:
        x["shared_w13"] = torch.zeros(48, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="top_k|shared"):
        FM.fused_moe(**x)
