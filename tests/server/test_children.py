"""Stopping a child process: politely when it listens, for sure when it does not."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from voice_llm.core.util import procfs
from voice_llm.core.util.children import stop_child, stop_pid


def _child(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # running, handlers set
    return proc


def test_a_child_that_listens_ends_on_sigterm() -> None:
    proc = _child("import sys, time; print('up', flush=True); time.sleep(60)")
    stop_child(proc, timeout_s=5)
    assert proc.returncode == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    proc = _child("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
                  "time.sleep(60)")
    stop_child(proc, timeout_s=0.3)
    assert proc.returncode == -signal.SIGKILL


def test_a_child_already_gone_is_left_as_it_ended() -> None:
    proc = _child("print('up', flush=True)")
    proc.wait()
    stop_child(proc)
    assert proc.returncode == 0


def test_stop_pid_stops_a_process_known_only_by_its_id_politely_first() -> None:
    proc = _child("import signal, sys, time\n"
                  "def bye(*_):\n    print('term', flush=True)\n    sys.exit(0)\n"
                  "signal.signal(signal.SIGTERM, bye); print('up', flush=True); time.sleep(60)")
    assert stop_pid(proc.pid, timeout_s=5) is True
    assert proc.stdout is not None and proc.stdout.read() == b"term\n"  # SIGTERM reached it, and it was heard
    assert procfs.start_ticks(proc.pid) is None  # gone (and reaped by stop_pid: it is our child)


def test_stop_pid_kills_one_that_ignores_sigterm() -> None:
    proc = _child("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
                  "time.sleep(60)")
    assert stop_pid(proc.pid, timeout_s=0.3) is True
    assert procfs.start_ticks(proc.pid) is None


def test_stop_pid_of_a_process_already_gone_says_gone() -> None:
    proc = _child("print('up', flush=True)")
    proc.wait()
    assert stop_pid(proc.pid, timeout_s=0.3) is True


def test_leader_first_asks_the_leader_alone_then_kills_what_is_left(tmp_path: Path) -> None:
    # A member that would note a SIGTERM in a file: with leader_first_s only the leader is asked (it ends on
    # it, as the Locust master does), so the member never sees SIGTERM; it is killed with what is left.
    noted = tmp_path / "member-saw-sigterm"
    member_code = (f"import signal, sys, time\ndef note(*_):\n    open({str(noted)!r}, 'w').close()\n    sys.exit(0)\n"
                   "signal.signal(signal.SIGTERM, note); print(1, flush=True); time.sleep(60)")
    code = ("import subprocess, sys, time\n"
            f"member = subprocess.Popen([sys.executable, '-c', {member_code!r}], stdout=subprocess.PIPE)\n"
            "member.stdout.readline(); print(member.pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    member = int(proc.stdout.readline())
    stop_child(proc, timeout_s=5, group=True, leader_first_s=5)
    assert proc.returncode == -signal.SIGTERM  # the leader ended on the polite signal meant for it alone
    deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously: a bound, not a measured time
    while procfs.start_ticks(member) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert procfs.start_ticks(member) is None and not noted.exists()
