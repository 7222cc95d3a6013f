"""The no-speculation decode core's conv update: one token per request, timed and checked on the CPU."""
import pytest

torch = pytest.importorskip("torch")

from calibrate.tables.decode_conv_none import none_decode_conv_rows  # noqa: E402
from core.config import ModelConfig, load_hardware  # noqa: E402
from core.tables import DECODE_CONV_COLUMNS  # noqa: E402
from policies.kernels import conv  # noqa: E402
from tiny_model import TINY  # noqa: E402


def test_one_token_update_is_causal_conv1d_update():
    """vLLM's causal_conv1d_update: y = silu(bias + w . [window, x]); the window drops its oldest input."""
    torch.manual_seed(0)
    b, c, k = 3, 128, 4
    x = torch.randn(b, 1, c)
    w, bias = torch.randn(c, k), torch.randn(c)
    state = torch.randn(b, c, k - 1)
    window = torch.cat([state, x.transpose(1, 2)], dim=2)  # [b, c, k], newest last
    want_y = torch.nn.functional.silu(bias + (window * w).sum(-1))
    want_state = window[:, :, 1:].clone()
    y, ctx = conv.reconstruct_verify(x, w, torch.full((b, 1), -1, dtype=torch.int32), state, bias=bias)
    conv.reconstruct_commit(ctx, torch.zeros(b, dtype=torch.int32))
    assert torch.allclose(y.reshape(b, c), want_y, atol=1e-5)
    assert torch.allclose(state, want_state)


def test_rows_have_the_table_schema():
    model = ModelConfig.model_validate(TINY)
    rows = none_decode_conv_rows(model, torch.device("cpu"), load_hardware("h200").hbm_bandwidth_gbs, reps=1,
                                 batches=(1, 4), log=lambda _: None)
    assert [tuple(r) for r in rows] == [DECODE_CONV_COLUMNS] * 2
    assert [(r["policy"], r["B"], r["P"], r["tokens"]) for r in rows] == [("none", 1, 1, 1), ("none", 4, 1, 4)]
    assert all(r["us"] > 0 for r in rows)
