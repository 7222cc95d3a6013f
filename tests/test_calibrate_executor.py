"""The GPU step executor on the CPU: dispatch with forced modes, the paged layout, and a tiny model run eagerly."""
import numpy as np
import pytest
import torch

from calibrate.device.graphs import EAGER, FULL, PIECEWISE, plan
from calibrate.executor.gdn import gdn_gating
from calibrate.executor.runner import Executor
from calibrate.executor.step_layout import accepted_node, block_tables, layout, verify_positions
from calibrate.model.shapes import LayerShapes
from core.config import load_model, load_policy
from sim.engine.step_trace import TracedRequest as R
from sim.pricing.dispatch import capture_sizes

SIZES = capture_sizes(1024, 8192, 4)
CHAIN = (1, 1, 1)


# ------------------------------------------------------------------ dispatch
@pytest.mark.parametrize("lens, decoding, mode, want", [
    ([4] * 3, [True] * 3, "vllm", (FULL, 16, 4)),  # 12 tokens pad to 16: one dummy request
    ([4] * 5, [True] * 5, "vllm", (FULL, 24, 6)),
    ([4, 4, 100], [True, True, False], "vllm", (PIECEWISE, 112, 3)),
    ([4, 600], [True, False], "vllm", (EAGER, 604, 2)),
    ([4] * 5, [True] * 5, "eager", (EAGER, 20, 5)),
    ([4, 600], [True, False], "graph", (PIECEWISE, 768, 2)),  # above the capture sizes: padded to 256s
    ([4] * 129, [True] * 129, "graph", (FULL, 768, 192)),
], ids=["full3", "full5-padded", "piecewise", "eager", "forced-eager", "forced-piecewise", "forced-full"])
def test_plan_modes_and_padding(lens, decoding, mode, want):
    p = plan(lens, decoding, 4, SIZES, True, mode)
    assert (p.mode, p.tokens, p.requests) == want


def test_plan_tree_that_breaks_full_graphs_runs_piecewise():
    assert plan([4] * 3, [True] * 3, 4, SIZES, False).mode == PIECEWISE


def test_plan_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        plan([4], [True], 4, SIZES, True, "fast")


# ------------------------------------------------------------------ layout
def test_layout_orders_decodes_first_and_assigns_consecutive_blocks():
    reqs = [R(7, 30, 10, (), 0), R(1, 0, 20, CHAIN, 2), R(2, 0, 3, (), 1)]
    lay = layout(reqs, block_size=16, num_blocks=100, lookahead=3)
    assert [r.rid for r in lay.order] == [1, 2, 7] and lay.num_decodes == 2
    assert lay.q_lens.tolist() == [4, 1, 30] and lay.seq_lens.tolist() == [24, 4, 40]
    assert lay.cu_q.tolist() == [0, 4, 5, 35] and lay.decode_tokens == 5 and lay.positions_max == 4
    assert lay.positions[:5].tolist() == [20, 21, 22, 23, 3] and lay.positions[5] == 10
    # blocks for seq_len + lookahead tokens: ceil(27/16)=2, ceil(7/16)=1, ceil(43/16)=3, from block 1 on
    assert lay.blocks.tolist() == [2, 1, 3] and lay.block_start.tolist() == [1, 3, 4]
    tables = block_tables(lay, width=4, num_blocks=100)
    assert tables.tolist() == [[1, 2, 0, 0], [3, 0, 0, 0], [4, 5, 6, 0]]
    # slot = block * 16 + offset, looked up through each request's table
    row_of = np.repeat(np.arange(3), lay.q_lens)
    want = tables[row_of, lay.positions // 16] * 16 + lay.positions % 16
    assert lay.slots.tolist() == want.tolist()


def test_layout_wraps_around_a_small_pool_never_using_the_dummy_block():
    lay = layout([R(i, 40, 0, (), 0) for i in range(4)], block_size=16, num_blocks=5, lookahead=0)
    tables = block_tables(lay, width=3, num_blocks=5)
    used = tables[tables > 0]
    assert used.min() >= 1 and used.max() <= 4 and (lay.slots // 16 >= 1).all()


def test_block_table_too_narrow_is_an_error():
    lay = layout([R(1, 100, 0, (), 0)], block_size=16, num_blocks=100, lookahead=0)
    with pytest.raises(ValueError, match="needs 7 blocks"):
        block_tables(lay, width=4, num_blocks=100)


@pytest.mark.parametrize("tree, accepted, node", [
    ((1, 1, 1), 1, 0), ((1, 1, 1), 3, 2), ((1, 1, 1), 4, 3), ((2, 2), 2, 1), ((2, 2), 3, 3), ((), 1, 0)])
def test_accepted_node_is_the_deepest_on_the_first_path(tree, accepted, node):
    assert accepted_node(tree, accepted) == node


def test_verify_positions():
    assert verify_positions(CHAIN) == 4 and verify_positions((2, 2)) == 7 and verify_positions(()) == 1


def test_gdn_gating_matches_torch():
    proj = torch.randn(7, 40)
    dt_bias, neg_a = torch.rand(4), -torch.rand(4).exp()
    g, beta = torch.full((7, 4), float("nan")), torch.full((7, 4), float("nan"))
    gdn_gating(proj, 30, dt_bias, neg_a, g, beta)
    b, a = proj[:, 30:34], proj[:, 34:38]
    torch.testing.assert_close(beta, b.sigmoid())
    torch.testing.assert_close(g, torch.nn.functional.softplus(a + dt_bias) * neg_a)


# ------------------------------------------------------------------ a tiny model, eagerly on the CPU
TINY = LayerShapes(model="tiny", tp=1, hidden=64, gdn_k_heads=2, gdn_v_heads=4, head_k_dim=16, head_v_dim=16,
                   conv_kernel=4, q_heads=4, kv_heads=2, head_dim=32, num_experts=8, top_k=2, expert_width=32,
                   shared_width=32, vocab=128, gdn_layers=1, attn_layers=1, mtp_depth=3)


def tiny(policy: str) -> Executor:
    return Executor(load_model("qwen3.5-35b-a3b"), load_policy(policy), device=torch.device("cpu"), max_requests=8,
                    max_context=200, max_num_seqs=8, max_num_batched_tokens=64, block_size=16,
                    kv_pool_bytes=1 << 20, kinds=["gdn", "attn"], shapes=TINY)


@pytest.mark.parametrize("policy", ["store_all", "reconstruct", "replay", "reconstruct_deferred"])
def test_tiny_mixed_step_writes_every_row_and_commits_decode_states(policy):
    ex = tiny(policy)
    reqs = [R(1, 0, 20, CHAIN, 3), R(2, 0, 5, (1, 1), 1), R(3, 7, 0, (), 0)]  # ragged decodes + a prefill
    before = ex.snapshot(4)
    ex.poison(14)
    out = ex.run(reqs, flush=True)
    assert out.mode == EAGER and out.kind == "mixed_graph"
    assert len(out.tokens) == 4 + 3 + 1 and len(out.accepted) == 2 and np.shape(out.drafts) == (3, 3)
    assert torch.isfinite(ex.x[:14].float()).all()
    after = ex.snapshot(4)

    def moved(slot: int) -> bool:  # any per-slot tensor: the state, or a pending commit (deferred)
        return any(not torch.equal(b[slot], a[slot]) for b, a in zip(before, after))
    # the two decodes (slots 1, 2) and the prefill (slot 3) moved on; the unused slot 0 did not
    assert not moved(0) and moved(1) and moved(2) and moved(3)


def test_tiny_prefill_in_two_chunks_equals_one_chunk():
    """The KV pages, conv window and GDN state a chunk leaves are what the next chunk reads."""
    ex = tiny("store_all")
    ex.run([R(1, 10, 0, (), 0)])
    whole = ex.x[9].float().clone()
    ex.run([R(1, 6, 0, (), 0)])
    ex.run([R(1, 4, 6, (), 0)])
    rel = (ex.x[3].float() - whole).norm() / whole.norm()
    assert rel < 2e-2, f"relative error {rel:.2e}"


def test_too_big_a_step_is_refused():
    with pytest.raises(ValueError, match="exceeds"):
        tiny("store_all").prepare([R(i, 0, 5, CHAIN, 1) for i in range(40)])


def test_one_executor_serves_policies_of_one_step_shape():
    ex = tiny("store_all")
    step = [R(1, 0, 20, CHAIN, 3), R(2, 5, 0, (), 0)]
    ex.run(step)
    ex.use_policy(load_policy("replay"))
    assert ex.verify_mod.__name__.endswith("replay") and ex.rs
    out = ex.run(step, flush=True)
    assert torch.isfinite(ex.x[:9].float()).all() and len(out.tokens) == 5
    with pytest.raises(ValueError, match="differ from this executor"):
        ex.use_policy(load_policy("store_all", {"draft_tree_widths": [2, 2]}))


@pytest.mark.parametrize("policy", ["replay", "reconstruct_deferred"])
def test_policy_states_outlive_a_policy_switch(policy):
    # A full graph captured under a policy (the correctness check) holds the addresses of its replay
    # caches / pending commits; returning to the policy must hand it the same tensors, not new ones
    # (on the H200 the graph then wrote into freed memory: an illegal memory access).
    def tensors(x):
        if isinstance(x, torch.Tensor):
            return [x.data_ptr()]
        if isinstance(x, (dict, list, tuple)):
            return [p for v in (x.values() if isinstance(x, dict) else x) for p in tensors(v)]
        return [p for v in vars(x).values() for p in tensors(v)] if hasattr(x, "__dataclass_fields__") else []

    ex = tiny(policy)
    pool = set(tensors({"ssm": [t for t in ex.ssm if t is not None], "conv": ex.conv_pool}))
    before = tensors((ex.rs, ex.rcs, ex.ds))
    assert set(before) - pool  # caches or pending buffers of their own, not only the pools
    ex.use_policy(load_policy("store_all"))
    assert not (ex.rs or ex.rcs or ex.ds)
    ex.use_policy(load_policy(policy))
    assert tensors((ex.rs, ex.rcs, ex.ds)) == before


def test_pipelined_steps_keep_their_own_outputs():
    # Async scheduling (calibrate.replay.timing.time_step_async): step N+1 is prepared and launched
    # before step N is finished; N's tokens must still be N's (double-buffered host outputs).
    from calibrate.replay.timing import time_step_async

    ex = tiny("reconstruct")
    a, b = [R(1, 0, 20, CHAIN, 3)], [R(1, 0, 30, CHAIN, 2), R(2, 0, 9, CHAIN, 1), R(3, 0, 5, CHAIN, 4)]
    sa = ex.prepare(a)
    ex.launch(sa)
    sb = ex.prepare(b)
    ex.launch(sb)
    oa, ob = ex.finish(sa), ex.finish(sb)
    assert len(oa.tokens) == 4 and len(oa.accepted) == 1 and np.shape(oa.drafts) == (3, 1)
    assert len(ob.tokens) == 12 and len(ob.accepted) == 3 and np.shape(ob.drafts) == (3, 3)
    assert time_step_async(ex, b, False, steps=2) > 0


def test_every_gdn_layer_of_a_step_gets_the_same_cu_seqlens_object():
    """fla memoises its varlen indices by the identity of cu_seqlens and builds them with a
    synchronous host-to-device copy: a new tensor per layer would stall the host at every GDN
    layer (an executor that did so measured mixed steps at 80-165 ms
    for 34-53 ms of GPU work). One object per
    step, as vLLM's metadata hands every layer."""
    ex = Executor(load_model("qwen3.5-35b-a3b"), load_policy("store_all"), device=torch.device("cpu"), max_requests=8,
                  max_context=200, max_num_seqs=8, max_num_batched_tokens=64, block_size=16,
                  kv_pool_bytes=1 << 20, kinds=["gdn", "gdn", "attn", "gdn"], shapes=TINY)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # the objects themselves: ids of freed ones recur

    def conv(x, w, initial_state, output_final_state, activation, cu_seqlens, cu_seqlens_cpu):
        seen.append((cu_seqlens, cu_seqlens_cpu))
        return x.clone(), initial_state.float()

    def chunk(q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
              cu_seqlens, cu_seqlens_cpu):
        seen.append((cu_seqlens, cu_seqlens_cpu))
        return torch.zeros_like(v), initial_state.float()
    ex.chunk_fn, ex.fla_conv = chunk, conv
    st = ex.prepare([R(1, 0, 20, CHAIN, 3), R(2, 9, 0, (), 0), R(3, 5, 7, (), 0)])
    ex.launch(st)
    ex.finish(st)
    assert len(seen) == 2 * 3
    assert all(cu is st.pf_cu and cpu is st.pf_cu_cpu for cu, cpu in seen)
    assert st.pf_cu.tolist() == [0, 9, 14]


def test_replay_caches_hold_the_traced_count_however_often_a_step_runs():
    """A step is run many times for timing; the replay policy's caches must stay at the trace's
    `replayed` count (capped to leave room for the path), never grow past their capacity."""
    ex = tiny("replay")
    gdn = ex.kinds.index("gdn")
    rs, rcs = ex.rs[gdn], ex.rcs[gdn]
    room = rs.capacity - 4
    step = [R(1, 0, 20, CHAIN, 3, 5, False), R(2, 0, 9, CHAIN, 2, 10_000, False)]
    for _ in range(4):
        ex.run(step)
        # after the commit each cache holds the traced count plus the path the commit appended
        assert rs.count[1:3].tolist() == rcs.count[1:3].tolist() == [5 + 3, room + 2]
        assert int(rs.count.max()) <= rs.capacity
    assert torch.isfinite(ex.x[:8].float()).all()


@pytest.mark.parametrize("policy", ["store_all", "reconstruct", "replay"])
def test_decode_core_conv_reads_projection_rows_and_normalises_q_k(policy):
    """The verify's q, k, v come from one conv launch over the projection rows in place: the
    float64 conv of those rows along each request's tree, q and k unit-norm per head."""
    from policies.kernels import reference as ref

    ex = tiny(policy)
    s = ex.s
    reqs = [R(1, 0, 20, CHAIN, 3), R(2, 0, 9, CHAIN, 0)]
    st = ex.prepare(reqs, mode="eager")
    ex.gdn_proj.normal_()
    window = ex.conv_pool[0][1:st.B + 1].clone()
    qkv, g, beta, nd = ex.gdn_inputs(0, st)
    (q, k, v, *_), _ = ex.verify_inputs(0, st, qkv[:nd], g[:nd], beta[:nd])
    parent = ex.i32.d("parent", st.B * st.T).view(st.B, st.T)
    qk = s.gdn_qk_channels
    y_ref, _ = ref.tree_conv(qkv[:nd].reshape(st.B, st.T, -1), ex.w.conv[0], parent, window,
                             norm_channels=2 * qk, norm_dim=s.head_k_dim)
    got = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], -1).double()
    assert (got - y_ref).abs().max() < 2e-2 * y_ref.abs().max()  # bf16 outputs
    norms = torch.cat([q, k], 2).double().norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
