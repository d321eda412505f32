"""Stopping a child process: politely when it listens, for sure when it does not."""

from __future__ import annotations

import signal
import subprocess
import sys

from voice_llm.util.children import stop_child


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
