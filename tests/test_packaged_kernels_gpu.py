"""GPU: the packaged kernels the calibrator prices (FlashInfer's GDN prefill, flash-attn-4, cuDNN SDPA),
called through our wrappers, against the float64 references on fresh random inputs."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from calibrate.kernels.inputs import nan_poison, paged_inputs  # noqa: E402
from calibrate.kernels.naive import paged_attention_ref  # noqa: E402
from calibrate.model import attention_backends as AB  # noqa: E402
from calibrate.model.flashinfer_gdn import load_flashinfer_chunk  # noqa: E402
from policies.kernels import reference as ref  # noqa: E402
from policies.kernels.inputs import rel_err  # noqa: E402


def _l2n(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.double(), dim=-1, eps=1e-6)


@pytest.mark.parametrize("lengths", [[200], [130, 1, 64, 257]], ids=["one", "varlen"])
def test_flashinfer_gdn_prefill_matches_reference(lengths):
    chunk = load_flashinfer_chunk()
    if chunk is None:
        pytest.skip("FlashInfer's GDN prefill does not import here")
    g = torch.Generator("cuda").manual_seed(sum(lengths))
    hk, hv, d, n, seqs = 2, 4, 128, sum(lengths), len(lengths)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    base = rnd(1, n, hk, d)
    q = (base + 0.5 * rnd(1, n, hk, d)).bfloat16()  # correlated queries and keys
    k = (base + 0.5 * rnd(1, n, hk, d)).bfloat16()
    v = rnd(1, n, hv, d).bfloat16()
    gate = torch.nn.functional.logsigmoid(rnd(1, n, hv) + 3.0)
    beta = torch.rand(1, n, hv, generator=g, device="cuda").bfloat16()
    state0 = rnd(seqs, hv, d, d) * 0.05
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0)
    with nan_poison():
        o, final = chunk(q, k, v, gate, beta, initial_state=state0, output_final_state=True, cu_seqlens=cu,
                         use_qk_l2norm_in_kernel=True, state_v_first=True)
    assert o.shape == v.shape and final.shape == state0.shape
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        chain = (torch.arange(b - a, device="cuda", dtype=torch.int32) - 1)[None]
        o_ref, states = ref.recurrence(_l2n(q[:, a:b]) * d ** -0.5, _l2n(k[:, a:b]), v[:, a:b], gate[:, a:b],
                                       beta[:, a:b], chain, state0[i:i + 1])
        assert rel_err(o[:, a:b], o_ref) < 2e-2
        assert rel_err(final[i], states[0, -1]) < 2e-2


@pytest.mark.parametrize("block", [16, 544, 1072])
def test_fa4_paged_matches_reference(block):
    fa = AB.load_fa4()
    if fa is None:
        pytest.skip("flash-attn-4 does not import here")
    x = paged_inputs([1, 4, 4, 300, 64], [5000, 17, 2100, 0, 1500], block, 2, 8, 256, "cuda", seed=block)
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["seq_lens"], x["cu_seqlens_q"],
            x["max_seqlen_q"], x["scale"])
    with nan_poison():
        out = AB.fa4_paged(fa, *args)()
    out = out[0] if isinstance(out, tuple) else out
    assert rel_err(out, paged_attention_ref(*args)) < 2e-2


@pytest.mark.parametrize("backend", sorted(AB.SDPA_BACKENDS))
def test_sdpa_prefill_matches_reference(backend):
    x = paged_inputs([700], [0], 700, 2, 8, 256, "cuda", seed=3)
    k = x["k_cache"][x["block_tables"][0, 0]].transpose(0, 1)[None]
    v = x["v_cache"][x["block_tables"][0, 0]].transpose(0, 1)[None]
    out = AB.sdpa_prefill(backend, x["q"].transpose(0, 1)[None], k, v)()
    want = paged_attention_ref(x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["seq_lens"],
                               x["cu_seqlens_q"], x["max_seqlen_q"], x["scale"])
    assert rel_err(out[0].transpose(0, 1), want) < 2e-2
