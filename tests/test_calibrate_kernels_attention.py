"""Paged attention and the KV-cache write (Triton, CPU interpreter) against the float64 reference."""
import pytest
import torch

from calibrate.kernels import paged_attention as PA
from calibrate.kernels.inputs import paged_inputs
from calibrate.kernels.naive import paged_attention_ref, reshape_and_cache_ref
from policies.kernels.inputs import rel_err

pytestmark = pytest.mark.usefixtures("nan_poison")
BF16_TOL = 2e-2  # bf16 probabilities into the PV product, bf16 output

CASES = {
    # name: (q_lens, contexts, block_size, kv_heads, group, head_dim, config)
    "decode-B3-bs7-g4-d32": ([1, 1, 1], [5, 40, 17], 7, 2, 4, 32, PA.AttnConfig(16, 16)),
    "verify-B3-P134-bs7-split3": ([1, 3, 4], [5, 40, 17], 7, 2, 4, 32, PA.AttnConfig(16, 16, num_splits=3)),
    "mixed-prefill20-bs5-g3-d24": ([20, 1, 2], [0, 33, 9], 5, 1, 3, 24, PA.AttnConfig(16, 16)),
    "mixed-bm32-bn32-split2": ([20, 1, 2], [0, 33, 9], 5, 1, 3, 24, PA.AttnConfig(32, 32, num_splits=2)),
    # Tiles of 16 keys over blocks of 13: every tile but one straddles two blocks.
    "prefill-chunk-after-ctx-bs13": ([37], [50], 13, 1, 2, 16, PA.AttnConfig(16, 16)),
    "empty-request-bs6": ([2, 0, 3], [9, 4, 0], 6, 2, 2, 16, PA.AttnConfig(16, 16)),
    "default-config": ([4, 4], [30, 3], 11, 2, 4, 32, None),
}


@pytest.mark.parametrize("case", CASES)
def test_against_reference(case):
    q_lens, ctxs, block_size, kv_heads, group, d, cfg = CASES[case]
    x = paged_inputs(q_lens, ctxs, block_size, kv_heads, group, d, seed=len(case))
    out = PA.paged_attention(**x, config=cfg)
    err = rel_err(out, paged_attention_ref(**x))
    assert err < BF16_TOL, f"{case}: relative error {err:.2e}"


def test_writes_into_out():
    x = paged_inputs([3, 1], [6, 12], 8, 1, 2, 16)
    out = torch.full_like(x["q"], float("nan"))
    ret = PA.paged_attention(**x, out=out, config=PA.AttnConfig(16, 16))
    assert ret is out
    assert rel_err(out, paged_attention_ref(**x)) < BF16_TOL


def test_reshape_and_cache_writes_only_its_slots():
    x = paged_inputs([1], [1], 9, 2, 1, 16)
    k_cache, v_cache = x["k_cache"], x["v_cache"]
    k, v = torch.randn(2, 5, 2, 16).to(torch.bfloat16).unbind(0)
    slots = torch.tensor([3, 17, -1, 0, 26])  # slot -1: a padding token
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    reshape_and_cache_ref(k[slots >= 0], v[slots >= 0], ref_k, ref_v, slots[slots >= 0])
    PA.reshape_and_cache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


@pytest.mark.parametrize("cfg, field", [(PA.AttnConfig(16, 16), "block_m"),
                                        (PA.AttnConfig(32, 16, num_splits=PA.MAX_SPLITS + 1), "num_splits")])
def test_bad_config_names_the_field(cfg, field):
    x = paged_inputs([1], [4], 4, 1, 32, 16)
    with pytest.raises(ValueError, match=field):
        PA.paged_attention(**x, config=cfg)
