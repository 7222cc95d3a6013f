"""Interpolation over a measured rectangular grid, in log space, monotone by construction.

Along `log` axes, log(us) is interpolated linearly in log(axis) (exact for power
laws); along `linear` axes (context lengths, where time is affine: one more cached
token, one more read), us itself linearly in the axis: exact at grid points,
and monotone along every axis once the grid values are (physics: more tokens,
sequences or context never take less time, so measured dips are noise; `monotone`
lifts each value to the running maximum along every axis before fitting).

Outside the grid a query raises OutOfGridError unless `extrapolate` is set: then a
value below an axis is clamped to its first grid point (an upper bound, by the
monotonicity above) and a value above is scaled proportionally from the last
(time linear in work, the large-size regime); each such query is counted in
`out_of_grid` so a run can report it.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from itertools import product
from typing import NamedTuple, Sequence

import numpy as np

SCALES = ("log", "linear")


class OutOfGridError(ValueError):
    """A query outside the measured grid while extrapolation is off."""


class GridInterpolator:
    def __init__(self, name: str, axis_names: Sequence[str], axes: Sequence[Sequence[float]],
                 values: Sequence[float], scales: Sequence[str], *, monotone: bool = True,
                 extrapolate: bool = False) -> None:
        if not (len(axis_names) == len(axes) == len(scales)):
            raise ValueError(f"{name}: axis_names, axes and scales must have one entry per axis")
        for a, ax, s in zip(axis_names, axes, scales):
            if s not in SCALES:
                raise ValueError(f"{name}: scale of axis {a!r} must be one of {SCALES}, got {s!r}")
            if list(ax) != sorted(set(ax)):
                raise ValueError(f"{name}: axis {a!r} must be strictly increasing, got {list(ax)}")
            if s == "log" and ax[0] <= 0:
                raise ValueError(f"{name}: log axis {a!r} needs positive values, got {ax[0]}")
        shape = [len(ax) for ax in axes]
        if len(values) != math.prod(shape):
            raise ValueError(f"{name}: {len(values)} values for a grid of shape {shape}")
        if any(not (v > 0) for v in values):
            raise ValueError(f"{name}: times must be positive, got min {min(values)}")
        self.name = name
        self.axis_names = tuple(axis_names)
        self.axes = tuple(tuple(float(x) for x in ax) for ax in axes)
        self.scales = tuple(scales)
        self.extrapolate = extrapolate
        self.out_of_grid: Counter[str] = Counter()
        self._ndim = len(self.axes)
        self._partials: dict[tuple[float, ...], Curve1D] = {}
        self._is_log = tuple(sc == "log" for sc in self.scales)
        self._t = tuple(tuple(self._tf(d, x) for x in ax) for d, ax in enumerate(self.axes))
        self._strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        vals = [float(v) for v in values]
        if monotone:
            vals = _running_max(vals, shape, self._strides)
        self.grid_values = tuple(vals)
        self._logv = [math.log(v) for v in vals]

    def _tf(self, d: int, x: float) -> float:
        return math.log(x) if self.scales[d] == "log" else float(x)

    def __call__(self, *x: float) -> float:
        # Hot path (called ~10 times per simulated step): plain Python, no numpy scalars.
        if len(x) != self._ndim:
            raise TypeError(f"{self.name}: expected {self._ndim} coordinates {self.axis_names}, got {len(x)}")
        log_c, lin_c, scale, outside = self._corners(x)
        for side in outside:
            self.out_of_grid[side] += 1
        return self._combine([(o, cw) for o, cw in log_c if cw], lin_c, 0) * scale

    def _corners(self, x: Sequence[float]) -> tuple[list[tuple[int, float]], list[tuple[int, float]], float, list[str]]:
        """The grid corners around `x` (its leading axes, where x is shorter) and their weights, over
        the log axes and over the linear ones, as (flat offset, weight); the out-of-grid factor; the
        out-of-grid sides met (for the caller to count)."""
        scale = 1.0
        log_c: list[tuple[int, float]] = [(0, 1.0)]
        lin_c: list[tuple[int, float]] = [(0, 1.0)]
        outside = []
        for d in range(len(x)):
            xd, ax = x[d], self.axes[d]
            if xd < ax[0] or xd > ax[-1]:
                xd, f, side = self._clamp(d, xd)
                scale *= f
                outside.append(side)
            t = self._t[d]
            if len(t) == 1:
                continue
            is_log = self._is_log[d]
            xt = math.log(xd) if is_log else xd
            i = bisect_right(t, xt) - 1
            if i > len(t) - 2:
                i = len(t) - 2
            w = (xt - t[i]) / (t[i + 1] - t[i])
            lo, hi = i * self._strides[d], (i + 1) * self._strides[d]
            c = log_c if is_log else lin_c
            c[:] = [(o + lo, cw * (1.0 - w)) for o, cw in c] + [(o + hi, cw * w) for o, cw in c]
        return log_c, lin_c, scale, outside

    def _combine(self, log_c: list[tuple[int, float]], lin_c: list[tuple[int, float]], shift: int) -> float:
        """log(time) multilinear over the log corners (zero weights left out), time linear over
        the linear ones; every flat offset moved by `shift`."""
        logv = self._logv
        acc = 0.0
        for base, wl in lin_c:
            if wl:
                base += shift
                acc += wl * math.exp(sum([cw * logv[base + o] for o, cw in log_c]))
        return acc

    def slice_at(self, prefix: tuple[float, ...]) -> "GridSlice":
        """The corners of the leading coordinates `prefix` (all axes but the last), so that the
        values at the last axis's grid points are read without working them out again."""
        if len(prefix) != self._ndim - 1:
            raise TypeError(f"{self.name}: a slice takes {self._ndim - 1} leading coordinates, got {len(prefix)}")
        log_c, lin_c, scale, outside = self._corners(prefix)
        return GridSlice([(o, cw) for o, cw in log_c if cw], lin_c, scale, tuple(outside))

    def slice_value(self, s: "GridSlice", j: int) -> float:
        """The grid at (*prefix, its last axis's j-th point): the float `self(*prefix, axes[-1][j])`
        gives (that point is a corner of weight 1 and its neighbour's weight is 0, so the
        neighbour drops out; along the last axis a flat offset moves by j), counted as one query."""
        for side in s.outside:
            self.out_of_grid[side] += 1
        return self._combine(s.log_corners, s.lin_corners, j) * s.scale

    def partial(self, *prefix: float) -> Curve1D:
        """The curve along the last axis at these leading coordinates (memoised)."""
        c = self._partials.get(prefix)
        if c is None:
            c = Curve1D(self, self._ndim - 1, prefix=prefix)
            if len(self._partials) < Curve1D.MEMO:
                self._partials[prefix] = c
        return c

    def _outside(self, d: int, xd: float) -> tuple[float, float]:
        """The in-grid coordinate to evaluate at, and the factor to apply (see module doc); counted."""
        x, f, side = self._clamp(d, xd)
        self.out_of_grid[side] += 1
        return x, f

    def _clamp(self, d: int, xd: float) -> tuple[float, float, str]:
        """`_outside`'s coordinate and factor, and the side it counts, uncounted."""
        ax = self.axes[d]
        side = "low" if xd < ax[0] else "high"
        if not self.extrapolate:
            raise OutOfGridError(
                f"{self.name}: {self.axis_names[d]}={xd:g} is outside the measured grid "
                f"[{ax[0]:g}, {ax[-1]:g}]; extend the calibration grid or allow extrapolation")
        key = f"{self.axis_names[d]}_{side}"
        return (ax[0], 1.0, key) if side == "low" else (ax[-1], xd / ax[-1], key)


class GridSlice(NamedTuple):
    """GridInterpolator.slice_at's corners of a slice's leading coordinates."""

    log_corners: list[tuple[int, float]]  # (flat offset, weight), zero weights left out
    lin_corners: list[tuple[int, float]]
    scale: float  # the out-of-grid factor of the leading coordinates
    outside: tuple[str, ...]  # the out-of-grid sides they meet, counted once per value read


class Curve1D:
    """A one-axis slice of a grid (values at that axis's grid points), fast to evaluate.

    Same interpolation and out-of-grid rules as GridInterpolator; out-of-grid queries
    are counted in the parent's counter. Given no values, the slice at `prefix` (the
    leading coordinates) takes each grid point's value from the parent when a query
    first needs it: a query reads two, and most slices are asked a few times only.
    Results are memoised per coordinate, since a simulation asks for the same token
    counts and batch sizes again and again.
    """

    MEMO = 100_000  # entries kept per curve

    def __init__(self, parent: GridInterpolator, axis: int, values: Sequence[float] | None = None,
                 prefix: tuple[float, ...] = ()) -> None:
        self.parent, self.axis = parent, axis
        self.ax = parent.axes[axis]
        self.is_log = parent.scales[axis] == "log"
        self.t = parent._t[axis]
        self.prefix = prefix
        # log(value) on a log axis; None: not read from the parent yet
        self.v: list[float | None] = ([None] * len(self.ax) if values is None else
                                      [math.log(v) if self.is_log else v for v in values])
        self.memo: dict[float, float] = {}
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None  # the axis and every value, for `many`
        self._slice: GridSlice | None = None  # the prefix's corners, once a value is read

    def _value(self, j: int) -> float:
        v = self.v[j]
        if v is None:
            if self._slice is None:
                self._slice = self.parent.slice_at(self.prefix)
            y = self.parent.slice_value(self._slice, j)
            v = self.v[j] = math.log(y) if self.is_log else y
        return v

    def __call__(self, x: float) -> float:
        y = self.memo.get(x)
        if y is not None:
            return y
        scale, xd = 1.0, x
        if x < self.ax[0] or x > self.ax[-1]:
            xd, scale = self.parent._outside(self.axis, x)
        t = self.t
        if len(t) == 1:
            y = self._value(0)
            y = math.exp(y) if self.is_log else y
        else:
            xt = math.log(xd) if self.is_log else xd
            i = min(bisect_right(t, xt) - 1, len(t) - 2)
            w = (xt - t[i]) / (t[i + 1] - t[i])
            lo, hi = self.v[i], self.v[i + 1]  # read from the parent on first need
            if lo is None:
                lo = self._value(i)
            if hi is None:
                hi = self._value(i + 1)
            y = lo + (hi - lo) * w
            y = math.exp(y) if self.is_log else y
        y *= scale
        if len(self.memo) < self.MEMO:
            self.memo[x] = y
        return y

    def many(self, x: np.ndarray) -> np.ndarray:
        """The curve at each of `x`: the floats `__call__` gives, worked out over the array on a
        linear axis (the same operations, in the same order), one query at a time on a log axis
        (numpy's exp and log may round differently from the math module's)."""
        if self.is_log or len(self.t) == 1:
            return np.fromiter(map(self, x.tolist()), float, len(x))
        if self._arrays is None:
            self._arrays = (np.asarray(self.t), np.array([self._value(j) for j in range(len(self.t))]))
        t, v = self._arrays
        first, last = self.ax[0], self.ax[-1]
        scale = 1.0
        if x.min() < first or x.max() > last:
            outside = (x < first) | (x > last)
            for q in x[outside].tolist():  # counted (or refused) as one query each
                self.parent._outside(self.axis, q)
            scale = np.where(x > last, x / last, 1.0)
            x = np.clip(x, first, last)
        i = np.searchsorted(t, x, side="right") - 1
        np.minimum(i, len(t) - 2, out=i)
        t0, lo = t[i], v[i]
        return (lo + (v[i + 1] - lo) * ((x - t0) / (t[i + 1] - t0))) * scale

def _running_max(vals: list[float], shape: list[int], strides: list[int]) -> list[float]:
    """Lift every value to the maximum of the values before it along each axis."""
    out = list(vals)
    for d, n in enumerate(shape):
        for flat in range(len(out)):
            i = (flat // strides[d]) % n
            if i:
                prev = flat - strides[d]
                if out[prev] > out[flat]:
                    out[flat] = out[prev]
    return out


def from_rows(name: str, rows: Sequence[dict], axis_names: Sequence[str], scales: Sequence[str],
              value: str = "us", fill_low: str | None = None, **kw: bool) -> GridInterpolator:
    """Build from table rows; every combination of the axes' values must be measured once, except
    that along the axis `fill_low` a missing cell takes the first measured value above it (the
    out-of-grid rule for a value below an axis: an upper bound, by monotonicity)."""
    axes = [sorted({float(r[a]) for r in rows}) for a in axis_names]
    cells: dict[tuple[float, ...], float] = {}
    for r in rows:
        key = tuple(float(r[a]) for a in axis_names)
        if key in cells:
            raise ValueError(f"{name}: duplicate measurement at {dict(zip(axis_names, key))}")
        cells[key] = float(r[value])
    missing = [k for k in product(*axes) if k not in cells]
    if fill_low is not None and missing:
        d = list(axis_names).index(fill_low)
        for k in missing:
            above = [k[:d] + (x,) + k[d + 1:] for x in axes[d] if x > k[d]]
            got = next((cells[a] for a in above if a in cells), None)
            if got is not None:
                cells[k] = got
        missing = [k for k in missing if k not in cells]
    if missing:
        raise ValueError(f"{name}: grid is not rectangular; {len(missing)} missing points, e.g. "
                         f"{dict(zip(axis_names, missing[0]))}")
    return GridInterpolator(name, axis_names, axes, [cells[k] for k in product(*axes)], scales, **kw)
