"""`Tuning`: which TreeWY kernel runs each pass and its launch shape (`treewy.TUNING` holds the one in use)."""
from __future__ import annotations

from dataclasses import dataclass

# tf32x3 keeps float32 accuracy (~1e-7 relative) on the tensor cores; plain tf32 does not.
VERIFY_KINDS = ("fused", "blocked", "rows")
PRECISIONS = ("tf32x3", "bf16x3", "ieee")
COMMIT_KINDS = ("dot", "loop")


@dataclass(frozen=True)
class Tuning:
    """Which kernel runs each pass and its launch shape; the bench's variants mode times several.

    verify: "fused" (`_fused_kernel`: solve and state pass in one, 16-position tl.dot blocks),
    "blocked" (`_solve_kernel` + `_apply_kernel`) or "rows" (`_rows_kernel`, row by row);
    rows_max: trees of at most this many positions use "rows" whatever `verify` says.
    commit: "dot" (`_commit_dot_kernel`, the path in 16-node tl.dot blocks) or "loop"
    (`_state_kernel`, one rank-1 update per path node). pending (reconstruct_deferred): the
    previous commit in tl.dot blocks or one rank-1 update per node. pack: trees of at most 8
    positions multiply the state once, k and q rows in one tile (see `_fused_kernel`). prep:
    trees of at most 16 positions skip `_prep_kernel`, the fused verify doing its work. prec:
    see `_dot`. bv: state
    rows per program (pending_bv: the verify that applies a pending commit). stages:
    Triton's software pipelining of the block loops; 1 (none) by default: most trees are one
    block, and a deeper pipeline's shared-memory buffers cut the programs in flight per SM.
    """
    verify: str = "fused"
    # The variants run of 2026-12-01 18:56 (kernels_variants_2026-12-01-1856.csv, 35B-A3B, B = 128 / 64, float32): 64 state
    # rows per verify program cut reconstruct's verify by 17-20% at every tree ((1,1,1) 203.6 ->
    # 163.0 us, (3,3,3) 1,069 -> 876, chain 64 805 -> 666), but slow reconstruct_deferred's (its
    # verify also applies and writes the pending commit: (1,1,1) 338.8 -> 433.9), which keeps 32
    # (pending_bv). A 3-stage pipeline on the commit alone: (1,1,1) 192.9 -> 160.4 us, chain 16
    # 102.2 -> 86.9 (on the verify it costs 2-40%).
    verify_bv: int = 64
    pending_bv: int = 32
    verify_warps: int = 4
    verify_stages: int = 1
    rows_max: int = 0
    commit: str = "dot"
    commit_bv: int = 32
    commit_warps: int = 4
    commit_stages: int = 3
    pending: str = "dot"
    # Register caps (Triton's maxnreg; 0: the compiler's choice). ncu (PROFILE.md): 138 / 130
    # registers allow 3 programs of 4 warps per SM; <= 128 allows 4, <= 96 five. 128 is run 5's
    # fastest (kernels_variants_2026-12-01-1319.csv: 5,601 us summed over its eight cases; no cap 6,457, 96 6,740).
    verify_maxnreg: int = 128
    commit_maxnreg: int = 128
    # The fused verify of trees it runs in 16-position blocks (more than 8 positions, or pack off):
    # its own block, warps and register cap. ncu (results/calibration/h200/ncu/2026-12-01):
    # at 128 registers the block loop spills past L1 ((3,3,3) at B = 128 wrote 438 MB to DRAM for
    # 126 MB of u and o), and its 61 KB of shared memory allow 3 programs per SM anyway, so 4
    # programs' worth of registers bought nothing. Capped at 168 (3 programs of 4 warps): run 11's
    # variants (kernels_variants_2026-12-01-2117.csv, 35B-A3B) verify (3,3,3) at B = 128 875.8 -> 733.7 us,
    # chains at B = 64: 64 positions 660.5 -> 545.7, 16 positions 142.4 -> 134.6; no cap (2
    # programs) 2% slower summed, 32 rows or 8 warps slower.
    loop_bv: int = 64
    loop_warps: int = 4
    loop_maxnreg: int = 168
    # Defaults: the fastest tuning of the first H200 variants run
    # (results/calibration/h200/kernels_variants_2026-12-01-0944.csv).
    pack: bool = True
    prep: bool = True
    prec: str = "bf16x3"
    # Chains (every parent[t] = t - 1, declared by the caller) verify in recurrent form (`_chain_kernel`)
    # when `chain` and they have at most chain_max positions (replay: cache slots included) or, for the
    # verify that first applies a pending commit (reconstruct_deferred), chain_pending_max; chain_bv state
    # rows per program, chain_warps warps (fla's fused_recurrent shape, 8 x 1). The walk costs a few
    # float32 passes over the tile per position where the fused kernel's blocks run on the tensor cores.
    # H200, 35B-A3B, float32 state, B = 128 (kernels_variants_2026-12-02-1429.csv; T = 8 from
    # kernels_flashinfer_2026-12-02.csv against run11 of kernels.csv): the fused verify of (1,1,1) takes
    # 158.6 us, the chain walk 170.5, so the plain verify keeps the fused kernel (chain_max 0; at T = 8
    # 175.3 against 302.3); the deferred verify, whose fused form loads the pending path and the state in
    # series (PROFILE.md), takes 344.9 fused and 264.0 walking (1,1,1), but at T = 8 373.5 fused
    # against 405.9 walking: chain_pending_max 4.
    chain: bool = True
    chain_max: int = 0
    chain_pending_max: int = 4
    chain_bv: int = 8
    chain_warps: int = 1
    # chain_prefetch: chains of at most treewy.PREFETCH_MAX positions (and pending nodes) without cache
    # slots walk in `_chain_prefetch_kernel`, every load issued before the first store.
    chain_prefetch: bool = False
    # sparse: the fused verify's block loop skips ancestor-mask blocks with no ancestor (in BFS order a
    # wide tree's leaves fill its last blocks, and a leaf is nobody's ancestor) and the in-block solve of
    # a block of leaves; the same outputs. Off by default: timed only at (3,3,3), B = 128, where it cut
    # reconstruct's verify 745.9 -> 671.7 us (kernels_variants_2026-12-02-1429.csv); the run's budget
    # ended before its other cases, and the committed table prices the dense loop.
    sparse: bool = False

    def __post_init__(self) -> None:
        if self.verify not in VERIFY_KINDS:
            raise ValueError(f"Tuning.verify must be one of {', '.join(VERIFY_KINDS)}, got {self.verify!r}")
        if self.commit not in COMMIT_KINDS:
            raise ValueError(f"Tuning.commit must be one of {', '.join(COMMIT_KINDS)}, got {self.commit!r}")
        for name in ("verify_bv", "pending_bv", "commit_bv", "loop_bv"):
            bv = getattr(self, name)
            if bv < 16 or bv & (bv - 1):
                raise ValueError(f"Tuning.{name} must be a power of two >= 16, got {bv}")
        if self.prec not in PRECISIONS:
            raise ValueError(f"Tuning.prec must be one of {', '.join(PRECISIONS)} (plain tf32 loses float32 "
                             f"accuracy), got {self.prec!r}")
        for name in ("verify_maxnreg", "commit_maxnreg", "loop_maxnreg"):
            r = getattr(self, name)
            if r and not 24 <= r <= 255:
                raise ValueError(f"Tuning.{name} must be 0 (compiler's choice) or 24..255 registers, got {r}")
        if self.chain_max < 0 or self.chain_pending_max < 0:
            raise ValueError(f"Tuning.chain_max and chain_pending_max must be >= 0 positions, got "
                             f"{self.chain_max}, {self.chain_pending_max}")
        if self.chain_bv < 4 or self.chain_bv & (self.chain_bv - 1):
            raise ValueError(f"Tuning.chain_bv must be a power of two >= 4, got {self.chain_bv}")
        if self.pending not in ("dot", "loop"):
            raise ValueError(f"Tuning.pending must be dot or loop, got {self.pending!r}")

    @property
    def dot_prec(self) -> str:
        """tl.dot's input_precision for the kernels without `_dot` (bf16x3 is `_dot`'s own)."""
        return "tf32x3" if self.prec == "bf16x3" else self.prec

    @classmethod
    def parse(cls, text: str) -> "Tuning":
        """"verify=fused,verify_bv=16,commit=loop" (fields not named keep their defaults)."""
        kw: dict[str, object] = {}
        names = {f: type(getattr(cls(), f)) for f in cls.__dataclass_fields__}
        for item in filter(None, (x.strip() for x in text.split(","))):
            key, _, val = item.partition("=")
            if key not in names:
                raise ValueError(f"unknown tuning field {key!r}; valid: {', '.join(names)}")
            if names[key] is bool:
                if val.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(f"tuning field {key} takes true or false, got {val!r}")
                kw[key] = val.lower() in ("true", "1")
            else:
                kw[key] = names[key](val)
        return cls(**kw)

    def launch(self, maxnreg: int) -> dict[str, int]:
        """Launch options for a register cap (none at 0: older Tritons lack the option)."""
        return {"maxnreg": maxnreg} if maxnreg else {}

    def label(self) -> str:
        return ",".join(f"{f}={getattr(self, f)}" for f in self.__dataclass_fields__)
