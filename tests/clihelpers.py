"""Running the `voice-llm` CLI the way a user does, and what every failure must look like.

``cli`` runs the command in this process (``voice_llm.cli.main.main(argv)``) with the environment, working folder,
stdin, stdout and stderr a subprocess would get, and hands back what a subprocess would: the exit status and both
streams. It costs milliseconds where a new interpreter costs ~0.6 s of imports, and it goes through the same
parser, handlers and error printing. An exception main lets out is printed as the traceback the interpreter would
print, with status 1, so "no traceback" is still asserted. ``cli_process`` starts the real `python -m voice_llm`,
for what only a process shows: the entry point, signals, children left behind, a lock held by another process.
``cli`` itself starts one for a command that may start the managed llama-server (`up`; `lab` and `load` without
--url): that server outlives the command, and its parent must be gone as it is for a user (run in this process,
the test process would be its parent and could reap it, and `status` would say more than it can for a user).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import traceback
import typing
from collections.abc import Iterator
from pathlib import Path

# Settings a developer may have exported that would change what a test means.
USER_SETTINGS = ("VOICE_LLM_API_KEY", "LLAMA_API_KEY", "VOICE_LLM_MODEL", "VOICE_LLM_SERVER_BIN")


# For a lab against a fake server that does not test the caller's turn: the capabilities that run a whole call
# (real Whisper, Silero and Piper in real time, ~1 min of a lab's 1.5) left out: dial, whose converse step it is, and
# the agent it dials.
WITHOUT_THE_CALL = {"VOICE_LLM_WITHOUT": "dial,agent"}

# For a real lab (or a step) that tests relations, not the bundled documents' length: the bundled KB cut to ~33
# words a document (title, opening, first fact: the 12-document prompt 835 tokens; tests/fixtures/kb-short/README.txt).
# Prefill and the cache step on a real server take seconds with it instead of minutes; `make lab` runs the full set.
SHORT_KB = Path(__file__).resolve().parent / "fixtures" / "kb-short"
# The session lab's repeats, as `make lab` runs it (Makefile REPEAT; the CLI's default is 3).
LAB_REPEAT = 2
# The session lab's call: the agent's replies cut at 16 tokens (`lab --reply-max-tokens`; the agent's default is 48).
# The caller hears every reply to its end, so 48-token replies (~10 s of speech each) were most of the call's 55 s;
# what is asserted on it (each gap heard, the agent's numbers beside it, the barge-in 500 ms into reply 3 and its
# silence) does not depend on the reply's length (the PCM call of tests/dial/test_dial_real.py uses 16 too).
LAB_REPLY_TOKENS = 16


def cli_env(state_dir: Path) -> dict[str, str]:
    """This environment without the user's voice-llm settings, with a private state folder."""
    environ = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    return {**environ, "VOICE_LLM_STATE": str(state_dir)}


@contextlib.contextmanager
def _as_a_process(env: dict[str, str], cwd: Path | str | None):
    """os.environ replaced by ``env``, the working folder ``cwd``, stdin empty, and the SIGTERM handler main
    installs (and SIGINT's) taken back afterwards: what a new process would have had, undone when the command returns."""
    saved_env, saved_cwd, saved_stdin = dict(os.environ), os.getcwd(), sys.stdin
    saved_signals = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    os.environ.clear()
    os.environ.update(env)
    sys.stdin = io.StringIO("")  # subprocess.DEVNULL
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        sys.stdin = saved_stdin
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def _captured_fds() -> Iterator[list[str]]:
    """File descriptors 1 and 2 (and sys.stdout/sys.stderr, unbuffered, on them) sent to two files: what the
    command prints and what a child it starts (Locust, espeak-ng) writes to the streams it inherits, in the order
    written, as a pipe to a subprocess would hold it. The list yielded holds both texts once the block ends."""
    texts: list[str] = []
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fds, saved_streams = (os.dup(1), os.dup(2)), (sys.stdout, sys.stderr)
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
            try:
                yield texts
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            os.close(saved_fds[0])
            os.close(saved_fds[1])
            texts.extend(_read(file) for file in (out, err))


def _read(file: typing.BinaryIO) -> str:
    file.seek(0)
    return file.read().decode("utf-8", errors="backslashreplace")


def _may_start_the_managed_server(args: tuple[str, ...]) -> bool:
    command = next((a for a in args if not a.startswith("-")), "")
    return command == "up" or (command in ("lab", "load") and not any(a.split("=")[0] == "--url" for a in args))


def _forget_what_a_new_process_would_not_know() -> None:
    """The TTS engine the speak step loads once per process, found on an earlier command's PATH: a command run here
    with espeak-ng off its PATH must find it missing, as a new process would (CI ran such a test after one that had
    loaded espeak-ng, and it went on to ask the server)."""
    from voice_llm.capabilities.speak import step as tts_step

    tts_step.forget_loaded_engines()


def cli(*args: str, env: dict[str, str], timeout: float = 120,
        cwd: Path | str | None = None) -> subprocess.CompletedProcess[str]:
    """`voice-llm ARGS` run in this process (see the module's docstring). ``timeout`` is kept for the callers'
    sake; pytest-timeout bounds an in-process command."""
    from voice_llm.cli import main as cli_main

    if _may_start_the_managed_server(args):
        return cli_process(*args, env=env, timeout=timeout, cwd=cwd)
    _forget_what_a_new_process_would_not_know()
    with _as_a_process(env, cwd), _captured_fds() as texts:
        try:
            status = cli_main.main(list(args))
        except SystemExit as exc:  # argparse's usage errors, --help, --version
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                status = 1
        except Exception:  # noqa: BLE001 - what the interpreter would print for an uncaught exception
            traceback.print_exc(file=sys.stderr)
            status = 1
    return subprocess.CompletedProcess(["voice-llm", *args], status, *texts)


def cli_process(*args: str, env: dict[str, str], timeout: float = 120,
                cwd: Path | str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m voice_llm ARGS` as a new process."""
    return subprocess.run([sys.executable, "-m", "voice_llm", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)


def assert_clean_failure(result: subprocess.CompletedProcess[str], *needles: str, one_line: bool = True) -> str:
    """Non-zero exit, no traceback, one line on stderr (unless a log tail follows), the needles in it."""
    err = result.stderr
    assert result.returncode != 0, (result.stdout, err)
    assert "Traceback" not in err and "Traceback" not in result.stdout, err
    if one_line:
        assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def make_kb(folder: Path, count: int = 12) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, count + 1):
        (folder / f"{i:02d}-doc.md").write_text(f"# Doc {i}\n\nThe clinic opens at {8 + i % 3} am.\n", encoding="utf-8")
    return folder


def wait_for_ready(agent: subprocess.Popen, ready_file: Path, timeout_s: float = 180.0,
                   what: str = "the agent") -> dict:
    """The ready file of a `voice-llm agent --ready-file` started as ``agent``, parsed, once it exists; fails the test
    with the agent's stderr if it exits first, or after ``timeout_s`` (loading Silero, Whisper and Piper on a shared
    2-core machine takes seconds to minutes)."""
    import json
    import time

    deadline = time.monotonic() + timeout_s
    while not ready_file.exists():
        assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
        assert time.monotonic() < deadline, f"{what} was not ready in {timeout_s:g} s"
        time.sleep(0.2)
    return json.loads(ready_file.read_text())
