"""The skewed-routing bench's inputs: the bias reaches every token's router logits, and the
routing statistics count what the router's top-k picks."""
import pytest

torch = pytest.importorskip("torch")

from calibrate.benches.moe_routing import routing_stats, skew  # noqa: E402
from calibrate.kernels.inputs import moe_inputs  # noqa: E402


def test_skew_adds_the_bias_to_every_tokens_logits():
    base = moe_inputs(32, 256, 64, 32, 8, True, seed=3)
    bias = torch.randn(64, generator=torch.Generator().manual_seed(1))
    sk = skew(base, bias)
    plain = base["x"][:, 1:].float() @ base["router_w"][:, 1:].float().T
    got = sk["x"].float() @ sk["router_w"].float().T
    assert torch.allclose(got - plain, bias.to(torch.bfloat16).float().expand_as(got), atol=1e-5)
    assert torch.equal(sk["w13"], base["w13"]) and torch.equal(base["x"][:, 1:], sk["x"][:, 1:])


def test_routing_stats_count_the_top_k():
    x = torch.eye(4)  # token i's logits are router row values at column i
    router = torch.tensor([[9.0, 0, 0, 9], [8, 8, 0, 8], [0, 7, 7, 0], [0, 0, 6, 0]])
    # top-2 per token: t0 {0,1}, t1 {1,2}, t2 {2,3}, t3 {0,1}
    touched, most, mean = routing_stats(x, router, 2)
    assert (touched, most) == (4, 3) and mean == pytest.approx(8 / 4)


def test_a_stronger_skew_touches_fewer_experts():
    base = moe_inputs(64, 256, 128, 32, 8, True, seed=5)
    pop = torch.randn(128, generator=torch.Generator().manual_seed(2))
    touched = [routing_stats(**{k: v for k, v in skew(base, a * pop).items() if k in ("x", "router_w")},
                             top_k=8)[0] for a in (0.0, 1.0, 2.0)]
    assert touched[0] > touched[1] > touched[2]
