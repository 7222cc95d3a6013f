"""On the GPU: each policy's verify and commit at every model config's GDN shard heads (the kernel bench's
MODELS, so a newly imported model's heads are checked before its kernels are timed)."""
import dataclasses

import pytest
import torch

from policies.kernels import reconstruct, reference as R, replay, store_all
from policies.kernels.bench_cases import MODELS
from policies.kernels.inputs import chain, full, random_inputs, rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TREES = [chain(4), full((2, 2, 2)), chain(4)]
ACCEPTED = [3, 5, 0]  # a chain's last node, a depth-2 node of the tree, the root alone


def check(model: str, policy: str, device: str, dk: int = 128) -> None:
    hk, hv = MODELS[model]
    x = random_inputs(TREES, hk=hk, hv=hv, dk=dk, dv=dk, seed=3, dtype=torch.float32)
    x = {n: t.to(device) if isinstance(t, torch.Tensor) else t for n, t in x.items()}
    o_ref, states = R.recurrence(**x)
    acc = torch.tensor(ACCEPTED, dtype=torch.int32, device=device)
    truth = states[torch.arange(len(TREES)), acc.long()]
    if policy == "replay":
        rs = replay.ReplayState.start(x["state"].clone(), flush_interval=2, max_path=4, hk=hk, dtype=torch.float32)
        o, ctx = replay.verify(**{**x, "state": rs})
        new = replay.materialize(replay.commit(ctx, acc))
    else:
        mod = {"store_all": store_all, "reconstruct": reconstruct}[policy]
        o, ctx = mod.verify(**{**x, "state": x["state"].clone()})
        new = mod.commit(dataclasses.replace(ctx, state=x["state"].clone()), acc)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(new, truth) < 1e-5


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("policy", ["store_all", "reconstruct", "replay"])
def test_verify_and_commit_at_the_models_shard_heads(model, policy):
    check(model, policy, "cuda")
