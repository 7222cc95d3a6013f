"""Replay's cache has one size, `policies.replay.cache_slots`: what the kernels allocate
for a sequence is what the memory model charges the pool (the latency model prices the
verify over the same `Replay.cache_slots`)."""
import pytest
import torch

from core.config import load_model, load_policy
from policies import make_policy
from policies.kernels.conv import ReplayConvState
from policies.kernels.replay import ReplayState


def allocated_bytes_per_layer(model, flush_interval, depth) -> int:
    """Bytes of one sequence's replay caches in one GDN layer on one rank, as the executor
    allocates them (calibrate/executor/gdn.py: ReplayState and ReplayConvState, bf16)."""
    g, tp = model.gdn, model.tensor_parallel
    state = torch.zeros(1, g.num_v_heads // tp, g.head_v_dim, g.head_k_dim)
    rs = ReplayState.start(state, flush_interval, depth + 1, g.num_k_heads // tp)
    channels = (2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim) // tp
    conv = ReplayConvState.start(torch.zeros(1, channels, g.conv_kernel - 1), flush_interval, depth + 1, torch.bfloat16)
    cached = [rs.k, rs.v, rs.g, rs.beta] + ([conv.x] if rs.capacity else [])  # conv keeps 1 dummy slot when empty
    return sum(t.numel() * t.element_size() for t in cached)


@pytest.mark.parametrize("name", ["qwen3.5-35b-a3b", "qwen3.5-397b-a17b"])
@pytest.mark.parametrize("widths", [[1, 1, 1], [3, 3, 3], [2, 1]])
@pytest.mark.parametrize("flush_interval", [1, 2, 4, 7])
def test_memory_model_charges_what_the_kernels_allocate(name, widths, flush_interval):
    model = load_model(name)
    policy = make_policy(model, load_policy("replay", {"draft_tree_widths": widths, "flush_interval": flush_interval}))
    per_layer = allocated_bytes_per_layer(model, flush_interval, len(widths))
    assert policy.cache_bytes_per_seq_per_gpu() == model.gdn_layers * per_layer
    assert ReplayState.start(torch.zeros(1, 1, 1, 1), flush_interval, len(widths) + 1, 1).capacity == policy.cache_slots()
