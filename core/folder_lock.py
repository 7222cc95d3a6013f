"""One writer per output folder: an exclusive `flock` on a hidden file beside the folder.

The kernel drops a flock when the last descriptor of its open file goes, however its holder
ends; but a forked child (a sweep's pool worker) inherits the descriptor, and a worker left
alive by a parent killed with SIGKILL would hold the lock for ever. So every forked child
closes the descriptors of the locks held here (`os.register_at_fork`), and a lock whose
recorded owner is no longer running is recognised as abandoned and taken over.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

from core.errors import ConfigError

_held: set[int] = set()  # descriptors of the locks this process holds


def _close_in_child() -> None:
    for fd in _held:
        try:
            os.close(fd)  # the parent's descriptor stays open, so its lock stays
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), which tells a
    recycled pid from the owner; None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22, counted after the command name


def owner_running(record: str) -> bool:
    """Whether the process a lock file names ("process N (started ...)", then its start
    ticks) still runs; an unreadable record counts as running."""
    words = record.split()
    if len(words) < 2 or words[0] != "process" or not words[1].isdigit():
        return True
    pid = int(words[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    ticks = words[-1] if len(words) > 4 and words[-2] == "ticks" else None
    return ticks is None or _start_ticks(pid) in (None, ticks)


class FolderLock:
    """An exclusive lock on a folder for one writer: a second process gets a ConfigError
    naming the process that holds it. The lock is a hidden file beside the folder (so a
    command that fails on its input creates nothing in it); a killed holder leaves no
    stale lock."""

    def __init__(self, folder: Path, option: str = "--out") -> None:
        self.folder, self.option = Path(folder), option
        self.path = self.folder.absolute().parent / f".{self.folder.name}.lock"
        self.fd: int | None = None

    def __enter__(self) -> "FolderLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{self.option} {self.folder}: cannot create {self.path.parent} ({e.strerror or e})") from None
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
                if holder and not owner_running(holder):
                    # Held by processes its dead owner left (pool workers of an older release):
                    # a fresh file under the same name is a fresh lock; they never write.
                    print(f"specsim: {self.folder}'s lock was held for {holder.splitlines()[0]}, which is no "
                          "longer running; taking it over", file=sys.stderr)
                    self._unlink_if(fd)
                    os.close(fd)
                    continue
                os.close(fd)
                raise ConfigError(f"{self.option} {self.folder}: in use by "
                                  f"{holder.splitlines()[0] if holder else 'another process'}; wait for it to "
                                  "finish or choose another folder") from None
            try:  # the holder before us may have removed the file between our open and our flock
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        record = f"process {os.getpid()} (started {time.strftime('%Y-%m-%d %H:%M:%S')})"
        if (ticks := _start_ticks(os.getpid())) is not None:
            record += f"\nstart ticks {ticks}"
        os.pwrite(fd, record.encode(), 0)
        self.fd = fd
        _held.add(fd)
        return self

    def _unlink_if(self, fd: int) -> None:
        """Remove the lock file if it is still the one `fd` opened (not a successor's)."""
        try:
            if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                self.path.unlink()
        except FileNotFoundError:
            pass

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            _held.discard(self.fd)
            self.path.unlink(missing_ok=True)
            os.close(self.fd)  # closing releases the flock
            self.fd = None
