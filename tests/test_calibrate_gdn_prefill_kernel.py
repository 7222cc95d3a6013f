"""The GDN prefill kernel choice and FlashInfer's wrapper: the launches vLLM's wrapper makes, checked
with stand-in packages (the CPU has neither FlashInfer nor a GPU)."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from calibrate.model import gdn_prefill_kernel as G
from calibrate.model.flashinfer_gdn import load_flashinfer_chunk


@pytest.fixture
def fake_packages(monkeypatch):
    """flashinfer.gdn_prefill and fla's l2norm_fwd stand-ins on an SM90 'GPU'; returns the kernel's calls."""
    calls = []

    def chunk_gated_delta_rule(**kw):
        calls.append(kw)
        o = kw["v"] * 1.0
        return (o, torch.zeros(kw["cu_seqlens"].numel() - 1, kw["v"].shape[1], 8, 8)) if kw["output_final_state"] else o

    def l2norm_fwd(x):  # fla's returns (y, rstd)
        assert x.is_contiguous()
        return 2 * x, torch.ones(x.shape[:-1])

    mods = {"flashinfer": types.ModuleType("flashinfer"), "flashinfer.gdn_prefill": types.ModuleType("x"),
            "fla": types.ModuleType("fla"), "fla.modules": types.ModuleType("m"),
            "fla.modules.norm": types.ModuleType("n"), "fla.modules.norm.l2norm": types.ModuleType("l")}
    mods["flashinfer.gdn_prefill"].chunk_gated_delta_rule = chunk_gated_delta_rule
    mods["fla.modules.norm.l2norm"].l2norm_fwd = l2norm_fwd
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    return calls


def _inputs(T: int = 5, H: int = 2, Hv: int = 4, D: int = 8) -> dict:
    g = torch.Generator().manual_seed(T)
    qkv = torch.randn(1, T, 2 * H * D + Hv * D, generator=g)
    q, k, v = qkv.split([H * D, H * D, Hv * D], -1)  # column ranges of one projection: not contiguous
    return {"q": q.view(1, T, H, D), "k": k.view(1, T, H, D), "v": v.reshape(1, T, Hv, D),
            "g": -torch.rand(1, T, Hv, generator=g), "beta": torch.rand(1, T, Hv, generator=g).bfloat16(),
            "initial_state": torch.randn(1, Hv, D, D, generator=g).bfloat16()}


def test_wrapper_makes_vllms_launches(fake_packages):
    chunk = load_flashinfer_chunk()
    x = _inputs()
    o, final = chunk(**x, output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True)
    kw = fake_packages[-1]
    assert torch.equal(kw["q"], 2 * x["q"][0]) and torch.equal(kw["k"], 2 * x["k"][0])  # normalised, squeezed
    assert kw["v"].is_contiguous() and torch.equal(kw["v"], x["v"][0])
    assert kw["g"].dtype == torch.float32 and torch.allclose(kw["g"], x["g"][0].exp())  # the decay, not its log
    assert kw["beta"].dtype == kw["initial_state"].dtype == torch.float32
    assert kw["cu_seqlens"].tolist() == [0, 5] and kw["cu_seqlens"].dtype == torch.int64
    assert o.shape == x["v"].shape and final.shape[0] == 1


def test_wrapper_keeps_one_length_tensor_and_passes_varlen_through(fake_packages):
    chunk = load_flashinfer_chunk()
    x = _inputs()
    chunk(**x)
    chunk(**x)
    assert fake_packages[0]["cu_seqlens"] is fake_packages[1]["cu_seqlens"]  # no host copy per call
    cu = torch.tensor([0, 2, 5])
    out = chunk(**{**x, "initial_state": x["initial_state"].repeat(2, 1, 1, 1)}, cu_seqlens=cu, cu_seqlens_cpu=cu)
    assert fake_packages[-1]["cu_seqlens"] is cu and out[1] is None
    assert torch.equal(fake_packages[-1]["q"], x["q"][0])  # no norms unless asked


def test_wrapper_refuses_fla_state_layout_and_old_gpus(fake_packages, monkeypatch):
    with pytest.raises(ValueError, match="state_v_first"):
        load_flashinfer_chunk()(**_inputs(), state_v_first=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert load_flashinfer_chunk() is None


def test_no_flashinfer_no_wrapper(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", None)  # import fails
    assert load_flashinfer_chunk() is None


def test_choice_prefers_flashinfer_then_fla(monkeypatch):
    fi, fla = object(), object()
    monkeypatch.setattr(G, "load_flashinfer_chunk", lambda: fi)
    monkeypatch.setattr(G, "load_fla_chunk", lambda: fla)
    assert G.load_gdn_prefill()[1] is fi and G.load_gdn_prefill("fla")[1] is fla
    assert G.load_gdn_prefill()[0].startswith("flashinfer ")
    monkeypatch.setattr(G, "load_flashinfer_chunk", lambda: None)
    name, fn = G.load_gdn_prefill()
    assert fn is fla and name.startswith("fla ")
    assert G.load_gdn_prefill("flashinfer") == (None, None)
    with pytest.raises(ValueError, match="auto, flashinfer or fla"):
        G.load_gdn_prefill("triton")
