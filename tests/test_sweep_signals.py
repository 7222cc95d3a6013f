"""A sweep killed outright (SIGKILL, the out-of-memory killer) or interrupted (Ctrl-C): its pool
workers end with it, its folder's lock is free for the rerun, and no worker prints a traceback.
Each test waits for a state (files on disk, processes gone), never for a moment; the bounds
are hang guards only."""
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.folder_lock import FolderLock, owner_running
from sim.cli import main as cli

REPO = Path(__file__).resolve().parent.parent
HANG_GUARD_S = 120
GRID = "fixed: {num_requests: 4}\naxes:\n  client.max_concurrency: [1, 256]\n  policy: [store_all, replay]\n"

SCRIPT = """\
import os, sys, time
sys.path[:0] = [{repo!r}, {tests!r}]
import sim.runs.sweep
import test_sweep_run

def marks_and_waits(cfg):
    # a worker says who it is, then a point at concurrency 256 never ends
    open(os.path.join({marks!r}, str(os.getpid())), "w").close()
    while cfg.client.max_concurrency == 256:
        time.sleep(3600)
    return test_sweep_run.fake_simulate(cfg)

sim.runs.sweep.default_simulate = marks_and_waits
sim.runs.sweep.warm_workloads = test_sweep_run.no_prepare
from sim.cli import main
sys.exit(main(["sweep", "--workload", "synthetic-fixed", "--grid", {grid!r}, "--jobs", "2", "--out", {out!r},
               "--no-progress"]))
"""


def _wait(condition, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"hang guard: {what}"
        assert proc is None or proc.poll() is None, f"the sweep ended before {what}"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


@pytest.fixture
def sweep_script(tmp_path):
    (tmp_path / "marks").mkdir()
    (tmp_path / "grid.yaml").write_text(GRID)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), marks=str(tmp_path / "marks"),
                                    grid=str(tmp_path / "grid.yaml"), out=str(tmp_path / "out")))
    return script


def _start(script: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script)], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _both_waiting(tmp_path: Path) -> list[int]:
    """The two workers' pids, once both block on a concurrency-256 point (the two others done)."""
    marks = tmp_path / "marks"
    _wait(lambda: len(list((tmp_path / "out" / "points").glob("*.json"))) == 2
          and len({p.name for p in marks.iterdir()}) == 2, "both workers blocked")
    return sorted(int(p.name) for p in marks.iterdir())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_a_sweep_ends_its_workers_and_the_rerun_resumes(sweep_script, tmp_path, monkeypatch, capsys):
    proc = _start(sweep_script)
    try:
        workers = _both_waiting(tmp_path)
        os.kill(proc.pid, signal.SIGKILL)  # the parent only, as the out-of-memory killer does
        proc.wait(timeout=HANG_GUARD_S)
        _wait(lambda: not any(_alive(w) for w in workers), "the workers to die with their parent")
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
        for w in workers if "workers" in locals() else []:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    import sim.runs.sweep
    import test_sweep_run
    monkeypatch.setattr(sim.runs.sweep, "default_simulate", test_sweep_run.fake_simulate)
    monkeypatch.setattr(sim.runs.sweep, "warm_workloads", test_sweep_run.no_prepare)
    rc = cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(tmp_path / "grid.yaml"), "--jobs", "1",
              "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "(2 run, 2 cached)" in err and "in use by" not in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_with_an_idle_worker_prints_no_worker_traceback(tmp_path):
    (tmp_path / "marks").mkdir()
    (tmp_path / "grid.yaml").write_text("fixed: {num_requests: 4}\naxes:\n  client.max_concurrency: [256, 1]\n")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), marks=str(tmp_path / "marks"),
                                    grid=str(tmp_path / "grid.yaml"), out=str(tmp_path / "out")))
    proc = _start(script)
    try:
        # one worker blocks, the other has finished its point and waits on the empty queue
        _wait(lambda: len(list((tmp_path / "out" / "points").glob("*.json"))) == 1
              and len(list((tmp_path / "marks").iterdir())) == 2, "one point done, one blocked", proc)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the group
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert err == "specsim sweep: interrupted\n", err


def _hold(path: Path, record: str) -> subprocess.Popen:
    """Another process holding `path`'s flock, as a dead sweep's orphaned worker did."""
    code = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nos.pwrite(fd, sys.argv[2].encode(), 0)\nprint('held', flush=True)\n"
            "time.sleep(3600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(path), record], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_lock_whose_owner_is_dead_is_taken_over(tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # ended and reaped: no process has this pid now (nor soon)
    holder = _hold(tmp_path / ".out.lock", f"process {pid} (started 2026-12-01 10:00:00)")
    try:
        with FolderLock(tmp_path / "out"):
            record = (tmp_path / ".out.lock").read_text()
            assert record.startswith(f"process {os.getpid()} ")
    finally:
        holder.kill()
        holder.wait()
    assert f"held for process {pid} (started 2026-12-01 10:00:00), which is no longer running" in capsys.readouterr().err


def test_a_lock_whose_owner_runs_is_refused(tmp_path):
    holder = _hold(tmp_path / ".out.lock", f"process {os.getpid()} (started 2026-12-01 10:00:00)")
    try:
        with pytest.raises(ConfigError, match=rf"--out {tmp_path / 'out'}: in use by process {os.getpid()} "
                                              r"\(started 2026-12-01 10:00:00\); wait for it"):
            FolderLock(tmp_path / "out").__enter__()
    finally:
        holder.kill()
        holder.wait()


def test_a_recycled_pid_is_no_owner(tmp_path):
    # our own pid, but another start time: the process that wrote the lock has ended
    assert owner_running(f"process {os.getpid()} (started x)\nstart ticks 1") is (not sys.platform.startswith("linux"))
    assert owner_running(f"process {os.getpid()} (started x)")
    assert owner_running("a line from an older release")


def test_a_forked_child_does_not_keep_the_parents_lock(tmp_path):
    lock = FolderLock(tmp_path / "out")
    with lock:
        child = os.fork()
        if child == 0:  # the child holds no descriptor of the lock: it could not release it either
            os._exit(0 if lock.fd is not None and _fd_closed(lock.fd) else 1)
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _fd_closed(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        return True
    return False
