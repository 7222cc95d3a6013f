"""Triton kernels against the float64 literal recurrence (CPU: TRITON_INTERPRET=1).

Every case checks the outputs and the committed state for every accepted position;
new tensors are NaN-poisoned, so an unwritten element fails.
"""
import dataclasses

import pytest
import torch
from hypothesis import given, settings, strategies as st

from policies.kernels import reconstruct, reference as R, replay, store_all
from policies.kernels.inputs import chain, full, preorder, random_inputs, rel_err, star
from policies.kernels.treewy import Tuning

pytestmark = pytest.mark.usefixtures("nan_poison")
POLICIES = {"store_all": store_all, "reconstruct": reconstruct}
F32, BF16 = 1e-5, 2e-2
# Cold start (no state to hide behind): float32 kernels come within ~3e-7 of float64 here;
# one factor of the triangular inverse left out gives 3e-5 to 6e-5.
COLD = 3e-6


def fresh(x):
    return {**x, "state": x["state"].clone()}


def check_policy(policy, x, tol, nodes=None, out_tol=None):
    """Outputs (within `out_tol`, default `tol`), then commit from the same verify for each
    accepted node (a fresh target state each time)."""
    o_ref, states = R.recurrence(**x)
    mod = POLICIES[policy]
    o, ctx = mod.verify(**fresh(x))
    assert not torch.isnan(o).any()
    err = rel_err(o, o_ref)
    assert err < (out_tol or tol), f"outputs: {err:.2e}"
    B, T = x["parent"].shape
    n = [T] * B if x["lengths"] is None else x["lengths"].tolist()
    for a in nodes if nodes is not None else range(T):
        acc = torch.tensor([min(a, m - 1) for m in n], dtype=torch.int32)
        new = mod.commit(dataclasses.replace(ctx, state=x["state"].clone()), acc)
        assert not torch.isnan(new).any()
        err = rel_err(new, states[torch.arange(B), acc.long()])
        assert err < tol, f"state at node {a}: {err:.2e}"


CASES = {
    # name: (trees, hk, hv, d)
    "chain7-d128": ([chain(7)], 1, 1, 128),
    "full222-d128": ([full((2, 2, 2))], 1, 1, 128),
    "T1": ([[-1]] * 2, 1, 1, 16),
    "star9": ([star(9)], 1, 2, 16),
    "full333-ragged-grouped": ([full((3, 3, 3)), preorder(full((2, 2, 2))), [-1]], 1, 2, 16),
    "deep65": ([chain(65)], 1, 1, 16),
}


# Keys from a few shared directions plus noise, slow decays and a cold-start state: the
# outputs and states are the tree's own update, so the error is relative to it, and every
# power of the coupling matrix in the solve matters (with independent keys at d = 128 they
# nearly vanish, and a missing factor of the triangular inverse passed).
CORRELATED = {
    "chain16-d128": ([chain(16)], 1, 1, 128),
    "deep-tree-d128": ([[-1] + [max(0, t - 1 - (t % 3 == 0)) for t in range(1, 16)]], 1, 2, 128),
    "full222-ragged-d128": ([full((2, 2, 2)), chain(11)], 1, 2, 128),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", CORRELATED)
def test_correlated_keys_at_d128_against_float64(policy, case):
    trees, hk, hv, d = CORRELATED[case]
    x = random_inputs(trees, hk=hk, hv=hv, dk=d, dv=d, seed=12, correlated_keys=True, state_scale=0.0,
                      log_decay=0.01)
    check_policy(policy, x, COLD)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", CASES)
def test_float32_against_float64(policy, case):
    trees, hk, hv, d = CASES[case]
    x = random_inputs(trees, hk=hk, hv=hv, dk=d, dv=d, seed=10)
    nodes = [0, 1, 31, 32, 63, 64] if case == "deep65" else None
    check_policy(policy, x, F32, nodes)


@pytest.mark.parametrize("policy", POLICIES)
def test_bf16_inputs(policy):
    """q, k, v in bf16 as vLLM serves them: the float32 state comes out float32-accurate (the
    products are exact on bf16 operands), the bf16 outputs within a few of their own roundings."""
    x = random_inputs([full((2, 2, 2)), chain(4)], hk=1, hv=2, dk=32, dv=32, seed=11, dtype=torch.bfloat16)
    o_ref = R.recurrence(**x)[0]
    rounding = rel_err(o_ref.to(torch.bfloat16), o_ref)  # the best a bf16 output can do
    check_policy(policy, x, F32, nodes=[0, 3, 14], out_tol=3 * rounding)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=4, deadline=None)
@given(parents=st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=24), seed=st.integers(0, 1000))
def test_random_trees(policy, parents, seed):
    tree = [-1] + [r % (t + 1) for t, r in enumerate(parents)]
    x = random_inputs([tree], hk=1, hv=1, dk=16, dv=16, seed=seed)
    check_policy(policy, x, F32)


def test_poisoned_outputs_would_fail():
    """The fixture is live: a fresh output reads NaN, which rel_err turns into a failure."""
    assert torch.isnan(torch.empty(3)).all()
    assert not rel_err(torch.empty(3), torch.ones(3)) < F32


@pytest.mark.parametrize("flush_interval", [1, 3])
def test_replay_steps_match_recurrence(flush_interval):
    """Four verify/commit steps on a ragged batch: outputs each step and the materialised
    state after each commit equal the literal recurrence carried across steps."""
    trees = [full((2, 2)), chain(5)]
    truth = None
    rs = None
    for step in range(4):
        x = random_inputs(trees, hk=1, hv=1, dk=16, dv=16, seed=20 + step, T=7)
        if rs is None:
            truth = x["state"].double()
            rs = replay.ReplayState.start(x["state"].clone(), flush_interval=flush_interval, max_path=5, hk=1,
                                          dtype=torch.float32)
        o_ref, states = R.recurrence(**{**x, "state": truth})
        o, ctx = replay.verify(**{**x, "state": rs})
        assert rel_err(o, o_ref) < F32, f"step {step} outputs"
        acc = torch.tensor([(2 * step + 1) % 7, (step + 2) % 5], dtype=torch.int32)
        rs = replay.commit(ctx, acc)
        truth = states[torch.arange(2), acc.long()]
        assert rs.steps == (step + 1) % flush_interval
        assert rel_err(replay.materialize(rs), truth) < F32, f"step {step} state"


def test_replay_bf16_cache():
    """k and v cached in bf16 (the default): the error stays within bf16 tolerance."""
    x = random_inputs([full((2, 2))], hk=1, hv=1, dk=16, dv=16, seed=30)
    rs = replay.ReplayState.start(x["state"].clone(), flush_interval=2, max_path=3, hk=1)
    _, states = R.recurrence(**x)
    rs = replay.commit(replay.verify(**{**x, "state": rs})[1], torch.tensor([5], dtype=torch.int32))
    assert rel_err(replay.materialize(rs), states[:, 5]) < BF16


BAD = {
    "q-rank": (lambda x: x.update(q=x["q"][0]), "q"),
    "hv-multiple": (lambda x: x.update(v=x["v"][:, :, :3], g=x["g"][:, :, :3], beta=x["beta"][:, :, :3],
                                       state=x["state"][:, :3]), "Hv"),
    "root": (lambda x: x["parent"].__setitem__((0, 0), 0), r"parent\[:, 0\]"),
    "not-parent-first": (lambda x: x["parent"].__setitem__((0, 2), 4), "parent-first"),
    "beta-shape": (lambda x: x.update(beta=x["beta"][..., :1]), "beta"),
}


@pytest.mark.parametrize("policy", [*POLICIES, "replay"])
@pytest.mark.parametrize("bad", BAD)
def test_bad_input_names_argument(policy, bad):
    x = random_inputs([full((2, 2))], hk=2, hv=4, dk=16, dv=16, seed=40)
    change, pattern = BAD[bad]
    change(x)
    with pytest.raises(ValueError, match=pattern):
        if policy == "replay":
            rs = replay.ReplayState.start(x["state"], flush_interval=2, max_path=3, hk=x["k"].shape[2])
            replay.verify(**{**x, "state": rs})
        else:
            POLICIES[policy].verify(**x)


@pytest.mark.parametrize("policy", [*POLICIES, "replay"])
@pytest.mark.parametrize("accepted", [[7], [-1], [0, 0]])
def test_accepted_out_of_range(policy, accepted):
    x = random_inputs([full((2, 2))], hk=1, hv=1, dk=16, dv=16, seed=41)
    if policy == "replay":
        o, ctx = replay.verify(**{**x, "state": replay.ReplayState.start(x["state"], 2, 3, hk=1)})
        commit = replay.commit
    else:
        o, ctx = POLICIES[policy].verify(**x)
        commit = POLICIES[policy].commit
    with pytest.raises(ValueError, match="accepted"):
        commit(ctx, torch.tensor(accepted, dtype=torch.int32))


def test_kernel_dims_must_be_powers_of_two():
    x = random_inputs([chain(3)], hk=1, hv=1, dk=24, dv=16, seed=42)
    with pytest.raises(ValueError, match="Dk"):
        reconstruct.verify(**x)


PATHS = {  # name: (tuning, trees)
    "rows-unrolled": (Tuning(rows_max=16, commit="loop"), [full((3, 3)), preorder(full((2, 2))), [-1]]),
    "rows-loop": (Tuning(rows_max=64), [full((2, 2, 2)), chain(20), [-1]]),
    "blocked-small": (Tuning(verify="blocked", commit="loop"), [chain(4), chain(2), [-1]]),
    "blocked-large": (Tuning(verify="blocked"), [chain(20), full((2, 2, 2))]),
    "fused-bv16-ieee": (Tuning(verify_bv=16, commit_bv=16, prec="ieee"), [chain(33), full((3, 3)), [-1]]),
    "fused-pack": (Tuning(prep=False), [chain(8), full((2, 2)), star(5), [-1]]),
    "fused-prep": (Tuning(pack=False), [chain(16), preorder(full((2, 2, 2))), star(5), [-1]]),
    "fused-pack-prep": (Tuning(), [chain(8), full((2, 2)), [-1]]),
    # leaves fill blocks 1-2 of (3,3,3) and star(33), and mix with inner nodes in a preorder (3,3,3)
    "fused-sparse": (Tuning(sparse=True), [full((3, 3, 3)), star(33), preorder(full((3, 3, 3)))]),
}


@pytest.mark.parametrize("path", PATHS)
def test_reconstruct_paths_forced(monkeypatch, path):
    """Every verify kernel (fused, row by row unrolled and looped, blocked solve + apply) and both
    commits (tl.dot blocks, per-node loop) are exact, whichever the default is."""
    from policies.kernels import treewy
    tuning, trees = PATHS[path]
    monkeypatch.setattr(treewy, "TUNING", tuning)
    x = random_inputs(trees, hk=1, hv=2, dk=16, dv=16, seed=12)
    check_policy("reconstruct", x, F32, nodes=[0, 1, 3, 6, 11, 19, 32])


def test_sparse_blocks_change_no_output(monkeypatch):
    """Skipping the mask blocks without ancestors gives the same u and o, bit for bit."""
    from policies.kernels import treewy
    x = random_inputs(PATHS["fused-sparse"][1], hk=1, hv=2, dk=16, dv=16, seed=13)
    out = {}
    for sparse in (False, True):
        monkeypatch.setattr(treewy, "TUNING", Tuning(sparse=sparse))
        o, ctx = reconstruct.verify(**fresh(x))
        out[sparse] = (o, ctx.u)
    assert torch.equal(out[True][0], out[False][0]) and torch.equal(out[True][1], out[False][1])


@pytest.mark.parametrize("trees", [[chain(4), star(3)], [chain(12), full((2, 2))], [chain(20), [-1]]],
                         ids=["pack", "prep", "blocks"])
def test_reconstruct_bf16_state(trees):
    """A bfloat16 state enters the verify's state products as one exact bf16 operand (no split):
    outputs stay float32-exact against the recurrence from that state; the committed state is
    rounded to bf16 once."""
    x = random_inputs(trees, hk=1, hv=2, dk=32, dv=32, seed=21, dtype=torch.bfloat16)
    x["v"] = x["v"].float()
    x["state"] = x["state"].to(torch.bfloat16)
    o_ref, states = R.recurrence(**{**x, "state": x["state"].double()})
    o, ctx = reconstruct.verify(**fresh(x))
    assert rel_err(o, o_ref) < F32
    acc = torch.tensor([len(t) - 1 for t in trees], dtype=torch.int32)
    new = reconstruct.commit(dataclasses.replace(ctx, state=x["state"].clone()), acc)
    assert new.dtype == torch.bfloat16
    assert rel_err(new, states[torch.arange(len(trees)), acc.long()]) < 1e-2


def test_tuning_register_caps():
    t = Tuning.parse("verify_maxnreg=128,commit_maxnreg=96")
    assert (t.launch(t.verify_maxnreg), t.launch(t.commit_maxnreg), Tuning().launch(0)) == \
        ({"maxnreg": 128}, {"maxnreg": 96}, {})
    with pytest.raises(ValueError, match="verify_maxnreg"):
        Tuning(verify_maxnreg=300)


def test_tuning_rejects_bad_fields():
    with pytest.raises(ValueError, match="verify"):
        Tuning(verify="fast")
    with pytest.raises(ValueError, match="verify_bv"):
        Tuning.parse("verify_bv=24")
    with pytest.raises(ValueError, match="unknown tuning field 'bv'"):
        Tuning.parse("bv=16")
    assert Tuning.parse("commit=loop,verify_warps=2,pack=true") == Tuning(commit="loop", verify_warps=2, pack=True)
    with pytest.raises(ValueError, match="pack takes true or false"):
        Tuning.parse("pack=yes")


@pytest.mark.parametrize("tuning", [Tuning(), Tuning(rows_max=16)], ids=["default", "rows"])
def test_replay_outputs_after_cache(monkeypatch, tuning):
    """Cache + tree of 3 + 7 = 10 positions (outputs from position 3), through the fused verify (the default) and
    through the unrolled row verify: the second step's outputs, with the first step's path
    cached, equal the recurrence."""
    from policies.kernels import treewy
    monkeypatch.setattr(treewy, "TUNING", tuning)
    x1 = random_inputs([full((2, 2))], hk=1, hv=1, dk=16, dv=16, seed=31)
    rs = replay.ReplayState.start(x1["state"].clone(), flush_interval=2, max_path=3, hk=1, dtype=torch.float32)
    _, states = R.recurrence(**x1)
    rs = replay.commit(replay.verify(**{**x1, "state": rs})[1], torch.tensor([4], dtype=torch.int32))
    x2 = random_inputs([full((2, 2))], hk=1, hv=1, dk=16, dv=16, seed=32)
    o_ref, _ = R.recurrence(**{**x2, "state": states[:, 4]})
    assert rel_err(replay.verify(**{**x2, "state": rs})[0], o_ref) < F32
