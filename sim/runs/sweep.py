"""`specsim sweep`: run a grid of points in parallel, resumably, then write points.csv.

One point is one `RunConfig`. Its result is stored as `points/<key>.json`, where the
key hashes the resolved config together with the code version (`sim/runs/code_version.py`: the
simulator's sources, configs and the calibration tables it reads) and a fingerprint of the
workload's requests, so an edit to any of them makes stale points miss. Only this (parent) process writes files, each through a
temporary file, fsync and `os.replace`: an interrupted sweep leaves whole point files
or none, and a rerun skips them. Points run in a process pool, or on a Dask cluster
with `--dask-scheduler`; a point that raises is recorded as failed (a model that
does not fit the memory budget as infeasible) and the sweep goes on.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack, closing
from concurrent.futures.process import BrokenProcessPool
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from core.config import CONFIG_DIR, REPO_ROOT, ConfigError, RunConfig, parse_set
from core.files import atomic_write_text, named_path
from core.folder_lock import FolderLock
from sim.runs.code_version import code_version, package_version
from sim.runs.grid import Grid, load_grid
from sim.runs.startup_checks import check_points
from sim.runs.sweep_executors import Point, Simulate, connect_dask, run_dask, run_local

STATUSES = ("ok", "failed", "infeasible")
FAILED_SHOWN = 10  # failed points named on the terminal; points.csv has them all
PROGRESS_LINES = 4  # without a terminal, progress is this many plain lines (25%, 50%, ...)


# ------------------------------------------------------------------------ point keys
def point_key(cfg: RunConfig, version: str) -> str:
    """`version`: the code version, plus the fingerprint of the point's workload data."""
    text = json.dumps(cfg.model_dump(mode="json"), sort_keys=True) + "\n" + version
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def git_describe() -> str:
    """The commit the sweep ran from, with '+dirty' for uncommitted edits; '' outside git.

    Edits under docs/ and to README.md do not count: they are what `make docs` writes while it
    runs its sweeps, not inputs of the simulator."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)docs", ":(exclude)README.md"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    if rev.returncode:
        return ""
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


# ---------------------------------------------------------------------- point files
def record_digest(rec: dict[str, Any]) -> str:
    """Hash of a point record without its digest field (JSON floats round-trip exactly)."""
    body = {k: v for k, v in rec.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def read_point(path: Path, key: str) -> dict[str, Any] | None:
    """A stored point if it is complete and belongs to `key`; None if absent or corrupt."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != key or rec.get("status") not in STATUSES:
        return None
    if rec.get("digest") != record_digest(rec):  # a hand-edited or damaged value anywhere in the record
        return None
    if rec["status"] == "ok" and not isinstance(rec.get("summary"), dict):
        return None
    try:  # the stored config and code version must hash to the key (no hand-edited files)
        if point_key(RunConfig.model_validate(rec["config"]), rec["code_version"] + rec["data_version"]) != key:
            return None
    except (KeyError, TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
    return rec


def default_simulate(cfg: RunConfig) -> dict[str, Any]:
    from sim.runs.run import simulate

    return simulate(cfg)


# ---------------------------------------------------------------------------- sweep
def workload_signature(cfg: RunConfig) -> str:
    return json.dumps([cfg.workload, cfg.num_requests, cfg.seed, cfg.workload_overrides], sort_keys=True)


def warm_workloads(points: list[RunConfig]) -> dict[str, str]:
    """Load each distinct workload once, here: its token-length cache is then on disk
    (and, with fork, in memory) before workers start, and a bad workload fails once.

    Returns a fingerprint of each workload's requests by `workload_signature`: a data
    file that changed (e.g. another BURSTGPT_PATH) changes the points' keys.
    """
    from workloads import load_workload

    prints: dict[str, str] = {}
    for cfg in points:
        sig = workload_signature(cfg)
        if sig not in prints:
            w = load_workload(cfg.workload, cfg.num_requests, cfg.seed, cfg.workload_overrides)
            data = [w.source, w.arrival, w.acceptance, [astuple(r) for r in w.requests]]
            prints[sig] = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    return prints


class _Lines:
    """tqdm's interface for a pipe or log file, where a redrawn bar becomes dozens of lines:
    one plain line at each quarter of the points."""

    def __init__(self, total: int, cached: int) -> None:
        self.total, self.cached, self.done, self.postfix = total, cached, 0, ""
        self.start = time.perf_counter()

    def __enter__(self) -> "_Lines":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def set_postfix(self, counts: dict[str, int], refresh: bool = False) -> None:
        self.postfix = ", ".join(f"{n} {status}" for status, n in counts.items())

    def update(self) -> None:
        self.done += 1
        if self.done * PROGRESS_LINES // self.total > (self.done - 1) * PROGRESS_LINES // self.total:
            print(f"sweep: {self.done}/{self.total} points run ({self.cached} cached; {self.postfix}) "
                  f"in {time.perf_counter() - self.start:.0f} s", file=sys.stderr, flush=True)


def _progress(total: int, cached: int, enabled: bool) -> Any:
    if enabled and not sys.stderr.isatty():
        return _Lines(total, cached)
    return tqdm(total=total, desc=f"sweep ({cached} cached)", unit="point", disable=not enabled, mininterval=0.5)


@dataclass
class SweepResult:
    records: list[dict[str, Any]]  # one per point, in grid order
    ran: int
    cached: int
    wall_s: float


def check_jobs(jobs: int | None) -> None:
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1 (worker processes), got {jobs}")


def run_sweep(
    configs: list[RunConfig],
    out_dir: Path,
    *,
    jobs: int | None = None,
    dask_scheduler: str | None = None,
    retry_failed: bool = False,
    simulate: Simulate | None = None,
    prepare: Callable[[list[RunConfig]], dict[str, str]] | None = None,
    progress: bool = True,
) -> SweepResult:
    """Run every point of `configs` not already stored under `out_dir/points`.

    `simulate` defaults to `sim.runs.run.simulate` and `prepare` to `warm_workloads`.
    """
    simulate = simulate or default_simulate
    prepare = prepare or warm_workloads
    check_jobs(jobs)
    start = time.perf_counter()
    with ExitStack() as stack:
        client = None
        if dask_scheduler:  # connect first: a bad address fails before any work
            client = connect_dask(dask_scheduler)
            stack.callback(client.close)
        data = prepare(configs)  # a bad workload fails here, before anything is written
        check_points(configs)  # and a configuration vLLM would refuse
        point_dir = out_dir / "points"
        point_dir.mkdir(parents=True, exist_ok=True)
        for stale in point_dir.glob(".*.tmp"):  # left by a process killed mid-write (SIGKILL)
            stale.unlink(missing_ok=True)
        points = []
        for c in configs:
            version, fingerprint = code_version(c.hardware), data.get(workload_signature(c), "")
            points.append(Point(point_key(c, version + fingerprint), version, fingerprint, c))
        if len({p.key for p in points}) != len(points):
            raise ConfigError("the grid produces the same point twice; check for duplicate axis values")
        stored: dict[str, dict[str, Any]] = {}
        unreadable = []
        for p in points:
            path = point_dir / f"{p.key}.json"
            rec = read_point(path, p.key)
            if rec is None and path.exists():
                unreadable.append(path.name)
            elif rec is not None and not (retry_failed and rec["status"] == "failed"):
                stored[p.key] = rec
        if unreadable:
            print(f"specsim sweep: {len(unreadable)} stored point file(s) in {point_dir} are corrupt or do not match "
                  f"their key; running those points again: {', '.join(unreadable[:5])}"
                  + (", ..." if len(unreadable) > 5 else ""), file=sys.stderr)
        todo = [p for p in points if p.key not in stored]
        if todo:
            results = run_dask(todo, simulate, client) if client else run_local(todo, simulate, jobs or os.cpu_count() or 1)
            stack.enter_context(closing(results))
            bar = stack.enter_context(_progress(len(todo), len(stored), progress))
            counts = dict.fromkeys(STATUSES[1:], 0)
            for p, result in results:
                rec = {"key": p.key, "code_version": p.version, "data_version": p.data,
                       "config": p.cfg.model_dump(mode="json"), **result}
                rec["digest"] = record_digest(rec)
                atomic_write_text(point_dir / f"{p.key}.json", json.dumps(rec, indent=1, sort_keys=True))
                stored[p.key] = rec
                if rec["status"] in counts:
                    counts[rec["status"]] += 1
                bar.set_postfix(counts, refresh=False)
                bar.update()
    return SweepResult([stored[p.key] for p in points], len(todo), len(points) - len(todo), time.perf_counter() - start)


# ------------------------------------------------------------------------------ CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True, help="workload name (configs/workloads/) or a path to its YAML")
    p.add_argument("--grid", default=str(CONFIG_DIR / "grids" / "paper.yaml"), help="grid YAML (default: configs/grids/paper.yaml)")
    p.add_argument("--model", default=None, help="run only this model (replaces the grid's model axis)")
    p.add_argument("--hardware", default=None, help="GPU profile (replaces the grid's; default: the grid's or h200)")
    p.add_argument("--out", default=None, help="sweep folder (default: results/sweeps/<workload>)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--dask-scheduler", default=None, metavar="ADDRESS", help="run points on this Dask scheduler (tcp://HOST:PORT)")
    p.add_argument("--retry-failed", action="store_true", help="rerun points stored as failed (infeasible ones stay)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="fix a grid field for every point, replacing the grid's value or axis, e.g. "
                        "workload_overrides.path=FILE or engine.admission=first_chunk (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` items -> {dotted field: value}; values are read as YAML (0.6 is a
    number, null is None, [1, 1] a list)."""
    return dict(parse_set(item, "workload_overrides.path=FILE") for item in items)


def data_file(cfg: RunConfig) -> dict[str, str] | None:
    """Where a file-based workload's data came from: {"path": absolute path, "from": the
    override or environment variable that gave it}; None for generated or packaged data."""
    from workloads.registry import load_spec

    spec = load_spec(cfg.workload, cfg.workload_overrides)
    path_env = getattr(spec, "path_env", None)
    if getattr(spec, "path", None):
        return {"path": str(Path(spec.path).expanduser().resolve()), "from": "workload_overrides.path"}
    if path_env and os.environ.get(path_env):
        return {"path": str(Path(os.environ[path_env]).expanduser().resolve()), "from": path_env}
    return None


def command_line(args: argparse.Namespace, out: Path, data: dict[str, str] | None = None) -> str:
    """The sweep's command with every choice spelled out, for report.md; a data file given
    through an environment variable is set in front, so the command reruns as it ran."""
    # VAR=value stays an assignment only if the value alone is quoted
    env = [f"{data['from']}={shlex.quote(data['path'])}"] if data and data["from"] != "workload_overrides.path" else []
    parts = ["specsim", "sweep", "--workload", args.workload, "--grid", args.grid]
    parts += ["--model", args.model] if args.model else []
    parts += ["--hardware", args.hardware] if args.hardware else []
    for item in args.set:
        parts += ["--set", item]
    parts += ["--out", str(out)]
    parts += ["--dask-scheduler", args.dask_scheduler] if args.dask_scheduler else []
    return " ".join(env + [shlex.join(parts)])


def _previous_calls(path: Path) -> list[dict[str, Any]]:
    try:
        history = json.loads(path.read_text()).get("history", [])
    except (OSError, ValueError, AttributeError):
        return []
    return history if isinstance(history, list) else []


def main(args: argparse.Namespace) -> int:
    grid = load_grid(args.grid, args.workload, model=args.model, hardware=args.hardware, sets=parse_sets(args.set))
    configs = grid.points(args.workload)
    out = named_path(args.out) or REPO_ROOT / "results" / "sweeps" / Path(args.workload).stem
    check_jobs(args.jobs)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder; choose a folder path")
    with FolderLock(out):
        check_same_sweep(out, _identity(args, grid, data_file(configs[0])))
        return _sweep_into(args, grid, configs, out)


def _identity(args: argparse.Namespace, grid: Grid, data: dict[str, str] | None) -> dict[str, Any]:
    """What makes a folder's sweep the same sweep: its points and the data behind them."""
    return {"workload": args.workload, "grid_fixed": grid.fixed, "grid_axes": grid.axes, "data_file": data}


def check_same_sweep(out: Path, identity: dict[str, Any]) -> None:
    """A folder holds one sweep: a rerun resumes it, another grid would replace its points.csv
    and leave its points beside the new ones."""
    try:
        earlier = json.loads((out / "sweep.json").read_text())
    except (OSError, ValueError):
        return  # a new folder, or a first call that did not finish
    if not isinstance(earlier, dict):
        return
    same = {k: earlier.get(k) for k in identity}
    if json.dumps(same, sort_keys=True) != json.dumps(identity, sort_keys=True, default=str):
        differ = ", ".join(k for k in identity if json.dumps(same[k], sort_keys=True)
                           != json.dumps(identity[k], sort_keys=True, default=str))
        raise ConfigError(f"--out {out}: holds another sweep (its sweep.json differs in {differ}); allowed: that "
                          f"sweep's own command, `{earlier.get('command', '?')}`, or another --out")


def _sweep_into(args: argparse.Namespace, grid: Grid, configs: list[RunConfig], out: Path) -> int:
    from sim.runs.report import write_points_csv

    try:
        result = run_sweep(configs, out, jobs=args.jobs, dask_scheduler=args.dask_scheduler,
                           retry_failed=args.retry_failed, progress=not args.no_progress)
    except BrokenProcessPool as e:  # a worker was killed (out of memory, signal): not a point's error
        print(f"specsim sweep: error: a worker process died ({e}); finished points are saved in "
              f"{out / 'points'}, rerun the same command to resume", file=sys.stderr)
        return 1
    table = write_points_csv(result.records, out / "points.csv")
    call = {
        "ran": result.ran,
        "cached": result.cached,
        "wall_s": round(result.wall_s, 2),
        "executor": f"dask {args.dask_scheduler}" if args.dask_scheduler else f"processes x {args.jobs or os.cpu_count()}",
    }
    data = data_file(configs[0])
    manifest = {
        "command": command_line(args, out, data),
        "workload": args.workload,
        "data_file": data,
        "grid": str(args.grid),
        "grid_fixed": grid.fixed,
        "grid_axes": grid.axes,
        "load_axis": grid.load_axis,
        "code_versions": sorted({r["code_version"] for r in result.records}),
        "git": git_describe(),
        "package": package_version(),
        "points": len(result.records),
        **call,
        # Earlier calls on this folder, for the record of fresh and cached timings.
        "history": (_previous_calls(out / "sweep.json") + [call])[-20:],
    }
    atomic_write_text(out / "sweep.json", json.dumps(manifest, indent=2) + "\n")
    counts = table["status"].value_counts().to_dict()
    print(
        f"{len(table)} points ({result.ran} run, {result.cached} cached) in {result.wall_s:.1f} s: "
        + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES)
        + f"\nwrote {out / 'points.csv'}",
        file=sys.stderr,
    )
    warned = [r for r in result.records if r["status"] == "ok" and r["summary"].get("warnings")]
    if warned:
        print(f"specsim sweep: warning: {len(warned)} point(s) ran but {warned[0]['summary']['warnings'][0]} (first: "
              f"{point_label(warned[0]['config'], grid.axes)}); the warnings column of points.csv names each",
              file=sys.stderr)
    failed = [r for r in result.records if r["status"] == "failed"]
    for r in failed[:FAILED_SHOWN]:
        print(f"failed: {point_label(r['config'], grid.axes)}: {r['error']}", file=sys.stderr)
    if failed:
        more = f" ({len(failed) - FAILED_SHOWN} more in points.csv)" if len(failed) > FAILED_SHOWN else ""
        print(f"specsim sweep: {len(failed)} point(s) failed{more}; their tracebacks are in {out / 'points'}; "
              "after a fix, rerun with --retry-failed", file=sys.stderr)
        return 1
    return 0


def point_label(config: dict[str, Any], axes: dict[str, Any]) -> str:
    """A point named by its grid-axis values, e.g. `policy=replay client.max_concurrency=8`."""
    def value(key: str) -> Any:
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    return " ".join(f"{k}={value(k)}" for k in axes) or config.get("policy", "")
