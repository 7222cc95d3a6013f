"""reconstruct_deferred against the float64 recurrence carried across steps (CPU: TRITON_INTERPRET=1).

Each step's outputs must equal the literal recurrence from the state committed at the
previous step, although that state is only written by this step's verify; a flush must
give the committed state; a slot whose request ended (discard) or was flushed must not
see the old pending update. New tensors are NaN-poisoned.
"""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from policies.kernels import reconstruct_deferred as RD, reference as R
from policies.kernels.inputs import chain, full, preorder, random_inputs, random_tree, rel_err, star

pytestmark = pytest.mark.usefixtures("nan_poison")
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def run_steps(steps, hk=1, hv=2, d=16, state_dtype=torch.float32, k_dtype=torch.float32, seed=0):
    """steps: list of (trees, accepted) sharing one batch and T. Checks every step's outputs and
    the flushed state at the end against the recurrence carried in float64 (rounded to the
    state dtype at each commit, as the kernels store it)."""
    T = max(len(t) for trees, _ in steps for t in trees)
    B = len(steps[0][0])
    ds = truth = None
    for i, (trees, accepted) in enumerate(steps):
        x = random_inputs(trees, hk=hk, hv=hv, dk=d, dv=d, seed=seed + i, T=T)
        if ds is None:
            s0 = x["state"].to(state_dtype)
            ds = RD.DeferredState.start(s0.clone(), max_path=T, hk=hk, k_dtype=k_dtype)
            truth = s0.double()
        x = {**x, "k": x["k"].to(k_dtype)}
        o_ref, states = R.recurrence(**{**x, "state": truth})
        o, ctx = RD.verify(**{**x, "state": ds})
        assert not torch.isnan(o).any()
        assert rel_err(o, o_ref) < TOL[state_dtype], f"step {i} outputs: {rel_err(o, o_ref):.2e}"
        acc = torch.tensor(accepted, dtype=torch.int32)
        RD.commit(ctx, acc)
        truth = states[torch.arange(B), acc.long()].to(state_dtype).double()
    final = RD.flush(ds)
    assert rel_err(final, truth) < TOL[state_dtype], f"flushed state: {rel_err(final, truth):.2e}"
    return ds


def test_chain_steps_float32():
    run_steps([([chain(4)] * 2, [3, 1]), ([chain(4)] * 2, [0, 3]), ([chain(4)] * 2, [2, 2])])


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_trees_ragged_grouped(state_dtype):
    """(3,3,3), a preordered (2,2,2) and a lone root in one batch, 2 v-heads per q/k head,
    16-node blocks crossed (T = 40), both state dtypes."""
    trees = [full((3, 3, 3)), preorder(full((2, 2, 2))), [-1]]
    run_steps([(trees, [39, 14, 0]), ([chain(40), star(9), full((2, 2))], [39, 5, 6]), (trees, [12, 3, 0])],
              hk=1, hv=2, state_dtype=state_dtype)


def test_bf16_keys_kept_exactly():
    """The pending keys are stored in the model's k dtype (bf16): no extra rounding."""
    trees = [full((2, 2)), chain(5)]
    run_steps([(trees, [6, 4]), (trees, [2, 3])], k_dtype=torch.bfloat16)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 1000), sizes=st.lists(st.integers(1, 20), min_size=2, max_size=2))
def test_random_trees_and_accepts(seed, sizes):
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(3):
        trees = [random_tree(n, gen) for n in sizes]
        steps.append((trees, [int(torch.randint(0, n, (1,), generator=gen)) for n in sizes]))
    run_steps(steps, seed=seed)


def test_request_ends_between_steps():
    """Slot 1's request ends after step 1 (discard) and a new one is placed there with its own
    prefilled state; slot 0 is flushed early (its state read elsewhere, e.g. swapped out),
    slot 2 carries on. Step 2: every slot's outputs equal the recurrence from its right state."""
    trees = [full((2, 2)), chain(7), chain(3)]
    x1 = random_inputs(trees, hk=1, hv=2, dk=16, dv=16, seed=50)
    ds = RD.DeferredState.start(x1["state"].clone(), max_path=7, hk=1, k_dtype=torch.float32)
    _, st1 = R.recurrence(**x1)
    acc = torch.tensor([5, 6, 1], dtype=torch.int32)
    RD.commit(RD.verify(**{**x1, "state": ds})[1], acc)
    truth = st1[torch.arange(3), acc.long()]
    fresh = torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(51))
    RD.discard(ds, torch.tensor([False, True, False]))
    ds.state[1] = fresh
    assert rel_err(RD.flush(ds, torch.tensor([True, False, False]))[0], truth[0]) < 1e-5
    assert ds.pending.pn.tolist() == [0, 0, 2]
    expected = truth.clone()
    expected[1] = fresh
    x2 = random_inputs([chain(3), full((2, 2)), star(4)], hk=1, hv=2, dk=16, dv=16, seed=52, T=7)
    o_ref, st2 = R.recurrence(**{**x2, "state": expected})
    o, ctx = RD.verify(**{**x2, "state": ds})
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(ds.state, expected) < 1e-5  # this verify wrote slot 2's deferred commit
    RD.commit(ctx, torch.tensor([2, 4, 3], dtype=torch.int32))
    assert rel_err(RD.flush(ds), st2[torch.arange(3), torch.tensor([2, 4, 3])]) < 1e-5


@pytest.mark.parametrize("model", ["qwen3.5-35b-a3b", "qwen3.5-397b-a17b"])
@pytest.mark.parametrize("widths", [[1, 1, 1], [3, 3, 3]])
def test_pending_memory_matches_policy_accounting(model, widths):
    """The simulator's per-sequence bytes (policies.ReconstructDeferred) equal what the kernels
    allocate for one sequence in one GDN layer on one rank (bf16 keys, as served)."""
    from core.config import load_model, load_policy
    from policies import make_policy
    m = load_model(model)
    policy = make_policy(m, load_policy("reconstruct_deferred", {"draft_tree_widths": widths}))
    g, tp = m.gdn, m.tensor_parallel
    state = torch.zeros(1, g.num_v_heads // tp, g.head_v_dim, g.head_k_dim)
    ds = RD.DeferredState.start(state, max_path=len(widths) + 1, hk=g.num_k_heads // tp)
    assert policy.pending_bytes_per_layer_per_gpu() == ds.pending_bytes_per_seq()
    assert policy.cache_bytes_per_seq_per_gpu() == m.gdn_layers * ds.pending_bytes_per_seq()


@pytest.mark.parametrize("name", ["bf16x3", "default", "tf32x3", "pp-pending-loop", "rows4-bv16-w1", "loop-w8-r0"])
def test_tunings_exact(name):
    """The bench's exactness check of a tuning, here in the interpreter: bf16x3 (q, k in bf16, the
    state split in three bf16 parts: exact to float32, where dropping the low part costs ~1e-5)
    with k and q packed in one tile and the tree prep in the verify kernel (T <= 8), and the
    pending commit as rank-1 updates, for reconstruct and two deferred steps."""
    from policies.kernels.variants import VARIANTS, check_tuning
    errs = check_tuning(VARIANTS[name], hk=1, hv=2, d=16, device="cpu")
    assert max(errs.values()) < 2e-6, errs


@pytest.mark.parametrize("bad,pattern", [
    ("max_path", "max_path"), ("rows", "rows must be a bool"), ("hk", "k has 2 heads"),
])
def test_bad_input_names_argument(bad, pattern):
    x = random_inputs([chain(5)], hk=1, hv=2, dk=16, dv=16, seed=60)
    ds = RD.DeferredState.start(x["state"].clone(), max_path=2, hk=1, k_dtype=torch.float32)
    with pytest.raises(ValueError, match=pattern):
        if bad == "max_path":
            RD.commit(RD.verify(**{**x, "state": ds})[1], torch.tensor([4], dtype=torch.int32))
        elif bad == "rows":
            RD.flush(ds, torch.tensor([1]))
        else:
            x2 = random_inputs([chain(5)], hk=2, hv=2, dk=16, dv=16, seed=61)
            RD.verify(**{**x2, "state": ds})


def test_loop_tuning_is_checked_and_parsed():
    from policies.kernels.treewy import Tuning
    assert Tuning.parse("loop_bv=32,loop_warps=8,loop_maxnreg=0") == Tuning(loop_bv=32, loop_warps=8, loop_maxnreg=0)
    with pytest.raises(ValueError, match="loop_bv must be a power of two"):
        Tuning(loop_bv=48)
    with pytest.raises(ValueError, match="loop_maxnreg must be 0"):
        Tuning(loop_maxnreg=300)


@pytest.mark.parametrize("T, pending, expect", [
    (4, False, (64, 4, 96)),      # packed: verify_*
    (16, False, (32, 2, 168)),    # the block loop: loop_*
    (40, False, (32, 2, 168)),
    (16, True, (16, 4, 96)),      # a pending commit: pending_bv with verify_* launch
])
def test_each_verify_gets_its_own_launch_shape(T, pending, expect, monkeypatch):
    from policies.kernels import treewy as W
    seen = []

    class Launch:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append((kw["BV"], kw["num_warps"], kw.get("maxnreg")))
    monkeypatch.setattr(W, "_fused_kernel", Launch())
    monkeypatch.setattr(W, "TUNING", W.Tuning(verify_bv=64, verify_warps=4, verify_maxnreg=96, pending_bv=16,
                                              loop_bv=32, loop_warps=2, loop_maxnreg=168))
    B, H, D = 2, 2, 128
    q = torch.zeros(B, T, H, D, dtype=torch.bfloat16)
    v = torch.zeros(B, T, H, D)
    beta = torch.zeros(B, T, H)
    lengths = torch.full((B,), T, dtype=torch.int32)
    pend = W.Pending.empty(B, 4, H, D, H, D, torch.bfloat16, "cpu") if pending else None
    W.state_pass(q, q, v, beta, torch.zeros(B, H, D, D), torch.zeros(B, 16, 16, dtype=torch.int8),
                 torch.zeros(B, T, H), lengths, pending=pend)
    assert seen == [expect]
