"""A step's batch gathered as columns (sim.engine.step_trace.assemble_columns, what the engine prices)
adds up to what a request-by-request count of the same rows gives, on every kind of batch."""
import random

import pytest

from sim.engine.step_trace import BatchColumns, assemble_batch, assemble_columns
from sim.pricing.dispatch import capture_sizes, dispatch_counts

VP = 4
SIZES = capture_sizes(256, 8192, VP)


def _counted(rows, depth):
    """The batch's totals request by request (the reference the columns must equal)."""
    t = dict(prefill_tokens=0, prefill_seqs=0, decode_seqs=0, spec_seqs=0, replay_tokens=0, flush_seqs=0,
             truncated=0, context_tokens=0, max_context=0, num_seqs=0)
    tokens, uniform, chunks = 0, True, []
    for n, ctx, dec, spec, replayed, flush in rows:
        t["num_seqs"] += 1
        tokens += n
        t["context_tokens"] += ctx
        t["max_context"] = max(t["max_context"], ctx)
        if not dec:
            t["prefill_tokens"] += n
            t["prefill_seqs"] += 1
            chunks.append((n, ctx))
            continue
        t["decode_seqs"] += 1
        uniform &= n == (VP if depth else 1)
        if spec:
            t["spec_seqs"] += 1
            t["truncated"] += VP - n
            t["replay_tokens"] += replayed
            t["flush_seqs"] += flush
    d = dispatch_counts(tokens, t["num_seqs"], t["decode_seqs"], uniform, SIZES, True)
    return {**t, "prefill_chunks": tuple(chunks), "kind": d.kind, "mode": d.mode, "padded_tokens": d.padded_tokens}


def _row(rng, kind):
    ctx = rng.randrange(0, 20_000)
    if kind == "verify":
        return (rng.choice([VP, VP, VP, 2, 3]), ctx, True, True, rng.randrange(0, 9), rng.random() < 0.5)
    if kind == "decode":
        return (1, ctx, True, False, 0, True)
    return (rng.randrange(1, 3000), ctx, False, False, 0, True)


@pytest.mark.parametrize("mix", [("verify",), ("decode",), ("prefill",), ("verify", "prefill"),
                                 ("verify", "decode", "prefill"), ("decode", "prefill")])
@pytest.mark.parametrize("seed", range(5))
def test_columns_add_up_as_the_requests_do(mix, seed):
    rng = random.Random(seed)
    for _ in range(20):
        rows = [_row(rng, rng.choice(mix)) for _ in range(rng.randrange(1, 200))]
        for depth in (0, 3):
            b = assemble_batch(rows, verify_positions=VP, draft_depth=depth, sizes=SIZES, full_graph_ok=True)
            assert {k: getattr(b, k) for k in _counted(rows, depth)} == _counted(rows, depth)


def test_columns_without_policy_state_commit_every_verify():
    cols = BatchColumns([VP, VP, 3], [10, 20, 30], [True] * 3, [True] * 3)
    b = assemble_columns(cols, verify_positions=VP, draft_depth=3, sizes=SIZES, full_graph_ok=True)
    assert (b.spec_seqs, b.flush_seqs, b.replay_tokens, b.truncated, b.max_context) == (3, 3, 0, 1, 30)
    with pytest.raises(ValueError, match="at least one request"):
        assemble_columns(BatchColumns([], [], [], []), verify_positions=VP, draft_depth=3, sizes=SIZES,
                         full_graph_ok=True)
