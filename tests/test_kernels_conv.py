"""Tree-aware short convolution: the Triton kernel and each policy's conv-state handling
against the literal walk up the ancestor path (float64), outputs and every accepted state."""
import dataclasses

import pytest
import torch

from policies.kernels import conv, reference as R
from policies.kernels.inputs import chain, full, preorder, rel_err, star

pytestmark = pytest.mark.usefixtures("nan_poison")
C, K = 160, 4  # channels: not a multiple of the 128-channel block


def inputs(trees, seed, T=None):
    gen = torch.Generator().manual_seed(seed)
    B, T = len(trees), T or max(len(t) for t in trees)
    parent = torch.full((B, T), -1, dtype=torch.int32)
    for b, t in enumerate(trees):
        parent[b, :len(t)] = torch.tensor(t, dtype=torch.int32)
    ragged = any(len(t) != T for t in trees)
    return dict(x=torch.randn(B, T, C, generator=gen), weight=torch.randn(C, K, generator=gen),
                parent=parent, conv_state=torch.randn(B, C, K - 1, generator=gen),
                lengths=torch.tensor([len(t) for t in trees], dtype=torch.int32) if ragged else None,
                bias=torch.randn(C, generator=gen))


TREES = {"chain2": [chain(2)], "full222": [full((2, 2, 2))], "ragged": [full((3, 3)), star(5), [-1], preorder(full((2, 2)))]}


@pytest.mark.parametrize("policy", ["store_all", "reconstruct"])
@pytest.mark.parametrize("trees", TREES)
def test_conv_policies(policy, trees):
    x = inputs(TREES[trees], seed=1)
    y_ref, states = R.tree_conv(**x)
    verify, commit = {"store_all": (conv.store_all_verify, conv.store_all_commit),
                      "reconstruct": (conv.reconstruct_verify, conv.reconstruct_commit)}[policy]
    B, T = x["parent"].shape
    n = [T] * B if x["lengths"] is None else x["lengths"].tolist()
    y, ctx = verify(**{**x, "conv_state": x["conv_state"].clone()})
    assert rel_err(y, y_ref) < 1e-6
    for a in range(T):
        acc = torch.tensor([min(a, m - 1) for m in n], dtype=torch.int32)
        new = commit(dataclasses.replace(ctx, conv_state=x["conv_state"].clone()), acc)
        assert rel_err(new, states[torch.arange(B), acc.long()]) < 1e-6, a


@pytest.mark.parametrize("flush_interval", [1, 3])
def test_conv_replay_steps(flush_interval):
    """Four steps: each step's outputs and, after each commit, the window the next step sees."""
    trees = [full((2, 2)), chain(4)]
    x0 = inputs(trees, seed=2, T=7)
    truth = x0["conv_state"].double()
    rs = conv.ReplayConvState.start(x0["conv_state"].clone(), flush_interval, max_path=4, dtype=torch.float32)
    for step in range(4):
        x = inputs(trees, seed=10 + step, T=7)
        x["weight"], x["bias"] = x0["weight"], x0["bias"]
        y_ref, states = R.tree_conv(**{**x, "conv_state": truth})
        y, ctx = conv.replay_verify(**{**x, "conv_state": rs})
        assert rel_err(y, y_ref) < 1e-6, step
        acc = torch.tensor([(step * 3 + 1) % 7, step % 4], dtype=torch.int32)
        rs = conv.replay_commit(ctx, acc)
        truth = states[torch.arange(2), acc.long()]
        assert rs.steps == (step + 1) % flush_interval
    # The committed window, however it is held, is what the next verify sees: check it directly.
    probe = inputs([[-1], [-1]], seed=99)
    probe["weight"], probe["bias"] = x0["weight"], x0["bias"]
    y_ref, _ = R.tree_conv(**{**probe, "conv_state": truth})
    assert rel_err(conv.replay_verify(**{**probe, "conv_state": rs})[0], y_ref) < 1e-6


@pytest.mark.parametrize("bad,arg", [("weight", "weight"), ("conv_state", "conv_state"), ("parent", "parent")])
def test_conv_bad_input(bad, arg):
    x = inputs([chain(3)], seed=3)
    x[bad] = x[bad][..., :1] if bad != "parent" else x[bad][:, :2]
    with pytest.raises(ValueError, match=arg):
        conv.reconstruct_verify(**x)


@pytest.mark.parametrize("policy", ["store_all", "reconstruct", "replay"])
def test_conv_fused_outputs(policy):
    """The executor's one launch: x read in place from wider projection rows, the leading q/k
    heads L2-normalised, q, k and v written as three contiguous tensors; the commit still
    follows the accepted path."""
    trees = [full((2, 2)), chain(3), [-1]]
    x = inputs(trees, seed=5, T=7)
    B, T, _ = x["x"].shape
    wide = torch.randn(B * T, C + 24, generator=torch.Generator().manual_seed(6))
    wide[:, :C] = x["x"].reshape(B * T, C)
    x["x"] = wide[:, :C].reshape(B, T, C)  # a view: rows C + 24 apart
    assert not x["x"].is_contiguous()
    out = dict(norm_channels=64, norm_dim=32, split=(32, 64))
    if policy == "replay":
        rs = conv.ReplayConvState.start(x["conv_state"].clone(), 3, max_path=4, dtype=torch.float32)
        prev = {**inputs([chain(2), chain(3), chain(1)], seed=8), "conv_state": x["conv_state"]}
        rs = conv.replay_commit(conv.replay_verify(**{**prev, "conv_state": rs})[1],
                                torch.tensor([1, 2, 0], dtype=torch.int32))
        _, prev_states = R.tree_conv(**prev)
        truth = prev_states[torch.arange(B), torch.tensor([1, 2, 0])]
        y, ctx = conv.replay_verify(**{**x, "conv_state": rs}, **out)
    else:
        truth = x["conv_state"].double()
        verify = {"store_all": conv.store_all_verify, "reconstruct": conv.reconstruct_verify}[policy]
        y, ctx = verify(**{**x, "conv_state": x["conv_state"].clone()}, **out)
    y_ref, states = R.tree_conv(**{**x, "conv_state": truth}, norm_channels=64, norm_dim=32)
    assert [tuple(p.shape) for p in y] == [(B, T, 32), (B, T, 32), (B, T, C - 64)]
    assert all(p.is_contiguous() for p in y)
    assert rel_err(torch.cat(y, -1), y_ref) < 1e-6
    norms = torch.cat(y, -1)[0, :4, :64].unflatten(-1, (2, 32)).norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)
    acc = torch.tensor([3, 2, 0], dtype=torch.int32)
    if policy == "replay":
        ctx.rs.steps = ctx.rs.flush_interval - 1  # this commit flushes: the window is written out
        new = conv.replay_commit(ctx, acc).conv_state
    else:
        new = {"store_all": conv.store_all_commit, "reconstruct": conv.reconstruct_commit}[policy](ctx, acc)
    assert rel_err(new, states[torch.arange(B), acc.long()]) < 1e-6


@pytest.mark.parametrize("bad", [dict(norm_channels=48, norm_dim=32), dict(norm_channels=64, norm_dim=24),
                                 dict(split=(0, 10)), dict(split=(100, 50))])
def test_conv_bad_output_options(bad):
    x = inputs([chain(3)], seed=3)
    with pytest.raises(ValueError, match="norm_dim|split"):
        conv.reconstruct_verify(**x, **bad)


def test_conv_replay_appends_from_projection_rows():
    """Replay's append reads the accepted path's inputs in place from strided rows: the next
    verify sees the window of the accepted node."""
    trees = [full((2, 2)), chain(3)]
    x = inputs(trees, seed=11, T=7)
    B, T, _ = x["x"].shape
    wide = torch.randn(B * T, C + 8, generator=torch.Generator().manual_seed(12))
    wide[:, :C] = x["x"].reshape(B * T, C)
    x["x"] = wide[:, :C].reshape(B, T, C)
    rs = conv.ReplayConvState.start(x["conv_state"].clone(), 3, max_path=4, dtype=torch.float32)
    _, ctx = conv.replay_verify(**{**x, "conv_state": rs})
    acc = torch.tensor([6, 2], dtype=torch.int32)
    rs = conv.replay_commit(ctx, acc)
    assert rs.steps == 1 and rs.count.tolist() == [3, 3]  # appended, not flushed
    _, states = R.tree_conv(**x)
    probe = {**inputs([[-1], [-1]], seed=13), "weight": x["weight"], "bias": x["bias"]}
    y_ref, _ = R.tree_conv(**{**probe, "conv_state": states[torch.arange(B), acc.long()]})
    assert rel_err(conv.replay_verify(**{**probe, "conv_state": rs})[0], y_ref) < 1e-6
