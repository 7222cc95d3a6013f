"""FlashInfer's GDN speculative-decoding kernels (CuTe DSL, flashinfer-python 0.7.2) timed beside ours.

    python3 -m policies.kernels.bench_flashinfer --out DIR [--T 4,8] [--B 128] [--tuning ...]
        [--time-budget-s 90]

Those whose sources say they run on SM90, at the 35B-A3B shapes (16 q/k heads, 32 v heads,
d = 128), chains of T positions, each call on its own buffers (cold L2), CUDA-graph timing:
- `gated_delta_rule_mtp` (flashinfer.gdn_decode; float32 state, [pool, Hv, V, K]) three ways:
  `mtp_output_only` (disable_state_update: reconstruct's verify, the state read once),
  `mtp_final_state` (the state read and written once: fla's recurrence, our deferred step) and
  `mtp_all_states` (every position's state into intermediate_states_buffer: store_all's verify);
- `gdn_decode_bf16_wy_output_only.gated_delta_rule_mtp` (`wy_output_only`, bfloat16 state, WY form);
- `gdn_decode_bf16_wy_ucache.gated_delta_rule_mtp_ucache` (`ucache_verify`: ReplaySSM's verify,
  state read-only, a 16-slot ring of hist_len cached (k, u, g) read and T appended) and
  `..._ucache_flush` (`ucache_flush`: one kernel that appends below flush_min and folds the
  ring into the state at or above it), at each fill of a flush cycle.
FlashInfer takes the raw gates (a, b, A_log, dt_bias) and L2-normalises q and k in the kernel, as
vLLM calls it; ours take g and beta. Beside them, ours at the same shapes (store_all, reconstruct,
reconstruct_deferred, replay) through the main bench's `run_policy`, and the copy rate of the same
run. Each FlashInfer kernel's outputs are checked against the float64 recurrence (column rel_err_o).
Writes flashinfer.csv and flashinfer_provenance.json.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import importlib.metadata
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from policies.kernels import reference, treewy
from policies.kernels.bench_cases import COLD_BYTES, D, MODELS, Case
from policies.kernels.bench_policy import run_policy
from policies.kernels.bench_timing import copy_bandwidth, recover, time_graph
from policies.kernels.inputs import chain, rel_err
from policies.kernels.tuning import Tuning

MODEL = "qwen3.5-35b-a3b"
# kind -> (module, function, state dtype, what of ours it stands beside)
KINDS = {  # in the order timed: a run cut by its budget loses the last
    "ucache_flush": ("flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache_flush", "gated_delta_rule_mtp_ucache_flush",
                     torch.bfloat16, "replay verify + append or flush"),
    "wy_output_only": ("flashinfer.gdn_kernels.gdn_decode_bf16_wy_output_only", "gated_delta_rule_mtp",
                       torch.bfloat16, "reconstruct verify"),
    "mtp_final_state": ("flashinfer.gdn_decode", "gated_delta_rule_mtp", torch.float32,
                        "reconstruct_deferred verify + commit (one state read and write)"),
    "mtp_output_only": ("flashinfer.gdn_decode", "gated_delta_rule_mtp", torch.float32, "reconstruct verify"),
    "mtp_all_states": ("flashinfer.gdn_decode", "gated_delta_rule_mtp", torch.float32, "store_all verify"),
    "ucache_verify": ("flashinfer.gdn_kernels.gdn_decode_bf16_wy_ucache", "gated_delta_rule_mtp_ucache",
                      torch.bfloat16, "replay verify + append"),
}
VERIFY_RING = 16   # the verify-only kernel's ring (W_RING); hist_len + T <= 16
FLUSH_RING = 32    # the flush kernel's rotating ring (RING_SLOTS)
FLUSH_INTERVAL = 4  # as our replay's bench: a flush every 4th step, so hist_len runs 0, T, 2T, 3T
FIELDS = ["source", "kernel", "stands_beside", "B", "T", "state_dtype", "hist_len", "flush", "us", "bytes",
          "pct_of_copy_bw", "rel_err_o", "mode", "copies"]


def load(kind: str) -> Callable | str:
    """The FlashInfer function of `kind`, or why not (not installed, its libraries failing to load)."""
    mod, fn, _, _ = KINDS[kind]
    try:
        return getattr(importlib.import_module(mod), fn)
    except Exception as exc:  # ImportError, or the DSL's own errors when its libraries do not load
        return f"{type(exc).__name__}: {exc}"


def flush_min(T: int) -> int:
    """The flush kernel's threshold: our bench's flush interval (a flush when 3 steps are cached),
    within its legal range (at most W_RING - T + 1: the ring must hold the next T)."""
    return max(1, min((FLUSH_INTERVAL - 1) * T, VERIFY_RING - T + 1))


def hist_lens(kind: str, T: int) -> tuple[int, ...]:
    """The ring fills a kind is timed at, steps of T accepted tokens: the verify kernel's while
    the ring holds T more; the flush kernel's up to and including its first flush (a cycle)."""
    if kind == "ucache_verify":
        return tuple(range(0, VERIFY_RING - T + 1, T))
    if kind == "ucache_flush":
        fm = flush_min(T)
        return tuple(range(0, fm, T)) + (T * math.ceil(fm / T),)
    return (0,)


def make_args(kind: str, B: int, T: int, hist_len: int = 0, seed: int = 0, device: str = "cuda",
              hk: int | None = None, hv: int | None = None) -> dict:
    """One call's keyword arguments (fresh buffers: a copy of its own). Gates as a model has them
    (A_log, dt_bias per head; a, b per token), q and k unnormalised (the kernel normalises),
    rings filled with `hist_len` random entries (keys unit-norm, log-decays cumulative)."""
    hk, hv = (hk, hv) if hk else MODELS[MODEL]
    _, _, sdt, _ = KINDS[kind]
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, generator=gen) * scale)

    x = dict(q=rnd(B, T, hk, D).bfloat16(), k=rnd(B, T, hk, D).bfloat16(), v=rnd(B, T, hv, D).bfloat16(),
             a=rnd(B, T, hv).bfloat16(), b=rnd(B, T, hv).bfloat16(),
             # bf16-exact: the WY kernels read both as bf16, the MTP kernel as float32
             A_log=(torch.rand(hv, device=device, generator=gen) * 2 - 2).bfloat16().float(),
             dt_bias=rnd(hv, scale=0.5).bfloat16().float())
    state = rnd(B, hv, D, D, scale=0.05).to(sdt)
    idx = torch.arange(B, dtype=torch.int32, device=device)
    if kind.startswith("mtp_"):
        x.update(initial_state=state, initial_state_indices=idx, use_qk_l2norm=True,
                 output=torch.empty(B, T, hv, D, dtype=torch.bfloat16, device=device),
                 disable_state_update=kind != "mtp_final_state")
        if kind == "mtp_all_states":
            x["intermediate_states_buffer"] = torch.empty(B, T, hv, D, D, dtype=torch.float32, device=device)
        return x
    x.update(initial_state_source=state, initial_state_indices=idx, use_qk_l2norm_in_kernel=True)
    if kind == "wy_output_only":
        return x
    slots = VERIFY_RING if kind == "ucache_verify" else FLUSH_RING
    kc = torch.zeros(B, hk, slots, D, dtype=torch.bfloat16, device=device)
    uc = torch.zeros(B, hv, slots, D, dtype=torch.bfloat16, device=device)
    gc_ = torch.zeros(B, hv, slots, dtype=torch.float32, device=device)
    if hist_len:
        kc[:, :, :hist_len] = torch.nn.functional.normalize(rnd(B, hk, hist_len, D), dim=-1).bfloat16()
        uc[:, :, :hist_len] = rnd(B, hv, hist_len, D, scale=0.1).bfloat16()
        gc_[:, :, :hist_len] = -torch.rand(B, hv, hist_len, device=device, generator=gen).cumsum(-1) * 0.1
    x.update(k_cache=kc, u_cache=uc, g_cache=gc_, hist_len=torch.full((B,), hist_len, dtype=torch.int32, device=device))
    if kind == "ucache_flush":
        x.update(cache_base=torch.zeros(B, dtype=torch.int32, device=device),
                 flush_min=flush_min(T), restart_hist_on_flush=False)
    return x


def flushes(kind: str, T: int, hist_len: int) -> bool:
    return kind == "ucache_flush" and hist_len >= flush_min(T)


def nbytes(kind: str, B: int, T: int, hist_len: int = 0, hk: int | None = None, hv: int | None = None) -> int:
    """Bytes a call must move: the state (read; written by mtp_final_state and a flush), every
    position's float32 state (mtp_all_states), q, k, v, a, b, the output, the ring entries read
    (hist_len) and appended (T)."""
    hk, hv = (hk, hv) if hk else MODELS[MODEL]
    s = B * hv * D * D * KINDS[kind][2].itemsize
    inp = B * T * (2 * hk * D * 2 + hv * D * 2 + 2 * hv * 2)
    o = B * T * hv * D * 2
    per_entry = B * (hk * D * 2 + hv * D * 2 + hv * 4)
    total = s + inp + o
    if kind == "mtp_final_state" or flushes(kind, T, hist_len):
        total += s
    if kind == "mtp_all_states":
        total += B * T * hv * D * D * 4
    if kind.startswith("ucache"):
        total += (hist_len + T) * per_entry
    return total


def reference_output(kind: str, x: dict, rows: int = 4) -> torch.Tensor:
    """The float64 recurrence on the first `rows` requests with FlashInfer's gates and norms (hist_len 0)."""
    st = x.get("initial_state", x.get("initial_state_source"))[:rows]
    q, k = (torch.nn.functional.normalize(x[n][:rows].double(), dim=-1) for n in ("q", "k"))
    g = -x["A_log"].double().exp() * torch.nn.functional.softplus(x["a"][:rows].double() + x["dt_bias"].double())
    beta = torch.sigmoid(x["b"][:rows].double())
    T = q.shape[1]
    parent = torch.tensor(chain(T), dtype=torch.int32, device=q.device).expand(rows, T).contiguous()
    o, _ = reference.recurrence(q * D ** -0.5, k, x["v"][:rows].double(), g, beta, parent, st.double())
    return o


def _time(calls: list[Callable[[], object]]) -> tuple[float, str]:
    """Graph timing; eager back-to-back launches between two events where a call cannot be captured."""
    try:
        return time_graph(calls), "graph"
    except Exception as exc:  # a wrapper that synchronises or allocates outside the pool
        print(f"  (graph capture failed: {type(exc).__name__}: {str(exc)[:200]}; timing eager)", flush=True)
        recover()
    for f in calls:
        f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for f in calls:
        f()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3 / len(calls), "eager"


def flashinfer_rows(kind: str, fn: Callable, B: int, T: int, copy_bw: float) -> list[dict]:
    rows = []
    for p in hist_lens(kind, T):
        n = nbytes(kind, B, T, p)
        copies = max(2, math.ceil(COLD_BYTES / n))
        xs = [make_args(kind, B, T, p, seed=s) for s in range(copies)]
        err = ""
        if p == 0:
            ref = reference_output(kind, xs[0])  # before the call: it may write its state or ring
            out = fn(**xs[0])
            out = out[0] if isinstance(out, tuple) else out
            err = rel_err(out[:4].double(), ref)
            xs[0] = make_args(kind, B, T, p, seed=0)
        us, mode = _time([lambda x=x: fn(**x) for x in xs])
        rows.append(dict(source="flashinfer", kernel=kind, stands_beside=KINDS[kind][3], B=B, T=T,
                         state_dtype=str(KINDS[kind][2]).removeprefix("torch."), hist_len=p,
                         flush=int(flushes(kind, T, p)), us=round(us, 2), bytes=n,
                         pct_of_copy_bw=round(100 * n / (us * 1e-6) / copy_bw, 1),
                         rel_err_o=f"{err:.1e}" if err != "" else "", mode=mode, copies=copies))
        print(f"flashinfer {kind:16} B={B} T={T} hist_len={p:<2} {us:8.1f} us {rows[-1]['pct_of_copy_bw']:5.1f}% "
              f"of copy ({mode}) rel_err_o {rows[-1]['rel_err_o']}", flush=True)
        del xs
        recover()
    return rows


def our_rows(B: int, T: int, dtype: str, copy_bw: float) -> list[dict]:
    hk, hv = MODELS[MODEL]
    c = Case(MODEL, hk, hv, B, "chain" if T not in (4, 8) else ("1,1,1" if T == 4 else "1,1,1,1,1,1,1"),
             tuple(chain(T)), dtype)
    rows = []
    full = (FLUSH_INTERVAL - 1) * T
    for policy, replayed, flush in (("store_all", 0, True), ("reconstruct", 0, True), ("reconstruct_deferred", 0, True),
                                    ("replay", 0, True), ("replay", full, False), ("replay", full, True)):
        for r in run_policy(c, policy, replayed, flush, copy_bw, modes=("graph",)):
            for part, us, n in (("verify", r["verify_us"], r["verify_bytes"]), ("commit", r["commit_us"], r["commit_bytes"]),
                                ("total", r["total_us"], r["bytes"])):
                rows.append(dict(source="ours", kernel=f"{policy} {part}", stands_beside="", B=B, T=T, state_dtype=dtype,
                                 hist_len=replayed, flush=int(flush), us=us, bytes=n,
                                 pct_of_copy_bw=round(100 * n / (us * 1e-6) / copy_bw, 1), rel_err_o="",
                                 mode="graph", copies=r["copies"]))
            print(f"ours {policy:20} B={B} T={T} {dtype:8} cached={replayed:<2} flush={int(flush)} verify "
                  f"{r['verify_us']:8.1f} commit {r['commit_us']:7.1f} total {r['total_us']:8.1f} us", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m policies.kernels.bench_flashinfer", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--T", default="4,8", help="comma-separated chain lengths (FlashInfer's WY kernels: 4 or 8)")
    ap.add_argument("--B", type=int, default=128)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {','.join(KINDS)}")
    ap.add_argument("--tuning", default="", help="our kernels' tuning (fields of Tuning), as the main bench's")
    ap.add_argument("--time-budget-s", type=float, default=0.0, help="start no new kernel after this (0: no limit)")
    ap.add_argument("--git-commit", default=os.environ.get("GIT_COMMIT", "unknown"))
    a = ap.parse_args(argv)
    try:
        Ts = tuple(int(t) for t in a.T.split(",") if t.strip())
        kinds = tuple(k for k in a.kinds.split(",") if k)
        treewy.TUNING = Tuning.parse(a.tuning) if a.tuning else treewy.TUNING
    except (ValueError, TypeError) as exc:
        ap.error(str(exc))
    if not Ts or any(k not in KINDS for k in kinds):
        ap.error(f"--kinds takes a comma-separated subset of {','.join(KINDS)}; --T a list of lengths")
    if not torch.cuda.is_available():
        print("bench_flashinfer: needs a CUDA GPU (run it through the device tool)", file=sys.stderr)
        return 2
    t0 = time.time()
    deadline = t0 + a.time_budget_s if a.time_budget_s else math.inf
    a.out.mkdir(parents=True, exist_ok=True)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.3f} TB/s", flush=True)
    prov = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, git_commit=a.git_commit,
                command=" ".join(["python3", "-m", "policies.kernels.bench_flashinfer",
                                  *(sys.argv[1:] if argv is None else argv)]),
                tuning=treewy.TUNING.label(), copy_bw_bytes_per_s=copy_bw, model=MODEL, B=a.B, T=list(Ts),
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), unavailable={}, failed={}, skipped=[])
    try:
        prov["flashinfer"] = importlib.metadata.version("flashinfer-python")
    except Exception:
        prov["flashinfer"] = "unknown"
    rows: list[dict] = []
    # per T: ours first (compiled by the main bench on a warm machine), then FlashInfer's (compiled here)
    plan = [p for T in Ts for p in [("ours", T, "float32"), ("ours", T, "bfloat16")] + [(k, T, None) for k in kinds]]
    for what, T, dtype in plan:
        if time.time() > deadline:
            prov["skipped"].append(f"{what} T={T} {dtype or ''}: not run (time budget)")
            continue
        try:
            if what == "ours":
                rows += our_rows(a.B, T, dtype, copy_bw)
            else:
                fn = load(what)
                if isinstance(fn, str):
                    prov["unavailable"][what] = fn
                    print(f"flashinfer {what}: unavailable: {fn}", flush=True)
                    continue
                rows += flashinfer_rows(what, fn, a.B, T, copy_bw)
        except Exception as exc:  # one kernel failing must not lose the others
            prov["failed"][f"{what} T={T}"] = f"{type(exc).__name__}: {exc}"
            print(f"FAILED {what} T={T}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}", flush=True)
            recover()
        with (a.out / "flashinfer.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
        prov["wall_s"] = round(time.time() - t0, 1)
        (a.out / "flashinfer_provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
