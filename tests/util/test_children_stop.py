"""The one stopper (issue 31.22): stopping a process group does not depend on how fast the machine is. Each wait
is a grace period that SIGKILL ends; when stop_child returns, no member of the group is alive (checked at once,
no polling in the test); a Ctrl-C during the grace period cuts it short without leaving the group running; the
load runner's stop swallows that second interrupt so its caller still keeps what the master wrote."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from voice_llm.capabilities.load import runner
from voice_llm.core.util import children, procfs

# A leader that ignores SIGTERM and starts a member that ignores it too (a Locust worker deaf to "quit"); it
# prints the member's pid once both ignore SIGTERM.
STUBBORN = textwrap.dedent("""\
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    member = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE)
    member.stdout.readline()
    print(member.pid, flush=True)
    time.sleep(120)
    """)


@pytest.fixture()
def stubborn() -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        member = int(proc.stdout.readline())
        assert procfs.group_members(proc.pid) == {proc.pid, member}
        yield proc, member
    finally:  # never leave one behind, even when the test fails
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def test_a_group_deaf_to_sigterm_is_gone_when_stop_returns(stubborn: tuple[subprocess.Popen[str], int]) -> None:
    proc, member = stubborn
    children.stop_child(proc, 0.2, group=True)
    assert proc.returncode == -signal.SIGKILL  # the grace period ended in SIGKILL
    assert procfs.group_members(proc.pid) == set() and procfs.start_ticks(member) is None


def test_the_runner_stops_the_group(stubborn: tuple[subprocess.Popen[str], int],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    proc, member = stubborn
    monkeypatch.setattr(runner, "MASTER_STOP_S", 0.2)
    runner._stop_group(proc)
    assert procfs.group_members(proc.pid) == set() and procfs.start_ticks(member) is None


def test_the_leader_first_then_the_group_as_the_runner_stops_the_master(stubborn: tuple[subprocess.Popen[str], int],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    proc, member = stubborn
    monkeypatch.setattr(runner, "MASTER_STOP_S", 0.2)
    runner._stop_master(proc)
    assert procfs.group_members(proc.pid) == set() and procfs.start_ticks(member) is None


@pytest.fixture()
def interrupt_soon() -> Iterator[None]:
    """A Ctrl-C every 0.3 s from now, in this (the main) thread, as a user's further Ctrl-C would come."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3, 0.3)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def test_a_second_interrupt_during_the_grace_period_still_kills_the_group(
        stubborn: tuple[subprocess.Popen[str], int], interrupt_soon: None) -> None:
    proc, member = stubborn
    with pytest.raises(KeyboardInterrupt):
        children.stop_child(proc, 60.0, group=True)  # the grace period would last a minute: the interrupt cuts it
    signal.setitimer(signal.ITIMER_REAL, 0)
    assert proc.returncode == -signal.SIGKILL
    assert procfs.group_members(proc.pid) == set() and procfs.start_ticks(member) is None


def test_the_load_runner_stops_the_master_and_keeps_the_interrupt_its_own(
        stubborn: tuple[subprocess.Popen[str], int], interrupt_soon: None, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, member = stubborn
    # Each grace period would last a minute: one Ctrl-C cuts the master's, the next the group's, and neither is
    # raised again (run_sweep raises SweepInterrupted next, with what the master wrote).
    monkeypatch.setattr(runner, "MASTER_STOP_S", 60.0)
    runner._stop_master(proc)
    signal.setitimer(signal.ITIMER_REAL, 0)
    assert proc.returncode == -signal.SIGKILL
    assert procfs.group_members(proc.pid) == set() and procfs.start_ticks(member) is None
