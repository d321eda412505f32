"""Read an OpenAI-style chat stream from llama.cpp's server by hand, with a timestamp on every line.

This file stands alone (standard library only) so it can be copied into a voice pipeline as it is, and
``python sse.py [--url URL]`` runs the brief's step 2 by itself. It has three layers:

* :class:`SSEDecoder` — a pure, incremental decoder of ``text/event-stream`` bytes into events, following the
  HTML standard's "Interpreting an event stream" rules
  (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation). No I/O.
* :func:`open_connection` / :func:`error_from_response` — the thin HTTP layer over :mod:`http.client`.
* :func:`run_stream` (rich result) and :func:`stream` (the brief's tuple) — send one chat request and time it.

Timing rule: the clock starts with ``time.perf_counter()`` just before the request is written to the socket, and a
chunk's time is when the bytes that completed its event were read from the socket.
"""

from __future__ import annotations

import codecs
import http.client
import json
import os
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

# The managed server's address (voice-llm's ServerSettings uses the same host and port); repeated here only
# because this file must run on its own.
DEFAULT_URL = "http://127.0.0.1:8080"
CHAT_PATH = "/v1/chat/completions"
DONE_DATA = "[DONE]"
READ_SIZE = 65536  # at most this many bytes per read; a read returns whatever has arrived, never waits for more

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
    """Nothing answered at the URL (refused, unknown host, connect timeout)."""


class HTTPStatusError(StreamError):
    """The server answered with a status other than 200; ``status`` and the server's ``error`` object."""

    def __init__(self, message: str, *, status: int, error: Mapping[str, Any] | None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.status = status
        self.error = dict(error or {})


class NotEventStreamError(StreamError):
    """A 200 answer whose body is not ``text/event-stream`` (an HTML page, a proxy, another service)."""


class ServerEventError(StreamError):
    """The server sent ``data: {"error": ...}`` after streaming began."""


class MalformedEventError(StreamError):
    """A ``data:`` line that is not JSON (and not ``[DONE]``)."""


class StreamTruncatedError(StreamError):
    """The connection ended before ``data: [DONE]``."""


class StreamTimeoutError(StreamError):
    """Nothing arrived for longer than the request timeout."""


# ---------------------------------------------------------------------------------------------------------------
# HTTP: one place that turns a base URL into a connection and a bad answer into an error.
# ---------------------------------------------------------------------------------------------------------------


def open_connection(base_url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """Return an unconnected HTTPConnection for ``base_url`` and the URL's path prefix (without trailing /)."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerUnreachableError(f"not an http(s) URL: {base_url!r}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        port = parts.port
    except ValueError as exc:
        raise ServerUnreachableError(f"bad port in URL {base_url!r}") from exc
    return cls(parts.hostname, port, timeout=timeout), parts.path.rstrip("/")


def request_headers(api_key: str | None, accept: str = "application/json") -> dict[str, str]:
    headers = {"Accept": accept}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def connect(conn: http.client.HTTPConnection, base_url: str) -> None:
    """Open the TCP connection now, so that connect time is not counted as the server's and a refusal is clear."""
    try:
        conn.connect()
    except ConnectionRefusedError as exc:
        raise ServerUnreachableError(
            f"no server at {base_url} (connection refused); start one with `voice-llm up` or pass --url"
        ) from exc
    except socket.gaierror as exc:
        raise ServerUnreachableError(f"cannot resolve the host of {base_url}: {exc.strerror}") from exc
    except (TimeoutError, OSError) as exc:
        raise ServerUnreachableError(f"cannot connect to {base_url}: {exc}") from exc


def error_from_response(resp: http.client.HTTPResponse, url: str) -> HTTPStatusError:
    """Read a non-200 answer and name the status and the server's own message (llama-server sends
    ``{"error": {"code", "message", "type", ...}}``, OpenAI's shape)."""
    try:
        body = resp.read(65536)
    except (OSError, http.client.HTTPException):
        body = b""
    error: dict[str, Any] | None = None
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            error = parsed["error"]
    except (ValueError, UnicodeDecodeError):
        pass
    detail = error.get("message") if error else body[:200].decode("utf-8", "replace").strip()
    message = f"{url} answered HTTP {resp.status} {resp.reason}: {detail or '(empty body)'}"
    kind = (error or {}).get("type")
    if kind == "exceed_context_size_error":
        message += (
            f" [prompt {error.get('n_prompt_tokens', '?')} tokens > n_ctx {error.get('n_ctx', '?')}: "
            "attach fewer documents or start the server with a larger --ctx]"
        )
    elif resp.status == 401:
        message += " [the server wants an API key: pass --api-key or set VOICE_LLM_API_KEY]"
    return HTTPStatusError(message, status=resp.status, error=error)


# ---------------------------------------------------------------------------------------------------------------
# The streaming request.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamResult:
    """Everything one streaming request showed. ``chunks`` hold only events with non-empty delta.content."""

    chunks: tuple[Chunk, ...]
    total_ms: float
    timings: dict[str, Any] | None
    first_event_ms: float | None
    finish_reason: str | None
    usage: dict[str, Any] | None
    request_body: dict[str, Any]
    received_bytes: int
    done: bool  # data: [DONE] was received
    closed_early: bool  # we closed the connection (deadline or should_stop) before [DONE]
    closed_at_ms: float | None = None
    events: int = 0
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def ttft_ms(self) -> float | None:
        return self.chunks[0].t_ms if self.chunks else None

    @property
    def text(self) -> str:
        return "".join(chunk.text for chunk in self.chunks)


def chat_body(
    messages: Sequence[Mapping[str, str]],
    max_tokens: int = 64,
    cache_prompt: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The brief's request body; ``extra`` adds or overrides fields (``n_predict``, ``stop``, ...)."""
    body: dict[str, Any] = {
        "messages": [dict(m) for m in messages],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 7,
        "cache_prompt": cache_prompt,
    }
    body.update(extra or {})
    return body


def _content_of(payload: Mapping[str, Any]) -> str:
    choices = payload.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    delta = choices[0].get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


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


def run_stream(
    messages: Sequence[Mapping[str, str]],
    max_tokens: int = 64,
    cache_prompt: bool = True,
    raw_out: str | os.PathLike[str] | IO[bytes] | None = None,
    *,
    base_url: str = DEFAULT_URL,
    api_key: str | None = None,
    timeout: float = 120.0,
    extra: Mapping[str, Any] | None = None,
    stop_after_ms: float | None = None,
    should_stop: Callable[[Chunk], bool] | None = None,
    on_chunk: Callable[[Chunk], None] | None = None,
) -> StreamResult:
    """Send one streaming chat request and decode it as the bytes arrive.

    ``raw_out`` (a path or a binary file) receives every byte of the body exactly as read, flushed per read, so
    a failure keeps everything that arrived (even half a line before a reset). ``stop_after_ms`` closes the
    connection that many ms after the request was sent; ``should_stop(chunk)`` returning True closes it after
    that chunk. ``on_chunk`` sees each content chunk as it arrives (for progress). Raises a
    :class:`StreamError` subclass on any failure.
    """
    body = chat_body(messages, max_tokens, cache_prompt, extra)
    payload = json.dumps(body).encode("utf-8")
    url = base_url.rstrip("/") + CHAT_PATH
    conn, prefix = open_connection(base_url, timeout)
    own_raw = raw_out is not None and not hasattr(raw_out, "write")
    raw: IO[bytes] | None = open(raw_out, "wb") if own_raw else raw_out  # type: ignore[arg-type]
    decoder = SSEDecoder()
    chunks: list[Chunk] = []
    received = 0
    resp: http.client.HTTPResponse | None = None
    sock: socket.socket | None = None

    def fail(cls: type[StreamError], message: str) -> StreamError:
        return cls(message, chunks=chunks, received_bytes=received)

    try:
        connect(conn, base_url)
        # Kept here: getresponse() sets conn.sock to None when the answer says "Connection: close" (the response
        # then owns the socket), and the deadline and the hard close below still need it.
        sock = conn.sock
        headers = request_headers(api_key, accept="text/event-stream")
        headers["Content-Type"] = "application/json"
        t0 = time.perf_counter()
        deadline = None if stop_after_ms is None else t0 + stop_after_ms / 1000.0
        cut_before_answer = False  # the deadline came before the answer's headers (a slow prompt)
        try:
            if deadline is not None and sock is not None:
                sock.settimeout(max(min(deadline - time.perf_counter(), timeout), 0.001))
            conn.request("POST", prefix + CHAT_PATH, body=payload, headers=headers)
            resp = conn.getresponse()
        except TimeoutError as exc:
            if deadline is None or time.perf_counter() < deadline:
                raise fail(StreamTimeoutError, f"{url} sent no answer within {timeout:g} s") from exc
            cut_before_answer = True
        except (OSError, http.client.HTTPException) as exc:
            raise fail(StreamTruncatedError, f"{url} closed the connection before answering: {exc}") from exc
        if resp is not None and resp.status != 200:
            raise error_from_response(resp, url)
        content_type = resp.getheader("Content-Type", "") if resp is not None else "text/event-stream"
        if "text/event-stream" not in content_type:
            sample = resp.read(200).decode("utf-8", "replace").strip()
            raise fail(
                NotEventStreamError,
                f"{url} answered {content_type or 'no content type'}, not text/event-stream: {sample[:120]!r}",
            )

        timings: dict[str, Any] | None = None
        usage: dict[str, Any] | None = None
        finish_reason: str | None = None
        first_event_ms: float | None = None
        n_events = 0
        done = False
        closed_early = cut_before_answer
        closed_at_ms: float | None = None
        while not closed_early:
            if deadline is not None and sock is not None:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    closed_early = True
                    break
                # Wake up at the deadline even if the server is silent, without touching the read timeout.
                sock.settimeout(min(remaining, timeout))
            try:
                # read1, not readline: a line-oriented read drops the half line it holds when the connection
                # breaks, and these bytes must reach raw_out; read1 returns what has arrived without waiting.
                data_in = resp.read1(READ_SIZE)
            except TimeoutError as exc:
                if deadline is not None and time.perf_counter() >= deadline:
                    closed_early = True
                    break
                raise fail(StreamTimeoutError, f"{url} sent nothing for {timeout:g} s ({received} bytes so far)") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise fail(
                    StreamTruncatedError,
                    f"stream ended early: the connection to {url} broke after {received} bytes and {len(chunks)} "
                    f"content chunks ({exc.__class__.__name__})",
                ) from exc
            t_read = time.perf_counter()
            if not data_in:
                break
            received += len(data_in)
            if raw is not None:
                raw.write(data_in)
                raw.flush()
            for event in decoder.feed(data_in):
                n_events += 1
                t_ms = (t_read - t0) * 1000.0
                if first_event_ms is None:
                    first_event_ms = t_ms
                if event.data == DONE_DATA:
                    done = True
                    continue
                try:
                    data = json.loads(event.data)
                except ValueError as exc:
                    raise fail(MalformedEventError, f"{url} sent a data line that is not JSON: {event.data[:200]!r}") from exc
                if not isinstance(data, dict):
                    raise fail(MalformedEventError, f"{url} sent a data line that is not a JSON object: {event.data[:200]!r}")
                if "error" in data:
                    err = data["error"]
                    detail = err.get("message", err) if isinstance(err, dict) else err
                    raise fail(ServerEventError, f"{url} reported an error mid-stream: {detail}")
                if isinstance(data.get("timings"), dict):
                    timings = data["timings"]
                if isinstance(data.get("usage"), dict):
                    usage = data["usage"]
                choices = data.get("choices") or []
                if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
                    finish_reason = choices[0]["finish_reason"]
                text = _content_of(data)
                if not text:  # the role-only first chunk, the final chunk: not tokens
                    continue
                chunk = Chunk(t_ms=t_ms, text=text)
                chunks.append(chunk)
                if on_chunk is not None:
                    on_chunk(chunk)
                if should_stop is not None and should_stop(chunk):
                    closed_early = True
                    break  # the events after it in the same read are not taken
            if closed_early:
                break
        t_end = time.perf_counter()
        if closed_early:
            _hard_close(conn, resp, sock)
            closed_at_ms = (time.perf_counter() - t0) * 1000.0
        elif not done:
            raise fail(
                StreamTruncatedError,
                f"stream ended early: {url} closed the stream with no [DONE] after {received} bytes and "
                f"{len(chunks)} content chunks",
            )
        decoder.end()
        return StreamResult(
            chunks=tuple(chunks),
            total_ms=(t_end - t0) * 1000.0,
            timings=timings,
            first_event_ms=first_event_ms,
            finish_reason=finish_reason,
            usage=usage,
            request_body=body,
            received_bytes=received,
            done=done,
            closed_early=closed_early,
            closed_at_ms=closed_at_ms,
            events=n_events,
        )
    finally:
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
    ``options`` are those of :func:`run_stream` (base_url, api_key, timeout, extra, stop_after_ms, ...)."""
    result = run_stream(messages, max_tokens, cache_prompt, raw_out, **options)
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
    (The package writes artifacts with voice_llm.artifacts; this file must stand alone, hence its own copy.)"""
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
    import argparse

    parser = argparse.ArgumentParser(description="Brief step 2: stream one answer, save sse_raw.txt and chunks.jsonl.")
    parser.add_argument("--url", default=os.environ.get("VOICE_LLM_URL", DEFAULT_URL))
    parser.add_argument("--api-key", default=os.environ.get("VOICE_LLM_API_KEY"))
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    raw_path = os.path.join(args.out, "sse_raw.txt")
    partial = raw_path + ".partial"
    try:
        os.makedirs(args.out, exist_ok=True)
        chunks, total_ms, timings = stream(list(STEP2_MESSAGES), raw_out=partial, base_url=args.url, api_key=args.api_key)
        os.replace(partial, raw_path)
        write_chunks_jsonl(os.path.join(args.out, "chunks.jsonl"), chunks)
    except StreamError as exc:
        size = os.path.getsize(partial) if os.path.exists(partial) else 0
        if size:
            print(f"sse.py: {exc} (the {size} bytes received are in {partial})", file=sys.stderr)
        else:  # nothing arrived: leave no empty evidence file behind
            if os.path.exists(partial):
                os.remove(partial)
            print(f"sse.py: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"sse.py: cannot write to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    first = f"{chunks[0]['t_ms']:.1f} ms" if chunks else "none"
    print(f"{len(chunks)} chunks, first token {first}, total {total_ms:.1f} ms, predicted_n {(timings or {}).get('predicted_n')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
