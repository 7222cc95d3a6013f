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
