"""Two runs into one OUT at once (issue 16.2): the second refuses naming the first, or waits with --wait."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from clihelpers import assert_clean_failure, cli, cli_env
from fakeserver import FakeServer, Reply, at, llama_events

from voice_llm.core.run.lock import LOCK_NAME


def _slow_answer() -> Reply:
    # ~1.6 s per answer, longer with the probe's: the first run holds OUT that long, and the second (run in this
    # process, clihelpers.cli) needs a few ms of CPU to reach the lock, still well within it on a loaded machine
    return Reply.stream(at(0.4, llama_events(["One.", " Two.", " Three."])))


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "voice_llm", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _wait_for(path: Path, proc: subprocess.Popen[str], limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@contextlib.contextmanager
def _first_run_holding(out: Path, env: dict[str, str]) -> Iterator[tuple[FakeServer, subprocess.Popen[str]]]:
    """`voice-llm sse` into OUT against a slow scripted server, yielded once it holds OUT's lock."""
    with FakeServer(_slow_answer()) as fake:
        first = _start(["sse", "-q", "--url", fake.url, "--out", str(out)], env)
        try:
            _wait_for(out / LOCK_NAME, first)
            yield fake, first
        finally:
            first.communicate(timeout=60)


def test_a_second_run_into_the_same_out_is_refused(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "state")
    out = tmp_path / "out"
    with _first_run_holding(out, env) as (fake, first):
        second = cli("ttft", "-q", "--url", fake.url, "--out", str(out), env=env)
        err = assert_clean_failure(second, str(out), "voice-llm sse", f"pid {first.pid}", "--wait")
        assert "ttft.json" not in os.listdir(out), err
    assert first.returncode == 0
    assert (out / "sse_raw.txt").is_file() and not (out / LOCK_NAME).exists()


def test_wait_runs_after_the_first_one(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "state")
    out = tmp_path / "out"
    with _first_run_holding(out, env) as (fake, first):
        second = cli("sse", "-q", "--wait", "--url", fake.url, "--out", str(out / "sub"), env=env)
        assert second.returncode == 0, second.stderr  # another OUT: never blocked
        waited = cli("health", "-q", "--wait", "--url", fake.url, "--out", str(out), env=env)
        assert first.poll() is not None, "the waiting run ran while the first still held OUT"
    assert first.returncode == 0
    # health against the fake gets a stream instead of JSON: it fails, but only after the first run let go.
    assert "Traceback" not in waited.stderr


def test_check_refuses_a_folder_another_run_is_writing(tmp_path: Path) -> None:
    """A folder half written is not checked (its FAILs would be the unfinished run's); after the run it is."""
    env = cli_env(tmp_path / "state")
    out = tmp_path / "out"
    with _first_run_holding(out, env) as (fake, first):
        during = cli("check", str(out), env=env)
        assert_clean_failure(during, str(out), "is being written by `voice-llm sse`", f"pid {first.pid}")
    assert first.returncode == 0
    after = cli("check", str(out), env=env)
    assert "is being written" not in after.stderr and "Traceback" not in after.stderr
