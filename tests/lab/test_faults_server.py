"""Faults of the server itself: killed mid-answer, a prompt longer than its context, and `up` failing in every
way a real machine offers (missing or corrupt model, port taken, stale pid file, a binary that does not run).

Each test asserts the message the user gets and that nothing saved before the fault was lost or replaced.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from voice_llm.core import sse
from voice_llm.core.scenario import prompts
from voice_llm.core.server import lifecycle as server
from voice_llm.core.util import procfs
from voice_llm.core.client.api import ServerClient

from conftest import RunningServer
from clihelpers import assert_clean_failure, cli

# Marked one by one: the tests that start or need a real llama-server, its binary or the model are `server` (slow);
# those that start nothing real (a corrupt state file, bad numbers, `log`/`down` with nothing started, another
# program on the port) are fast.
WAIT_S = 60.0  # upper bound on any single wait in this module





def _alive(pid: int) -> bool:
    return server._proc_start_ticks(pid) is not None


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def up_refused(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`voice-llm up ARGS` that must be refused before any llama-server runs, in this process like every other
    command here. clihelpers.cli starts `up` as a process of its own because the server a successful one starts
    outlives it (its parent must be gone, as for a user); a refused one starts none, and a new interpreter was ~1 s
    of each such test. Status, message and "no traceback" are main's either way (clihelpers)."""
    import clihelpers
    from unittest import mock

    with mock.patch.object(clihelpers, "_may_start_the_managed_server", lambda _args: False):
        return cli("up", *args, env=env)


def _wait_for(condition, timeout_s: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------------------------
# 2. The server killed (SIGKILL) in the middle of a long generation
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_server_killed_mid_generation_keeps_the_bytes_and_the_earlier_artifacts(
    running_server: RunningServer, tmp_path: Path, env: dict[str, str], step_context
) -> None:
    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    # A previous complete run: its files must come through the crash byte for byte, including the complete raw
    # file of the very request that is about to fail.
    (out / "ttft.json").write_text(json.dumps({"runs": [], "ttft_p50": 101.0, "total_p50": 900.0}) + "\n")
    (out / "sse_raw.txt").write_bytes(b'data: {"choices":[]}\n\ndata: [DONE]\n\n')
    (out / "raw" / "long.sse").write_bytes(b"data: [DONE]\n\n")
    before = _snapshot(out)

    ctx = step_context(running_server.url, timeout=WAIT_S, out=out)
    partial = out / "raw" / "long.sse.partial"
    outcome: dict[str, object] = {}

    def long_request() -> None:
        try:
            outcome["result"] = ctx.request("long", prompts.chat(prompts.ONE_SENTENCE_SYSTEM, prompts.CANCEL_REQUEST),
                                            max_tokens=256)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = exc

    worker = threading.Thread(target=long_request, daemon=True)
    worker.start()
    # Several content chunks have arrived (the role chunk alone is ~200 bytes): the answer is under way.
    _wait_for(lambda: partial.exists() and partial.stat().st_size > 1500 or not worker.is_alive(),
              what="the first chunks of the long answer")
    assert worker.is_alive(), f"the 256-token answer finished before it could be killed: {outcome}"
    pid = running_server.record.pid
    os.kill(pid, signal.SIGKILL)
    worker.join(WAIT_S)
    assert not worker.is_alive(), "the reader did not notice the dead server"
    server._reap(pid)

    error = outcome.get("error")
    assert isinstance(error, sse.StreamTruncatedError), outcome
    message = str(error)
    assert "stream ended early" in message
    assert f"after {error.received_bytes} bytes" in message and f"{len(error.chunks)} content chunks" in message
    assert error.received_bytes > 1500 and error.chunks
    # The raw bytes that arrived are on disk, exactly as many as the message says.
    raw = partial.read_bytes()
    assert len(raw) == error.received_bytes
    assert raw.startswith(b"data: {") and b"[DONE]" not in raw
    assert any(f"{len(raw)} bytes received are in {partial}" in note for note in getattr(error, "__notes__", []))
    # Earlier artifacts untouched, nothing half-written next to them.
    after = _snapshot(out)
    del after["raw/long.sse.partial"]
    assert after == before
    assert not list(out.rglob("*.tmp"))

    # The CLI then reports the dead server in one line, and its state as stale, without a traceback.
    status = cli("status", "--port", str(running_server.settings.port), env=env, timeout=30)
    assert status.returncode != 0 and "not running" in status.stdout and "stale" in status.stdout
    assert "Traceback" not in status.stderr
    gone = cli("sse", "--url", running_server.url, "--out", str(out), "-q", env=env, timeout=30)
    assert_clean_failure(gone, "connection refused")
    assert _snapshot(out).keys() >= before.keys()
    assert all(_snapshot(out)[name] == data for name, data in before.items())


# ---------------------------------------------------------------------------------------------------------------
# 3. A prompt longer than the context, from a real KB folder with big documents
# ---------------------------------------------------------------------------------------------------------------

WORDS = ("clinic patient appointment doctor nurse insurance billing vaccine prescription refill telehealth "
         "parking Saturday morning laboratory results fasting pediatrics cancellation reception").split()


def _document(index: int, words: int) -> str:
    body = " ".join(WORDS[(index * 7 + i * 3 + i // 5) % len(WORDS)] for i in range(words))
    return f"# Document {index}\n\n{body}.\n"


@pytest.mark.server
def test_prompt_longer_than_the_context_is_refused_before_any_request(
    module_server: RunningServer, tmp_path: Path, env: dict[str, str]
) -> None:
    kb = tmp_path / "kb"
    kb.mkdir()
    # The first four documents are short; all twelve together are far more than the server's 4096 tokens. The
    # lab counts its longest prompt with the server's tokenizer first (issue 16.6), so nothing is spent on the
    # 0- and 4-document requests before the 12-document one would fail with HTTP 400.
    for i in range(1, 13):
        (kb / f"{i:02d}-doc.md").write_text(_document(i, 40 if i <= 4 else 700), encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    previous = b'[{"docs": 0, "prompt_n": 30, "prompt_ms": 50.0, "ttft_ms": 60.0}]\n'
    (out / "prefill.json").write_bytes(previous)

    result = cli("prefill", "--url", module_server.url, "--kb", str(kb), "--out", str(out), "-q", env=env,
                 timeout=300)
    err = assert_clean_failure(result, "context is 4096 tokens per slot", "--kb", "larger --ctx", "12-doc.md")
    match = re.search(r"is (\d+) tokens, and the server's context is 4096", err)
    assert match and int(match.group(1)) > 4096, err
    # Refused before any request: the earlier prefill.json is intact and no evidence file was started.
    assert (out / "prefill.json").read_bytes() == previous
    assert not list(out.glob("raw/prefill-*"))
    assert not list(out.rglob("*.tmp"))
    # The server is fine afterwards.
    assert ServerClient(module_server.url).health() == {"status": "ok"}


# ---------------------------------------------------------------------------------------------------------------
# 5. `up` failures
# ---------------------------------------------------------------------------------------------------------------


def _record_file(state: Path, port: int) -> Path:
    return state / f"port-{port}" / "server.json"


@pytest.mark.server
def test_up_with_a_missing_model_file(env: dict[str, str], state_dir: Path, port: int, server_binary: Path) -> None:
    result = up_refused("--port", str(port), "--model", "/nonexistent/model.gguf", "-q", env=env)
    assert_clean_failure(result, "model file", "does not exist", "/nonexistent/model.gguf")
    assert not _record_file(state_dir, port).exists()
    assert server.port_is_free("127.0.0.1", port)


@pytest.mark.server
def test_up_with_a_truncated_gguf_shows_the_servers_log_tail(
    env: dict[str, str], state_dir: Path, port: int, tmp_path: Path, model_path: Path, server_binary: Path
) -> None:
    broken = tmp_path / "truncated.gguf"
    with open(model_path, "rb") as src:
        broken.write_bytes(src.read(1 << 20))
    result = cli("up", "--port", str(port), "--model", str(broken), "-q", env=env, timeout=120)
    err = assert_clean_failure(result, "exited with code", "while loading", one_line=False)
    lines = err.strip().splitlines()
    assert lines[0].startswith("voice-llm up: llama-server exited with code 1 while loading; last lines of ")
    assert str(state_dir / f"port-{port}" / "server.log") in lines[0]
    tail = "\n".join(lines[1:])
    assert 0 < len(lines) - 1 <= server.LOG_TAIL_LINES
    assert "failed to load model" in tail and str(broken) in tail
    # Nothing left running or recorded; the log stays for `voice-llm log`.
    assert not _record_file(state_dir, port).exists()
    assert server.port_is_free("127.0.0.1", port)
    status = cli("status", "--port", str(port), env=env, timeout=30)
    assert status.returncode != 0 and "not running" in status.stdout
    log = cli("log", "--port", str(port), env=env, timeout=30)
    assert log.returncode == 0 and "failed to load model" in log.stdout


@pytest.mark.server
def test_up_on_a_port_held_by_another_program(env: dict[str, str], state_dir: Path, port: int,
                                              server_binary: Path, model_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = up_refused("--port", str(port), "-q", env=env)
        assert_clean_failure(result, f"port {port}", "in use by another program", "--port")
        assert not _record_file(state_dir, port).exists()
        # The other program still owns its port.
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass


@pytest.mark.server
def test_stale_pid_file_never_signals_the_process_that_now_has_that_pid(
    env: dict[str, str], state_dir: Path, port: int, server_binary: Path, model_path: Path
) -> None:
    bystander = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        ticks = server._proc_start_ticks(bystander.pid)
        assert ticks is not None
        stale = {
            "pid": bystander.pid, "start_ticks": ticks + 12345,  # the pid was reused by a later process
            "host": "127.0.0.1", "port": port, "url": f"http://127.0.0.1:{port}", "binary": str(server_binary),
            "model": str(model_path), "ctx": 4096, "slots": 1, "started_at": time.time() - 3600,
            "api_key_set": False,
        }
        record = _record_file(state_dir, port)
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps(stale))

        status = cli("status", "--port", str(port), "--json", env=env, timeout=30)
        assert status.returncode != 0 and "Traceback" not in status.stderr
        assert json.loads(status.stdout)["running"] is False and "stale" in json.loads(status.stdout)["note"]

        down = cli("down", "--port", str(port), env=env, timeout=30)
        assert down.returncode == 0, down.stderr
        assert "not running any more" in down.stdout and "stale" in down.stdout
        assert bystander.poll() is None and not record.exists()

        record.write_text(json.dumps(stale))
        up = cli("up", "--port", str(port), "-q", env=env, timeout=240)
        assert up.returncode == 0, up.stderr
        try:
            assert bystander.poll() is None
            new = server.read_record(port)
            assert new is not None and new.pid != bystander.pid and _alive(new.pid)
            assert ServerClient(new.url).health() == {"status": "ok"}
        finally:
            down = cli("down", "--port", str(port), env=env, timeout=60)
        assert down.returncode == 0 and "stopped" in down.stdout
        assert bystander.poll() is None, "the unrelated process that reused the pid was signalled"
    finally:
        bystander.kill()
        bystander.wait(10)


@pytest.mark.parametrize("content", ["not json {", "[1, 2]", '{"pid": "x"}', ""])
def test_a_corrupt_state_file_is_not_trusted(env: dict[str, str], state_dir: Path, port: int, content: str) -> None:
    record = _record_file(state_dir, port)
    record.parent.mkdir(parents=True)
    record.write_text(content)
    status = cli("status", "--port", str(port), env=env, timeout=30)
    assert status.returncode != 0 and "not running" in status.stdout and "Traceback" not in status.stderr
    down = cli("down", "--port", str(port), env=env, timeout=30)
    assert down.returncode == 0 and "Traceback" not in down.stderr


def _write(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.server
@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("not-executable", ["cannot run the llama-server binary", "Permission denied"]),
        ("text-with-exec-bit", ["cannot run the llama-server binary", "Exec format error"]),
        ("nonexistent", ["llama-server binary", "does not exist or is not a file"]),
        ("a-directory", ["llama-server binary", "does not exist or is not a file"]),
    ],
)
def test_up_with_a_server_binary_that_does_not_run(
    kind: str, expected: list[str], env: dict[str, str], state_dir: Path, port: int, tmp_path: Path, model_path: Path
) -> None:
    binary = {
        "not-executable": lambda: _write(tmp_path / "llama-server", "#!/bin/sh\nexit 0\n", 0o644),
        "text-with-exec-bit": lambda: _write(tmp_path / "llama-server", "just some text\n", 0o755),
        "nonexistent": lambda: tmp_path / "no" / "llama-server",
        "a-directory": lambda: tmp_path,
    }[kind]()
    result = up_refused("--port", str(port), "--server-bin", str(binary), "-q", env=env)
    assert_clean_failure(result, *expected, str(binary))
    assert not _record_file(state_dir, port).exists()
    assert server.port_is_free("127.0.0.1", port)


@pytest.mark.server
def test_up_with_a_server_binary_that_exits_at_once(env: dict[str, str], state_dir: Path, port: int,
                                                    tmp_path: Path, model_path: Path) -> None:
    binary = _write(tmp_path / "llama-server", "#!/bin/sh\necho 'error: unknown argument --cache-ram' >&2\nexit 3\n",
                    0o755)
    result = up_refused("--port", str(port), "--server-bin", str(binary), "-q", env=env)
    err = assert_clean_failure(result, "exited with code 3 while loading", one_line=False)
    assert err.strip().splitlines()[-1] == "error: unknown argument --cache-ram"
    assert not _record_file(state_dir, port).exists()


@pytest.mark.server
def test_ctrl_c_while_the_server_loads_leaves_no_server_behind(
    env: dict[str, str], state_dir: Path, port: int, server_binary: Path, model_path: Path
) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "voice_llm", "up", "--port", str(port), "-q"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        record_file = _record_file(state_dir, port)
        _wait_for(lambda: record_file.exists() or proc.poll() is not None, what="the server record")
        record = server.read_record(port)
        assert record is not None and proc.poll() is None
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 130, (stdout, stderr)
    assert "interrupted" in stderr and "Traceback" not in stderr
    _wait_for(lambda: not _alive(record.pid), timeout_s=15, what="the half-started server to exit")
    assert not record_file.exists()
    assert server.port_is_free("127.0.0.1", port)


def test_log_and_down_before_anything_was_started(env: dict[str, str], port: int) -> None:
    log = cli("log", "--port", str(port), env=env, timeout=30)
    assert_clean_failure(log, "no server log", "voice-llm up")
    down = cli("down", "--port", str(port), env=env, timeout=30)
    assert down.returncode == 0 and "no managed server" in down.stdout


@pytest.mark.parametrize(("flags", "needle"), [(["--port", "0"], "argument --port: a port is 1..65535"),
                                               (["--ctx", "16"], "--ctx must be at least"),
                                               (["--slots", "0"], "argument --slots: must be at least 1")])
def test_up_with_bad_numbers(flags: list[str], needle: str, env: dict[str, str], state_dir: Path) -> None:
    result = up_refused(*flags, "-q", env=env)
    usage = needle.startswith("argument")  # refused by the flag's type: argparse's usage line, then the error
    assert_clean_failure(result, needle, one_line=not usage)
    assert result.returncode == (2 if usage else 1)
    assert not state_dir.exists() or not list(state_dir.rglob("server.json"))



@pytest.mark.server
@pytest.mark.parametrize("kind", ["a-file", "under-proc"])
def test_a_state_folder_that_cannot_be_written(kind: str, env: dict[str, str], tmp_path: Path, port: int,
                                               server_binary: Path, model_path: Path) -> None:
    if kind == "a-file":
        state = tmp_path / "state-file"
        state.write_text("not a folder\n")
    else:
        state = Path("/proc/voice-llm-test-state")
    env = {**env, "VOICE_LLM_STATE": str(state)}
    up = up_refused("--port", str(port), "-q", env=env)
    assert_clean_failure(up, f"cannot write the server's state folder {state / f'port-{port}'}",
                         "set VOICE_LLM_STATE to a writable folder")
    assert server.port_is_free("127.0.0.1", port)  # nothing was started without a record to find it by
    status = cli("status", "--port", str(port), env=env, timeout=30)
    assert status.returncode == 1 and "not running" in status.stdout and "Traceback" not in status.stderr
    down = cli("down", "--port", str(port), env=env, timeout=30)
    assert down.returncode == 0 and "no managed server" in down.stdout and "Traceback" not in down.stderr


# ---------------------------------------------------------------------------------------------------------------
# Issues 15.7, 16.3, 16.7, 16.8: down keeps the record until the process is gone; a server without a record
# is still found; a crash log survives the next `up`; a step says the managed server died
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_down_keeps_the_record_when_the_signal_fails(running_server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    port = running_server.settings.port

    def refuse(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(server.os, "killpg", refuse)
    with pytest.raises(server.ServerError, match=f"not allowed to stop llama-server \\(pid {running_server.record.pid}\\)"):
        server.down(port)
    assert server.read_record(port) == running_server.record  # still findable, so `down` can be tried again
    assert _alive(running_server.record.pid)
    monkeypatch.undo()
    assert "stopped" in server.down(port)
    assert server.read_record(port) is None and not _alive(running_server.record.pid)


def _held_by_http_server(port: int) -> subprocess.Popen[bytes]:
    holder = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # Listening, and seen by /proc as its listener: what `status` and `down` look for.
    _wait_for(lambda: procfs.listener_pid(port) == holder.pid or holder.poll() is not None, what="http.server")
    return holder


@pytest.mark.server
def test_a_server_whose_state_folder_was_deleted_is_still_found_and_stopped(
    env: dict[str, str], state_dir: Path, port: int, server_binary: Path, model_path: Path
) -> None:
    assert cli("up", "--port", str(port), "-q", env=env).returncode == 0
    record = server.read_record(port)
    assert record is not None
    try:
        shutil.rmtree(state_dir)
        status = cli("status", "--port", str(port), env=env, timeout=30)
        assert status.returncode == 1 and "not running" in status.stdout
        assert f"answered by a llama-server voice-llm has no record of (pid {record.pid}, " in status.stdout
        up = cli("up", "--port", str(port), "-q", env=env)
        assert_clean_failure(up, f"in use by a llama-server voice-llm has no record of (pid {record.pid}",
                             f"`voice-llm down --port {port}` stops it")
        down = cli("down", "--port", str(port), env=env, timeout=60)
        assert down.returncode == 0 and f"stopped llama-server on port {port} (pid {record.pid}" in down.stdout
        assert "no record" in down.stdout
        _wait_for(lambda: not _alive(record.pid), timeout_s=15, what="the unrecorded server to exit")
        assert server.port_is_free("127.0.0.1", port)
    finally:
        if _alive(record.pid):
            os.kill(record.pid, signal.SIGKILL)


def test_down_never_stops_another_program_on_the_port(env: dict[str, str], port: int) -> None:
    holder = _held_by_http_server(port)
    try:
        status = cli("status", "--port", str(port), env=env, timeout=30)
        assert status.returncode == 1 and f"answered by another program (pid {holder.pid}, " in status.stdout
        assert "http.server" in status.stdout
        down = cli("down", "--port", str(port), env=env, timeout=30)
        assert down.returncode == 0 and "no managed server" in down.stdout
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait(10)


@pytest.mark.server
def test_a_server_killed_mid_step_is_named_and_its_log_kept(
    env: dict[str, str], state_dir: Path, port: int, tmp_path: Path, server_binary: Path, model_path: Path
) -> None:
    assert cli("up", "--port", str(port), "-q", env=env).returncode == 0
    record = server.read_record(port)
    assert record is not None
    out = tmp_path / "out"
    step = subprocess.Popen([sys.executable, "-m", "voice_llm", "ttft", "--port", str(port), "--out", str(out), "-q"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Kill it while an answer streams (a partial raw file with bytes in it).
        _wait_for(lambda: any(p.stat().st_size > 0 for p in out.glob("raw/*.partial")) or step.poll() is not None,
                  what="the first streamed bytes")
        os.kill(record.pid, signal.SIGKILL)
        _, err = step.communicate(timeout=WAIT_S)
    finally:
        if step.poll() is None:
            step.kill()
        if _alive(record.pid):
            os.kill(record.pid, signal.SIGKILL)
    _wait_for(lambda: not _alive(record.pid), timeout_s=15, what="the killed server to go")
    assert step.returncode == 1 and "Traceback" not in err, err
    assert "stream ended early" in err  # the reader's own words stay; the cause follows
    assert f"cause: llama-server on port {port} (pid {record.pid}) died" in err
    assert f"last lines of its log {state_dir / f'port-{port}' / 'server.log'}" in err
    crash_log = (state_dir / f"port-{port}" / "server.log").read_bytes()
    assert crash_log.strip().splitlines()[-1].decode() in err  # the tail shown is the dead server's

    # status and log without --port find the dead server and its log.
    status = cli("status", env=env, timeout=30)
    assert status.returncode == 1 and f"port {port}: not running" in status.stdout
    assert f"llama-server on port {port} (pid {record.pid}) died" in status.stdout
    log = cli("log", "-n", "3", env=env, timeout=30)
    assert log.returncode == 0 and log.stdout.encode() == b"".join(crash_log.splitlines(keepends=True)[-3:])

    # The next `up` keeps the dead server's log and says where.
    again = cli("up", "--port", str(port), "-q", env=env)
    try:
        assert again.returncode == 0, again.stderr
        kept = state_dir / f"port-{port}" / "server.log.1"
        assert f"the previous llama-server on port {port} (pid {record.pid}) died" in again.stderr
        assert f"its log is kept in {kept}" in again.stderr
        assert kept.read_bytes() == crash_log
        assert (state_dir / f"port-{port}" / "server.log").read_bytes() != crash_log
    finally:
        cli("down", "--port", str(port), env=env)


@pytest.mark.server
def test_explain_death_gives_the_signal_of_a_server_it_started(running_server: RunningServer) -> None:
    port = running_server.settings.port
    assert server.explain_death(port) is None  # running
    os.kill(running_server.record.pid, signal.SIGKILL)
    _wait_for(lambda: procfs.is_zombie(running_server.record.pid), timeout_s=15, what="the server to die")
    death = server.explain_death(port)
    assert death is not None and f"(pid {running_server.record.pid}) was killed by signal SIGKILL" in death
    assert "last lines of its log" in death
