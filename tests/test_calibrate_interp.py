"""The grid interpolator on synthetic tables with known answers."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from core.interp import GridInterpolator, OutOfGridError, from_rows

B = (1, 2, 4, 8, 16, 64)
P = (1, 4, 16)
CTX = (1024, 4096, 32768)


def f(b, p, c):  # a latency-like surface: fixed cost + work terms, increasing in every axis
    return 5.0 + 0.3 * b * p + 1e-3 * b * c + 0.01 * p


def grid3(**kw):
    rows = [{"B": b, "P": p, "ctx": c, "us": f(b, p, c)} for b in B for p in P for c in CTX]
    return from_rows("decode", rows, ("B", "P", "ctx"), ("log", "log", "linear"), **kw)


def test_exact_at_every_grid_point():
    g = grid3()
    for b in B:
        for p in P:
            for c in CTX:
                assert g(b, p, c) == pytest.approx(f(b, p, c), rel=1e-12)


def test_power_law_is_exact_between_points():
    # log-log interpolation reproduces a power law exactly anywhere inside the grid
    rows = [{"tokens": n, "us": 3.0 * n ** 0.7} for n in (1, 4, 16, 64, 256)]
    g = from_rows("t", rows, ("tokens",), ("log",))
    for n in (1.5, 3, 10, 100, 200):
        assert g(n) == pytest.approx(3.0 * n ** 0.7, rel=1e-12)


def test_mixed_axes_are_exact_for_power_law_times_affine_context():
    def t(n, c):
        return n ** 1.5 * (10.0 + 0.5 * c)
    rows = [{"tokens": n, "ctx": c, "us": t(n, c)} for n in (128, 512) for c in (0, 1024, 4096)]
    g = from_rows("p", rows, ("tokens", "ctx"), ("log", "linear"))
    for n, c in ((128, 512), (256, 0), (300, 3000), (512, 4096)):
        assert g(n, c) == pytest.approx(t(n, c), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(b=st.floats(1, 64), p=st.floats(1, 16), c=st.floats(1024, 32768), db=st.floats(0, 30))
def test_monotone_in_every_axis(b, p, c, db):
    g = grid3()
    assert g(min(64, b + db), p, c) >= g(b, p, c) * (1 - 1e-12)
    assert g(b, min(16, p + db), c) >= g(b, p, c) * (1 - 1e-12)
    assert g(b, p, min(32768, c * (1 + db))) >= g(b, p, c) * (1 - 1e-12)


def test_noisy_dips_are_lifted_to_keep_monotonicity():
    rows = [{"tokens": n, "us": u} for n, u in ((1, 10.0), (2, 9.5), (4, 12.0))]
    g = from_rows("t", rows, ("tokens",), ("log",))
    assert g.grid_values == (10.0, 10.0, 12.0)
    assert g(1.5) == pytest.approx(10.0)


def test_outside_grid_is_a_clear_error():
    g = grid3()
    with pytest.raises(OutOfGridError, match=r"B=128 is outside the measured grid \[1, 64\]"):
        g(128, 4, 4096)
    with pytest.raises(OutOfGridError, match="ctx=100"):
        g(4, 4, 100)


def test_extrapolation_is_flagged_and_counted():
    g = grid3(extrapolate=True)
    assert g(128, 4, 4096) == pytest.approx(2 * f(64, 4, 4096))  # proportional above
    assert g(4, 4, 100) == pytest.approx(f(4, 4, 1024))  # clamped below (an upper bound)
    assert g(4, 4, 65536) == pytest.approx(2 * f(4, 4, 32768))
    assert g.out_of_grid == {"B_high": 1, "ctx_low": 1, "ctx_high": 1}


def test_rejects_non_rectangular_and_bad_tables():
    rows = [{"B": b, "P": p, "us": 1.0 + b} for b in (1, 2) for p in (1, 2)][:-1]
    with pytest.raises(ValueError, match="not rectangular"):
        from_rows("x", rows, ("B", "P"), ("log", "log"))
    with pytest.raises(ValueError, match="duplicate"):
        from_rows("x", [{"B": 1, "us": 1.0}, {"B": 1, "us": 2.0}], ("B",), ("log",))
    with pytest.raises(ValueError, match="scale of axis 'B' must be one of"):
        GridInterpolator("x", ("B",), ((1, 2),), (1.0, 2.0), ("cubic",))
    with pytest.raises(ValueError, match="times must be positive"):
        GridInterpolator("x", ("B",), ((1, 2),), (0.0, 2.0), ("log",))
    assert math.isclose(GridInterpolator("x", ("B",), ((1, 2),), (1.0, 4.0), ("log",))(math.sqrt(2)), 2.0)


def test_fill_low_completes_a_staircase_grid_from_above():
    # gdn_prefill_varlen: `seqs` sequences are measured only from 8 x seqs tokens on
    rows = [{"tokens": t, "seqs": s, "us": float(t + 10 * s)} for t in (16, 64, 256) for s in (1, 2, 8) if 8 * s <= t]
    with pytest.raises(ValueError, match="not rectangular"):
        from_rows("v", rows, ("tokens", "seqs"), ("log", "log"))
    g = from_rows("v", rows, ("tokens", "seqs"), ("log", "log"), fill_low="tokens")
    assert g(16, 8) == pytest.approx(64 + 80)  # the first measured value above it along tokens
    assert g(64, 8) == pytest.approx(64 + 80) and g(256, 2) == pytest.approx(256 + 20)  # measured cells unchanged
    # a cell with nothing measured above it along the axis stays missing
    with pytest.raises(ValueError, match="not rectangular"):
        from_rows("v", rows[:-1], ("tokens", "seqs"), ("log", "log"), fill_low="tokens")


def test_a_slice_reads_only_the_grid_points_a_query_needs():
    """partial() reads a grid point's value from the parent when a query first needs it,
    and answers exactly as a slice filled at every grid point does (inside and outside the grid)."""
    from core.interp import Curve1D

    g = grid3(extrapolate=True)
    reads = []
    real = GridInterpolator.slice_value

    def counting(self, s, j):
        reads.append(j)
        return real(self, s, j)

    GridInterpolator.slice_value = counting
    try:
        for b, p in ((3, 2), (64, 16), (1, 1), (100, 5)):
            full = Curve1D(g, 2, [g(b, p, c) for c in CTX])
            reads.clear()
            lazy = g.partial(b, p)
            assert reads == []  # nothing read before a query
            for c in (1024, 2000, 4096, 9000, 32768, 50000, 500):
                reads.clear()
                assert lazy(c) == full(c)
                assert len(reads) <= 2
    finally:
        GridInterpolator.slice_value = real


AXIS = st.lists(st.floats(0.5, 5000.0), min_size=1, max_size=4, unique=True).map(sorted)


@settings(max_examples=150, deadline=None)
@given(axes=st.lists(AXIS, min_size=2, max_size=4), log=st.lists(st.booleans(), min_size=4, max_size=4),
       data=st.data())
def test_a_slices_values_are_the_grids_floats_and_counts(axes, log, data):
    """A slice's value at a grid point of its last axis is the float the grid gives there, bit for
    bit, and counts the same out-of-grid queries, wherever its leading coordinates fall: on grid
    points, between them or outside (linear and log axes in any mix)."""
    scales = ["log" if lg else "linear" for lg in log[:len(axes)]]
    n = math.prod(len(a) for a in axes)
    values = data.draw(st.lists(st.floats(0.01, 1e4), min_size=n, max_size=n))
    g = GridInterpolator("g", [f"a{d}" for d in range(len(axes))], axes, values, scales, extrapolate=True)
    twin = GridInterpolator("g", [f"a{d}" for d in range(len(axes))], axes, values, scales, extrapolate=True)
    prefix = tuple(data.draw(st.one_of(st.sampled_from(ax), st.floats(0.1, 20000.0))) for ax in axes[:-1])
    s = g.slice_at(prefix)
    for j, x in enumerate(axes[-1]):
        assert g.slice_value(s, j) == twin(*prefix, x)
    assert g.out_of_grid == twin.out_of_grid
