"""bench_flashinfer's CPU parts: the arguments it builds match what FlashInfer's wrappers assert, the
bytes it scores each kernel against, the flush cycle it walks and the float64 reference it checks
outputs with. The timing itself needs the H200 and the CuTe DSL packages."""
import math

import pytest
import torch

from policies.kernels import bench_flashinfer as BF
from policies.kernels.bench_cases import D


@pytest.mark.parametrize("kind", list(BF.KINDS))
def test_arguments_have_the_shapes_the_wrappers_assert(kind):
    B, T, hk, hv = 3, 4, 2, 4
    x = BF.make_args(kind, B, T, hist_len=4, device="cpu", hk=hk, hv=hv)
    assert x["q"].shape == x["k"].shape == (B, T, hk, D) and x["v"].shape == (B, T, hv, D)
    assert x["a"].shape == x["b"].shape == (B, T, hv) and x["q"].dtype == torch.bfloat16
    assert torch.equal(x["A_log"], x["A_log"].bfloat16().float())  # the WY kernels read it as bf16
    state = x.get("initial_state", x.get("initial_state_source"))
    assert state.shape == (B, hv, D, D) and state.dtype == BF.KINDS[kind][2]
    assert torch.equal(x["initial_state_indices"], torch.arange(B, dtype=torch.int32))
    if kind.startswith("mtp_"):
        assert x["disable_state_update"] == (kind != "mtp_final_state") and x["output"].shape == (B, T, hv, D)
        assert ("intermediate_states_buffer" in x) == (kind == "mtp_all_states")
    if kind.startswith("ucache"):
        slots = BF.VERIFY_RING if kind == "ucache_verify" else BF.FLUSH_RING
        assert x["k_cache"].shape == (B, hk, slots, D) and x["u_cache"].shape == (B, hv, slots, D)
        assert x["g_cache"].shape == (B, hv, slots) and x["g_cache"].dtype == torch.float32
        assert x["hist_len"].dtype == torch.int32 and x["hist_len"].tolist() == [4] * B
        assert torch.allclose(x["k_cache"][:, :, :4].float().norm(dim=-1), torch.ones(B, hk, 4), atol=1e-2)
        assert not x["k_cache"][:, :, 4:].any() and (torch.diff(x["g_cache"][:, :, :4], dim=-1) <= 0).all()
    if kind == "ucache_flush":
        assert x["restart_hist_on_flush"] is False and x["flush_min"] == 12


def test_a_flush_cycle_of_each_ring():
    assert BF.hist_lens("ucache_verify", 4) == (0, 4, 8, 12) and BF.hist_lens("ucache_verify", 8) == (0, 8)
    assert BF.hist_lens("ucache_flush", 4) == (0, 4, 8, 12)  # three appends, then the fold
    assert [BF.flushes("ucache_flush", 4, p) for p in (0, 4, 8, 12)] == [False, False, False, True]
    assert BF.hist_lens("ucache_flush", 8) == (0, 8, 16) and BF.flush_min(8) == 9  # the ring holds 16
    assert BF.hist_lens("wy_output_only", 4) == (0,)


def test_bytes_count_state_passes_and_the_ring():
    B, T, hk, hv = 2, 4, 16, 32
    s32, s16 = B * hv * D * D * 4, B * hv * D * D * 2
    io = B * T * (2 * hk * D * 2 + hv * D * 2 + 2 * hv * 2) + B * T * hv * D * 2
    entry = B * (hk * D * 2 + hv * D * 2 + hv * 4)
    assert BF.nbytes("mtp_output_only", B, T) == s32 + io
    assert BF.nbytes("mtp_final_state", B, T) == 2 * s32 + io
    assert BF.nbytes("mtp_all_states", B, T) == s32 * (1 + T) + io
    assert BF.nbytes("wy_output_only", B, T) == s16 + io
    assert BF.nbytes("ucache_verify", B, T, 8) == s16 + io + 12 * entry
    assert BF.nbytes("ucache_flush", B, T, 8) == s16 + io + 12 * entry
    assert BF.nbytes("ucache_flush", B, T, 12) == 2 * s16 + io + 16 * entry  # the fold writes the state


def test_reference_is_one_gated_delta_step_with_flashinfers_gates():
    x = BF.make_args("mtp_output_only", 2, 1, device="cpu", hk=1, hv=2)
    o = BF.reference_output("mtp_output_only", x, rows=2)
    q, k = (torch.nn.functional.normalize(x[n].double(), dim=-1)[:, 0].repeat_interleave(2, dim=1) for n in ("q", "k"))
    g = -x["A_log"].double().exp() * torch.nn.functional.softplus(x["a"][:, 0].double() + x["dt_bias"].double())
    beta = torch.sigmoid(x["b"][:, 0].double())
    S, v = x["initial_state"].double(), x["v"][:, 0].double()
    S = g.exp()[..., None, None] * (S - beta[..., None, None] * torch.einsum("bhvd,bhd->bhv", S, k)[..., None]
                                    * k[:, :, None, :]) + beta[..., None, None] * v[..., None] * k[:, :, None, :]
    want = torch.einsum("bhvd,bhd->bhv", S, q * D ** -0.5)
    assert torch.allclose(o[:, 0], want, rtol=1e-10, atol=1e-12)


def test_missing_flashinfer_is_reported_not_raised():
    try:
        import flashinfer.gdn_decode  # noqa: F401
    except Exception:
        for kind in BF.KINDS:
            assert isinstance(BF.load(kind), str) and BF.load(kind)
    else:
        pytest.skip("flashinfer is importable here")


def test_bad_kinds_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        BF.main(["--out", "unused", "--kinds", "ucache_flush,nope"])
    assert exc.value.code == 2 and "--kinds takes" in capsys.readouterr().err
    assert math.isclose(BF.flush_min(4), 12)
