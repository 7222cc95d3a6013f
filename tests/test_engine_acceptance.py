"""Acceptance model: docs/design.md#draft-trees' reference accepted lengths, seeded per-request streams."""
import numpy as np
import pytest

from core.config import ConfigError
from sim.engine.acceptance import (REFERENCE_ACCEPTED_LEN, AcceptanceModel, AcceptanceStream, accept_thresholds,
                            default_rank_rows, expected_accepted_len)


@pytest.mark.parametrize("widths", list(REFERENCE_ACCEPTED_LEN), ids=str)
def test_default_reproduces_reference_accepted_length_monte_carlo(widths):
    model = AcceptanceModel(widths, seed=0)
    stream = model.stream(request_id=0)
    draws = np.array([stream.accepted_drafts() for _ in range(200_000)])
    mean_len = draws.mean() + 1  # bonus token included
    assert mean_len == pytest.approx(REFERENCE_ACCEPTED_LEN[widths], abs=0.02)
    assert model.expected_len() == pytest.approx(REFERENCE_ACCEPTED_LEN[widths], abs=1e-9)


def test_default_rows_are_distributions():
    rows = default_rank_rows(3)
    assert len(rows) == 3
    for row in rows:
        assert all(p >= 0 for p in row) and sum(row) <= 1


def test_wider_trees_accept_more_and_depth_counts():
    lens = [AcceptanceModel(w, 0).expected_len() for w in [(1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 4, 4)]]
    assert lens == sorted(lens) and lens[0] < lens[-1] < 4.0
    assert AcceptanceModel((1,), 0).expected_len() < AcceptanceModel((1, 1), 0).expected_len()


def test_closed_form_expected_length():
    rows = [[0.5, 0.2], [0.4, 0.1], [0.3]]
    thr = accept_thresholds(rows, (2, 1, 1))
    assert thr == pytest.approx((0.7, 0.4, 0.3))
    assert expected_accepted_len(thr) == pytest.approx(1 + 0.7 + 0.28 + 0.084)


def test_streams_are_per_request_and_independent_of_interleaving():
    thr = accept_thresholds(default_rank_rows(3), (1, 1, 1))
    a = AcceptanceStream(7, 3, thr)
    alone = [a.accepted_drafts() for _ in range(500)]
    b, other = AcceptanceStream(7, 3, thr), AcceptanceStream(7, 4, thr)
    mixed = []
    for i in range(500):  # another request consuming in between changes nothing
        mixed.append(b.accepted_drafts())
        for _ in range(i % 3):
            other.accepted_drafts()
    assert alone == mixed
    assert alone != [AcceptanceStream(8, 3, thr).accepted_drafts() for _ in range(500)]  # seed matters


def test_same_uniforms_give_nested_acceptance_across_trees():
    """Common random numbers also across trees: a wider tree accepts at least as much, step by step."""
    chain = AcceptanceModel((1, 1, 1), 0).stream(5)
    tree = AcceptanceModel((3, 3, 3), 0).stream(5)
    pairs = [(chain.accepted_drafts(), tree.accepted_drafts()) for _ in range(2000)]
    assert all(c <= t for c, t in pairs) and any(c < t for c, t in pairs)


def test_workload_category_overrides_default():
    model = AcceptanceModel((1, 1, 1), 0, {"math": [[0.9], [0.9], [0.9]], "": [[0.5], [0.5], [0.5]]})
    assert model.expected_len("math") == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    assert model.expected_len("other") == pytest.approx(1 + 0.5 + 0.25 + 0.125)  # workload default ("")
    assert model.source == "workload"


@pytest.mark.parametrize("rows,match", [
    ([[0.5], [0.5]], "one row per tree depth"),
    ([[0.5], [0.7, 0.4], [0.1]], "summing to <= 1"),
    ([[0.5], [-0.1], [0.1]], "non-negative"),
])
def test_bad_acceptance_rows(rows, match):
    with pytest.raises(ConfigError, match=match):
        AcceptanceModel((1, 1, 1), 0, {"": rows})


def test_stream_reads_d_uniforms_per_verify_across_refills():
    """Whatever the refill sizes, the k-th verify step's count comes from uniforms D*k .. D*k+D-1
    of the request's seeded stream (the common random numbers every policy shares)."""
    from sim.engine.acceptance import UNIFORM_BLOCK_MAX

    model = AcceptanceModel((1, 1, 1), seed=3)
    stream = model.stream(request_id=42)
    steps = 3 * UNIFORM_BLOCK_MAX + 17  # past several refills of growing size
    got = [stream.accepted_drafts() for _ in range(steps)]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([3, 42])))
    p = model.thresholds("")
    want = []
    for _ in range(steps):
        u = rng.random(3)
        a = 0
        while a < 3 and u[a] < p[a]:
            a += 1
        want.append(a)
    assert got == want
