"""`specsim calibrate {measure,merge,validate}`.

  measure   time the layer tables, memory and whole-step check on this machine's GPU
            (`make calibrate GPU_PY=python3`): one command recalibrates a GPU
  merge     copy a measurement directory (e.g. one fetched from the device machine)
            into results/calibration/<gpu>/, appending its provenance
  validate  held-out interpolation error and whole-step error of the latency model
"""
from __future__ import annotations

import argparse
import json
import shutil
import tarfile
from pathlib import Path

from core.config import REPO_ROOT, ConfigError, load_hardware, load_model, model_names
from calibrate import provenance
from calibrate.grid import ALL_JOBS, jobs_for_part


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    m = sub.add_parser("measure", help="time layers on this machine's GPU")
    m.add_argument("--gpu", required=True, help="hardware config name (e.g. h200); tables go to its calibration_dir")
    m.add_argument("--model", action="append", help="model config name (repeatable; default: all)")
    m.add_argument("--quick", action="store_true", help="coarse grid (a smoke run)")
    m.add_argument("--part", type=int, default=None, help="measure one part of the jobs (1, 2 or 3), to split device calls")
    m.add_argument("--jobs", default=None, help="comma-separated jobs instead of --part")
    m.add_argument("--out", type=Path, default=None, help="output root (default: the GPU's calibration_dir)")
    m.add_argument("--device", default="cuda")
    m.add_argument("--modes", default="graph,eager")
    m.add_argument("--git-commit", default=None, help="commit of the measured tree (default: git rev-parse HEAD)")
    m.add_argument("--time-budget-s", type=float, default=None, help="skip jobs that would start after this many seconds")
    m.add_argument("--step-policy", default="store_all", help="policy kernel run inside the whole-step check")
    m.add_argument("--tar", type=Path, default=None, help="also write the output root as this .tar.gz after every job")

    g = sub.add_parser("merge", help="copy measured tables into results/calibration/<gpu>/")
    g.add_argument("--gpu", required=True)
    g.add_argument("--src", type=Path, required=True, help="a measurement root (holding <model>/) or a .tar.gz of one")
    g.add_argument("--device-time-s", type=float, default=None, help="device time the measuring call used (from the device tool)")

    v = sub.add_parser("validate", help="held-out interpolation error and whole-step error")
    v.add_argument("--gpu", required=True)
    v.add_argument("--model", action="append", help="default: every model with tables")
    v.add_argument("--holdout", type=float, default=0.2)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--json", action="store_true")


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
    from calibrate.run import measure

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
        if args.tar:
            with tarfile.open(args.tar, "w:gz") as t:
                t.add(out, arcname="calibration")
    rc = 0
    for name in _models(args.model):
        rc |= measure(load_model(name), hw, jobs, out, quick=args.quick, device=args.device, modes=modes,
                      commit=args.git_commit or provenance.git_commit(), time_budget_s=args.time_budget_s,
                      step_policy=args.step_policy, on_job_done=tar)
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
    mdirs = [d for d in sorted(src.iterdir()) if d.is_dir() and (d / "provenance.json").exists()]
    if not mdirs:
        raise ConfigError(f"--src {args.src}: no <model>/provenance.json inside")
    summary = provenance.read(root / "provenance.json")
    for d in mdirs:
        load_model(d.name)
        target = root / d.name
        target.mkdir(parents=True, exist_ok=True)
        new = provenance.read(d / "provenance.json")
        for f in d.iterdir():
            if f.suffix in (".csv",) or f.name == "memory.json":
                shutil.copy2(f, target / f.name)
        for part in new.get("parts", []):
            if args.device_time_s:  # the whole device call's time (machine start included), shared by its models
                part["device_time_s"] = args.device_time_s
        old = provenance.read(target / "provenance.json")
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


def _validate(args: argparse.Namespace) -> int:
    from calibrate.validate import validate_model

    hw = load_hardware(args.gpu)
    root = REPO_ROOT / (hw.calibration_dir or "")
    names = args.model or [n for n in model_names() if (root / n).is_dir()]
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


def main(args: argparse.Namespace) -> int:
    return {"measure": _measure, "merge": _merge, "validate": _validate}[args.action](args)
