"""A server whose every route trickles its headers (one byte a second): the command's /props, the capability
probe and the step would each wait their own limit if nothing stopped them. The first GET that runs out of time
ends the command, so the whole command ends within its limit + a few seconds, with one line."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from clihelpers import assert_clean_failure, cli

SLACK_S = 4.0  # a hang guard for a loaded machine, not a speed target


@contextmanager
def trickling_server() -> Iterator[str]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                for byte in b"Content-Type: application/json\r\nX-Slow: " + b"x" * 200:
                    if stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(1)
            except OSError:
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        srv.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, limit_s", [
    (["health", "--deadline", "6"], 6.0),
    (["sse", "--timeout", "4"], 4.0),
    (["ttft", "--timeout", "3", "--deadline", "6"], 3.0),
])
def test_a_server_trickling_every_route_costs_one_limit(args: list[str], limit_s: float, tmp_path: Path,
                                                       env: dict[str, str]) -> None:
    with trickling_server() as url:
        t0 = time.monotonic()
        result = cli(*args, "--url", url, "--out", str(tmp_path / "out"), "-q", env=env, timeout=100)
        elapsed = time.monotonic() - t0
    err = assert_clean_failure(result, url, "its headers did not end")
    assert elapsed < limit_s + SLACK_S, (elapsed, err)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.json")), "no half run is left"


@pytest.mark.parametrize("args, needle", [
    (["down", "--port", "99999"], "a port is 1..65535"),
    (["ttft", "--port", "0"], "a port is 1..65535"),
    (["status", "--port", "-1"], "a port is 1..65535"),
    (["up", "--ctx", "0"], "must be at least 1"),
    (["lab", "--repeat", "0"], "must be at least 1"),
    (["log", "-n", "-5"], "must be at least 1"),
    (["sse", "--url", "http://127.0.0.1:9/v1/chat/completions"], "not an endpoint: 'http://127.0.0.1:9/v1'"),
    (["sse", "--url", "localhost:8080"], "not an http:// or https:// URL"),
])
def test_a_bad_number_or_url_is_a_usage_error_before_anything_starts(args: list[str], needle: str,
                                                                      env: dict[str, str]) -> None:
    result = cli(*args, env=env, timeout=30)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_check_on_a_folder_that_is_no_run_is_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "notes.txt").write_text("not a run\n")
    result = cli("check", str(tmp_path), env=env, timeout=30)
    assert_clean_failure(result, "holds no voice-llm artifact")
