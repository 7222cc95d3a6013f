"""GPU: the fused MoE at the models' shapes with the configs it runs there (its tuned table where one
is committed for this GPU, else the heuristic), against the float64 reference, outputs NaN-poisoned."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from calibrate.kernels import fused_moe as FM  # noqa: E402
from calibrate.kernels import moe_configs as MC  # noqa: E402
from calibrate.kernels.inputs import moe_inputs, nan_poison  # noqa: E402
from calibrate.kernels.naive import fused_moe_ref  # noqa: E402
from calibrate.model.shapes import LayerShapes  # noqa: E402
from core.config import load_model  # noqa: E402
from policies.kernels.inputs import rel_err  # noqa: E402

TOL = 2e-2
MODELS = ("qwen3.5-35b-a3b", "qwen3.5-397b-a17b")


def _inputs(model: str, tokens: int) -> dict:
    s = LayerShapes.from_model(load_model(model))
    return moe_inputs(tokens, s.hidden, s.num_experts, s.expert_width, s.top_k, True, "cuda", seed=tokens)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tokens", [1, 13, 48, 700])
def test_the_configs_it_runs_match_the_reference(model, tokens):
    x = _inputs(model, tokens)
    with nan_poison():
        out = FM.fused_moe(**x)
    assert rel_err(out, fused_moe_ref(**x)) < TOL


@pytest.mark.parametrize("model", MODELS)
def test_every_table_entry_matches_the_reference(model):
    s = LayerShapes.from_model(load_model(model))
    table = MC.load_table(s.num_experts, s.expert_width, torch.cuda.get_device_name())
    if table is None:
        pytest.skip("no tuned table for this GPU")
    x = _inputs(model, 37)
    ref = fused_moe_ref(**x)
    for t, cfg in table.items():
        with nan_poison():
            out = FM.fused_moe(**x, config=cfg)
        assert rel_err(out, ref) < TOL, f"entry {t}: {cfg}"
