"""The float64 references: docs/design.md#the-recurrence's worked example, closed form == literal recurrence."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from policies.kernels import reference as R
from policies.kernels.inputs import chain, full, preorder, random_inputs, rel_err, star

TREES = {
    "chain8": chain(8), "star9": star(9), "deep40": chain(40), "full222": full((2, 2, 2)),
    "full333": full((3, 3, 3)), "full222-dfs": preorder(full((2, 2, 2))), "T1": [-1], "chain65": chain(65),
}


def literal_and_closed(x, dtype=torch.float64):
    o_lit, states = R.recurrence(**x, dtype=dtype)
    o_cf, u = R.tree_solve(**x, dtype=dtype)
    return o_lit, states, o_cf, u


def check_every_node(x, tol):
    o_lit, states, o_cf, u = literal_and_closed(x)
    assert rel_err(o_cf, o_lit) < tol
    B, T = x["parent"].shape
    n = [T] * B if x["lengths"] is None else x["lengths"].tolist()
    for a in range(T):
        acc = torch.tensor([min(a, m - 1) for m in n])
        s = R.tree_state(x["k"], x["g"], x["parent"], x["state"], u, acc, x["lengths"])
        err = rel_err(s, states[torch.arange(B), acc])
        assert err < tol, f"node {a}: {err:.2e}"


def test_worked_example_exactly():
    one = torch.ones(1, 3, 1, 1, dtype=torch.float64)
    x = dict(q=one, k=one, v=torch.tensor([2.0, 3.0, 1.0], dtype=torch.float64).view(1, 3, 1, 1),
             g=torch.full((1, 3, 1), math.log(0.9), dtype=torch.float64),
             beta=torch.full((1, 3, 1), 0.5, dtype=torch.float64),
             parent=torch.tensor([chain(3)], dtype=torch.int32), state=torch.zeros(1, 1, 1, 1, dtype=torch.float64),
             lengths=None)
    o, states = R.recurrence(**x)
    assert states.flatten().tolist() == pytest.approx([1.0, 1.95, 1.3775], abs=1e-14)
    assert o.flatten().tolist() == pytest.approx([1.0, 1.95, 1.3775], abs=1e-14)
    o_cf, u = R.tree_solve(**x)
    assert u.flatten().tolist() == pytest.approx([1.0, 1.05, -0.3775], abs=1e-14)
    s3 = R.tree_state(x["k"], x["g"], x["parent"], x["state"], u, torch.tensor([2]))
    assert s3.item() == pytest.approx(1.3775, abs=1e-14)
    # The regrouped sum of the example: 0.81 * 1 + 0.9 * 1.05 - 0.3775.
    assert 0.81 * 1 + 0.9 * 1.05 - 0.3775 == pytest.approx(s3.item(), abs=1e-14)


@pytest.mark.parametrize("tree", TREES)
def test_closed_form_matches_recurrence(tree):
    x = random_inputs([TREES[tree]] * 2, hk=2, hv=4, dk=16, dv=8, seed=1, dtype=torch.float64)
    check_every_node(x, 1e-12)


@pytest.mark.parametrize("dk,dv,hk,hv", [(128, 128, 1, 2), (5, 7, 1, 3)], ids=["d128-grouped", "d5x7-odd"])
def test_closed_form_sizes(dk, dv, hk, hv):
    x = random_inputs([full((2, 2, 2)), chain(7)], hk=hk, hv=hv, dk=dk, dv=dv, seed=2, dtype=torch.float64)
    check_every_node(x, 1e-12)


def test_closed_form_ragged():
    x = random_inputs([full((3, 3, 3)), star(5), [-1], chain(12)], hk=1, hv=2, dk=8, dv=8, seed=3, dtype=torch.float64)
    check_every_node(x, 1e-12)


@settings(max_examples=25, deadline=None)
@given(parents=st.lists(st.integers(0, 10 ** 6), min_size=0, max_size=30), seed=st.integers(0, 1000))
def test_closed_form_random_trees(parents, seed):
    tree = [-1] + [r % (t + 1) for t, r in enumerate(parents)]
    x = random_inputs([tree], hk=1, hv=2, dk=6, dv=5, seed=seed, dtype=torch.float64)
    check_every_node(x, 1e-12)


def test_closed_form_float32_accuracy():
    """The float32 closed form stays near float32 rounding (docs/design.md#the-recurrence: about 1e-7)."""
    x = random_inputs([full((3, 3, 3))], hk=1, hv=2, dk=64, dv=64, seed=4, dtype=torch.float64)
    o_lit, _, o32, _ = literal_and_closed(x, dtype=torch.float32)
    assert rel_err(o32, o_lit) < 1e-5


@pytest.mark.parametrize("change,arg", [
    (lambda x: x.update(q=x["q"][0]), "q"),
    (lambda x: x.update(v=x["v"][:, :, :3]), "Hv"),
    (lambda x: x.update(g=x["g"][:, :2]), "g"),
    (lambda x: x.update(state=x["state"][..., :3]), "state"),
    (lambda x: x["parent"].__setitem__((0, 0), 0), "parent"),
    (lambda x: x["parent"].__setitem__((0, 3), 3), "parent"),
    (lambda x: x["parent"].__setitem__((0, 2), 5), "parent"),
    (lambda x: x.update(lengths=torch.tensor([9])), "lengths"),
], ids=["q-rank", "hv-multiple", "g-shape", "state-shape", "root-not-minus-1", "self-parent", "child-first", "lengths"])
def test_bad_input_names_argument(change, arg):
    x = random_inputs([full((2, 2))], hk=2, hv=4, dk=4, dv=4, seed=5, dtype=torch.float64)
    change(x)
    with pytest.raises(ValueError, match=arg):
        R.recurrence(**x)
