"""Child processes this program started: stop one for sure, politely first, and let none outlive the program.

:func:`stop_child` is the one stopper. :func:`running` starts a short-lived helper program (espeak-ng) in a
process group of its own and tracks it until it ends, so that whatever way the block is left (an answer, an
error, a deadline, Ctrl-C or SIGTERM, which the CLI turns into KeyboardInterrupt) the program and anything it
started are stopped; :func:`stop_all` stops every tracked one at once, for an interrupt that reaches another
thread than the one waiting on the program, and runs at exit as the last resort.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

STOP_TIMEOUT_S = 5.0

_tracked: set[subprocess.Popen[Any]] = set()
_tracked_lock = threading.Lock()


def _signal(proc: subprocess.Popen[Any], sig: int, group: bool) -> None:
    if group:
        try:
            os.killpg(proc.pid, sig)  # the child leads its group (start_new_session): its own children go too
        except ProcessLookupError:
            pass
    else:
        proc.send_signal(sig)


def stop_child(proc: subprocess.Popen[Any], timeout_s: float = STOP_TIMEOUT_S, *, group: bool = False) -> None:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL: the process is gone (and reaped) when this returns.
    ``group``: the child was started with ``start_new_session=True`` and the signals go to its whole process
    group, so a program it started (a shell script's ``sleep``) does not keep running and holding its pipes.
    A child that has already ended is only reaped: its group is not signalled (its id may be reused)."""
    if proc.poll() is None:
        _signal(proc, signal.SIGTERM, group)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL, group)
            proc.wait()
        if group:  # the leader is gone; a member that ignored SIGTERM must not outlive it
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@contextmanager
def running(argv: Sequence[str], stop_timeout_s: float = STOP_TIMEOUT_S, **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """``with running([...], stdout=PIPE) as proc:`` — the program runs in a process group of its own, tracked
    until the block is left; then it is stopped (:func:`stop_child` on its group) if it still runs, however the
    block is left. The caller bounds its own waits; this makes sure nothing is left behind."""
    proc = subprocess.Popen(list(argv), start_new_session=True, **popen)
    with _tracked_lock:
        _tracked.add(proc)
    try:
        yield proc
    finally:
        try:
            stop_child(proc, stop_timeout_s, group=True)
        finally:
            with _tracked_lock:
                _tracked.discard(proc)


def stop_all(timeout_s: float = 1.0) -> None:
    """Stop every program started with :func:`running` that still runs (their own threads then see their pipes
    end). For an interrupt in one thread while another waits on a program, and at exit."""
    with _tracked_lock:
        procs = list(_tracked)
    for proc in procs:
        stop_child(proc, timeout_s, group=True)


atexit.register(stop_all)
