"""Shared test setup: seeding, the Triton interpreter on CPU-only machines, NaN-poisoned outputs."""
import os

import torch

# Before anything imports triton: CPU machines run kernels through the interpreter.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def nan_poison(monkeypatch):
    """Every torch.empty / empty_like comes back filled with NaN (floats) or -77 (ints),
    so an output element a kernel forgot to write fails the test instead of reading as 0."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(-77)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))


@pytest.fixture
def rtne_fp8(monkeypatch):
    """Triton's interpreter's float32 -> float8_e4m3fn casts done by torch (round to nearest even, the
    GPU's `cvt.rn`): Triton 3.9's interpreter ORs the rounding carry into the exponent, so a value that
    rounds up to a power of two comes out as half of it."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as I
    convert = I._convert_float

    def fixed(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.float8e4nv and rounding_mode == I._ir.ROUNDING_MODE.RTNE:
            x = torch.from_numpy(np.ascontiguousarray(data).view(np.float32))
            return x.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(data.shape)
        return convert(data, src, dst, rounding_mode)

    monkeypatch.setattr(I, "_convert_float", fixed)
