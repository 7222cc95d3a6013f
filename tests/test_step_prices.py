"""Each distinct batch is priced once (sim.engine.step_prices): a step whose totals repeat gets the
price its own batch has, the memo lets go under load, and the step log's per-term sums,
durations and usage are what adding step by step gives."""
import random

import pytest

from sim.engine.acceptance import AcceptanceModel
from sim.engine.core import run_engine
from sim.engine.metrics import StepLog
from sim.engine.pool import make_pool
from sim.engine.step_prices import PROBE_ENTRIES, StepPrices
from sim.engine.step_trace import BatchTotals
from sim.pricing.latency import TERMS, LatencySources, StepTime
from test_engine_scenarios import CURRENT, OLD, setup, specs


class FieldPrice:
    """A price that changes with every StepBatch field a latency model may read."""

    sources = LatencySources({t: "config" for t in TERMS})

    def __init__(self) -> None:
        self.calls = 0

    def step_time(self, b) -> StepTime:
        self.calls += 1
        fields = (b.num_seqs, b.prefill_tokens, b.prefill_seqs, b.decode_seqs, b.spec_seqs, b.verify_positions,
                  b.context_tokens, b.max_context, b.eager, b.replay_tokens, b.flush_seqs, b.draft_depth,
                  b.truncated, b.kind, b.mode, b.padded_tokens, b.prefill_chunks)
        terms = {t: 1e-3 + (hash((t, fields)) % 10_000) * 1e-9 for t in TERMS}
        return StepTime(terms, b.graph_mode)


def _run(lengths, policy, engine, concurrency):
    model, pol, layout, pool_bytes = setup(policy, engine=engine)
    latency = FieldPrice()
    result = run_engine(specs(*lengths), pool=make_pool("paged", model, pol, layout, pool_bytes), policy=pol,
                        latency=latency, acceptance=AcceptanceModel(pol.tree.widths, 0, {"": [[1.0]] * 3}), max_num_batched_tokens=8192,
                        max_num_seqs=1024, max_concurrency=concurrency, trace=True, engine=engine,
                        block_tokens=layout.attn_block_tokens)
    return result, latency


@pytest.mark.parametrize("policy", ["store_all", "replay", "none"])
@pytest.mark.parametrize("engine", [OLD, CURRENT], ids=["sync", "async"])
def test_a_repeated_step_gets_its_own_batch_price(policy, engine):
    result, latency = _run([(300, 200), (40, 150), (300, 200), (2500, 120), (300, 200), (40, 150)], policy, engine,
                           concurrency=1)
    traced = result.steps._traced
    assert latency.calls < 0.6 * len(traced)  # a request repeats every step of an earlier one of its length
    for _, batch, st in traced:
        assert st == FieldPrice().step_time(batch)
    assert list(result.steps.durations) == [st.total_s for _, _, st in traced]


def test_the_memo_lets_go_of_steps_that_do_not_repeat():
    log = StepLog(False, 100)
    prices = StepPrices(FieldPrice(), log, verify_positions=4, draft_depth=3, sizes=(4, 8, 16), full_graph_ok=True)
    totals = [BatchTotals(2, 8, 2, True, 2, 0, 0, 2, ctx, ctx, ()) for ctx in range(PROBE_ENTRIES)]
    for t in totals[:10]:
        prices.price(t)
        prices.price(t)  # a repeat is a hit
    assert len(prices.memo) == 10 and prices.hits == 10
    for t in totals[10:]:
        prices.price(t)
    assert not prices.memo  # 10 hits in 4,096 entries: under load the memo is dropped
    prices.price(totals[0])
    assert not prices.memo and prices.latency.calls == PROBE_ENTRIES + 1


def test_step_log_sums_as_a_running_total():
    rng = random.Random(3)
    log = StepLog(False, 1234)
    prices = [StepTime({t: rng.random() * 10 ** rng.randint(-7, -1) for t in TERMS}, "full") for _ in range(50)]
    rows = [log.add_price(st, i % 3 == 0) for i, st in enumerate(prices)]
    running = dict.fromkeys(TERMS, 0.0)
    free = []
    for _ in range(5000):
        row = rng.choice(rows)
        log.price_rows.append(row)
        free.append(rng.randrange(0, 1235))
        log.free.append(free[-1])
        for t, v in prices[row].terms.items():
            running[t] += v
    assert log.term_sums == running  # exactly: the same additions in the same order
    assert list(log.durations) == [prices[r].total_s for r in log.price_rows]
    assert list(log.usage) == [1.0 - f / 1234 for f in free]
    assert log.eager_steps == sum(1 for r in log.price_rows if r % 3 == 0)
    assert log.price(rows[7]) == prices[7] and len(log) == 5000
