"""The cancel step's /slots polls (api.JSONPoller): one kept-alive connection, a fixed interval, the clock started by the caller
(at the close). A local HTTP/1.1 server counts connections and requests; no llama-server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from voice_llm.core.client.api import ServerClient
from voice_llm.core.lab.cancel import wait_until_idle

from fakeserver import serving


class SlotsServer(ThreadingHTTPServer):
    def __init__(self, busy_polls: int, close_every: int = 0) -> None:
        super().__init__(("127.0.0.1", 0), SlotsHandler)
        self.busy_polls = busy_polls
        self.close_every = close_every  # answer "Connection: close" on every n-th request (0: never)
        self.connections = 0
        self.requests = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class SlotsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as llama-server's HTTP server does
    server: SlotsServer

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.requests += 1
            n = self.server.requests
        body = json.dumps([{"id": 0, "is_processing": n <= self.server.busy_polls}]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        close = bool(self.server.close_every) and n % self.server.close_every == 0
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def busy_then_idle() -> Iterator[SlotsServer]:
    with serving(SlotsServer(busy_polls=20)) as httpd:
        yield httpd  # type: ignore[misc]


def test_polls_go_over_one_kept_alive_connection(busy_then_idle: SlotsServer) -> None:
    since = time.perf_counter()
    with ServerClient(busy_then_idle.url, timeout=5).poller("/slots") as poller:
        idle_ms = wait_until_idle(poller, since, interval_s=0.002)
        assert poller.connections == 1
    after_ms = (time.perf_counter() - since) * 1000.0
    assert busy_then_idle.requests == 21  # 20 busy answers, then the idle one
    assert busy_then_idle.connections == 1
    # counted from the caller's moment, and the 20 waits between polls are in it
    assert 20 * 2.0 <= idle_ms <= after_ms


def test_the_clock_starts_at_the_given_moment_not_at_the_first_poll(busy_then_idle: SlotsServer) -> None:
    busy_then_idle.busy_polls = 0
    earlier = time.perf_counter() - 0.25  # e.g. the close, 250 ms before the reader returned
    with ServerClient(busy_then_idle.url, timeout=5).poller("/slots") as poller:
        assert wait_until_idle(poller, earlier) >= 250.0


def test_a_connection_the_server_closes_is_opened_again() -> None:
    with serving(SlotsServer(busy_polls=6, close_every=3)) as httpd:
        with ServerClient(httpd.url, timeout=5).poller("/slots") as poller:
            wait_until_idle(poller, time.perf_counter(), interval_s=0.001)
            assert poller.connections == 3  # polls 1-3, 4-6, 7
        assert httpd.requests == 7
