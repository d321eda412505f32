"""A small scripted HTTP server on 127.0.0.1 for testing the SSE reader's failure paths without llama-server.

Each test says what the server answers (:class:`Reply`): a status, headers and a body sent as timed pieces,
framed with chunked transfer encoding, with ``Connection: close`` (body ends when the socket closes) or with a
Content-Length; the answer may end normally, or be cut (the socket shut down, or reset, in the middle). The server
records every request it received (headers and body) and whether the client closed the connection while it was
still sending. Everything is bounded: every wait has a timeout, and leaving the ``with`` block stops any
answer still in progress and joins the threads.

    with FakeServer(Reply.stream(llama_events(["Hi", "!"]))) as fake:
        run_stream(messages, base_url=fake.url)
        assert fake.requests[0].json["stream"] is True
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

# Upper bound on any single wait inside the server, whatever a test scripts.
MAX_WAIT_S = 10.0
POLL_S = 0.02


# ---------------------------------------------------------------------------------------------------------------
# What to send
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    ``pieces`` are ``(delay_s, bytes)``: wait ``delay_s`` (counted from the previous piece), then send the bytes
    (one HTTP chunk each when ``framing == "chunked"``). ``framing`` is ``"chunked"``, ``"close"`` (no length,
    the body ends when the server closes the socket) or ``"length"`` (Content-Length of all pieces). ``end`` is
    ``"normal"``, ``"cut"`` (shut the socket down right after the last piece, no terminating chunk: a FIN) or
    ``"reset"`` (close with SO_LINGER 0: an RST). ``stall_s`` waits before the status line is sent.
    ``head_pieces`` are ``(delay_s, bytes)`` sent right after the status line, before the headers: a server that
    trickles its headers (``at(1.0, [b"X"] * 30)``: one byte of a header line a second).
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    pieces: tuple[tuple[float, bytes], ...] = ()
    framing: str = "chunked"
    end: str = "normal"
    stall_s: float = 0.0
    head_pieces: tuple[tuple[float, bytes], ...] = ()

    @classmethod
    def stream(cls, pieces: Iterable[tuple[float, bytes]] | bytes, *, framing: str = "chunked", end: str = "normal",
               content_type: str = "text/event-stream", stall_s: float = 0.0) -> Reply:
        if isinstance(pieces, bytes):
            pieces = [(0.0, pieces)]
        return cls(200, (("Content-Type", content_type),), tuple(pieces), framing, end, stall_s)

    @classmethod
    def body(cls, status: int, body: bytes, content_type: str) -> Reply:
        return cls(status, (("Content-Type", content_type),), ((0.0, body),), framing="length")

    @classmethod
    def json(cls, status: int, value: Any) -> Reply:
        return cls.body(status, json.dumps(value).encode("utf-8"), "application/json; charset=utf-8")

    @classmethod
    def html(cls, status: int = 200) -> Reply:
        page = b"<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n<body>It works</body></html>\n"
        return cls.body(status, page, "text/html; charset=utf-8")


CONTEXT_OVERFLOW = {
    "error": {
        "code": 400,
        "message": "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5000,
        "n_ctx": 4096,
    }
}
UNAUTHORIZED = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}


def event(payload: Any) -> bytes:
    """One SSE event as llama-server writes it: ``data: <json>\\n\\n`` (or ``data: [DONE]\\n\\n``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode("utf-8")


DONE = event("[DONE]")
TIMINGS = {"cache_n": 0, "prompt_n": 12, "prompt_ms": 40.5, "prompt_per_token_ms": 3.4, "prompt_per_second": 296.0,
           "predicted_n": 3, "predicted_ms": 30.0, "predicted_per_token_ms": 10.0, "predicted_per_second": 100.0}


def chunk_payload(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}],
        "created": 1732890000, "id": "chatcmpl-fake", "model": "fake", "system_fingerprint": "b0-fake",
        "object": "chat.completion.chunk", **extra,
    }


def llama_events(texts: Sequence[str], *, timings: dict[str, Any] | None = TIMINGS, done: bool = True) -> list[bytes]:
    """The events of one llama-server answer: role-only chunk, one chunk per text, final chunk, [DONE]."""
    events = [event(chunk_payload({"role": "assistant", "content": None}))]
    events += [event(chunk_payload({"content": text})) for text in texts]
    final = chunk_payload({}, "stop", **({"timings": timings} if timings is not None else {}))
    events.append(event(final))
    if done:
        events.append(DONE)
    return events


def at(delay_s: float, events: Iterable[bytes]) -> list[tuple[float, bytes]]:
    """Pieces: each event sent ``delay_s`` after the previous one."""
    return [(delay_s, e) for e in events]


# ---------------------------------------------------------------------------------------------------------------
# What was received
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    client_closed: bool = False  # the client closed its side while we were still answering
    write_failed: bool = False  # a write failed (EPIPE / ECONNRESET) because the client had gone
    sent_bytes: int = 0  # body bytes handed to the kernel
    sent_at: list[float] = field(default_factory=list)  # time.monotonic() as each body piece went to the kernel
    finished: threading.Event = field(default_factory=threading.Event)
    client_port: int = 0  # the client's source port: one port = one connection

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class _ClientGone(Exception):
    pass


# ---------------------------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = MAX_WAIT_S  # every read of the request is bounded
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def _answer(self) -> None:
        fake = self.server.fake
        self.answered = getattr(self, "answered", 0) + 1
        # One request per connection (the script is per request), unless the fake keeps connections alive: then
        # up to ``keep_alive`` requests, after which it closes the connection without saying so.
        self.close_connection = self.answered >= fake.keep_alive
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        record = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                          client_port=self.client_address[1])
        with fake.lock:
            if not fake.script_probe and _is_capability_probe(record):
                # The lab probes the server's capabilities before its steps: not part of a test's script. Answered
                # 404, so the probe learns nothing and the steps behave as they did before it existed.
                fake.probes.append(record)
                reply = PROPS_NOT_FOUND
            elif self.command == "GET" and self.path == "/slots" and fake.slots is not None:
                # The agent's --preemptive gate asks for the slots (agent.server.Agent.preemptive_gate): a fake
                # given ``slots`` answers it outside the script (SLOTS_NOT_LISTED: 404, a server with no slots list)
                fake.probes.append(record)
                reply = PROPS_NOT_FOUND if fake.slots == SLOTS_NOT_LISTED else Reply.json(200, fake.slots)
            elif self.command == "GET" and self.path == "/props" and not fake.script_props:
                # The lab asks /props once for the run's metadata before its steps: not part of a test's script.
                fake.probes.append(record)
                reply = PROPS_NOT_FOUND
            else:
                fake.requests.append(record)
                reply = fake.next_reply()
        try:
            self._send(reply, record)
        except _ClientGone:
            pass
        except (BrokenPipeError, ConnectionResetError):
            record.write_failed = True
            record.client_closed = True
        finally:
            record.finished.set()

    def _wait(self, seconds: float, record: Recorded) -> None:
        """Sleep ``seconds`` (bounded), noticing if the client closes the connection or the server stops."""
        deadline = time.monotonic() + min(seconds, MAX_WAIT_S)
        while True:
            if self.server.fake.stopping.is_set():
                raise _ClientGone
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            readable, _, _ = select.select([self.connection], [], [], min(remaining, POLL_S))
            if readable:
                # The client sends nothing after its request, so readable means EOF (or a reset).
                try:
                    data = self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    data = b""
                if not data:
                    record.client_closed = True
                    raise _ClientGone

    def _write(self, data: bytes, record: Recorded) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def _send(self, reply: Reply, record: Recorded) -> None:
        if reply.stall_s:
            self._wait(reply.stall_s, record)
        self.send_response_only(reply.status)
        if reply.head_pieces:
            self.flush_headers()  # the status line now, then the trickle
            for delay, piece in reply.head_pieces:
                if delay:
                    self._wait(delay, record)
                self._write(piece, record)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        elif reply.framing == "length":
            self.send_header("Content-Length", str(sum(len(p) for _, p in reply.pieces)))
        if not self.server.fake.keep_alive:
            self.send_header("Connection", "close")
        self.end_headers()  # flushes the header buffer to the socket
        for delay, piece in reply.pieces:
            if delay:
                self._wait(delay, record)
            if reply.framing == "chunked":
                self._write(b"%x\r\n%s\r\n" % (len(piece), piece), record)
            else:
                self._write(piece, record)
            record.sent_bytes += len(piece)
            record.sent_at.append(time.monotonic())
        if reply.end == "normal":
            if reply.framing == "chunked":
                self._write(b"0\r\n\r\n", record)
            return
        if reply.end == "reset":
            self._wait(0.05, record)  # let the bytes already sent reach the client before the reset
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            self.connection.shutdown(socket.SHUT_RDWR)
        self.connection.close()


SLOTS_NOT_LISTED = "not listed"  # FakeServer(slots=...): /slots answers 404 outside the script
PROPS_NOT_FOUND = Reply.json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})


def _is_capability_probe(record: Recorded) -> bool:
    """A request of voice_llm.core.client.capabilities.probe: its GETs carry a header, its one stream a fixed tiny prompt."""
    from voice_llm.core.client.capabilities import PROBE_HEADER, PROBE_MAX_TOKENS, PROBE_MESSAGES

    if record.headers.get(PROBE_HEADER[0].lower()) == PROBE_HEADER[1]:
        return True
    if record.method != "POST":
        return False
    try:
        body = json.loads(record.body)
    except ValueError:
        return False
    return (isinstance(body, dict) and body.get("messages") == list(PROBE_MESSAGES)
            and body.get("max_tokens") == PROBE_MAX_TOKENS)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeServer


class FakeServer:
    """``with FakeServer(reply) as fake:`` — ``fake.url`` answers every request with ``reply`` (or with the
    next of a list of replies, the last one repeating). ``fake.requests`` records what arrived."""

    def __init__(self, replies: Reply | Sequence[Reply], *, script_props: bool = False, keep_alive: int = 0,
                 script_probe: bool = False, port: int = 0, slots: list[dict[str, Any]] | str | None = None) -> None:
        self.port = port  # 0: a free one; a test that re-runs a command against "the same server" passes the last
        self.replies = [replies] if isinstance(replies, Reply) else list(replies)
        self.keep_alive = keep_alive  # requests per kept-alive connection (Content-Length replies); 0: close each
        assert self.replies, "at least one reply"
        self.script_props = script_props  # False: GET /props answers 404 outside the script (see _answer)
        self.script_probe = script_probe  # False: the capability probe's requests answer 404 outside the script
        # GET /slots outside the script: llama-server's list, or SLOTS_NOT_LISTED (404); None: /slots is scripted
        self.slots = slots
        self.requests: list[Recorded] = []
        self.probes: list[Recorded] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def next_reply(self) -> Reply:
        index = min(len(self.requests) - 1, len(self.replies) - 1)
        return self.replies[index]

    @property
    def url(self) -> str:
        assert self._httpd is not None, "use FakeServer as a context manager"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeServer:
        self._httpd = _Server(("127.0.0.1", self.port), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fakeserver", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()  # ends any scripted wait at once
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=MAX_WAIT_S)
        for record in self.requests:
            record.finished.wait(timeout=MAX_WAIT_S)

    def wait_finished(self, index: int = -1, timeout: float = 5.0) -> Recorded:
        """The recorded request once its answer is over (sent, cut, or abandoned by the client)."""
        deadline = time.monotonic() + timeout
        while not self.requests and time.monotonic() < deadline:
            time.sleep(POLL_S)
        record = self.requests[index]
        assert record.finished.wait(max(0.0, deadline - time.monotonic())), "the fake server is still answering"
        return record


@contextmanager
def serving(httpd: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    """Serve ``httpd`` from a thread for the ``with`` block; then shut it down, close it and join the thread."""
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(MAX_WAIT_S)


class _TCPListener:
    """A listening socket on 127.0.0.1 that hands each connection to ``_on_connection`` in a thread of its own;
    leaving the ``with`` block stops accepting and joins every thread."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.getsockname()[1]

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def __enter__(self) -> Self:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_S * 5)
        self._spawn(self._accept_loop)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in list(self._threads):
            thread.join(timeout=MAX_WAIT_S)
        assert self._listener is not None
        self._listener.close()

    def _spawn(self, target: Any, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True, name=type(self).__name__)
        self._threads.append(thread)
        thread.start()
        return thread

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self.stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._on_connection(client)

    def _on_connection(self, client: socket.socket) -> None:
        raise NotImplementedError


class RawServer(_TCPListener):
    """``with RawServer(answer) as raw:`` — a bare TCP server for what an HTTP server cannot script (a TLS client
    talking to a plain server). Each connection: read what the client sends first, send ``answer`` (nothing when
    empty), then hold the connection open until the client closes it (at most MAX_WAIT_S). ``client_closed``
    counts the connections the client closed itself."""

    def __init__(self, answer: bytes = b"") -> None:
        super().__init__()
        self.answer = answer
        self.client_closed = 0
        self.connections = 0  # connections accepted

    def _on_connection(self, client: socket.socket) -> None:
        self.connections += 1
        self._spawn(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        deadline = time.monotonic() + MAX_WAIT_S
        answered = False
        try:
            while not self.stopping.is_set() and time.monotonic() < deadline:
                readable, _, _ = select.select([client], [], [], POLL_S)
                if not readable:
                    continue
                try:
                    data = client.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self.client_closed += 1
                    return
                if self.answer and not answered:
                    answered = True
                    client.sendall(self.answer)
        finally:
            client.close()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound and released: a connect to it is refused, and a server
    may take it). The suite's only one: conftest and the tests import it from here."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


unused_port = free_port  # the same port, named for tests that want a connect to be refused


# ---------------------------------------------------------------------------------------------------------------
# A recording TCP proxy: what really came over the wire from a real server
# ---------------------------------------------------------------------------------------------------------------


class RecordingProxy(_TCPListener):
    """``with RecordingProxy(real_url) as proxy:`` — ``proxy.url`` forwards every TCP connection to the real
    server unchanged and records the bytes of each direction (``proxy.downstream[i]`` = server -> client)."""

    def __init__(self, target_url: str) -> None:
        from urllib.parse import urlsplit

        super().__init__()
        parts = urlsplit(target_url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.upstream: list[bytearray] = []
        self.downstream: list[bytearray] = []
        self._pumps: list[threading.Thread] = []

    def __exit__(self, *exc: object) -> None:
        # The client may close as soon as it has read `data: [DONE]`, before the server's last chunk (the
        # `0\r\n\r\n` that ends a chunked body) has passed through. Let each connection end by itself (the
        # server closes once the client has) so the record is the whole response, then stop.
        for pump in list(self._pumps):
            pump.join(timeout=MAX_WAIT_S)
        super().__exit__(*exc)

    def _on_connection(self, client: socket.socket) -> None:
        up, down = bytearray(), bytearray()
        self.upstream.append(up)
        self.downstream.append(down)
        self._pumps.append(self._spawn(self._pump, client, up, down))

    def _pump(self, client: socket.socket, up: bytearray, down: bytearray) -> None:
        server = socket.create_connection(self.target, timeout=MAX_WAIT_S)
        peers = {client: (server, up), server: (client, down)}
        open_ends = {client, server}
        deadline = time.monotonic() + 120.0  # a real answer of a few tokens takes seconds; never hang forever
        try:
            while open_ends and not self.stopping.is_set() and time.monotonic() < deadline:
                readable, _, _ = select.select(list(open_ends), [], [], POLL_S * 5)
                for sock in readable:
                    other, record = peers[sock]
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if data:
                        record += data
                        try:
                            other.sendall(data)
                        except OSError:  # that side has gone; keep recording what the other still sends
                            pass
                    else:
                        open_ends.discard(sock)
                        try:
                            other.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
        finally:
            client.close()
            server.close()


def split_http_response(raw: bytes) -> tuple[bytes, bytes]:
    """(head, body) of a recorded HTTP/1.1 response, the body de-chunked if it was sent chunked."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep, "no end of headers in the recorded response"
    if b"transfer-encoding: chunked" not in head.lower():
        return head, rest
    body = bytearray()
    while True:
        size_line, sep, rest = rest.partition(b"\r\n")
        assert sep, "truncated chunk size line"
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return head, bytes(body)
        assert rest[size:size + 2] == b"\r\n", "chunk not followed by CRLF"
        body += rest[:size]
        rest = rest[size + 2:]
