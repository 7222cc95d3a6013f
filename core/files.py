"""File helpers: atomic writes, text input that fails as a user error, and output folders
that a failed or interrupted command leaves as they were (one writer each: core.folder_lock)."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from core.errors import ConfigError


def atomic_write_text(path: Path, text: str) -> None:
    """Write all of `text` or nothing: temp file in the same folder, fsync, rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file's contents; a binary file, a folder or an unreadable path is a
    ConfigError naming `what` the file was meant to be."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.reason}); expected {what}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what}: {e.strerror or e}") from None


class StagedOutput:
    """An output folder written whole or not at all.

    Files go to a hidden folder beside `target` (same filesystem, so moving them in is a
    rename); `publish` moves each in with `os.replace` and removes the `files` and `folders`
    that this run did not produce (a traced run's steps.csv after an untraced rerun), so
    the folder never mixes two runs. Other files in `target` are the user's and stay.
    Creating the staging folder up front checks the path before any work: a regular
    file, a path under one, a read-only or missing filesystem fails at once.
    """

    def __init__(self, target: Path, files: Iterable[str], folders: Iterable[str] = (), option: str = "--out") -> None:
        self.target = Path(target)
        files = tuple(files)
        self.owned = (*files, *folders)
        where = f"{option} {self.target}"
        if self.target.exists() and not self.target.is_dir():
            raise ConfigError(f"{where}: exists and is not a folder; choose a folder path")
        for name in files:
            if (self.target / name).is_dir():
                raise ConfigError(f"{where}: {self.target / name} is a folder where this command writes a file; "
                                  "remove it or choose another folder")
        parent = self.target.absolute().parent
        above = next(p for p in (parent, *parent.parents) if p.exists())
        if not above.is_dir():
            raise ConfigError(f"{where}: {above} is a file, not a folder; choose a folder path")
        try:
            parent.mkdir(parents=True, exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", suffix=".tmp", dir=parent))
        except OSError as e:
            raise ConfigError(f"{where}: cannot write in {parent} ({e.strerror or e})") from None

    def publish(self) -> None:
        """Move every staged file or folder into `target`, replacing what was there."""
        self.target.mkdir(exist_ok=True)
        made = {p.name for p in self.path.iterdir()}
        for name in sorted(made):
            dst = self.target / name
            if dst.is_dir() and not dst.is_symlink():
                # A folder cannot be replaced in one rename: move the old one aside first.
                old = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=self.target))
                os.replace(dst, old / name)
                os.replace(self.path / name, dst)
                shutil.rmtree(old)
            else:
                os.replace(self.path / name, dst)
        for name in self.owned:
            if name not in made:
                stale = self.target / name
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale)
                else:
                    stale.unlink(missing_ok=True)
        self.discard()

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> "StagedOutput":
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()  # after publish there is nothing left; after a failure, the partial files


def named_path(text: str | None, option: str = "--out") -> Path | None:
    """A path the user named on the command line (None: not given). An empty one, such as an unset
    shell variable gives, would mean the current folder: refused, not taken for '.'."""
    if text is None:
        return None
    if not text.strip():
        raise ConfigError(f"{option} {text!r}: an empty path; allowed: a path such as runs/x, or . for the current "
                          "folder")
    return Path(text)
