"""What the kernel benchmark measures: models, batches, trees, policies, and the bytes each call must move."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from core.config import load_model, model_names
from policies.kernels.inputs import chain, full


# GDN_BENCH_REHEARSAL=1 on a machine without a GPU (with TRITON_INTERPRET=1): the same command
# end to end at toy sizes on the CPU (wall-clock timings, no graphs), so a GPU run cannot
# fail on a typo. Its numbers mean nothing.
REHEARSAL = os.environ.get("GDN_BENCH_REHEARSAL") == "1" and not torch.cuda.is_available()
DEVICE = "cpu" if REHEARSAL else "cuda"
D = 16 if REHEARSAL else 128  # head dim (d_k = d_v) of both models
# Per GDN layer on one GPU: (q/k heads, v heads) of every model config whose heads are D wide, at its
# tensor-parallel shard (the 397B at TP 8: 16/8 q/k heads, 64/8 v heads).
MODELS = {m.name: (m.gdn.num_k_heads // m.tensor_parallel, m.gdn.num_v_heads // m.tensor_parallel)
          for m in map(load_model, model_names()) if m.gdn.head_k_dim == m.gdn.head_v_dim == 128}
STUDY_MODELS = ("qwen3.5-35b-a3b", "qwen3.5-397b-a17b")  # the main table's default models
BATCHES = (1, 8, 32, 64, 128, 256)
KERNELS_B = 64                # batch of the kernel-by-kernel table
if REHEARSAL:
    MODELS = {m: (1, 2) if m == "qwen3.5-35b-a3b" else (1, 1) for m in MODELS}
    BATCHES = (1, 64, 128)
    KERNELS_B = 2
TREES = {"1,1,1": (1, 1, 1), "1,1,1,1,1,1,1": (1,) * 7, "2,2,2": (2, 2, 2), "3,3,3": (3, 3, 3),
         "4,4,4": (4, 4, 4)}
CHAINS = (2, 16, 32, 64)      # extra chains (positions T), beside (1,1,1) = 4 and (1,)*7 = 8
# "none": no speculation, one token a step (bench_fla.none_rows: the kernel vLLM runs for it).
POLICIES = ("store_all", "reconstruct", "replay", "reconstruct_deferred", "none")
# Policies whose verify takes `chain` (the recurrent verify of chains; the bench verifies with check=False,
# so it says which trees are chains).
CHAIN_POLICIES = ("reconstruct", "reconstruct_deferred", "replay")
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# --reference-store-all: store_all timed beside a filtered run at these (model, tree, B)
STORE_ALL_REFERENCE = {("qwen3.5-35b-a3b", "1,1,1", 64), ("qwen3.5-35b-a3b", "1,1,1", 128),
                       ("qwen3.5-35b-a3b", "3,3,3", 128)}
if REHEARSAL:
    STORE_ALL_REFERENCE = {("qwen3.5-35b-a3b", "1,1,1", 2), ("qwen3.5-35b-a3b", "1,1,1", 3)}
FLUSH_INTERVAL = 4            # replay's m: flush every 4th commit
COLD_BYTES = 1 if REHEARSAL else 512 << 20  # distinct buffers per graph, so L2 (60 MB) starts cold
MAX_COPIES = 128              # at B = 1 that is still 80-320 MB of distinct buffers
MAX_FOOTPRINT = 40 << 30      # one call's buffers; larger cases are skipped (listed in provenance)
FIELDS = ["model", "policy", "B", "T", "tree", "depth", "replayed_tokens", "flush", "mode", "verify_us",
          "commit_us", "total_us", "verify_bytes", "commit_bytes", "bytes", "gbs", "pct_of_copy_bw",
          "extra_mem_bytes", "copies", "state_dtype"]


@dataclass(frozen=True)
class Case:
    model: str
    hk: int
    hv: int
    B: int
    tree: str
    parents: tuple[int, ...]
    state_dtype: str = "float32"

    @property
    def T(self) -> int:
        return len(self.parents)

    @property
    def is_chain(self) -> bool:
        """Every position's parent is the one before (the recurrent-form verify's trees)."""
        return all(p == t - 1 for t, p in enumerate(self.parents))

    @property
    def depth(self) -> int:
        d = [0] * self.T
        for t in range(1, self.T):
            d[t] = d[self.parents[t]] + 1
        return max(d)


def cases(quick: bool, dtypes: tuple[str, ...] = ("float32",), batches: tuple[int, ...] = BATCHES,
          models: tuple[str, ...] = STUDY_MODELS) -> list[Case]:
    """Batches in the order given (smallest first by default), the models and state dtypes per
    batch: a run cut by --budget-s loses the last B. Quick: B = 128 (the targets) before B = 1."""
    return [dataclasses.replace(c, state_dtype=d) for c in _cases(quick, batches, models) for d in dtypes]


def _cases(quick: bool, batches: tuple[int, ...], models: tuple[str, ...]) -> list[Case]:
    out = []
    for B in ((128, 1) if quick else batches):
        if REHEARSAL and B > 2:
            B = 2 if B == 64 else 3  # toy batches; keep 64 and 128 apart for the store_all reference

        for model, (hk, hv) in MODELS.items():
            if model not in models or (quick and model != "qwen3.5-35b-a3b"):
                continue
            for name, w in TREES.items():
                if quick and name not in ("1,1,1", "3,3,3"):
                    continue
                out.append(Case(model, hk, hv, B, name, tuple(full(w))))
            for T in (() if quick else CHAINS):
                out.append(Case(model, hk, hv, B, "chain", tuple(chain(T))))
    return out


def none_cases(dtypes: tuple[str, ...], batches: tuple[int, ...], models: tuple[str, ...]) -> list[Case]:
    """The no-speculation baseline's cases: one token (T = 1, no tree), in `cases`' order."""
    out = []
    for B in batches:
        if REHEARSAL and B > 2:
            B = 2 if B == 64 else 3
        out += [Case(m, hk, hv, B, "", (-1,), d) for m, (hk, hv) in MODELS.items() if m in models for d in dtypes]
    return out


def sizes(c: Case) -> dict[str, int]:
    return dict(S=c.B * c.hv * D * D * STATE_DTYPES[c.state_dtype].itemsize,
                inp=c.B * c.T * (2 * c.hk * D * 2 + c.hv * D * 2 + 2 * c.hv * 4),  # bf16 q,k,v; f32 g,beta
                o=c.B * c.T * c.hv * D * 2, u=c.B * c.T * c.hv * D * 4,
                path_uk=c.B * (c.depth + 1) * (c.hv * D * 4 + c.hk * D * 2))


def policy_bytes(c: Case, policy: str, replayed: int, flush: bool) -> tuple[int, int]:
    s = sizes(c)
    if policy == "none":  # the decode step reads the state and writes it back, nothing to commit
        return 2 * s["S"] + s["inp"] + s["o"], 0
    if policy == "store_all":
        return s["S"] * (1 + c.T) + s["inp"] + s["o"], 2 * s["S"]
    if policy == "reconstruct":
        return s["S"] + s["inp"] + s["o"] + s["u"], 2 * s["S"] + s["path_uk"]
    if policy == "reconstruct_deferred":  # verify: the previous commit's write and its pending path
        return 2 * s["S"] + s["path_uk"] + s["inp"] + s["o"] + s["u"], 2 * s["path_uk"]
    per_tok_cache = c.B * (c.hk * D * 2 + c.hv * D * 2 + 2 * c.hv * 4)
    per_tok_u = c.B * c.hv * D * 4
    verify = s["S"] + s["inp"] + replayed * per_tok_cache + s["o"] + s["u"] + replayed * per_tok_u
    if flush:
        commit = 2 * s["S"] + s["path_uk"] + replayed * c.B * (c.hv * D * 4 + c.hk * D * 2)
    else:
        commit = 2 * (c.depth + 1) * per_tok_cache
    return verify, commit
