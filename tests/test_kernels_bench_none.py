"""The no-speculation baseline rows of the kernel bench: cases, bytes, and the float64 step they are checked against."""
import pytest
import torch

from policies.kernels import reference as R
from policies.kernels.bench_cases import STUDY_MODELS, Case, none_cases, policy_bytes, sizes
from policies.kernels.bench_fla import decode_reference
from policies.kernels.inputs import random_inputs, rel_err


def test_none_cases_are_one_token_per_model_dtype_and_batch():
    cs = none_cases(("float32", "bfloat16"), (128, 1), STUDY_MODELS)
    assert [c.B for c in cs] == [128] * 4 + [1] * 4
    assert {(c.T, c.tree, c.depth) for c in cs} == {(1, "", 0)}
    assert {(c.model, c.state_dtype) for c in cs} == {(m, d) for m in STUDY_MODELS for d in ("float32", "bfloat16")}


def test_none_bytes_read_and_write_the_state_once_and_commit_nothing():
    c = Case("qwen3.5-35b-a3b", 16, 32, 128, "", (-1,), "bfloat16")
    s = sizes(c)
    assert policy_bytes(c, "none", 0, True) == (2 * s["S"] + s["inp"] + s["o"], 0)
    assert s["S"] == 128 * 32 * 128 * 128 * 2


def test_decode_reference_is_the_literal_recurrence_with_vllm_gating():
    """Gates and q/k norms applied as vLLM's decode kernel does them, then one step of the literal rule."""
    x = random_inputs([[-1]] * 3, hk=2, hv=4, dk=16, dv=16, seed=3)
    a_log, dt_bias = torch.rand(4) - 0.5, torch.rand(4) - 0.5
    o, s = decode_reference(x, a_log, dt_bias)
    g = -a_log.exp() * torch.nn.functional.softplus(x["g"] + dt_bias)
    qn = x["q"] / (x["q"].pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    kn = x["k"] / (x["k"].pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    o_ref, states = R.recurrence(qn, kn, x["v"], g, torch.sigmoid(x["beta"]), x["parent"], x["state"])
    # the gates here are float32, the reference's float64: equal to float32 rounding
    assert rel_err(s, states[:, 0]) < 1e-6
    assert rel_err(o, o_ref[:, 0] * 16 ** -0.5) < 1e-6
    assert rel_err(s, x["state"]) > 1e-2  # the step moved the state


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vllm_decode_call_is_the_float64_step_on_the_gpu():
    """vLLM 0.17.1's own decode call (carried), on scattered state slots with a poisoned output, against
    the float64 step: each request's slot moves, the others stay."""
    from policies.kernels.bench_fla import load_vllm_decode, vllm_decode_call
    from policies.kernels.bench_policy import make_copy
    fn = load_vllm_decode()
    assert fn is not None, "vLLM's Python files are not carried (source .carry-a/setup.sh a)"
    c = Case("qwen3.5-35b-a3b", 16, 32, 8, "", (-1,), "float32")
    x = make_copy(c, 5)
    a_log, dt_bias = torch.rand(32, device="cuda") - 0.5, torch.rand(32, device="cuda") - 0.5
    o_ref, s_ref = decode_reference(x, a_log, dt_bias)
    pool = torch.full((24, *x["state"].shape[1:]), float("nan"), device="cuda")
    idx = torch.randperm(24, device="cuda")[:8].to(torch.int32)
    pool[idx.long()] = x["state"]
    before = pool.clone()
    o = vllm_decode_call(fn, {**x, "state": pool}, a_log, dt_bias, idx, torch.arange(9, device="cuda", dtype=torch.int32))
    assert rel_err(pool[idx.long()], s_ref) < 1e-5 and rel_err(o[0].float(), o_ref) < 1e-2
    rest = torch.ones(24, dtype=torch.bool, device="cuda")
    rest[idx.long()] = False
    assert bool(torch.isnan(pool[rest]).all()) and bool(torch.isnan(before[rest]).all())
