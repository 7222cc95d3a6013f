"""The calibrator's block-FP8 layers (calibrate/model/layers_fp8.py, calibrate/model/fp8_linear.py) on the CPU through
Triton's interpreter: each layer against a float64 reference of the same dequantised weights (activations
quantised per token and group of 128 as the kernels do), and the measure jobs of a tiny FP8 checkpoint
end to end."""
import csv
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from calibrate.kernels import fp8_gemm as G
from calibrate.kernels.fused_moe_fp8 import default_config, fused_moe_fp8_ref
from calibrate.model import fp8_linear as FL
from calibrate.model import layers as L
from calibrate.model.layers_fp8 import Fp8MoEWeights, GDNInProj, fp8_weights
from calibrate.model.shapes import LayerShapes
from calibrate.model.work import moe_work
from calibrate.tables.grid import Grid
from core.config import ModelConfig, load_hardware, validate
from policies.kernels.inputs import rel_err
from tiny_model import TINY_FP8

pytestmark = pytest.mark.usefixtures("nan_poison", "rtne_fp8")
S = LayerShapes.from_model(validate(ModelConfig, TINY_FP8, "tiny fp8"))
CPU = torch.device("cpu")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the layer tests run on the GPU where there is one
# ours everywhere, and torch's block-wise scaled_mm where it runs
GEMMS = pytest.mark.parametrize("gemm", ["triton"] + (["torch"] if DEV.type == "cuda" else []))
TOL = 2e-2
GRID = Grid(tokens=(1, 2, 4), decode_b=(1,), decode_p=(1,), decode_ctx=(16,), prefill_chunk=(8,), prefill_ctx=(0,),
            step_shapes=((2, 2, 16),), activation_tokens=(8,), name="tiny")


def _qdq(h: torch.Tensor) -> torch.Tensor:
    """float64 of the activation as the kernels quantise it: per token and group of 128, from bf16."""
    q, s = G.group_quant_ref(h.to(torch.bfloat16))
    return q.double() * s.double().repeat_interleave(G.GROUP, 1)


class Ref:
    """A block-FP8 projection's float64 reference: the quantised activation times the dequantised weight."""

    def __init__(self, lin: FL.Fp8Linear) -> None:
        self.w = lin.dequantised()

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return _qdq(h) @ self.w.T


def _ref(w: object) -> object:
    """The same weights in float64, each block-FP8 projection as its Ref."""
    if isinstance(w, FL.Fp8Linear):
        return Ref(w)
    if isinstance(w, torch.Tensor):
        return w.double()
    return dataclasses.replace(w, **{f.name: _ref(getattr(w, f.name)) for f in dataclasses.fields(w)})


def test_fp8_weights_quantise_the_checkpoints_projections_and_keep_the_rest():
    gdn = fp8_weights(L.gdn_weights(S, CPU), S, FL.TRITON)
    assert isinstance(gdn.in_proj, GDNInProj) and isinstance(gdn.out_proj, FL.Fp8Linear)
    assert gdn.in_proj.qkvz.weight.shape == (S.gdn_conv_channels + S.gdn_v_channels, S.hidden)
    assert gdn.in_proj.qkvz.weight.dtype == G.FP8 and gdn.in_proj.qkvz.scale.shape == (4, 1)
    assert gdn.in_proj.ba.dtype == torch.bfloat16 and gdn.in_proj.ba.shape == (2 * S.gdn_v_heads, S.hidden)
    attn = fp8_weights(L.attn_weights(S, CPU), S, FL.TRITON)
    assert isinstance(attn.qkv, FL.Fp8Linear) and isinstance(attn.o_proj, FL.Fp8Linear)
    bf16 = L.moe_weights(S, CPU)
    moe = fp8_weights(bf16, S, FL.TRITON)
    assert isinstance(moe, Fp8MoEWeights) and moe.w13.dtype == moe.w2.dtype == G.FP8
    assert moe.w13_s.shape == (S.num_experts, 2, 1) and isinstance(moe.shared13, FL.Fp8Linear)
    assert moe.router is bf16.router and moe.shared_gate is bf16.shared_gate  # kept in bf16
    # the same random weights, quantised: within one fp8 step of each
    back = G.dequantize_weight_blocks(moe.w2, moe.w2_s)
    assert torch.allclose(back, bf16.w2.double(), rtol=1 / 16, atol=bf16.w2.double().abs().max().item() / 448)
    mtp = fp8_weights(L.mtp_weights(S, CPU), S, FL.TRITON)
    assert isinstance(mtp.fc, torch.Tensor)  # mtp.fc is not among the checkpoint's block-FP8 projections


@GEMMS
def test_gdn_dense_halves_match_the_float64_reference(gemm):
    w = fp8_weights(L.gdn_weights(S, DEV), S, FL.pick_gemm(gemm, DEV))
    x, o = torch.randn(6, S.hidden, device=DEV).bfloat16(), torch.randn(6, S.gdn_v_channels, device=DEV).bfloat16()
    qkvz, ba = L.gdn_in(x, w, S)
    r = _ref(w)
    qkvz_r, ba_r = L.gdn_in(x.double(), r, S)
    assert rel_err(qkvz.double(), qkvz_r) < TOL and rel_err(ba.double(), ba_r) < TOL
    z = qkvz[:, S.gdn_conv_channels:]
    out = L.gdn_out(o, z, w, S)
    assert rel_err(out.double(), L.gdn_out(o.double(), z.double(), r, S)) < TOL


@GEMMS
def test_attn_forward_matches_the_float64_reference(gemm):
    w = fp8_weights(L.attn_weights(S, DEV), S, FL.pick_gemm(gemm, DEV))
    n = 7
    x = torch.randn(n, S.hidden, device=DEV).bfloat16()
    cos, sin = L.rope_tables(torch.arange(n, device=DEV) + 100, S.rotary_dim)
    slots = torch.randperm(n, device=DEV)
    kv = (n, S.kv_heads, S.head_dim)
    kc, vc = torch.empty(kv, device=DEV).bfloat16(), torch.empty(kv, device=DEV).bfloat16()
    out = L.attn_forward(x, w, S, cos, sin, slots, kc, vc)
    kr, vr = torch.empty(kv, device=DEV).double(), torch.empty(kv, device=DEV).double()
    ref = L.attn_forward(x.double(), _ref(w), S, cos, sin, slots, kr, vr)
    assert rel_err(out.double() - x.double(), ref - x.double()) < TOL  # the layer's increment, not the residual
    assert rel_err(kc.double(), kr) < TOL and rel_err(vc.double(), vr) < TOL


@GEMMS
def test_mlp_forward_matches_the_float64_reference(gemm):
    s = dataclasses.replace(S, num_experts=0, top_k=0, expert_width=0, shared_width=0, mlp_width=256,
                            fp8_projections=frozenset({"gate_proj", "up_proj", "down_proj"}))
    w = fp8_weights(L.mlp_weights(s, DEV), s, FL.pick_gemm(gemm, DEV))
    assert isinstance(w.w13, FL.Fp8Linear) and isinstance(w.w2, FL.Fp8Linear)
    x = (0.1 * torch.randn(5, s.hidden, device=DEV)).bfloat16()  # a small residual: the sum's bf16 rounding stays small
    out = L.ffn_forward(x, w, s)
    ref = L.ffn_forward(x.double(), _ref(w), s)
    assert rel_err(out.double() - x.double(), ref - x.double()) < TOL


@GEMMS
@pytest.mark.parametrize("T", [5, 20])  # one pair per M-block, and the expert-sorted path
def test_moe_forward_routes_fp8_experts_and_runs_the_shared_expert_dense(T, gemm):
    w = fp8_weights(L.moe_weights(S, DEV), S, FL.pick_gemm(gemm, DEV))
    x = (torch.randn(1, S.hidden, device=DEV) + 0.5 * torch.randn(T, S.hidden, device=DEV)).bfloat16()
    out = L.moe_forward(x, w, S)
    h = F.rms_norm(x, (S.hidden,), w.norm, L.EPS)  # the routing follows the bf16 norm, as the kernel's
    routed = fused_moe_fp8_ref(h, w.router, w.w13, w.w13_s, w.w2, w.w2_s, S.top_k, None, None, None, None, None,
                               config=default_config(T)).double()
    gate, up = Ref(w.shared13)(h.double()).chunk(2, -1)
    shared = torch.sigmoid(h.double() @ w.shared_gate.double().T) * Ref(w.shared2)(F.silu(gate) * up)
    assert rel_err(out.double() - x.double(), routed + shared) < TOL
    assert rel_err(out.double() - x.double(), routed) > 0.05  # the shared expert is in it


@pytest.mark.parametrize("m", [1, 6, 8])
def test_torch_linear_pads_the_rows_before_quantising_and_cuts_back(monkeypatch, m):
    # F.scaled_mm stands in for cuBLASLt: it refuses M not a multiple of 4 and row-major activation scales.
    def fake(a, b, scale_a, _ta, scale_b, _tb, output_dtype):
        assert a.shape[0] % 4 == 0 and scale_a.stride() == (1, a.shape[0])
        return G.fp8_block_gemm_ref(a, scale_a, b.t(), scale_b, output_dtype)

    monkeypatch.setattr(F, "ScalingType", type("ST", (), {"BlockWise1x128": 0, "BlockWise128x128": 1}), raising=False)
    monkeypatch.setattr(F, "scaled_mm", fake, raising=False)
    monkeypatch.setattr(FL, "B_LAYOUT", ["n_by_k"])
    lin = FL.Fp8Linear.of(torch.randn(384, 256) * 0.05, FL.torch_gemm())
    x = torch.randn(m, 256).bfloat16()
    out = lin(x)
    assert out.shape == (m, 384) and out.dtype == torch.bfloat16
    assert rel_err(out.double(), Ref(lin)(x)) < TOL


@pytest.mark.skipif(DEV.type == "cuda", reason="a stand-in scaled_mm on the CPU")
def test_the_check_finds_the_weight_scale_layout_or_says_why_none_works(monkeypatch):
    def fake(a, b, scale_a, _ta, scale_b, _tb, output_dtype):
        if scale_b.shape != (b.shape[1] // 128, b.shape[0] // 128):
            raise RuntimeError("scale_b must be N/128 x K/128")
        return G.fp8_block_gemm_ref(a, scale_a, b.t(), scale_b, output_dtype)

    monkeypatch.setattr(F, "ScalingType", type("ST", (), {"BlockWise1x128": 0, "BlockWise128x128": 1}), raising=False)
    monkeypatch.setattr(F, "scaled_mm", fake, raising=False)
    monkeypatch.setattr(FL, "B_LAYOUT", [])
    assert FL.check_torch_block_mm(CPU, 256, 256) is None and FL.B_LAYOUT == ["n_by_k"]

    def refuse(*a, **k):
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
    monkeypatch.setattr(F, "scaled_mm", refuse, raising=False)
    why = FL.check_torch_block_mm(CPU, 256, 256)
    assert "n_by_k M=16: RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED" in why and FL.B_LAYOUT == []


def test_pick_gemm_takes_torchs_only_where_it_passes_its_check(capsys):
    assert FL.pick_gemm("triton", CPU) is FL.TRITON
    logged = []
    assert FL.pick_gemm("auto", CPU, logged.append) is FL.TRITON and "Triton" in logged[0]
    with pytest.raises(SystemExit, match="--fp8-gemm torch"):
        FL.pick_gemm("torch", CPU)
    with pytest.raises(ValueError, match="torch, triton, auto"):
        FL.pick_gemm("cutlass", CPU)


@pytest.mark.skipif(DEV.type == "cuda", reason="the CPU harness: Triton's interpreter runs the kernels")
def test_measure_writes_an_fp8_checkpoints_tables_at_fp8_weight_bytes(tmp_path, monkeypatch):
    from calibrate.tables.run import measure

    calls = []
    call = FL.Fp8Linear.__call__
    monkeypatch.setattr(FL.Fp8Linear, "__call__", lambda self, x: calls.append(x.shape) or call(self, x))
    model = validate(ModelConfig, TINY_FP8, "tiny fp8")
    bf16_model = validate(ModelConfig, {**TINY_FP8, "weights": "bf16"}, "tiny bf16")
    jobs = ("gdn", "attn_proj", "moe", "lm_head", "mtp_fc")
    for m, todo in ((model, jobs + ("memory",)), (bf16_model, ("memory",))):
        assert measure(m, load_hardware("h200"), todo, tmp_path / m.weights, device="cpu", modes=("eager",),
                       commit="abc", grid=GRID, log=lambda s: None) == 0
    assert calls  # the block-FP8 projections ran
    mdir = tmp_path / "fp8" / model.name
    rows = {j: list(csv.DictReader((mdir / f"{j}.csv").open())) for j in jobs}
    measured = {w: json.loads((tmp_path / w / model.name / "memory.json").read_text())["checks"]
                ["weights_per_gpu_bytes"]["measured_tensors"] for w in ("fp8", "bf16")}
    assert 0.5 < measured["fp8"] / measured["bf16"] < 0.6  # the embedding and LM head stay bf16
    assert all(len(r) == len(GRID.tokens) and float(x["us"]) > 0 for r in rows.values() for x in r)
    bf16 = LayerShapes.from_model(validate(ModelConfig, {**TINY_FP8, "weights": "bf16"}, "tiny bf16"))
    n = int(rows["attn_proj"][-1]["tokens"])
    act = 2 * n * (S.hidden + S.qkv_features) + 2 * n * (S.q_heads * S.head_dim + S.hidden)
    # one byte a weight plus a float32 scale per 128 x 128 block: q/gate, k, v and o_proj
    assert int(rows["attn_proj"][-1]["bytes"]) == S.attn_weight_bytes + act == (256 + 3 * 128) * 128 + 4 * 5 + act
    assert S.attn_weight_bytes < bf16.attn_weight_bytes / 1.9
    fp8_gdn = (512 * 128 + 128 * 128) + 4 * (4 + 1) + 2 * 2 * 128  # qkvz, out_proj and their scales; b, a in bf16
    n = int(rows["gdn"][-1]["tokens"])
    act = 2 * n * (S.hidden + S.gdn_in_features + S.gdn_v_channels + S.hidden)
    assert int(rows["gdn"][-1]["bytes"]) == fp8_gdn + act
    assert moe_work(bf16, 1)[1] / 2.1 < int(rows["moe"][0]["bytes"]) < moe_work(bf16, 1)[1] / 1.8
    part = json.loads((mdir / "provenance.json").read_text())["parts"][-1]
    kernels = part["packaged_kernels"]
    assert set(kernels) == {"gdn", "attn_proj", "moe"}  # the LM head and mtp.fc stay bf16
    assert "fp8_block_gemm" in kernels["gdn"] and "fused_moe_fp8" in kernels["moe"]


@pytest.mark.skipif(DEV.type == "cuda", reason="the CPU harness: Triton's interpreter runs the kernels")
@pytest.mark.slow  # a whole speculative step of the tiny model in the interpreter: about a minute
def test_step_check_runs_the_fp8_checkpoints_layers(tmp_path, monkeypatch):
    from calibrate.tables import stepcheck
    from calibrate.tables.run import measure

    calls = []
    call = FL.Fp8Linear.__call__
    monkeypatch.setattr(FL.Fp8Linear, "__call__", lambda self, x: calls.append(x.shape) or call(self, x))
    monkeypatch.setattr(stepcheck, "load_kernel", lambda name: None)  # the step without its GDN recurrence
    model = validate(ModelConfig, TINY_FP8, "tiny fp8")
    assert measure(model, load_hardware("h200"), ("step_check",), tmp_path, device="cpu", modes=("eager",),
                   commit="abc", grid=GRID, log=lambda s: None) == 0
    steps = list(csv.DictReader((tmp_path / model.name / "step_check.csv").open()))
    assert len(steps) == len(GRID.step_shapes) and all(float(r["step_us"]) > 0 for r in steps)
    b, p, _ = GRID.step_shapes[0]
    assert (b * p, S.hidden) in calls  # the target's projections at the step's tokens
