"""One writer per output folder: a lock on OUT so two runs never interleave their files.

``flock`` on ``OUT/.voice-llm.lock``: released by the kernel when the process ends, however it ends, so a crashed
run never leaves the folder locked. The file says who holds it (pid, command, since when) for the message the
second run prints, and is removed when the run ends; a waiter that locked a file already removed (its inode no
longer at the path) tries again, so two runs never hold two different lock files at once. The file is opened
with ``O_NOFOLLOW`` and must be a regular file: a link planted at its name is refused, its target never written.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from voice_llm.core.errors import OutputBusyError, OutputDirError
from voice_llm.core.sse import parse_json

LOCK_NAME = ".voice-llm.lock"


def _holder(fd: int) -> str:
    try:
        info = parse_json(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")  # the one guarded parser
        return f"`voice-llm {info.get('command', '?')}` (pid {info.get('pid', '?')}, since {info.get('since', '?')})"
    except (ValueError, OSError, AttributeError):  # not JSON, nested too deeply, or not an object: someone's lock
        return "another voice-llm run"


def _acquire(path: Path, out: Path, wait: bool) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OutputDirError(f"{path} is a symbolic link: voice-llm does not write through links in an "
                                     "output folder; remove it") from exc
            raise OutputDirError(f"cannot lock the output folder {out}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted there: never written
            os.close(fd)
            raise OutputDirError(f"{path} is not a regular file: remove it to use {out}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError as exc:
            holder = _holder(fd)
            os.close(fd)
            raise OutputBusyError(
                f"{out} is being written by {holder}; wait for it to finish, pass --wait, or use another --out"
            ) from exc
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed the file as we waited: lock the new one


def writer_of(out: Path) -> str | None:
    """Who holds OUT's lock now (another process writing it), or None. Reads only: never creates the lock file,
    never follows a link, and never blocks. For readers that must not certify a half-written folder (check)."""
    try:
        fd = os.open(out / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file (or not a file we would lock): nobody holds it
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(fd)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked_out(out: Path, command: str, wait: bool = False) -> Iterator[None]:
    """Hold OUT for this process. With ``wait`` block until the other run is done; else refuse at once."""
    path = out / LOCK_NAME
    fd = _acquire(path, out, wait)
    try:
        since = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": command, "since": since}).encode(), 0)
        yield
    finally:
        try:
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)  # still locked by us: nobody else can hold this inode
        except OSError:
            pass
        os.close(fd)  # closing the descriptor releases the flock
