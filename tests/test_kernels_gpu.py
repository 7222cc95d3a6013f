"""On the GPU: the kernels at the models' real shapes, and the tree path inside a CUDA graph."""
import dataclasses

import pytest
import torch

from policies.kernels import conv, reconstruct, reconstruct_deferred as RD, reference as R, replay, store_all
from policies.kernels.inputs import chain, full, preorder, random_inputs, random_tree, rel_err, star
from policies.kernels.treewy import Tuning

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def on_gpu(x):
    return {n: t.cuda() if isinstance(t, torch.Tensor) else t for n, t in x.items()}


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["f32", "bf16"])
@pytest.mark.parametrize("policy", ["store_all", "reconstruct"])
def test_real_shapes(policy, dtype, tol):
    """35B-A3B heads (Hk 16, Hv 32, d 128), a ragged batch of a (3,3,3) tree, a chain of 64, a (4,4,4) tree."""
    mod = {"store_all": store_all, "reconstruct": reconstruct}[policy]
    x = on_gpu(random_inputs([full((3, 3, 3)), chain(64), full((4, 4, 4))], hk=16, hv=32, dk=128, dv=128, seed=1,
                             dtype=dtype))
    o_ref, states = R.recurrence(**x)
    o, ctx = mod.verify(**{**x, "state": x["state"].clone()})
    assert rel_err(o, o_ref) < tol
    for a in (0, 13, 39, 63, 84):
        acc = torch.tensor([min(a, 39), min(a, 63), a], dtype=torch.int32, device="cuda")
        new = mod.commit(dataclasses.replace(ctx, state=x["state"].clone()), acc)
        assert rel_err(new, states[torch.arange(3), acc.long()]) < tol, a


@pytest.mark.parametrize("trees", [[chain(4), chain(4), [-1], chain(2)],
                                   [full((2, 2, 2)), preorder(full((2, 2, 2))), chain(9)],
                                   [full((3, 3, 3)), chain(40), star(7)]], ids=["T4", "T15", "T40"])
@pytest.mark.parametrize("tuning", [Tuning(rows_max=64), Tuning(verify="blocked", commit="loop"), Tuning(),
                                    Tuning(prec="tf32x3", pack=False, prep=False, verify_bv=64, commit_bv=16)],
                         ids=["rows", "blocked-loop", "default", "tf32x3-bv64"])
def test_reconstruct_paths_real_shapes(monkeypatch, trees, tuning):
    """35B-A3B heads, ragged: every verify kernel (the row verify forced for every T, unrolled up to
    16) and commit against float64. (The bench's variants mode checks each tuning it times.)"""
    from policies.kernels import treewy
    monkeypatch.setattr(treewy, "TUNING", tuning)
    x = on_gpu(random_inputs(trees, hk=16, hv=32, dk=128, dv=128, seed=6))
    o_ref, states = R.recurrence(**x)
    o, ctx = reconstruct.verify(**{**x, "state": x["state"].clone()})
    assert rel_err(o, o_ref) < 1e-5
    n = [len(t) for t in trees]
    for a in (0, 1, 3, 14, 39):
        acc = torch.tensor([min(a, m - 1) for m in n], dtype=torch.int32, device="cuda")
        new = reconstruct.commit(dataclasses.replace(ctx, state=x["state"].clone()), acc)
        assert rel_err(new, states[torch.arange(len(trees)), acc.long()]) < 1e-5, a


@pytest.mark.parametrize("tuning", [Tuning(), Tuning(prec="tf32x3")], ids=["default", "tf32x3"])
@pytest.mark.parametrize("trees", [[chain(16), full((3, 3, 3))], [[-1] + [max(0, t - 1 - (t % 3 == 0)) for t in range(1, 40)]]],
                         ids=["chain16-333", "deep40"])
def test_float32_operands_keep_float32_accuracy(monkeypatch, trees, tuning):
    """Correlated keys, slow decays and a cold start at the 35B's heads: the error is measured on
    the tree's own update and every power of the solve's coupling matrix counts. The products
    are float32-accurate (bf16x3 or tf32x3); plain tf32 (10 mantissa bits) lands near 1e-4, which
    only a GPU shows: the interpreter ignores tl.dot's input precision."""
    from policies.kernels import treewy
    monkeypatch.setattr(treewy, "TUNING", tuning)
    x = on_gpu(random_inputs(trees, hk=16, hv=32, dk=128, dv=128, seed=8, correlated_keys=True, state_scale=0.0,
                             log_decay=0.01))
    o_ref, states = R.recurrence(**x)
    o, ctx = reconstruct.verify(**{**x, "state": x["state"].clone()})
    assert rel_err(o, o_ref) < 1e-5
    n = [len(t) for t in trees]
    for a in (0, 7, 15, 39):
        acc = torch.tensor([min(a, m - 1) for m in n], dtype=torch.int32, device="cuda")
        new = reconstruct.commit(dataclasses.replace(ctx, state=x["state"].clone()), acc)
        assert rel_err(new, states[torch.arange(len(trees)), acc.long()]) < 1e-5, a


def test_replay_real_shapes():
    x = on_gpu(random_inputs([full((3, 3, 3))] * 2, hk=2, hv=8, dk=128, dv=128, seed=2))
    rs = replay.ReplayState.start(x["state"].clone(), flush_interval=2, max_path=4, hk=2, dtype=torch.float32)
    o_ref, states = R.recurrence(**x)
    o, ctx = replay.verify(**{**x, "state": rs})
    assert rel_err(o, o_ref) < 1e-5
    acc = torch.tensor([39, 5], dtype=torch.int32, device="cuda")
    rs = replay.commit(ctx, acc)
    truth = states[torch.arange(2), acc.long()]
    assert rel_err(replay.materialize(rs), truth) < 1e-5
    x2 = on_gpu(random_inputs([full((3, 3, 3))] * 2, hk=2, hv=8, dk=128, dv=128, seed=3))
    o_ref2, _ = R.recurrence(**{**x2, "state": truth})
    assert rel_err(replay.verify(**{**x2, "state": rs})[0], o_ref2) < 1e-5


def graph_batches(static: dict, acc: torch.Tensor, gen_seed: int, seed: int, T: int):
    """Three batches of trees of other shapes and sizes (chains, full trees, a star, random and
    preorder trees, a lone root), each written into a captured graph's static inputs and accepted
    nodes (the deepest node); yields (i, inputs, lengths, accepted) for the replay and its check."""
    gen = torch.Generator().manual_seed(gen_seed)
    trees = [[chain(40), full((3, 3, 3)), star(17)], [random_tree(40, gen), preorder(full((3, 3, 3))), [-1]],
             [full((2, 2, 2)), random_tree(33, gen), chain(12)]]
    for i, tr in enumerate(trees):
        x = on_gpu(random_inputs(tr, hk=2, hv=4, dk=128, dv=128, seed=seed + i, T=T))
        lengths = torch.tensor([len(t) for t in tr], dtype=torch.int32, device="cuda")
        for name in ("q", "k", "v", "g", "beta", "parent"):
            static[name].copy_(x[name])
        static["lengths"].copy_(lengths)
        accepted = torch.tensor([len(t) - 1 for t in tr], dtype=torch.int32, device="cuda")
        acc.copy_(accepted)
        yield i, x, lengths, accepted


def test_reconstruct_tree_in_cuda_graph():
    """Capture verify + commit once for T = 40; replay it for different trees and sizes
    written into the same device tensors: each replay matches the reference."""
    T, B = 40, 3
    static = on_gpu(random_inputs([full((3, 3, 3))] * B, hk=2, hv=4, dk=128, dv=128, seed=4))
    static["lengths"] = torch.full((B,), T, dtype=torch.int32, device="cuda")
    acc = torch.zeros(B, dtype=torch.int32, device="cuda")
    s0 = static["state"].clone()

    def step():
        static["state"].copy_(s0)
        o, ctx = reconstruct.verify(**static)
        return o, reconstruct.commit(ctx, acc)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_out, s_out = step()
    for i, x, lengths, accepted in graph_batches(static, acc, gen_seed=5, seed=10, T=T):
        s0.copy_(x["state"])
        graph.replay()
        torch.cuda.synchronize()
        ref = {**x, "lengths": lengths}
        o_ref, states = R.recurrence(**ref)
        assert rel_err(o_out, o_ref) < 1e-5, i
        assert rel_err(s_out, states[torch.arange(B), accepted.long()]) < 1e-5, i


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["f32", "bf16"])
def test_deferred_real_shapes(dtype, tol):
    """35B-A3B heads, three steps on a ragged batch ((3,3,3), chain 64, (4,4,4)), state in
    `dtype`: each step's outputs and the final flush against the float64 recurrence carried
    across steps (rounded to `dtype` at each commit, as stored)."""
    trees = [full((3, 3, 3)), chain(64), full((4, 4, 4))]
    ds = truth = None
    for step, acc in enumerate(([39, 63, 84], [5, 0, 20], [13, 40, 84])):
        x = on_gpu(random_inputs(trees, hk=16, hv=32, dk=128, dv=128, seed=20 + step, dtype=torch.bfloat16))
        if ds is None:
            ds = RD.DeferredState.start(x["state"].to(dtype), max_path=65, hk=16)
            truth = x["state"].to(dtype).double()
        o_ref, states = R.recurrence(**{**x, "state": truth})
        o, ctx = RD.verify(**{**x, "state": ds})
        # o is stored in the inputs' dtype (bf16): its rounding bounds the error whatever the state's dtype.
        assert rel_err(o, o_ref) < max(tol, 4e-3), step
        accepted = torch.tensor(acc, dtype=torch.int32, device="cuda")
        RD.commit(ctx, accepted)
        truth = states[torch.arange(3), accepted.long()].to(dtype).double()
    assert rel_err(RD.flush(ds), truth) < tol


def test_deferred_steps_in_cuda_graph():
    """verify + commit of reconstruct_deferred captured once (T = 40) and replayed as successive
    steps with other trees, sizes and accepted nodes written into the same tensors; one slot
    is discarded and refilled between two replays. Outputs each step and the final flush match."""
    T, B = 40, 3
    static = on_gpu(random_inputs([full((3, 3, 3))] * B, hk=2, hv=4, dk=128, dv=128, seed=30))
    static["lengths"] = torch.full((B,), T, dtype=torch.int32, device="cuda")
    acc = torch.zeros(B, dtype=torch.int32, device="cuda")
    ds = RD.DeferredState.start(static.pop("state").clone(), max_path=40, hk=2, k_dtype=torch.float32)

    def step():
        o, ctx = RD.verify(**static, state=ds, check=False)
        RD.commit(ctx, acc, check=False)
        return o

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    RD.discard(ds, torch.ones(B, dtype=torch.bool, device="cuda"))  # the warm-up step never happened
    truth = ds.state.double().clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_out = step()
    for i, x, lengths, accepted in graph_batches(static, acc, gen_seed=31, seed=40, T=T):
        if i == 2:  # slot 1's request ended; a new one arrives with its own state
            RD.discard(ds, torch.tensor([False, True, False], device="cuda"))
            fresh = torch.randn(4, 128, 128, device="cuda")
            truth[1] = fresh.double()
            ds.state[1] = fresh
        graph.replay()
        torch.cuda.synchronize()
        o_ref, states = R.recurrence(**{**x, "lengths": lengths, "state": truth})
        assert rel_err(o_out, o_ref) < 1e-5, i
        truth = states[torch.arange(B), accepted.long()]
    assert rel_err(RD.flush(ds), truth) < 1e-5


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("policy", ["store_all", "reconstruct", "replay"])
def test_conv_real_width(policy, fused):
    """35B-A3B's conv width (2 x 16 x 128 + 32 x 128 channels), a (3,3,3) tree and a chain; fused:
    as the executor calls it (projection rows in place, q/k L2 norms, q, k, v split), in a CUDA graph."""
    trees, C, qk = [full((3, 3, 3)), chain(5)], 2 * 16 * 128 + 32 * 128, 16 * 128
    gen = torch.Generator().manual_seed(7)
    parent = torch.full((2, 40), -1, dtype=torch.int32)
    for b, t in enumerate(trees):
        parent[b, :len(t)] = torch.tensor(t, dtype=torch.int32)
    proj = torch.randn(2 * 40, C + 64, generator=gen).bfloat16()
    x = on_gpu(dict(x=proj, weight=torch.randn(C, 4, generator=gen), parent=parent,
                    conv_state=torch.randn(2, C, 3, generator=gen).bfloat16(),
                    lengths=torch.tensor([40, 5], dtype=torch.int32), bias=None))
    x["x"] = x["x"][:, :C].reshape(2, 40, C) if fused else x["x"][:, :C].reshape(2, 40, C).contiguous()
    out = dict(norm_channels=2 * qk, norm_dim=128, split=(qk, 2 * qk)) if fused else {}
    y_ref, states = R.tree_conv(**x, norm_channels=out.get("norm_channels", 0))
    verify, commit = {"store_all": (conv.store_all_verify, conv.store_all_commit),
                      "reconstruct": (conv.reconstruct_verify, conv.reconstruct_commit),
                      "replay": (conv.replay_verify, conv.replay_commit)}[policy]
    cs = x["conv_state"].clone()
    if policy == "replay":  # flushed every commit: the window is rebuilt from the path
        cs = conv.ReplayConvState.start(cs, 1, max_path=40, dtype=torch.bfloat16)
    acc = torch.tensor([39, 4], dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    verify(**{**x, "conv_state": cs}, **out)  # compile outside the capture
    with torch.cuda.graph(graph):
        y, ctx = verify(**{**x, "conv_state": cs}, **out)
        new = commit(ctx, acc, check=False)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(torch.cat(y, -1) if fused else y, y_ref) < 2e-2
    new = new.conv_state if policy == "replay" else new
    assert rel_err(new, states[torch.arange(2), acc.long()]) < 1e-2


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", ["vllm", "fla"])
def test_none_decode_in_place_real_shapes(dtype, tol, shape):
    """The baseline's one-token step (fla's kernel, state written over itself) against the float64 step."""
    fr = pytest.importorskip("fla.ops.gated_delta_rule.fused_recurrent")
    from policies.kernels.bench_fla import DECODE_SHAPES, decode_inplace, decode_reference
    x = on_gpu(random_inputs([[-1]] * 5, hk=16, hv=32, dk=128, dv=128, seed=4, dtype=torch.bfloat16))
    x["state"] = x["state"].to(dtype)
    a_log, dt_bias = torch.rand(32, device="cuda") - 0.5, torch.rand(32, device="cuda") - 0.5
    o_ref, s_ref = decode_reference(x, a_log, dt_bias)
    o = torch.full_like(x["v"], float("nan"))
    decode_inplace(fr.fused_recurrent_gated_delta_rule_fwd_kernel, x, a_log, dt_bias, o, *DECODE_SHAPES[shape])
    assert rel_err(x["state"], s_ref) < tol and rel_err(o[:, 0], o_ref) < 1e-2


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(32, 4), (8, 1)], ids=["bv32w4", "bv8w1"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["walk", "prefetch"])
def test_chain_verify_real_shapes(monkeypatch, dtype, tol, shape, prefetch):
    """The recurrent chain verify at 35B-A3B heads: reconstruct (chains of 8, 5, 1; every accepted
    node) and reconstruct_deferred over three steps, state in `dtype`, inside a CUDA graph whose
    chain lengths change between replays; the walk and its prefetching kernel."""
    from policies.kernels import treewy
    monkeypatch.setattr(treewy, "TUNING", dataclasses.replace(treewy.TUNING, chain=True, chain_max=8, chain_pending_max=8,
                                                               chain_bv=shape[0], chain_warps=shape[1],
                                                               chain_prefetch=prefetch))
    x = on_gpu(random_inputs([chain(8), chain(5), [-1]], hk=16, hv=32, dk=128, dv=128, seed=7, dtype=torch.bfloat16))
    x["state"] = x["state"].to(dtype)
    o_ref, states = R.recurrence(**x)
    o, ctx = reconstruct.verify(**{**x, "state": x["state"].clone()})
    assert rel_err(o, o_ref) < max(tol, 4e-3)
    for a in range(8):
        acc = torch.tensor([a, min(a, 4), 0], dtype=torch.int32, device="cuda")
        new = reconstruct.commit(dataclasses.replace(ctx, state=x["state"].clone()), acc)
        assert rel_err(new, states[torch.arange(3), acc.long()].to(dtype)) < tol, a
    static = {n: x[n].clone() for n in ("q", "k", "v", "g", "beta", "parent")}
    static["lengths"] = torch.tensor([8, 5, 1], dtype=torch.int32, device="cuda")
    ds = RD.DeferredState.start(x["state"].clone(), max_path=8, hk=16)
    acc = torch.zeros(3, dtype=torch.int32, device="cuda")
    RD.commit(RD.verify(**static, state=ds, check=False, chain=True)[1], acc, check=False)  # compile outside
    RD.discard(ds, torch.ones(3, dtype=torch.bool, device="cuda"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, ctx_g = RD.verify(**static, state=ds, check=False, chain=True)
        RD.commit(ctx_g, acc, check=False)
    truth = x["state"].double()
    for step, (lens, accepted) in enumerate((([8, 5, 1], [7, 2, 0]), ([3, 8, 2], [1, 7, 1]), ([8, 8, 8], [5, 0, 7]))):
        y = on_gpu(random_inputs([chain(n) for n in lens], hk=16, hv=32, dk=128, dv=128, seed=30 + step, T=8,
                                 dtype=torch.bfloat16))
        for n in ("q", "k", "v", "g", "beta", "parent"):
            static[n].copy_(y[n])
        static["lengths"].copy_(torch.tensor(lens, dtype=torch.int32))
        acc.copy_(torch.tensor(accepted, dtype=torch.int32))
        o_ref, states = R.recurrence(**{**y, "lengths": static["lengths"], "state": truth})
        graph.replay()
        assert rel_err(o_g, o_ref) < max(tol, 6e-3), step
        truth = states[torch.arange(3), acc.long()].to(dtype).double()
    assert rel_err(RD.flush(ds), truth) < tol
