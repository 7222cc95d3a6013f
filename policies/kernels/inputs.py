"""Draft-tree parent arrays and random GDN inputs, shared by the tests and the benchmark."""
from __future__ import annotations

import torch

from policies.tree import DraftTree


def chain(T: int) -> list[int]:
    """Root plus T - 1 draft tokens in a line."""
    return [-1] + list(range(T - 1))


def star(T: int) -> list[int]:
    """Root plus T - 1 children of the root."""
    return [-1] + [0] * (T - 1)


def full(widths: tuple[int, ...]) -> list[int]:
    """Full tree of per-depth widths, BFS order (the simulator's DraftTree)."""
    return list(DraftTree(tuple(widths)).parents)


def preorder(parents: list[int]) -> list[int]:
    """The same tree renumbered in DFS preorder: another valid parent-first order."""
    children: dict[int, list[int]] = {}
    for t, p in enumerate(parents):
        children.setdefault(p, []).append(t)
    order, stack = [], [0]
    while stack:
        t = stack.pop()
        order.append(t)
        stack.extend(reversed(children.get(t, [])))
    new = {old: i for i, old in enumerate(order)}
    return [-1] + [new[parents[old]] for old in order[1:]]


def random_tree(T: int, gen: torch.Generator) -> list[int]:
    """Each node t >= 1 picks a uniformly random earlier parent."""
    return [-1] + [int(torch.randint(0, t, (1,), generator=gen)) for t in range(1, T)]


SHARED_KEY_DIRECTIONS = 4  # correlated keys: each key mixes these few directions, plus noise
KEY_NOISE = 0.3


def random_inputs(parents: list[list[int]], hk: int, hv: int, dk: int, dv: int, seed: int,
                  dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                  T: int | None = None, correlated_keys: bool = False,
                  state_scale: float = 1.0, log_decay: float = 1.0) -> dict[str, torch.Tensor]:
    """Inputs for verify: one parent list per sequence (ragged when sizes differ).

    Decays a in (e^-log_decay, 1) and b in (0, 1) as in a trained GDN layer (long-memory
    heads decay slowly: a small `log_decay`); k is L2-normalised;
    the committed state is a random float32 state of `state_scale` (0: a cold start, so
    outputs and states are the tree's own update and an error is measured on its scale).
    Independent random keys at d = 128 are nearly orthogonal, so the solve's coupling
    terms (powers of the strictly lower k.k matrix) almost vanish and a missing one goes
    unseen; `correlated_keys` draws them from a few shared directions plus noise, as a
    trained layer's keys overlap, which, with slow decays, makes those terms large.
    """
    B = len(parents)
    T = T or max(len(p) for p in parents)
    gen = torch.Generator().manual_seed(seed)
    par = torch.full((B, T), -1, dtype=torch.int32)
    for b, p in enumerate(parents):
        par[b, :len(p)] = torch.tensor(p, dtype=torch.int32)
    if correlated_keys:
        basis = torch.randn(SHARED_KEY_DIRECTIONS, dk, generator=gen)
        mix = torch.randn(B, T, hk, SHARED_KEY_DIRECTIONS, generator=gen)
        raw = mix @ basis + KEY_NOISE * torch.randn(B, T, hk, dk, generator=gen)
    else:
        raw = torch.randn(B, T, hk, dk, generator=gen)
    k = torch.nn.functional.normalize(raw, dim=-1)
    x = dict(q=torch.randn(B, T, hk, dk, generator=gen) / dk ** 0.5, k=k, v=torch.randn(B, T, hv, dv, generator=gen),
             g=-log_decay * torch.rand(B, T, hv, generator=gen), beta=torch.rand(B, T, hv, generator=gen) * 0.98 + 0.01,
             parent=par, state=state_scale * torch.randn(B, hv, dv, dk, generator=gen))
    x = {n: t.to(device=device, dtype=dtype if n in ("q", "k", "v") else t.dtype) for n, t in x.items()}
    ragged = any(len(p) != T for p in parents)
    x["lengths"] = torch.tensor([len(p) for p in parents], dtype=torch.int32, device=device) if ragged else None
    return x


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64; NaN anywhere gives NaN, so comparisons fail."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))
