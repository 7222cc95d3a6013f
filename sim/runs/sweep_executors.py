"""Where a sweep's points run: a local process pool or a Dask cluster; each point's record.

`run_point` runs in the worker and turns the point's summary, or its error, into a
record; the executors yield (point, record) as points finish, in any order.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from core.config import ConfigError, RunConfig

Simulate = Callable[[RunConfig], dict[str, Any]]
DASK_CONNECT_TIMEOUT_S = 5
PR_SET_PDEATHSIG = 1  # linux/prctl.h: the signal a process gets when its parent dies
PARENT_POLL_S = 1.0  # where there is no prctl: how often a worker looks for its parent


def run_point(simulate: Simulate, cfg: RunConfig) -> dict[str, Any]:
    """Runs in a worker: the point's record. Errors become records, interrupts do not."""
    start = time.perf_counter()
    trace = None
    try:
        summary = simulate(cfg)
        status, error = "ok", None
    except ConfigError as e:  # e.g. the weights do not fit the memory budget
        summary, status, error = None, "infeasible", str(e)
    except Exception as e:
        summary, status, error = None, "failed", f"{type(e).__name__}: {e}"
        trace = "".join(traceback.format_exception(e)[-6:])
    return {
        "status": status,
        "summary": summary,
        "error": error,
        "traceback": trace,
        "elapsed_s": round(time.perf_counter() - start, 3),
    }


@dataclass(frozen=True)
class Point:
    key: str
    version: str  # code version
    data: str  # fingerprint of the workload's requests
    cfg: RunConfig


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def start_worker(parent: int) -> None:
    """A pool worker's first act. Ctrl-C reaches the whole process group: the parent stops the
    workers, so they ignore it (no traceback from each). A worker dies with its parent, whose
    SIGKILL (or the out-of-memory killer) would otherwise leave it asleep on the pool's queue."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    else:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(1)


def run_local(points: list[Point], simulate: Simulate, jobs: int) -> Iterator[tuple[Point, dict[str, Any]]]:
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(points)), initializer=start_worker, initargs=(os.getpid(),))
    futures: dict[Future, Point] = {pool.submit(run_point, simulate, p.cfg): p for p in points}
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield futures[fut], fut.result()
    except BaseException:
        # Ctrl-C or an error: drop queued points and stop running ones now (their results
        # were never written, so a rerun redoes them). Python 3.11 has no public way to
        # terminate pool workers (3.14 adds terminate_workers).
        workers = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers:
            proc.terminate()
        raise
    pool.shutdown(wait=True)


def connect_dask(address: str) -> Any:
    try:
        from distributed import Client
    except ImportError:
        raise ConfigError("--dask-scheduler needs dask.distributed: pip install -e '.[cluster]'") from None
    try:
        return Client(address, timeout=f"{DASK_CONNECT_TIMEOUT_S}s")
    except Exception as e:  # refused, unresolvable, malformed: all mean "no scheduler there"
        raise ConfigError(
            f"--dask-scheduler {address!r}: cannot reach a Dask scheduler there ({type(e).__name__}: {e}; "
            f"timeout {DASK_CONNECT_TIMEOUT_S} s); start one with `dask scheduler` and pass its tcp://HOST:PORT"
        ) from None


def run_dask(points: list[Point], simulate: Simulate, client: Any) -> Iterator[tuple[Point, dict[str, Any]]]:
    from distributed import as_completed

    futures = {client.submit(run_point, simulate, p.cfg, key=f"specsim-point-{p.key}", pure=False): p for p in points}
    try:
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    finally:
        client.cancel(list(futures))
