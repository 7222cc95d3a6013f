"""`specsim calibrate {measure,merge,validate,replay}`.

  measure   time the layer tables, memory and whole-step check on this machine's GPU
            (`make calibrate GPU_PY=python3`): one command recalibrates a GPU
  merge     copy a measurement directory (e.g. one fetched from the device machine)
            into results/calibration/<gpu>/, appending its provenance; a table's rows of
            modes the new run did not measure (--modes graph) stay from the earlier run
  validate  held-out interpolation error and whole-step error of the latency model
  replay    execute the steps of simulator runs (steps.csv) with the whole model on this
            machine's GPU; measured vs predicted step times, and the host costs (host.csv)
"""
from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import shutil
import tarfile
from pathlib import Path

from calibrate.device import provenance
from calibrate.tables.grid import ALL_JOBS, GRIDS, jobs_for_part
from core.config import REPO_ROOT, ConfigError, load_hardware, load_model, load_policy, model_names
from core.files import atomic_write_text
from core.tables import TABLES


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    m = sub.add_parser("measure", help="time layers on this machine's GPU")
    m.add_argument("--gpu", required=True, help="hardware config name (e.g. h200); tables go to its calibration_dir")
    m.add_argument("--model", action="append", help="model config name (repeatable; default: all)")
    m.add_argument("--quick", action="store_true", help="the smoke grid (--grid quick)")
    m.add_argument("--grid", default=None, choices=tuple(GRIDS),
                   help="shapes to time: full (1.5x steps), coarse (2x steps, about half the time) or quick (a smoke run)")
    m.add_argument("--part", type=int, default=None, help="measure one part of the jobs (1, 2 or 3), to split GPU runs")
    m.add_argument("--jobs", default=None, help="comma-separated jobs instead of --part")
    m.add_argument("--out", type=Path, default=None, help="output root (default: the GPU's calibration_dir)")
    m.add_argument("--device", default="cuda")
    m.add_argument("--modes", default="graph,eager")
    m.add_argument("--git-commit", default=None, help="commit of the measured tree (default: git rev-parse HEAD)")
    m.add_argument("--time-budget-s", type=float, default=None, help="skip jobs that would start after this many seconds")
    m.add_argument("--step-policy", default="store_all", help="policy kernel run inside the whole-step check")
    m.add_argument("--tar", type=Path, default=None, help="also write the output root as this .tar.gz after every job")
    m.add_argument("--attn-backend", default="triton", choices=("triton", "fa4", "auto"),
                   help="attention cores' kernel: our Triton paged kernel, flash-attn-4's paged forward (vLLM "
                        "runs FlashAttention 3 in the same layout), or fa4 where it imports")
    m.add_argument("--fp8-gemm", default="auto", choices=("torch", "triton", "auto"),
                   help="a block-FP8 checkpoint's projections: torch's block-wise scaled_mm (cuBLASLt, vLLM's "
                        "CUTLASS stand-in), our Triton GEMM, or torch's where it passes its check here")

    g = sub.add_parser("merge", help="copy measured tables into results/calibration/<gpu>/")
    g.add_argument("--gpu", required=True)
    g.add_argument("--src", type=Path, required=True, help="a measurement root (holding <model>/) or a .tar.gz of one")
    g.add_argument("--device-time-s", type=float, default=None, help="device time the measuring call used (from the device tool)")
    g.add_argument("--faster-of", default="", metavar="TABLES",
                   help="comma list of tables (e.g. attn_decode,attn_prefill) that --src measured with another "
                        "stand-in for the same vLLM kernel on the folder's grid: each shape keeps the faster row, "
                        "its `kernel` column says which (calibrate/tables/merge_faster.py)")

    v = sub.add_parser("validate", help="held-out interpolation error and whole-step error")
    v.add_argument("--gpu", required=True)
    v.add_argument("--model", action="append", help="default: every model with tables")
    v.add_argument("--holdout", type=float, default=0.2)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--json", action="store_true")

    r = sub.add_parser("replay", help="execute traced simulator steps on this GPU: measured vs predicted")
    r.add_argument("--steps", type=Path, action="append", default=[],
                   help="RUN/steps.csv from `specsim run --trace-steps` (repeatable; one model per call)")
    r.add_argument("--gpu", required=True, help="hardware config name (e.g. h200)")
    r.add_argument("--out", type=Path, default=None, help="output root (default: the GPU's calibration_dir)")
    r.add_argument("--smoke", action="store_true", help="2-layer model on synthetic steps of every kind (< 60 s)")
    r.add_argument("--max-steps", type=int, default=None, help="at most this many steps in all, spread over each run")
    r.add_argument("--time-budget-s", type=float, default=None, help="stop replaying steps after this many seconds")
    r.add_argument("--reps", type=int, default=3, help="timed runs per step (median reported)")
    r.add_argument("--passes", type=int, default=1,
                   help="times each picked step is measured, in passes over them all minutes apart; the summary "
                        "compares a step's fastest pass (as host.csv keeps each point's lowest pass)")
    r.add_argument("--step-kinds", default="",
                   help="comma list of step kinds to replay (uniform_decode, mixed_graph, mixed_eager, "
                        "prefill_only; default: every kind)")
    r.add_argument("--warmup", type=int, default=1, help="untimed runs per step first (graph capture, autotune)")
    r.add_argument("--mode", default="vllm", help="vllm (FULL/PIECEWISE/eager by vLLM's rule), eager, or graph")
    r.add_argument("--kv-pool-gb", type=float, default=24.0, help="cap on the paged KV pool")
    r.add_argument("--no-host", action="store_true",
                   help="skip the host-cost measurements (host.csv, host_policies.csv)")
    r.add_argument("--host-only", action="store_true",
                   help="measure the host tables alone (host.csv, host_policies.csv): no check, no steps")
    r.add_argument("--host-policies", default="",
                   help="comma list of policy configs host_policies.csv measures (default: every one of the "
                        "executor's step shape)")
    r.add_argument("--pin-cpu", type=int, default=None, metavar="CPU",
                   help="run the replay's thread on this CPU alone (host-bound steps drift less)")
    r.add_argument("--model", default=None, help="--smoke without --steps: model config name")
    r.add_argument("--policy", default="store_all", help="--smoke without --steps: policy config name")
    r.add_argument("--device", default="cuda")
    r.add_argument("--git-commit", default=None)
    r.add_argument("--resume", type=Path, default=None, metavar="DIR",
                   help="a previous replay's <out>/<model> folder: its rows are kept and its steps not replayed "
                        "again (its provenance parts are carried over)")
    r.add_argument("--fit-host", action="store_true",
                   help="with --summarize: first fit DIR/host_fit.json (host-op group scales, calibrate.replay.host_fit) "
                        "to DIR/replay_steps.csv, then re-price with it")
    r.add_argument("--summarize", type=Path, default=None, metavar="DIR",
                   help="no GPU: re-price DIR/replay_steps.csv with today's latency model (and the old eager "
                        "sum) from the --steps files, and rewrite DIR/replay_summary.json")


def _calib_root(gpu: str) -> Path:
    hw = load_hardware(gpu)
    if hw.derived or not hw.calibration_dir:
        raise ConfigError(f"hardware {gpu!r} is derived from {hw.derived_from!r}: calibrate that GPU instead")
    return REPO_ROOT / hw.calibration_dir


def _models(names: list[str] | None) -> list[str]:
    names = names or model_names()
    for n in names:
        load_model(n)  # a ConfigError names the valid models
    return names


def _measure(args: argparse.Namespace) -> int:
    from calibrate.tables.run import measure

    hw = load_hardware(args.gpu)
    out = args.out or _calib_root(args.gpu)
    try:
        jobs = tuple(j.strip() for j in args.jobs.split(",")) if args.jobs else jobs_for_part(args.part)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    bad = [j for j in jobs if j not in ALL_JOBS]
    if bad:
        raise ConfigError(f"--jobs: unknown {bad}; valid: {', '.join(ALL_JOBS)}")
    modes = tuple(m.strip() for m in args.modes.split(","))
    if not modes or any(m not in ("graph", "eager") for m in modes):
        raise ConfigError(f"--modes must be a comma-separated subset of graph,eager; got {args.modes!r}")

    def tar() -> None:
        if args.tar:  # whole or not at all: a call cut off while it writes keeps the previous one
            tmp = args.tar.with_name(f".{args.tar.name}.tmp")
            with tarfile.open(tmp, "w:gz") as t:
                t.add(out, arcname="calibration")
            os.replace(tmp, args.tar)
    rc = 0
    for name in _models(args.model):
        rc |= measure(load_model(name), hw, jobs, out, quick=args.quick, device=args.device, modes=modes,
                      grid=GRIDS[args.grid or ("quick" if args.quick else "full")],
                      commit=args.git_commit or provenance.git_commit(), time_budget_s=args.time_budget_s,
                      step_policy=args.step_policy, attn_backend=args.attn_backend, fp8_gemm=args.fp8_gemm,
                      on_job_done=tar)
    return rc


def _merge(args: argparse.Namespace) -> int:
    root = _calib_root(args.gpu)
    src = args.src
    if src.suffix == ".gz":
        dest = Path("/tmp") / f"calib-merge-{src.stem}"
        shutil.rmtree(dest, ignore_errors=True)
        with tarfile.open(src) as t:
            t.extractall(dest, filter="data")
        src = dest / "calibration"
    faster = {t.strip() for t in args.faster_of.split(",") if t.strip()}
    if faster - set(TABLES):
        raise ConfigError(f"--faster-of: unknown tables {sorted(faster - set(TABLES))}; valid: {', '.join(TABLES)}")
    mdirs = [d for d in sorted(src.iterdir()) if d.is_dir() and (d / "provenance.json").exists()]
    if not mdirs:
        raise ConfigError(f"--src {args.src}: no <model>/provenance.json inside")
    summary = provenance.read(root / "provenance.json")
    for d in mdirs:
        load_model(d.name)
        target = root / d.name
        target.mkdir(parents=True, exist_ok=True)
        new = provenance.read(d / "provenance.json")
        old = provenance.read(target / "provenance.json")
        new_modes = {m for part in new.get("parts", []) for m in part.get("modes", [])}
        kept: dict[str, list[str]] = {}
        kept_ops: dict[str, list[str]] = {}
        faster_of: dict[str, dict] = {}
        for f in d.iterdir():
            if f.stem in faster and (target / f.name).exists():
                taken = _merge_faster(f, target / f.name, new_modes, old.get("parts", []), new.get("parts", []))
                faster_of[f.name] = {"rows_from_this_part": taken}
            elif f.suffix == ".csv" and (target / f.name).exists():
                by, values = _merge_csv(f, target / f.name, new_modes)
                if values:
                    (kept if by == "mode" else kept_ops)[f.name] = values
            elif f.suffix in (".csv",) or f.name in ("memory.json", "replay_summary.json", "replay_check.json",
                                                     "profile_peak.json", "kernels_provenance.json"):
                shutil.copy2(f, target / f.name)
        for part in new.get("parts", []):
            if args.device_time_s:  # the whole GPU run's time (machine start included), shared by its models
                part["device_time_s"] = args.device_time_s
            if kept:  # rows of modes this run did not measure stay, from the earlier parts
                part["kept_rows_from_earlier_parts"] = kept
            if kept_ops:  # host ops this run did not measure stay, from the earlier parts
                part["kept_ops_from_earlier_parts"] = kept_ops
            if faster_of:  # shapes this stand-in timed faster than the folder's (the rest stay)
                part["faster_of"] = faster_of
        for part in old.get("parts", []):
            for name, modes in kept.items():
                if name.removesuffix(".csv") in part.get("jobs", {}):
                    rows = part.setdefault("rows_in_tables", {}).get(name, part.get("modes", []))
                    part["rows_in_tables"][name] = [m for m in rows if m in modes]
        provenance.write(target / "provenance.json",
                         {"model": d.name, "parts": old.get("parts", []) + new.get("parts", [])})
        print(f"merged {d.name}: {', '.join(sorted(f.name for f in d.iterdir()))}")
        summary.setdefault("models", {})[d.name] = sorted(f.name for f in target.iterdir())
    call_time = args.device_time_s or max(p.get("device_time_s", 0.0) for d in mdirs
                                          for p in provenance.read(d / "provenance.json").get("parts", []))
    summary["device_time_s"] = round(summary.get("device_time_s", 0.0) + call_time, 1)
    summary.setdefault("calls", []).append({"src": args.src.name, "models": [d.name for d in mdirs],
                                            "device_time_s": call_time})
    summary["gpu"] = args.gpu
    provenance.write(root / "provenance.json", summary)
    return 0


def _merge_faster(src: Path, dst: Path, new_modes: set[str], old_parts: list[dict], new_parts: list[dict]) -> int:
    """dst keeps, shape by shape, whichever of its rows and src's timed faster (calibrate.tables.merge_faster)."""
    from calibrate.tables.merge_faster import faster_rows, kernel_label

    def raw(path: Path) -> list[dict]:  # the rows as written: measured text is never re-formatted
        with path.open(newline="") as f:
            return list(csv.DictReader(f))

    table = src.stem
    rows, taken = faster_rows(table, raw(dst), raw(src), new_modes or {"graph"},
                              kernel_label(old_parts, table), kernel_label(new_parts, table))
    cols = list(rows[0]) + [c for r in rows for c in r if c not in rows[0]]
    tmp = dst.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(cols)), restval="")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(dst)
    return taken


def _merge_csv(src: Path, dst: Path, new_modes: set[str]) -> tuple[str, list[str]]:
    """Write src's rows to dst, keeping dst's rows of modes src's run did not measure (e.g. the
    eager rows when only graph mode was re-measured), or in a table of host ops (`op`, no `mode`)
    its rows of ops src's run did not measure; returns which ("mode" or "op") and the kept values.
    Columns are the union (a column only one side has is empty on the other side's rows)."""

    with src.open(newline="") as f:
        r = csv.DictReader(f)
        cols, rows = list(r.fieldnames or []), list(r)
    with dst.open(newline="") as f:
        r = csv.DictReader(f)
        old_cols, old_rows = list(r.fieldnames or []), list(r)
    if new_modes and "mode" in cols and "mode" in old_cols:
        by = "mode"
        keep = [row for row in old_rows if row["mode"] not in new_modes]
    elif "op" in cols and "op" in old_cols and "mode" not in old_cols:
        by = "op"  # a host table: the ops a run did not measure (host-only runs capture no graphs) stay
        new_ops = {row["op"] for row in rows}
        keep = [row for row in old_rows if row["op"] not in new_ops]
    else:
        shutil.copy2(src, dst)
        return "", []
    cols += [c for c in old_cols if c not in cols]
    with dst.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, restval="")
        w.writeheader()
        w.writerows(rows + keep)
    return by, sorted({row[by] for row in keep})


def _validate(args: argparse.Namespace) -> int:
    from calibrate.tables.validate import validate_model

    hw = load_hardware(args.gpu)
    root = REPO_ROOT / (hw.calibration_dir or "")
    # A folder holding only a profile-run peak has no tables to validate.
    names = args.model or [n for n in model_names() if any((root / n).glob("*.csv"))]
    if not names:
        raise ConfigError(f"no calibration tables under {root}; run `specsim calibrate measure --gpu {args.gpu}` first")
    if not 0 < args.holdout < 1:
        raise ConfigError(f"--holdout must be in (0, 1), got {args.holdout}")
    ok = True
    for name in _models(names):
        res = validate_model(root / name, load_model(name), hw, args.holdout, args.seed)
        provenance.write(root / name / "validation.json", res)
        if args.json:
            print(json.dumps(res, indent=2))
            continue
        print(f"{name}: held-out {res['points']} points ({args.holdout:.0%} of each table's first axis): "
              f"median APE {res['median_ape_pct']}%, p90 {res['p90_ape_pct']}%")
        for t, r in {**res["per_mode"], **res["per_table"]}.items():
            print(f"  {t:<13} {r['points']:>4} pts  median {r['median_ape_pct']:>6}%  p90 {r['p90_ape_pct']:>6}%")
        for s in res["step_check"]:
            sim = f"  (with kernels.csv {s['sim_err_pct']:+.1f}%)" if "sim_err_pct" in s else ""
            print(f"  step B={s['B']:<4} P={s['P']:<3} ctx={s['ctx']:<6} {s['mode']:<5} measured {s['step_us']:>9.0f} us"
                  f"  predicted {s['pred_us']:>9.0f} us  error {s['err_pct']:+.1f}%{sim}")
        if res["step_check"]:
            print(f"  whole step: median |error| {res['step_median_abs_err_pct']}%, max {res['step_max_abs_err_pct']}%")
        ok &= res["median_ape_pct"] is not None and res["median_ape_pct"] <= 5.0
    return 0 if ok else 1


def _replay(args: argparse.Namespace) -> int:
    from calibrate.device.graphs import MODES
    from calibrate.replay.summary import SUMMARY_KINDS

    if args.mode not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}; got {args.mode!r}")
    for name, v in (("--max-steps", args.max_steps), ("--reps", args.reps), ("--passes", args.passes)):
        if v is not None and v < 1:
            raise ConfigError(f"{name} must be >= 1, got {v}")
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {args.warmup}")
    if not args.steps and not args.smoke:
        raise ConfigError("--steps RUN/steps.csv is required (or --smoke)")
    step_kinds = [k.strip() for k in args.step_kinds.split(",") if k.strip()] or None
    bad = [k for k in step_kinds or [] if k not in SUMMARY_KINDS[:-1]]
    if bad:
        raise ConfigError(f"--step-kinds: unknown {bad}; valid: {', '.join(SUMMARY_KINDS[:-1])}")
    if args.fit_host and not args.summarize:
        raise ConfigError("--fit-host needs --summarize DIR (it fits DIR/host_fit.json to DIR/replay_steps.csv)")
    if args.resume and not (args.resume / "replay_steps.csv").is_file():
        raise ConfigError(f"--resume {args.resume}: no replay_steps.csv there (give a replay's <out>/<model> folder)")
    load_hardware(args.gpu)
    if args.model:
        load_model(args.model)
    load_policy(args.policy)
    if args.summarize:
        from calibrate.replay.outputs import read_replay_rows, write_outputs
        from calibrate.replay.runs import load_run, reprice
        from calibrate.replay.summary import fastest_passes, summarize
        from sim.engine.step_trace import StepTraceError

        try:
            runs = {(run := load_run(p)).name: run for p in args.steps}
        except StepTraceError as e:
            raise ConfigError(str(e)) from None
        rows = read_replay_rows(args.summarize / "replay_steps.csv")
        if args.fit_host:
            from calibrate.replay.host_fit import fit_host, prepare_steps, step_evaluator
            from sim.pricing.host_model import HOST_FIT

            fit_rows = fastest_passes(rows)  # as the summary scores them
            try:
                evaluate = step_evaluator(prepare_steps(fit_rows, runs, args.gpu))
            except ValueError as e:
                raise ConfigError(f"--fit-host: {e}") from None
            fit = fit_host(evaluate, fit_rows, args.summarize / "replay_steps.csv")
            atomic_write_text(args.summarize / HOST_FIT, json.dumps(fit, indent=2) + "\n")
        reprice(rows, runs, args.gpu, print)
        from calibrate.replay.host_speed import tables_probe_from

        ref = tables_probe_from(args.summarize)
        write_outputs(args.summarize, rows, ref)
        print(json.dumps(summarize(rows, tables_probe_us=ref), indent=2))
        return 0
    from calibrate.replay.run import replay
    from sim.engine.step_trace import StepTraceError

    host_policies = [p for p in args.host_policies.split(",") if p] if args.host_policies else None
    for p in host_policies or []:
        load_policy(p)  # a ConfigError names the valid policies
    if args.host_only and args.no_host:
        raise ConfigError("--host-only measures the host tables: drop --no-host")
    if args.pin_cpu is not None and args.pin_cpu not in os.sched_getaffinity(0):
        raise ConfigError(f"--pin-cpu must be one of this process's CPUs {sorted(os.sched_getaffinity(0))}; "
                          f"got {args.pin_cpu}")
    if args.host_only and args.device == "cpu":
        raise ConfigError("--host-only measures host costs behind a busy GPU: --device must be a CUDA device")
    try:
        return replay(args.steps, args.gpu, args.out or _calib_root(args.gpu), smoke=args.smoke,
                      max_steps=args.max_steps, time_budget_s=args.time_budget_s, reps=args.reps,
                      warmup=args.warmup, mode=args.mode, kv_pool_gb=args.kv_pool_gb, host=not args.no_host,
                      model_name=args.model, policy_name=args.policy, device=args.device, resume=args.resume,
                      host_only=args.host_only, host_policies=host_policies, pin_cpu=args.pin_cpu,
                      passes=args.passes, step_kinds=step_kinds, commit=args.git_commit or provenance.git_commit(),
                      log=functools.partial(print, flush=True))
    except StepTraceError as e:
        raise ConfigError(str(e)) from None


def main(args: argparse.Namespace) -> int:
    return {"measure": _measure, "merge": _merge, "validate": _validate, "replay": _replay}[args.action](args)
