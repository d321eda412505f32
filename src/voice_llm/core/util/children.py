"""Processes this program stops: the one stopper, politely first, and no child outlives the program.

:func:`stop_child` stops a child this program started (a ``Popen``), :func:`stop_pid` a process it knows only by
its id (the llama-server an earlier ``voice-llm up`` started): both SIGTERM, wait, then SIGKILL, and ``group``
sends the signals to the whole process group. :func:`running` starts a short-lived helper program (espeak-ng)
in a process group of its own and tracks it until it ends, so that whatever way the block is left (an answer, an
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
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from voice_llm.core.util import procfs

STOP_TIMEOUT_S = 5.0
KILL_WAIT_S = 5.0  # after SIGKILL: the kernel frees a large process's memory before it is gone
POLL_S = 0.02

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


def stop_child(proc: subprocess.Popen[Any], timeout_s: float = STOP_TIMEOUT_S, *, group: bool = False,
               leader_first_s: float | None = None) -> None:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL: the process is gone (and reaped) when this returns.
    ``group``: the child was started with ``start_new_session=True`` and the signals go to its whole process
    group, so a program it started (a shell script's ``sleep``, a Locust worker) does not keep running and
    holding its pipes; when this returns, the rest of the group has been SIGKILLed and waited for (up to
    ``KILL_WAIT_S``, :func:`kill_group_members`).
    ``leader_first_s``: first SIGTERM the leader alone and give it that long to stop its own group (the Locust
    master lets its workers send their last samples); an interrupt cuts that wait short (the leader still gets
    the group's SIGTERM, on which the master saves what it measured). Then the group as above, whatever is left of
    it. A child that has already ended is only reaped: its group is not signalled (its id may be reused), except
    by :func:`kill_group_members` right after its end.

    Nothing here depends on how fast the machine is: each wait is a grace period, and what has not stopped by its
    end is SIGKILLed (a signal that cannot be caught or ignored). A Ctrl-C (or SIGTERM, which the CLI turns into
    one) during the group's grace period does not leave the group running: it ends the wait at once, the group is
    SIGKILLed and the leader reaped, and then the interrupt goes on (KeyboardInterrupt)."""
    if leader_first_s is not None and proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(leader_first_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):  # an interrupt: on to the group's SIGTERM now
            pass
        if group and proc.poll() is not None:
            kill_group_members(proc)
    if proc.poll() is None:
        _signal(proc, signal.SIGTERM, group)
        interrupted = False
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            interrupted = _kill(proc, group)
        except KeyboardInterrupt:  # a second interrupt: stop at once, then let it go on
            _kill(proc, group)
            interrupted = True
        if group:  # the leader is gone; a member that ignored SIGTERM must not outlive it
            kill_group_members(proc)
        if interrupted:
            raise KeyboardInterrupt


def _kill(proc: subprocess.Popen[Any], group: bool) -> bool:
    """SIGKILL (the group's, with ``group``) and reap the leader, which SIGKILL ends at once; an interrupt meanwhile
    cannot stop this half way (True: one came, the caller raises it when the group is gone)."""
    _signal(proc, signal.SIGKILL, group)
    interrupted = False
    while True:
        try:
            proc.wait()
            return interrupted
        except KeyboardInterrupt:
            interrupted = True


def kill_group_members(proc: subprocess.Popen[Any], wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL what is left of the process group a child led (``start_new_session``) once the child has ended:
    members that outlived their leader. Call it right after the leader's end was seen: while a member lives the
    group's id cannot be given to a new process, and with none left the signal finds nothing. The members are not
    our children (we cannot reap them), so their end is waited for in /proc, up to ``wait_s`` (a process in an
    uninterruptible wait dies only when it leaves it): True when none is alive."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return True
    deadline = time.monotonic() + wait_s
    while procfs.group_members(proc.pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our own child (a server a test started in-process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _gone(pid: int) -> bool:
    _reap(pid)
    return procfs.start_ticks(pid) is None  # a zombie has exited: gone


def stop_pid(pid: int, timeout_s: float = STOP_TIMEOUT_S, *, group: bool = False,
             kill_wait_s: float = KILL_WAIT_S) -> bool:
    """Stop a process known by its id (not a ``Popen`` of ours): SIGTERM (to its group with ``group``), wait up
    to ``timeout_s`` until it is gone (a zombie counts as gone; reaped if it is our child), then SIGKILL and wait
    up to ``kill_wait_s``. True when it is gone, False when it survived SIGKILL. Raises PermissionError when it
    is not ours to signal. The caller checked that ``pid`` is the process it means (start time, command)."""
    kill = os.killpg if group else os.kill
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, kill_wait_s)):
        try:
            kill(pid, sig)
        except ProcessLookupError:
            _reap(pid)
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if _gone(pid):
                return True
            time.sleep(POLL_S)
    return _gone(pid)


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
