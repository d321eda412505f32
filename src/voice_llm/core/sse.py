"""Read an OpenAI-style chat stream from llama.cpp's server by hand, with a timestamp on every line.

This file stands alone (standard library only) so it can be copied into a voice pipeline as it is, and
``python sse.py [--url URL]`` runs the brief's step 2 by itself. It has three layers:

* :class:`SSEDecoder` — a pure, incremental decoder of ``text/event-stream`` bytes into events, following the
  HTML standard's "Interpreting an event stream" rules
  (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation). No I/O.
* :func:`open_connection` / :func:`error_from_response` — the thin HTTP layer over :mod:`http.client`.
* :func:`run_stream` (rich result) and :func:`stream` (the brief's tuple) — send one chat request and time it.
  Read it in three steps: ``_send_request`` (connect, send, status and headers), ``_read_body`` (the read loop and
  the clocks) and ``_Reading.handle`` (what one event means).

Timing rule: the clock starts with ``time.perf_counter()`` just before the request is written to the socket, and a
chunk's time is when the bytes that completed its event were read from the socket.

Limits: ``timeout`` is the longest time without a token (keep-alive comments, role-only and empty events do not
reset it: a server that only pings fails like a silent one, with :class:`NoContentTimeoutError`); ``deadline_s``
bounds the whole request (:class:`DeadlineExceededError`). Both are kept on the wall clock for everything the
request waits for (connect, TLS handshake, status and headers, an error body, the stream): each socket read is
given only the time left (:func:`limit_reads`), so a server that trickles one byte at a time cannot stretch them.
The reader returns at ``data: [DONE]`` and closes the connection, whether or not the server ends the body. A base
URL may end in ``/v1`` as OpenAI clients write it.
"""

from __future__ import annotations

import argparse
import codecs
import http.client
import io
import json
import math
import os
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

# The managed server's address (voice-llm's ServerSettings uses the same host and port); repeated here only
# because this file must run on its own.
DEFAULT_URL = "http://127.0.0.1:8080"
# The two files brief step 2 writes (``python sse.py``). This module stands alone, so it names them itself;
# voice_llm.core.util.artifacts, the table of artifact names, takes these two from here.
RAW_FILE = "sse_raw.txt"
CHUNKS_FILE = "chunks.jsonl"
CHAT_PATH = "/v1/chat/completions"
DONE_DATA = "[DONE]"
READ_SIZE = 65536  # at most this many bytes per read; a read returns whatever has arrived, never waits for more
V1_SUFFIX = "/v1"  # OpenAI clients' base URLs end in /v1; server_root drops it
DEFAULT_TIMEOUT_S = 120.0  # the longest wait for a token (keep-alive comments do not count)
DEFAULT_DEADLINE_S = 600.0  # the longest a whole request may take
TIMEOUT_SLACK_S = 0.05  # how late a timeout may fire, to keep the socket's timeout unchanged while tokens flow
# One socket wait is at most this long (the OS refuses a timeout like 1e300); a longer limit is waited in turns.
MAX_SOCKET_WAIT_S = 3600.0
TLS_HANDSHAKE_TIMEOUT_S = 5.0  # a plain-HTTP server never answers a TLS handshake: give up after this
# An https URL found not to speak TLS fails at once for this long, so that a command's next requests (the probe's
# GETs, the steps, which come seconds later) do not each wait for a handshake again: the first one ends the
# command. Short, so that a long-lived process sees a server that has since been given TLS.
NOT_TLS_REMEMBER_S = 60.0
# An error answer (status other than 200) is read for its message only: its first 64 KiB hold any server's JSON
# error object (llama-server's is ~300 bytes); the rest is not read, so a huge or endless error body costs nothing.
ERROR_BODY_LIMIT = 65536
# OpenSSL's reasons when the answer to a ClientHello is not TLS (a plain "HTTP/1.1 400" among them).
NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                             "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "BAD_RECORD_TYPE"})

# ---------------------------------------------------------------------------------------------------------------
# The decoder: bytes -> lines -> events, no I/O.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event. ``id`` is the stream's last event ID at dispatch time, as the standard says."""

    data: str
    event: str = "message"
    id: str = ""


class SSEDecoder:
    """Incremental ``text/event-stream`` decoder.

    ``feed(bytes)`` may be called with any split of the stream (even one byte at a time); it returns the events
    completed by those bytes. ``retry`` holds the last valid ``retry:`` value in ms, or None.
    """

    def __init__(self) -> None:
        # The stream is always UTF-8 (spec: "Streams must be decoded using the UTF-8 decode algorithm"); the
        # incremental decoder keeps a multi-byte character split across feeds, and invalid bytes become U+FFFD.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_start = True  # a leading U+FEFF is ignored once, at the very start of the stream
        self._line = ""  # text of the line not yet terminated
        self._skip_lf = False  # the last text ended with CR: an LF first in the next text completes that CRLF
        self._event_type = ""
        self._data: list[str] = []
        self._last_event_id = ""
        self.retry: int | None = None

    def feed(self, data: bytes) -> list[ServerSentEvent]:
        return self._feed_text(self._utf8.decode(data))

    def end(self) -> list[ServerSentEvent]:
        """End of stream. Spec: "any pending data must be discarded" — an event with no final blank line is
        dropped (the line being read is discarded too), so this always returns an empty list."""
        self._utf8.decode(b"", final=True)
        self._line = ""
        self._data = []
        self._event_type = ""
        return []

    def _feed_text(self, text: str) -> list[ServerSentEvent]:
        if self._at_start and text:
            self._at_start = False
            if text[0] == "\ufeff":
                text = text[1:]
        if self._skip_lf and text:
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
        events: list[ServerSentEvent] = []
        start = 0
        length = len(text)
        # Spec grammar: end-of-line = ( cr lf / cr / lf ). Scan for either terminator; a CR that is the last
        # character cannot be told from a CRLF yet, so it ends the line now and an LF that comes next is skipped.
        while start < length:
            cr = text.find("\r", start)
            lf = text.find("\n", start)
            if cr < 0 and lf < 0:
                break
            end = lf if cr < 0 or (0 <= lf < cr) else cr
            line = self._line + text[start:end]
            self._line = ""
            if text[end] == "\r":
                if end + 1 < length:
                    start = end + 2 if text[end + 1] == "\n" else end + 1
                else:
                    self._skip_lf = True
                    start = length
            else:
                start = end + 1
            event = self._process_line(line)
            if event is not None:
                events.append(event)
        if start < length:
            self._line += text[start:]
        return events

    def _process_line(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":  # a comment (llama-server's keep-alive is ":")
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]  # exactly one leading space is removed
        if name == "event":
            self._event_type = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._last_event_id = value
        elif name == "retry":
            if value and value.isascii() and value.isdigit():
                self.retry = int(value)
        # any other field name is ignored
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event_type = self._data, self._event_type
        self._data, self._event_type = [], ""
        if not data:  # spec: an empty data buffer dispatches nothing
            return None
        return ServerSentEvent(data="\n".join(data), event=event_type or "message", id=self._last_event_id)


# ---------------------------------------------------------------------------------------------------------------
# Errors. Each carries what arrived before it happened, so nothing received is lost.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """One content chunk: its text and the ms from just before the request until its bytes were read."""

    t_ms: float
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"t_ms": self.t_ms, "text": self.text}


class StreamError(Exception):
    """Base of every failure of a streaming request; ``chunks`` and ``received_bytes`` tell what arrived."""

    def __init__(self, message: str, *, chunks: Sequence[Chunk] = (), received_bytes: int = 0) -> None:
        super().__init__(message)
        self.chunks: tuple[Chunk, ...] = tuple(chunks)
        self.received_bytes = received_bytes


class ServerUnreachableError(StreamError):
    """Nothing answered at the URL (refused, unknown host, connect timeout, failed TLS handshake)."""


class NotTLSError(ServerUnreachableError):
    """An ``https://`` URL whose server does not speak TLS (most often a plain-HTTP server: use ``http://``)."""


class HTTPStatusError(StreamError):
    """The server answered with a status other than 200; ``status`` and the server's ``error`` object."""

    def __init__(self, message: str, *, status: int, error: Mapping[str, Any] | None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.status = status
        self.error = dict(error or {})


class NotEventStreamError(StreamError):
    """A 200 answer whose body is not ``text/event-stream`` (an HTML page, a proxy, another service)."""


class AnswerTooLargeError(StreamError):
    """A JSON answer (not a stream) larger than the caller's cap: refused rather than read into memory."""


class ServerEventError(StreamError):
    """The server sent ``data: {"error": ...}`` after streaming began."""


class MalformedEventError(StreamError):
    """A ``data:`` line that is not a JSON object (and not ``[DONE]``), or one nested too deeply to parse."""


class StreamTruncatedError(StreamError):
    """The connection ended before ``data: [DONE]``."""


class StreamTimeoutError(StreamError):
    """A time limit ran out; ``limit`` names which one (the subclasses below, for a streaming request)."""

    limit = "timeout"


class NoContentTimeoutError(StreamTimeoutError):
    """No token arrived for ``timeout`` s. Comments (keep-alive pings), role-only and empty events do not count:
    a server that only pings is as stuck as a silent one."""

    limit = "no-content timeout"


class DeadlineExceededError(StreamTimeoutError):
    """The whole request took longer than its overall ``deadline_s``, however steadily tokens came."""

    limit = "deadline"


def parse_json(text: str | bytes) -> Any:
    """``json.loads`` that fails with ValueError only: JSON nested thousands of levels deep makes the parser
    raise RecursionError, which a hostile stream or a damaged file must not turn into a crash."""
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise ValueError(f"nested too deeply to parse ({len(text)} characters of JSON)") from exc


# ---------------------------------------------------------------------------------------------------------------
# HTTP: one place that turns a base URL into a connection and a bad answer into an error.
# ---------------------------------------------------------------------------------------------------------------


def server_root(base_url: str) -> str:
    """The server's root URL, without a trailing ``/`` or ``/v1``. OpenAI clients write base URLs as
    ``http://host:8080/v1``; the chat path (``/v1/chat/completions``) and llama-server's own endpoints
    (``/props``, ``/slots``) are all under the root, so the ``/v1`` is dropped here, once."""
    parts = urllib.parse.urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https"):
        return base_url  # open_connection says what is wrong with it
    path = parts.path.rstrip("/")
    if path.endswith(V1_SUFFIX):
        path = path[: -len(V1_SUFFIX)]
    return f"{parts.scheme}://{parts.netloc}{path}"


def open_connection(base_url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """Return an unconnected HTTPConnection for ``base_url`` and the URL's path prefix (no trailing / or /v1)."""
    parts = urllib.parse.urlsplit(server_root(base_url))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerUnreachableError(f"not an http(s) URL: {base_url!r}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        port = parts.port
    except ValueError as exc:
        raise ServerUnreachableError(f"bad port in URL {base_url!r}") from exc
    return cls(parts.hostname, port, timeout=timeout), parts.path


def request_headers(api_key: str | None, accept: str = "application/json") -> dict[str, str]:
    headers = {"Accept": accept}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _plain_http_hint(base_url: str) -> str:
    return "use " + urllib.parse.urlsplit(base_url)._replace(scheme="http").geturl()


def socket_wait(limit: float) -> float:
    """The socket timeout for a wait that must end by ``limit`` (a ``time.perf_counter()`` time)."""
    return max(min(limit - time.perf_counter(), MAX_SOCKET_WAIT_S), 0.001)


class _WallClockReader(io.RawIOBase):
    """The raw bytes under an HTTPResponse, each socket read given only the time left until ``limit()`` (a
    ``perf_counter`` time, asked anew before every read, so a limit that moves on with each token is followed).

    http.client's own file object gives every ``recv`` the whole socket timeout again: a server that sends one
    byte a second (of its headers, an error body, a chunk-size line) would hold the request for ever. Here a read
    asked for after the limit, or one still waiting at it, raises TimeoutError."""

    def __init__(self, sock: socket.socket, limit: Callable[[], float], slack: float) -> None:
        super().__init__()
        self._sock, self._limit, self._slack = sock, limit, slack
        # Held, never read: like http.client's own file object it keeps the descriptor open until the answer is
        # closed, though the connection may close its socket first (after an answer with "Connection: close").
        self._hold = sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            remaining = self._limit() - time.perf_counter()
            if remaining <= 0:
                raise TimeoutError("timed out")
            wait = min(remaining, MAX_SOCKET_WAIT_S)
            current = self._sock.gettimeout()
            # Re-set the timeout only when it would wait too long (by more than the slack) or far too short: while
            # tokens flow it stays put; a wake-up before the limit just goes round once more.
            if current is None or current > wait + self._slack or current < wait / 2:
                self._sock.settimeout(wait)
            try:
                return self._sock.recv_into(buffer)
            except TimeoutError:
                continue  # the clock above decides whether the limit was reached

    def close(self) -> None:
        if not self.closed:
            self._hold.close()
        super().close()


class _LimitedSocket:
    """What an HTTPResponse is given as its socket: all it asks of one is a file object to read from."""

    def __init__(self, sock: socket.socket, limit: Callable[[], float], slack: float) -> None:
        self._sock, self._limit, self._slack = sock, limit, slack

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_WallClockReader(self._sock, self._limit, self._slack))


def limit_reads(conn: http.client.HTTPConnection, limit: Callable[[], float], slack: float = TIMEOUT_SLACK_S) -> None:
    """Make every read of the answers on ``conn`` (status line, headers, body) end by ``limit()``, a
    ``time.perf_counter()`` time asked before each socket read; past it a read raises TimeoutError. ``slack``: how
    late a read may give up (0 for an exact cut)."""

    def response(sock: socket.socket, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:
        return http.client.HTTPResponse(_LimitedSocket(sock, limit, slack), *args, **kwargs)  # type: ignore[arg-type]

    conn.response_class = response  # type: ignore[assignment]


def read_some(resp: http.client.HTTPResponse, max_bytes: int) -> tuple[bytes, BaseException | None]:
    """Up to ``max_bytes`` of the body, read as it arrives: what arrived, and the error that ended the read before
    the end of the body (TimeoutError at the limit, a broken connection), or None."""
    parts: list[bytes] = []
    size = 0
    while size < max_bytes:
        try:
            data = resp.read1(min(READ_SIZE, max_bytes - size))
        except (OSError, http.client.HTTPException) as exc:
            return b"".join(parts), exc
        if not data:
            break
        parts.append(data)
        size += len(data)
    return b"".join(parts), None


def one_line(text: str) -> str:
    """A server's text (an HTML page, a message with newlines) as one line of a message."""
    return " ".join(text.split())


# https endpoints found not to speak TLS: (host, port) -> (perf_counter time found, the error's message).
_NOT_TLS: dict[tuple[str, int | None], tuple[float, str]] = {}


def _not_tls(conn: http.client.HTTPConnection, message: str) -> NotTLSError:
    _NOT_TLS[(conn.host, conn.port)] = (time.perf_counter(), message)
    return NotTLSError(message)


def connect(conn: http.client.HTTPConnection, base_url: str, limit: float | None = None) -> None:
    """Open the TCP connection now, so that connect time is not counted as the server's and a refusal is clear.

    The connect and the TLS handshake each wait until ``limit`` (a ``perf_counter`` time) at the latest, and for
    https at most ``TLS_HANDSHAKE_TIMEOUT_S``: a plain-HTTP server never answers a handshake (it waits for the end
    of a request line), which would otherwise hang for the whole request timeout. An https URL found not to speak
    TLS fails at once for its next requests (``NOT_TLS_REMEMBER_S``): a command ends at its first request."""
    tls = isinstance(conn, http.client.HTTPSConnection)
    if tls:
        known = _NOT_TLS.get((conn.host, conn.port))
        if known is not None and time.perf_counter() - known[0] < NOT_TLS_REMEMBER_S:
            raise NotTLSError(known[1])
    full_timeout = conn.timeout
    wait = min(full_timeout if isinstance(full_timeout, (int, float)) else math.inf, MAX_SOCKET_WAIT_S)
    if limit is not None:
        wait = min(wait, limit - time.perf_counter())
    if tls:
        wait = min(wait, TLS_HANDSHAKE_TIMEOUT_S)
    conn.timeout = max(wait, 0.001)
    try:
        conn.connect()
    except ConnectionRefusedError as exc:
        port = urllib.parse.urlsplit(server_root(base_url)).port  # the port asked for: `up` must start it there
        up = f"voice-llm up --port {port}" if port else "voice-llm up"
        raise ServerUnreachableError(
            f"no server at {base_url} (connection refused); start one with `{up}` or pass --url"
        ) from exc
    except socket.gaierror as exc:
        raise ServerUnreachableError(f"cannot resolve the host of {base_url}: {exc.strerror}") from exc
    except TimeoutError as exc:
        if tls and conn.sock is not None:  # TCP connected, and the handshake never finished
            raise _not_tls(conn,
                f"{base_url}: no TLS handshake within {conn.timeout:.3g} s: the server does not speak TLS "
                f"(a plain HTTP server?); {_plain_http_hint(base_url)}"
            ) from exc
        raise ServerUnreachableError(f"cannot connect to {base_url} within {conn.timeout:.3g} s: {exc}") from exc
    except ssl.SSLError as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        if reason in NOT_TLS_REASONS:
            raise _not_tls(conn,
                f"{base_url}: the server does not speak TLS (it answered the TLS handshake with plain bytes: "
                f"{reason}); {_plain_http_hint(base_url)}"
            ) from exc
        raise ServerUnreachableError(
            f"TLS handshake with {base_url} failed: {reason} (if the server speaks plain HTTP, "
            f"{_plain_http_hint(base_url)})"
        ) from exc
    except OSError as exc:
        raise ServerUnreachableError(f"cannot connect to {base_url}: {exc}") from exc
    finally:
        conn.timeout = full_timeout
    if conn.sock is not None and isinstance(full_timeout, (int, float)):
        conn.sock.settimeout(min(full_timeout, MAX_SOCKET_WAIT_S))  # what the handshake's limit replaced


def status_error(status: int, reason: str, body: bytes, url: str, stopped: BaseException | None = None) -> HTTPStatusError:
    """The error for a non-200 answer: the status and the server's own message (llama-server sends
    ``{"error": {"code", "message", "type", ...}}``, OpenAI's shape), else the start of the body. ``stopped``:
    what ended the body's read early (the time limit, a broken connection), said in the message."""
    error: dict[str, Any] | None = None
    try:
        parsed = parse_json(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            error = parsed["error"]
    except (ValueError, UnicodeDecodeError):
        pass
    if error and error.get("message"):
        detail = one_line(str(error["message"]))[:500]
    else:
        detail = one_line(body[:200].decode("utf-8", "replace"))
    message = f"{url} answered HTTP {status} {one_line(reason)}: {detail or '(empty body)'}"
    if stopped is not None:
        why = "no more came within the time limit" if isinstance(stopped, TimeoutError) else (
            f"the connection broke: {stopped.__class__.__name__}")
        message += f" (the body stopped after {len(body)} bytes: {why})"
    kind = (error or {}).get("type")
    if kind == "exceed_context_size_error":
        message += (
            f" [prompt {error.get('n_prompt_tokens', '?')} tokens > n_ctx {error.get('n_ctx', '?')}: "
            "attach fewer documents or start the server with a larger --ctx]"
        )
    elif status == 401:
        message += " [the server wants an API key: pass --api-key or set VOICE_LLM_API_KEY]"
    return HTTPStatusError(message, status=status, error=error)


def error_from_response(resp: http.client.HTTPResponse, url: str) -> HTTPStatusError:
    """Read a non-200 answer (its first ``ERROR_BODY_LIMIT`` bytes, within the request's time limit when the
    connection has one: :func:`limit_reads`) and make its :func:`status_error`."""
    body, stopped = read_some(resp, ERROR_BODY_LIMIT)
    return status_error(resp.status, resp.reason, body, url, stopped)


# ---------------------------------------------------------------------------------------------------------------
# The streaming request: request (connect, send, status), read loop, event handling.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamResult:
    """Everything one streaming request showed. ``chunks`` hold only events with non-empty delta.content (what
    a voice pipeline speaks); ``reasoning_chunks`` the ``reasoning_content``/``reasoning`` deltas a reasoning
    model sends before its answer, which are never spoken."""

    chunks: tuple[Chunk, ...]
    total_ms: float
    timings: dict[str, Any] | None
    first_event_ms: float | None
    finish_reason: str | None
    usage: dict[str, Any] | None
    request_body: dict[str, Any]
    received_bytes: int
    done: bool  # data: [DONE] was received
    closed_early: bool  # we closed the connection (a StreamStop: after_ms, when or cancel) before [DONE]
    closed_at_ms: float | None = None
    events: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    reasoning_chunks: tuple[Chunk, ...] = ()
    # time.perf_counter() when the request was sent (the 0 of every *_ms above), so a caller can put its own
    # perf_counter readings on the request's clock (the cancel step times the slot from the close)
    started_at: float | None = None

    @property
    def ttft_ms(self) -> float | None:
        """Time to the first spoken token: reasoning never counts."""
        return self.chunks[0].t_ms if self.chunks else None

    @property
    def first_reasoning_ms(self) -> float | None:
        return self.reasoning_chunks[0].t_ms if self.reasoning_chunks else None

    @property
    def text(self) -> str:
        return "".join(chunk.text for chunk in self.chunks)

    @property
    def reasoning_text(self) -> str:
        return "".join(chunk.text for chunk in self.reasoning_chunks)


def chat_body(
    messages: Sequence[Mapping[str, str]],
    max_tokens: int = 64,
    cache_prompt: bool = True,
    extra: Mapping[str, Any] | None = None,
    *,
    model: str | None = None,
    include_usage: bool = False,
) -> dict[str, Any]:
    """The brief's request body; ``model`` names the model (OpenAI-style servers require it),
    ``include_usage`` asks for a final ``usage`` chunk, ``extra`` adds or overrides fields (``n_predict``, ...)."""
    body: dict[str, Any] = {"model": model} if model else {}
    body.update({
        "messages": [dict(m) for m in messages],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 7,
        "cache_prompt": cache_prompt,
    })
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(extra or {})
    return body


def _first_choice(payload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = payload.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def _hard_close(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse | None,
                sock: socket.socket | None = None) -> None:
    """Close the socket for real. ``resp`` keeps a file object on the socket, so ``close()`` alone may leave
    the descriptor open; ``shutdown`` sends the FIN now, which is what llama-server checks to cancel a task."""
    sock = sock or conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    if resp is not None:
        resp.close()
    conn.close()


class _Reading:
    """One request while it is read: what arrived so far, and its clocks. The clocks are absolute
    ``perf_counter`` times. The limits count from :meth:`begin` (before the connect): the no-content limit moves
    on with each token, the deadline is fixed. The measurements and the cut (``stop_after_ms``) count from
    :meth:`start`, just before the request is written."""

    def __init__(self, url: str, timeout: float, deadline_s: float | None, stop_after_ms: float | None,
                 on_chunk: Callable[[Chunk], None] | None, should_stop: Callable[[Chunk], bool] | None) -> None:
        self.url, self.timeout, self.deadline_s = url, timeout, deadline_s
        self.stop_after_ms, self.on_chunk, self.should_stop = stop_after_ms, on_chunk, should_stop
        self.chunks: list[Chunk] = []
        self.reasoning: list[Chunk] = []
        self.received = 0
        self.events = 0
        self.first_event_ms: float | None = None
        self.timings: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.answered = False  # the status line and headers arrived
        self.done = False
        self.closed_early = False
        self.t0 = self.content_limit = self.fixed_limit = self.deadline = self.cut = math.inf

    def begin(self) -> None:
        """The limits start: before the connect, so connect and TLS handshake count against them too."""
        now = time.perf_counter()
        self.content_limit = now + self.timeout
        self.deadline = math.inf if self.deadline_s is None else now + self.deadline_s
        self.fixed_limit = self.deadline

    def start(self) -> None:
        """The clock starts: just before the request is written to the socket."""
        self.t0 = t0 = time.perf_counter()
        self.cut = math.inf if self.stop_after_ms is None else t0 + self.stop_after_ms / 1000.0
        self.fixed_limit = min(self.deadline, self.cut)

    def limit(self) -> float:
        """When the next read must have returned: the nearest of the no-content limit, the deadline, the cut."""
        return min(self.content_limit, self.fixed_limit)

    def fail(self, cls: type[StreamError], message: str) -> StreamError:
        return cls(message, chunks=self.chunks, received_bytes=self.received)

    def expire(self) -> None:
        """The nearest limit ran out: the cut closes the stream (``closed_early``), a timeout raises."""
        if self.cut <= min(self.content_limit, self.deadline):
            self.closed_early = True
            return
        if self.deadline <= self.content_limit:
            raise self.fail(DeadlineExceededError,
                            f"deadline: {self.url} did not finish within the deadline of {self.deadline_s:g} s "
                            f"({len(self.chunks)} content chunks, {self.received} bytes so far)")
        if not self.answered:
            raise self.fail(NoContentTimeoutError,
                            f"no-content timeout: {self.url} sent no answer within {self.timeout:g} s")
        raise self.fail(NoContentTimeoutError,
                        f"no-content timeout: {self.url} sent no content for {self.timeout:g} s "
                        f"({self.received} bytes so far; keep-alive comments and empty events do not count)")

    def handle(self, event: ServerSentEvent, t_read: float) -> bool:
        """Take one event read at ``t_read``; True when reading should stop ([DONE], or should_stop)."""
        self.events += 1
        t_ms = (t_read - self.t0) * 1000.0
        if self.first_event_ms is None:
            self.first_event_ms = t_ms
        if event.data == DONE_DATA:
            self.done = True
            return True
        try:
            data = parse_json(event.data)
        except ValueError as exc:
            raise self.fail(MalformedEventError,
                            f"{self.url} sent a data line that is not JSON ({exc}): {event.data[:200]!r}") from exc
        if not isinstance(data, dict):
            raise self.fail(MalformedEventError,
                            f"{self.url} sent a data line that is not a JSON object: {event.data[:200]!r}")
        if "error" in data:
            err = data["error"]
            detail = err.get("message", err) if isinstance(err, dict) else err
            raise self.fail(ServerEventError, f"{self.url} reported an error mid-stream: {one_line(str(detail))[:500]}")
        if isinstance(data.get("timings"), dict):
            self.timings = data["timings"]
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        choice = _first_choice(data)
        if choice is None:
            return False
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if thought and isinstance(thought, str):
            self.reasoning.append(Chunk(t_ms=t_ms, text=thought))
            self.content_limit = t_read + self.timeout
        text = delta.get("content")
        if not text or not isinstance(text, str):  # the role-only first chunk, the final chunk: not tokens
            return False
        chunk = Chunk(t_ms=t_ms, text=text)
        self.chunks.append(chunk)
        self.content_limit = t_read + self.timeout
        if self.on_chunk is not None:
            self.on_chunk(chunk)
        if self.should_stop is not None and self.should_stop(chunk):
            self.closed_early = True  # the events after it in the same read are not taken
            return True
        return False

    def result(self, body: dict[str, Any], t_end: float, closed_at: float | None) -> StreamResult:
        return StreamResult(
            chunks=tuple(self.chunks),
            total_ms=(t_end - self.t0) * 1000.0,
            timings=self.timings,
            first_event_ms=self.first_event_ms,
            finish_reason=self.finish_reason,
            usage=self.usage,
            request_body=body,
            received_bytes=self.received,
            done=self.done,
            closed_early=self.closed_early,
            closed_at_ms=None if closed_at is None else (closed_at - self.t0) * 1000.0,
            events=self.events,
            reasoning_chunks=tuple(self.reasoning),
            started_at=self.t0,
        )


def _send_request(conn: http.client.HTTPConnection, base_url: str, path: str, payload: bytes,
                  api_key: str | None, reading: _Reading) -> tuple[socket.socket, http.client.HTTPResponse | None]:
    """Connect, send the request, read the status and headers. The response is None when the cut
    (``stop_after_ms``) came before the answer (a slow prompt)."""
    reading.begin()
    connect(conn, base_url, reading.limit())
    # Kept here: getresponse() sets conn.sock to None when the answer says "Connection: close" (the response
    # then owns the socket), and the clocks and the hard close still need it.
    sock = conn.sock
    assert sock is not None
    headers = request_headers(api_key, accept="text/event-stream")
    headers["Content-Type"] = "application/json"
    # Every read of the answer (headers, an error body, the stream) waits only until the nearest limit. The cut
    # is kept exact; the timeouts fire at most TIMEOUT_SLACK_S late, which keeps the socket's timeout unchanged
    # while tokens flow.
    limit_reads(conn, reading.limit, 0.0 if reading.stop_after_ms is not None else TIMEOUT_SLACK_S)
    reading.start()
    try:
        sock.settimeout(socket_wait(reading.limit()))  # for the send
        conn.request("POST", path, body=payload, headers=headers)
        resp = conn.getresponse()
    except TimeoutError:
        reading.expire()  # raises unless it was the cut
        return sock, None
    except (OSError, http.client.HTTPException) as exc:
        raise reading.fail(StreamTruncatedError, f"{reading.url} closed the connection before answering: {exc}") from exc
    reading.answered = True
    try:
        if resp.status != 200:
            raise error_from_response(resp, reading.url)
        content_type = resp.getheader("Content-Type", "")
        if "text/event-stream" not in content_type:
            sample = one_line(read_some(resp, 200)[0].decode("utf-8", "replace"))
            raise reading.fail(
                NotEventStreamError,
                f"{reading.url} answered {one_line(content_type) or 'no content type'}, not text/event-stream: "
                f"{sample[:120]!r}",
            )
    except BaseException:
        _hard_close(conn, resp, sock)  # now: the error (and its traceback) would otherwise keep the socket open
        raise
    return sock, resp



class StreamCancel:
    """A stop from another thread, for a caller who barges in between two tokens.

    ``should_stop`` is asked only when a chunk arrives, so a stop waits for the next token (up to a second on a busy
    machine, or the whole prefill). :meth:`cancel` shuts the reader's socket down at once instead
    (``socket.shutdown`` is safe from another thread, unlike ``close``): the read waiting for the next token returns,
    and the reader ends as closed early, like a ``should_stop``, never as a broken stream. llama-server sees the
    connection go and cancels the task (tools/server/README.md: a closed connection stops the generation).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.requested_at: float | None = None  # time.perf_counter() of the first cancel()

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def attach(self, sock: socket.socket) -> None:
        """The reader's socket, once connected; a cancel that came first shuts it down now."""
        with self._lock:
            self._sock = sock
            if self.requested_at is not None:
                _shutdown(sock)

    def cancel(self) -> None:
        with self._lock:
            if self.requested_at is None:
                self.requested_at = time.perf_counter()
            if self._sock is not None:
                _shutdown(self._sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed or never connected: nothing left to stop
        pass


def _read_body(resp: http.client.HTTPResponse, sock: socket.socket, reading: _Reading, raw: IO[bytes] | None,
               cancel: StreamCancel | None = None) -> None:
    """Read and decode the body until [DONE], should_stop, a cancel, the cut, or a failure (raised). Each read waits
    only until the nearest limit (:func:`limit_reads`); past it the read raises TimeoutError."""
    decoder = SSEDecoder()
    while True:
        if cancel is not None and cancel.requested:
            reading.closed_early = True
            return
        try:
            # read1, not readline (decision 0001): a line-oriented read drops the half line it holds when the connection
            # breaks, and these bytes must reach raw_out; read1 returns what has arrived without waiting.
            data_in = resp.read1(READ_SIZE)
        except TimeoutError:
            reading.expire()  # raises unless it was the cut
            return
        except (OSError, http.client.HTTPException) as exc:
            if cancel is not None and cancel.requested:  # our own shutdown, not the server's
                reading.closed_early = True
                return
            raise reading.fail(
                StreamTruncatedError,
                f"stream ended early: the connection to {reading.url} broke after {reading.received} bytes and "
                f"{len(reading.chunks)} content chunks ({exc.__class__.__name__})",
            ) from exc
        t_read = time.perf_counter()
        if not data_in:
            if cancel is not None and cancel.requested:
                reading.closed_early = True
                return
            break
        reading.received += len(data_in)
        if raw is not None:
            raw.write(data_in)
            raw.flush()
        for event in decoder.feed(data_in):
            if reading.handle(event, t_read):
                return
    decoder.end()
    if not reading.done:
        raise reading.fail(
            StreamTruncatedError,
            f"stream ended early: {reading.url} closed the stream with no [DONE] after {reading.received} bytes and "
            f"{len(reading.chunks)} content chunks",
        )


@dataclass(frozen=True)
class StreamStop:
    """How the reader closes the connection before ``data: [DONE]``; any of the three, or several (the first to
    come closes it). ``after_ms``: that many ms after the request was written (the brief's 0.5 s barge-in cut).
    ``when(chunk)`` returning True: right after that content chunk. ``cancel`` (a :class:`StreamCancel`): at once,
    from another thread, between two tokens. Each ends the stream as closed early, never as a broken stream."""

    after_ms: float | None = None
    when: Callable[[Chunk], bool] | None = None
    cancel: StreamCancel | None = None


@dataclass(frozen=True)
class StreamRequest:
    """One streaming chat request: what to ask (messages, max_tokens, cache_prompt, model, include_usage, and
    ``extra`` fields of the body), where (base_url, api_key), how long to wait (``timeout``: the longest time
    without a token, content or reasoning, keep-alive comments not counted; ``deadline_s``: the whole request,
    None for no limit) and when to stop early (``stop``)."""

    messages: Sequence[Mapping[str, str]]
    max_tokens: int = 64
    cache_prompt: bool = True
    model: str | None = None
    include_usage: bool = False
    extra: Mapping[str, Any] | None = None
    base_url: str = DEFAULT_URL
    api_key: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    deadline_s: float | None = DEFAULT_DEADLINE_S
    stop: StreamStop | None = None


def stream_request(
    messages: Sequence[Mapping[str, str]],
    max_tokens: int = 64,
    cache_prompt: bool = True,
    *,
    base_url: str = DEFAULT_URL,
    api_key: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    deadline_s: float | None = DEFAULT_DEADLINE_S,
    model: str | None = None,
    include_usage: bool = False,
    extra: Mapping[str, Any] | None = None,
    stop_after_ms: float | None = None,
    should_stop: Callable[[Chunk], bool] | None = None,
    cancel: StreamCancel | None = None,
) -> StreamRequest:
    """The request of the keyword call (``run_stream(messages, stop_after_ms=500, base_url=...)``, as docs/api.md
    shows it): the three ways to stop become one :class:`StreamStop`."""
    stops = (stop_after_ms, should_stop, cancel)
    stop = None if all(way is None for way in stops) else StreamStop(stop_after_ms, should_stop, cancel)
    return StreamRequest(messages, max_tokens, cache_prompt, model, include_usage, extra, base_url, api_key,
                         timeout, deadline_s, stop)


def run_stream(
    request: StreamRequest | Sequence[Mapping[str, str]],
    *args: Any,
    raw_out: str | os.PathLike[str] | IO[bytes] | None = None,
    on_chunk: Callable[[Chunk], None] | None = None,
    **options: Any,
) -> StreamResult:
    """Send one streaming chat request and decode it as the bytes arrive; return at ``data: [DONE]``.

    ``request`` is a :class:`StreamRequest`; the messages with the keywords of :func:`stream_request` (and
    ``max_tokens, cache_prompt, raw_out`` by position, as before) are the same call. ``raw_out`` (a path or a
    binary file) receives every byte of the body exactly as read, flushed per read, so a failure keeps everything
    that arrived (even half a line before a reset). ``on_chunk`` sees each content chunk as it arrives (for
    progress). Raises a :class:`StreamError` subclass on any failure.
    """
    if isinstance(request, StreamRequest):
        if args or options:
            raise TypeError(f"run_stream(StreamRequest) takes only raw_out and on_chunk besides, not "
                            f"{', '.join([*(repr(a) for a in args), *options]) }")
    else:
        if len(args) > 2:  # max_tokens, cache_prompt, raw_out: the positions of the call before StreamRequest
            if raw_out is not None:
                raise TypeError("run_stream() got raw_out twice")
            raw_out, args = args[2], args[:2]
        request = stream_request(request, *args, **options)
    return _run(request, raw_out, on_chunk)


def _run(request: StreamRequest, raw_out: str | os.PathLike[str] | IO[bytes] | None,
         on_chunk: Callable[[Chunk], None] | None) -> StreamResult:
    stop = request.stop or StreamStop()
    cancel = stop.cancel
    base_url, timeout = request.base_url, request.timeout
    body = chat_body(request.messages, request.max_tokens, request.cache_prompt, request.extra, model=request.model,
                     include_usage=request.include_usage)
    conn, prefix = open_connection(base_url, timeout)
    reading = _Reading(server_root(base_url) + CHAT_PATH, timeout, request.deadline_s, stop.after_ms, on_chunk,
                       stop.when)
    own_raw = raw_out is not None and not hasattr(raw_out, "write")
    raw: IO[bytes] | None = open(raw_out, "wb") if own_raw else raw_out  # type: ignore[arg-type]
    resp: http.client.HTTPResponse | None = None
    sock: socket.socket | None = None
    try:
        payload = json.dumps(body).encode("utf-8")
        sock, resp = _send_request(conn, base_url, prefix + CHAT_PATH, payload, request.api_key, reading)
        if resp is not None:
            if cancel is not None:
                cancel.attach(sock)
            _read_body(resp, sock, reading, raw, cancel)
        t_end = time.perf_counter()
        closed_at = None
        if reading.closed_early:
            _hard_close(conn, resp, sock)
            closed_at = time.perf_counter()
        return reading.result(body, t_end, closed_at)
    finally:
        # After [DONE] too: the connection is closed now, not when the server ends the body (a server or proxy
        # that holds it open would otherwise make every request wait for the timeout).
        _hard_close(conn, resp, sock) if resp is not None and not resp.isclosed() else conn.close()
        if own_raw and raw is not None:
            raw.close()


def stream(
    messages: Sequence[Mapping[str, str]],
    max_tokens: int = 64,
    cache_prompt: bool = True,
    raw_out: str | os.PathLike[str] | IO[bytes] | None = None,
    **options: Any,
) -> tuple[list[dict[str, Any]], float, dict[str, Any] | None]:
    """The brief's function: ``(chunks, total_ms, timings)`` with chunks as ``{"t_ms", "text"}`` dicts.
    ``options`` are those of :func:`stream_request` (base_url, api_key, timeout, deadline_s, extra, ...) and
    ``on_chunk``."""
    result = run_stream(messages, max_tokens, cache_prompt, raw_out=raw_out, **options)
    return [chunk.as_dict() for chunk in result.chunks], result.total_ms, result.timings


# ---------------------------------------------------------------------------------------------------------------
# Step 2 of the brief, runnable on its own: python sse.py [--url URL] [--out DIR]
# ---------------------------------------------------------------------------------------------------------------

STEP2_MESSAGES = (
    {"role": "system", "content": "You are a clinic phone assistant. Answer in one short sentence."},
    {"role": "user", "content": "What should a new patient bring?"},
)


def write_chunks_jsonl(path: str | os.PathLike[str], chunks: Iterable[Mapping[str, Any]]) -> None:
    """chunks.jsonl, written to a temp file and renamed so an earlier complete file is never half-replaced.
    (The package writes artifacts with voice_llm.core.util.artifacts; this file must stand alone, hence its own copy.)"""
    tmp = f"{os.fspath(path)}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            for chunk in chunks:
                fh.write(json.dumps({"t_ms": chunk["t_ms"], "text": chunk["text"]}, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C or a full disk: no stray temp file, the earlier chunks.jsonl stays
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Brief step 2: stream one answer, save sse_raw.txt and chunks.jsonl.")
    parser.add_argument("--url", default=os.environ.get("VOICE_LLM_URL", DEFAULT_URL))
    parser.add_argument("--api-key", default=os.environ.get("VOICE_LLM_API_KEY"))
    parser.add_argument("--out", default=".")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="give up after this long without a token (keep-alive comments do not count)")
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, metavar="SECONDS",
                        help="give up when the whole request takes longer than this")
    args = parser.parse_args(argv)
    raw_path = os.path.join(args.out, RAW_FILE)
    partial = raw_path + ".partial"
    try:
        os.makedirs(args.out, exist_ok=True)
        chunks, total_ms, timings = stream(list(STEP2_MESSAGES), raw_out=partial, base_url=args.url,
                                           api_key=args.api_key, timeout=args.timeout, deadline_s=args.deadline)
        os.replace(partial, raw_path)
        write_chunks_jsonl(os.path.join(args.out, CHUNKS_FILE), chunks)
    except StreamError as exc:
        size = os.path.getsize(partial) if os.path.exists(partial) else 0
        if size:
            print(f"sse.py: {exc} (the {size} bytes received are in {partial})", file=sys.stderr)
        else:  # nothing arrived: leave no empty evidence file behind
            if os.path.exists(partial):
                os.remove(partial)
            print(f"sse.py: {exc}", file=sys.stderr)
        return 1  # voice_llm.core.errors.EXIT_FAILURE's value: this module stands alone (the standard library only)
    except OSError as exc:
        print(f"sse.py: cannot write to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    first = f"{chunks[0]['t_ms']:.1f} ms" if chunks else "none"
    print(f"{len(chunks)} chunks, first token {first}, total {total_ms:.1f} ms, predicted_n {(timings or {}).get('predicted_n')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
