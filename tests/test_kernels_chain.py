"""The recurrent-form chain verify (`_chain_kernel`) against the float64 recurrence (CPU: TRITON_INTERPRET=1).

Chains of several lengths, ragged in one batch, with correlated keys (each key near the one
before, so every delta-rule correction is large), grouped heads, several launch shapes; for
reconstruct (outputs, then the state the unchanged commit rebuilds at every accepted node) and
reconstruct_deferred over steps (its pending path applied by the chain kernel, and by the tree
kernel after a chain step, and the other way round), and replay over a flush cycle (the cache
and the chain walked as one, the unused cache slots skipped). New tensors are NaN-poisoned.
"""
import dataclasses

import pytest
import torch

from policies.kernels import reconstruct, reconstruct_deferred as RD, reference as R, replay, treewy
from policies.kernels.inputs import chain, full, random_inputs, rel_err

pytestmark = pytest.mark.usefixtures("nan_poison")
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


class Spy:
    """Counts launches of a Triton kernel and runs it."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


class ChainSpies:
    """Launches of both chain kernels: the walk and its prefetching form for short chains."""

    def __init__(self, monkeypatch):
        self.walk, self.prefetch = Spy(treewy._chain_kernel), Spy(treewy._chain_prefetch_kernel)
        monkeypatch.setattr(treewy, "_chain_kernel", self.walk)
        monkeypatch.setattr(treewy, "_chain_prefetch_kernel", self.prefetch)

    @property
    def launches(self) -> int:
        return self.walk.launches + self.prefetch.launches


@pytest.fixture(params=[False, True], ids=["walk", "prefetch"])
def chain_spy(request, monkeypatch):
    """Counts chain-kernel launches; the chain verify on, for chains of any length (chain_max: all
    positions), with and without the prefetching kernel for the short ones."""
    monkeypatch.setattr(treewy, "TUNING", dataclasses.replace(treewy.TUNING, chain=True, chain_max=treewy.MAX_POSITIONS,
                                                               chain_pending_max=treewy.MAX_POSITIONS,
                                                               chain_prefetch=request.param))
    return ChainSpies(monkeypatch)


def correlated(x: dict, seed: int, spread: float = 0.3) -> dict:
    """Keys of each sequence and head random-walk from the first one (unit norm)."""
    gen = torch.Generator().manual_seed(seed)
    k = x["k"].clone()
    for t in range(1, k.shape[1]):
        k[:, t] = k[:, t - 1] + spread * torch.randn(k[:, t].shape, generator=gen)
    return {**x, "k": torch.nn.functional.normalize(k, dim=-1)}


@pytest.mark.parametrize("lengths", [(1,), (4, 4), (7, 3, 1), (16, 9), (33, 17, 2)], ids=lambda n: f"T{n[0]}")
@pytest.mark.parametrize("heads,d,shape", [((1, 2), 16, (32, 4)), ((2, 2), 32, (8, 1)), ((1, 4), 16, (4, 2))],
                         ids=["hv2-d16", "hk2-d32-bv8w1", "hv4-bv4w2"])
def test_reconstruct_chains(monkeypatch, chain_spy, lengths, heads, d, shape):
    monkeypatch.setattr(treewy, "TUNING", dataclasses.replace(treewy.TUNING, chain_bv=shape[0], chain_warps=shape[1]))
    x = correlated(random_inputs([chain(n) for n in lengths], hk=heads[0], hv=heads[1], dk=d, dv=d,
                                 seed=sum(lengths)), seed=d)
    o_ref, states = R.recurrence(**x)
    o, ctx = reconstruct.verify(**{**x, "state": x["state"].clone()})
    assert chain_spy.launches == 1
    assert rel_err(o, o_ref) < TOL[torch.float32]
    B = len(lengths)
    for a in sorted({0, 1, max(lengths) // 2, max(lengths) - 1}):
        acc = torch.tensor([min(a, n - 1) for n in lengths], dtype=torch.int32)
        new = reconstruct.commit(dataclasses.replace(ctx, state=x["state"].clone()), acc)
        assert rel_err(new, states[torch.arange(B), acc.long()]) < TOL[torch.float32], a


def test_chain_flag(chain_spy):
    """chain=None finds chains from the parents; chain=False keeps the tree kernels; chain=True on a tree is refused."""
    x = random_inputs([chain(5), chain(2)], hk=1, hv=2, dk=16, dv=16, seed=1)
    o_ref, _ = R.recurrence(**x)
    o, _ = reconstruct.verify(**{**x, "state": x["state"].clone()}, chain=False)
    assert chain_spy.launches == 0 and rel_err(o, o_ref) < TOL[torch.float32]
    reconstruct.verify(**{**x, "state": x["state"].clone()}, check=False, chain=True)
    assert chain_spy.launches == 1
    t = random_inputs([full((2, 2)), chain(7)], hk=1, hv=2, dk=16, dv=16, seed=2)
    with pytest.raises(ValueError, match="chain=True"):
        reconstruct.verify(**t, chain=True)
    reconstruct.verify(**{**t, "state": t["state"].clone()})
    assert chain_spy.launches == 1  # a tree in the batch: the tree kernels


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_deferred_chain_and_tree_steps(chain_spy, state_dtype):
    """Steps alternate chains (chain kernel) and a tree (fused kernel) in one DeferredState: each
    verify applies the pending path the other kind of step recorded."""
    T, hk, hv, d = 9, 1, 2, 16
    steps = [([chain(9), chain(5), chain(9)], [8, 2, 0]), ([chain(9), chain(9), chain(1)], [4, 8, 0]),
             ([full((2, 2)), chain(9), chain(3)], [5, 8, 2]), ([chain(9)] * 3, [8, 0, 6]),
             ([chain(9)] * 3, [3, 3, 3])]
    ds = truth = None
    for i, (trees, accepted) in enumerate(steps):
        x = correlated(random_inputs(trees, hk=hk, hv=hv, dk=d, dv=d, seed=10 + i, T=T), seed=i)
        if ds is None:
            ds = RD.DeferredState.start(x["state"].to(state_dtype), max_path=T, hk=hk, k_dtype=torch.float32)
            truth = x["state"].to(state_dtype).double()
        o_ref, states = R.recurrence(**{**x, "state": truth})
        o, ctx = RD.verify(**{**x, "state": ds})
        assert not torch.isnan(o).any()
        assert rel_err(o, o_ref) < TOL[state_dtype], f"step {i}: {rel_err(o, o_ref):.2e}"
        acc = torch.tensor(accepted, dtype=torch.int32)
        RD.commit(ctx, acc)
        truth = states[torch.arange(3), acc.long()].to(state_dtype).double()
    assert chain_spy.launches == 4
    assert rel_err(RD.flush(ds), truth) < TOL[state_dtype]


@pytest.mark.parametrize("flush_interval", [1, 3])
def test_replay_chains_over_flush_cycles(chain_spy, flush_interval):
    """Ragged chains: outputs each step and the materialised state after each commit equal the
    recurrence carried across steps, while the cache fills unevenly (paths of 1 to 5 nodes)."""
    trees = [chain(5), chain(3), chain(5)]
    truth = rs = None
    for step in range(5):
        x = correlated(random_inputs(trees, hk=1, hv=2, dk=16, dv=16, seed=40 + step, T=5), seed=step)
        if rs is None:
            truth = x["state"].double()
            rs = replay.ReplayState.start(x["state"].clone(), flush_interval=flush_interval, max_path=5, hk=1,
                                          dtype=torch.float32)
        o_ref, states = R.recurrence(**{**x, "state": truth})
        o, ctx = replay.verify(**{**x, "state": rs})
        assert rel_err(o, o_ref) < TOL[torch.float32], f"step {step} outputs"
        acc = torch.tensor([(step + 4) % 5, step % 3, 0], dtype=torch.int32)
        rs = replay.commit(ctx, acc)
        truth = states[torch.arange(3), acc.long()]
        assert rel_err(replay.materialize(rs), truth) < TOL[torch.float32], f"step {step} state"
    assert chain_spy.launches >= 5


def test_long_chains_keep_the_fused_kernel(chain_spy, monkeypatch):
    monkeypatch.setattr(treewy, "TUNING", dataclasses.replace(treewy.TUNING, chain=True, chain_max=8))
    x = random_inputs([chain(9), chain(4)], hk=1, hv=2, dk=16, dv=16, seed=5)
    o_ref, _ = R.recurrence(**x)
    o, _ = reconstruct.verify(**{**x, "state": x["state"].clone()})
    assert chain_spy.launches == 0 and rel_err(o, o_ref) < TOL[torch.float32]
    reconstruct.verify(**{**x, "parent": x["parent"][:, :8].contiguous(), "q": x["q"][:, :8], "k": x["k"][:, :8],
                          "v": x["v"][:, :8], "g": x["g"][:, :8], "beta": x["beta"][:, :8],
                          "lengths": torch.tensor([8, 4], dtype=torch.int32), "state": x["state"].clone()})
    assert chain_spy.launches == 1


def test_default_tuning_walks_only_short_chains_with_a_pending_commit(chain_spy, monkeypatch):
    """The H200's choice: reconstruct's verify keeps the fused kernel on chains; reconstruct_deferred's
    (which first applies the pending commit) walks chains of up to 4 positions, longer ones fused."""
    monkeypatch.setattr(treewy, "TUNING", treewy.Tuning())
    x = random_inputs([chain(4), chain(4)], hk=1, hv=2, dk=16, dv=16, seed=6)
    o_ref, states = R.recurrence(**x)
    o, _ = reconstruct.verify(**{**x, "state": x["state"].clone()})
    assert chain_spy.launches == 0 and rel_err(o, o_ref) < TOL[torch.float32]
    ds = RD.DeferredState.start(x["state"].clone(), max_path=8, hk=1, k_dtype=x["k"].dtype)
    o, ctx = RD.verify(**{**x, "state": ds})
    assert chain_spy.launches == 1 and rel_err(o, o_ref) < TOL[torch.float32]
    RD.commit(ctx, torch.tensor([3, 1], dtype=torch.int32))
    y = random_inputs([chain(5), chain(2)], hk=1, hv=2, dk=16, dv=16, seed=8)
    truth = states[torch.arange(2), torch.tensor([3, 1])]
    o_ref, _ = R.recurrence(**{**y, "state": truth})
    o, _ = RD.verify(**{**y, "state": ds})  # 5 positions: the fused kernel, the pending path applied there
    assert chain_spy.launches == 1 and rel_err(o, o_ref) < TOL[torch.float32]


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_prefetch_kernel_runs_short_chains_only_and_equals_the_walk(monkeypatch, state_dtype):
    """The prefetching kernel takes chains (and pending paths) of at most PREFETCH_MAX, with no cache
    slots; its outputs, u, mask, path decays and written state equal the walk's exactly (the same
    float32 operations in the same order), ragged lengths and a partial pending path included."""
    x = correlated(random_inputs([chain(4), chain(3), chain(1)], hk=1, hv=2, dk=16, dv=16, seed=21, T=4), seed=2)
    gen = torch.Generator().manual_seed(5)
    pending = treewy.Pending.empty(3, 4, 2, 16, 1, 16, torch.float32, torch.device("cpu"))
    pending.pn.copy_(torch.tensor([4, 2, 0], dtype=torch.int32))
    pending.pu.copy_(0.1 * torch.randn(pending.pu.shape, generator=gen))
    pending.pk.copy_(torch.nn.functional.normalize(torch.randn(pending.pk.shape, generator=gen), dim=-1))
    pending.pg.copy_(-0.2 * torch.rand(pending.pg.shape, generator=gen))
    lengths = torch.tensor([4, 3, 1], dtype=torch.int32)
    outs = {}
    for prefetch in (False, True):
        spies = ChainSpies(monkeypatch)
        monkeypatch.setattr(treewy, "TUNING", dataclasses.replace(treewy.TUNING, chain_prefetch=prefetch))
        state = x["state"].to(state_dtype).clone()
        pd = dataclasses.replace(pending, **{f: getattr(pending, f).clone() for f in ("pu", "pk", "pg", "pn")})
        o, u, mask, gc = treewy.chain_pass(x["q"], x["k"], x["v"], x["g"], x["beta"], state, lengths, pending=pd)
        assert (spies.prefetch.launches, spies.walk.launches) == ((1, 0) if prefetch else (0, 1))
        outs[prefetch] = (o, u, mask[:, :4, :4], gc, state)
    for a, b in zip(outs[False], outs[True]):
        assert torch.equal(a, b)
    # past PREFETCH_MAX positions, or a replay's cache slots: the walk
    spies = ChainSpies(monkeypatch)
    y = random_inputs([chain(treewy.PREFETCH_MAX + 1)], hk=1, hv=2, dk=16, dv=16, seed=22)
    treewy.chain_pass(y["q"], y["k"], y["v"], y["g"], y["beta"], y["state"].clone(),
                      torch.tensor([treewy.PREFETCH_MAX + 1], dtype=torch.int32))
    treewy.chain_pass(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"].clone(), lengths, out_start=1,
                      cached=torch.tensor([1, 0, 1], dtype=torch.int32))
    assert (spies.prefetch.launches, spies.walk.launches) == (0, 2)
