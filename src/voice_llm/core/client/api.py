"""The client side of the server: JSON endpoints (/health, /props, /slots) and chat streams, one base URL.

Every request here is bounded on the wall clock (connect, TLS handshake, headers, body, all together) by
``min(timeout, deadline_s)``: a JSON answer is what a stream's first token is, so it gets the no-content
``timeout``, and never more than the whole-request ``deadline_s``. Each socket read is given only the time left
(:func:`voice_llm.core.sse.limit_reads`), so a server that trickles its answer cannot stretch it. Bodies are capped at
``MAX_ANSWER_BYTES``.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from voice_llm.core import sse

# The largest JSON answer read. llama-server's largest real answers are far smaller (/props with its chat
# template: ~10-30 KB; /slots with 4 slots: tens of KB; /tokenize of a full 128k-token context: ~1 MB); a bigger
# body is refused with one line instead of being held in memory and copied into artifacts (capabilities.json,
# props.json), where a hostile 59 MB /v1/models answer once became ~120 MB of files.
MAX_ANSWER_BYTES = 8 * 1024 * 1024


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass(frozen=True)
class ServerProps:
    """What a /props answer (or a saved props.json) says about the server: the one reader of its fields, so the
    probe, the run's metadata, the preflight, ``status``, ``load`` and the report agree on what "the context" is.

    Each field is None when the answer does not say it in the expected shape (any other JSON, a list, a string,
    a negative or boolean number): a hostile or older server is "not said", never a traceback."""

    n_ctx: int | None = None  # the context of ONE slot (llama-server divides --ctx-size by the slots)
    total_slots: int | None = None
    model_path: str | None = None
    build_info: str | None = None

    @classmethod
    def parse(cls, props: Any) -> ServerProps:
        """From the parsed JSON. ``n_ctx`` is ``default_generation_settings.n_ctx``; older servers put it at the
        top level, read only when there is no ``default_generation_settings`` object."""
        if not isinstance(props, dict):
            return cls()
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else props.get("n_ctx")
        text = {key: value if isinstance(value := props.get(key), str) else None for key in ("model_path", "build_info")}
        return cls(n_ctx=_positive_int(n_ctx), total_slots=_positive_int(props.get("total_slots")), **text)


def slots_processing(slots: Any) -> tuple[bool, ...] | None:
    """What a /slots answer says of each slot: whether it is processing (llama-server's ``is_processing``). The one
    reader of /slots (the cancel step waits for none processing, the agent's preemptive gate counts the idle ones).
    None when the answer is not a list of slot objects each with a boolean ``is_processing`` (another server, a
    hostile or older one): not a slots list, never a traceback."""
    if not isinstance(slots, list):
        return None
    if not all(isinstance(slot, dict) and isinstance(slot.get("is_processing"), bool) for slot in slots):
        return None
    return tuple(slot["is_processing"] for slot in slots)


@dataclass(frozen=True)
class Answer:
    """One JSON endpoint's answer: the status, two headers, and the body (read only for an accepted status)."""

    status: int
    content_type: str
    server: str | None
    body: bytes


@dataclass(frozen=True)
class ServerClient:
    """Talks to one llama-server. Every call sends the API key, if any, as ``Authorization: Bearer``.

    ``base_url`` may end in ``/v1`` (how OpenAI clients write it): it is kept as the server's root
    (:func:`voice_llm.core.sse.server_root`). ``timeout`` is the longest wait for an answer (for a stream: for a token),
    ``deadline_s`` the longest a whole chat request may take."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = sse.DEFAULT_TIMEOUT_S
    deadline_s: float | None = sse.DEFAULT_DEADLINE_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", sse.server_root(self.base_url))

    def time_limit(self, cap_s: float | None = None) -> _Limit:
        """The wall-clock limit of one JSON request starting now: ``min(timeout, deadline_s, cap_s)``."""
        return _Limit.starting(self.timeout, self.deadline_s, cap_s)

    def answer(self, method: str, path: str, *, body: Any = None, headers: Mapping[str, str] | None = None,
               accept_status: tuple[int, ...] | None = (200,), cap_s: float | None = None) -> Answer:
        """One request (a POST of ``body`` as JSON, if given) on a connection of its own, bounded by
        :meth:`time_limit`. A status in ``accept_status`` has its body read (at most ``MAX_ANSWER_BYTES``); any
        other raises HTTPStatusError, or with ``accept_status=None`` is returned with the first
        ``sse.ERROR_BODY_LIMIT`` bytes of its body (what arrived in time). Raises a
        :class:`voice_llm.core.sse.StreamError` for everything else (no answer in time, a broken connection, ...)."""
        url = self.base_url + path
        limit = self.time_limit(cap_s)
        conn, prefix = sse.open_connection(self.base_url, self.timeout)
        try:
            sse.connect(conn, self.base_url, limit.at)
            sse.limit_reads(conn, lambda: limit.at)
            return _exchange(conn, method, prefix + path, url, self.api_key, limit, accept_status, body, headers)
        finally:
            conn.close()

    def get_json(self, path: str, *, accept_status: tuple[int, ...] = (200,),
                 cap_s: float | None = None) -> tuple[int, Any]:
        """GET ``path`` and parse its JSON body; a status outside ``accept_status`` raises HTTPStatusError."""
        answer = self.answer("GET", path, accept_status=accept_status, cap_s=cap_s)
        return answer.status, parse_answer(answer.body, self.base_url + path)

    def post_json(self, path: str, body: Any) -> Any:
        """POST ``body`` as JSON to ``path`` and parse the JSON answer (/apply-template, /tokenize)."""
        return parse_answer(self.answer("POST", path, body=body).body, self.base_url + path)

    def health(self) -> Any:
        return self.get_json("/health")[1]

    def props(self, cap_s: float | None = None) -> Any:
        """The /props answer as parsed JSON (what props.json and capabilities.json record verbatim)."""
        return self.get_json("/props", cap_s=cap_s)[1]

    def server_props(self, cap_s: float | None = None) -> ServerProps:
        """The /props answer read by the one parser (:class:`ServerProps`)."""
        return ServerProps.parse(self.props(cap_s))

    def slots(self) -> Any:
        return self.get_json("/slots")[1]

    def poller(self, path: str = "/slots") -> JSONPoller:
        """``with client.poller() as slots: slots.get()`` — poll ``path`` on one kept-alive connection."""
        return JSONPoller(self, path)

    def chat(self, messages: Any, max_tokens: int = 64, cache_prompt: bool = True, **options: Any) -> sse.StreamResult:
        """One streaming chat request through the one reader, :func:`voice_llm.core.sse.run_stream`; ``options`` are
        its keywords (``model``, ``include_usage``, ``stop_after_ms``, ``should_stop``, ``on_chunk``, ...)."""
        options.setdefault("deadline_s", self.deadline_s)
        return sse.run_stream(
            messages, max_tokens, cache_prompt,
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, **options,
        )


class JSONPoller:
    """GET one JSON endpoint again and again on ONE kept-alive connection.

    Polling /slots while a cancelled request winds down must not cost a new TCP connection (and a new server
    thread) per poll on the cores the server is using. When the server closed the connection between two polls
    (its keep-alive limit or idle timeout), the poll is sent once more on a new connection. ``connections``
    counts the connections opened. Each poll is one request with its own limit (:meth:`ServerClient.time_limit`).
    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, client: ServerClient, path: str) -> None:
        self.client = client
        self.path = path
        self.url = client.base_url + path
        self.connections = 0
        self._conn: http.client.HTTPConnection | None = None
        self._prefix = ""
        self._limit = client.time_limit()

    def __enter__(self) -> JSONPoller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def get(self) -> Any:
        """One poll: the endpoint's parsed JSON. Raises a :class:`voice_llm.core.sse.StreamError` like get_json."""
        self._limit = self.client.time_limit()
        while True:
            # http.client drops the socket itself after an answer that says "Connection: close".
            fresh = self._conn is None or self._conn.sock is None
            if fresh:
                self.close()
                self._conn, self._prefix = sse.open_connection(self.client.base_url, self.client.timeout)
                sse.connect(self._conn, self.client.base_url, self._limit.at)
                sse.limit_reads(self._conn, lambda: self._limit.at)  # the limit of the poll under way
                self.connections += 1
            assert self._conn is not None
            try:
                answer = _exchange(self._conn, "GET", self._prefix + self.path, self.url, self.client.api_key,
                                   self._limit, (200,))
            except sse.StreamTruncatedError:
                self.close()
                if fresh:
                    raise
                continue  # the kept-alive connection was closed by the server: once more on a new one
            except sse.StreamError:
                self.close()
                raise
            return parse_answer(answer.body, self.url)


@dataclass(frozen=True)
class _Limit:
    """One JSON request's limit: ``at`` (a ``perf_counter`` time), and what it is, for the message."""

    at: float
    seconds: float
    is_deadline: bool  # the whole-request deadline is the nearer limit

    @classmethod
    def starting(cls, timeout: float, deadline_s: float | None, cap_s: float | None = None) -> _Limit:
        deadline = math.inf if deadline_s is None else deadline_s
        seconds = min(timeout, deadline, math.inf if cap_s is None else cap_s)
        return cls(time.perf_counter() + seconds, seconds, deadline < timeout and deadline <= seconds)

    def error(self, url: str, received: int) -> sse.StreamTimeoutError:
        # ``received``: body bytes; 0 also when the headers never ended (a trickling status line and headers).
        so_far = f"{received} bytes of its body so far" if received else "its headers did not end"
        if self.is_deadline:
            return sse.DeadlineExceededError(
                f"deadline: {url} did not answer within the deadline of {self.seconds:g} s ({so_far})",
                received_bytes=received)
        return sse.StreamTimeoutError(f"{url} sent no whole answer within {self.seconds:g} s ({so_far})",
                                      received_bytes=received)


def _exchange(conn: http.client.HTTPConnection, method: str, target: str, url: str, api_key: str | None,
              limit: _Limit, accept_status: tuple[int, ...] | None, body: Any = None,
              headers: Mapping[str, str] | None = None) -> Answer:
    """One request on an open connection whose reads end at ``limit`` (:func:`voice_llm.core.sse.limit_reads`); an
    accepted answer's body is read to the end, so the connection can be used again."""
    all_headers = {**sse.request_headers(api_key), **(headers or {})}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode("utf-8")
        all_headers["Content-Type"] = "application/json"
    try:
        assert conn.sock is not None
        conn.sock.settimeout(sse.socket_wait(limit.at))  # for the send
        conn.request(method, target, body=payload, headers=all_headers)
        resp = conn.getresponse()
        try:
            content_type, server = resp.getheader("Content-Type", "") or "", resp.getheader("Server")
            if accept_status is not None and resp.status in accept_status or accept_status is None and resp.status == 200:
                return Answer(resp.status, content_type, server, _read_answer(resp, url, limit))
            if accept_status is None:  # an answer to record, not to use: the start of its body, as far as it came
                return Answer(resp.status, content_type, server, sse.read_some(resp, sse.ERROR_BODY_LIMIT)[0])
            raise sse.error_from_response(resp, url)
        except BaseException:
            resp.close()  # now: the error (and its traceback) would otherwise keep the socket open
            raise
    except TimeoutError as exc:
        raise limit.error(url, 0) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise sse.StreamTruncatedError(f"{url} broke the connection: {exc.__class__.__name__}: {exc}") from exc


def _read_answer(resp: http.client.HTTPResponse, url: str, limit: _Limit) -> bytes:
    """The whole body, at most MAX_ANSWER_BYTES (a larger one is refused before it is read, when its
    Content-Length says so, else as soon as it has grown past the cap)."""
    too_large = sse.AnswerTooLargeError(
        f"{url} answered more than {MAX_ANSWER_BYTES // (1024 * 1024)} MiB, larger than any server's JSON answer "
        f"should be: refused (the cap is {MAX_ANSWER_BYTES} bytes)")
    if resp.length is not None and resp.length > MAX_ANSWER_BYTES:
        raise too_large
    body, stopped = sse.read_some(resp, MAX_ANSWER_BYTES + 1)
    if isinstance(stopped, TimeoutError):
        raise limit.error(url, len(body)) from stopped
    if stopped is not None:
        raise sse.StreamTruncatedError(
            f"{url} broke the connection after {len(body)} bytes of its answer: {stopped.__class__.__name__}",
            received_bytes=len(body)) from stopped
    if len(body) > MAX_ANSWER_BYTES:
        raise too_large
    if resp.length:  # the connection ended before the Content-Length was reached
        raise sse.StreamTruncatedError(f"{url} broke the connection after {len(body)} bytes of its answer "
                                       f"({resp.length} more were announced)", received_bytes=len(body))
    resp.close()  # the whole body is read: the kept-alive connection is free for the next request
    return body


def parse_answer(body: bytes, url: str) -> Any:
    """A server's JSON answer through the one guarded parser (:func:`voice_llm.core.sse.parse_json`): anything not
    JSON, or nested too deeply to parse, is a MalformedEventError naming the URL."""
    try:
        return sse.parse_json(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise sse.MalformedEventError(f"{url} did not answer JSON ({exc}): {body[:120]!r}") from exc
