"""The client side of the server: JSON endpoints (/health, /props, /slots) and chat streams, one base URL."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass, field
from typing import Any

from voice_llm import sse


def props_n_ctx(props: Any) -> int | None:
    """The context of one slot from a /props answer (``default_generation_settings.n_ctx``; older servers put it at
    the top), or None when the answer does not say it as a positive whole number."""
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else props.get("n_ctx")
    return n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None


@dataclass(frozen=True)
class ServerClient:
    """Talks to one llama-server. Every call sends the API key, if any, as ``Authorization: Bearer``.

    ``base_url`` may end in ``/v1`` (how OpenAI clients write it): it is kept as the server's root
    (:func:`voice_llm.sse.server_root`). ``timeout`` is the longest wait for an answer (for a stream: for a token),
    ``deadline_s`` the longest a whole chat request may take."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = sse.DEFAULT_TIMEOUT_S
    deadline_s: float | None = sse.DEFAULT_DEADLINE_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", sse.server_root(self.base_url))

    def get_json(self, path: str, *, accept_status: tuple[int, ...] = (200,)) -> tuple[int, Any]:
        """GET ``path`` and parse its JSON body; a status outside ``accept_status`` raises HTTPStatusError."""
        url = self.base_url + path
        conn, prefix = sse.open_connection(self.base_url, self.timeout)
        try:
            sse.connect(conn, self.base_url)
            status, body = _request(conn, prefix + path, self.api_key, url, self.timeout, accept_status)
        finally:
            conn.close()
        return status, _parse(body, url)

    def post_json(self, path: str, body: Any) -> Any:
        """POST ``body`` as JSON to ``path`` and parse the JSON answer (/apply-template, /tokenize)."""
        url = self.base_url + path
        conn, prefix = sse.open_connection(self.base_url, self.timeout)
        try:
            sse.connect(conn, self.base_url)
            _, answer = _request(conn, prefix + path, self.api_key, url, self.timeout, (200,), body=body)
        finally:
            conn.close()
        return _parse(answer, url)

    def health(self) -> Any:
        return self.get_json("/health")[1]

    def props(self) -> Any:
        return self.get_json("/props")[1]

    def slots(self) -> Any:
        return self.get_json("/slots")[1]

    def poller(self, path: str = "/slots") -> JSONPoller:
        """``with client.poller() as slots: slots.get()`` — poll ``path`` on one kept-alive connection."""
        return JSONPoller(self, path)

    def chat(self, messages: Any, max_tokens: int = 64, cache_prompt: bool = True, **options: Any) -> sse.StreamResult:
        """One streaming chat request through the one reader, :func:`voice_llm.sse.run_stream`; ``options`` are
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
    counts the connections opened. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, client: ServerClient, path: str) -> None:
        self.client = client
        self.path = path
        self.url = client.base_url + path
        self.connections = 0
        self._conn: http.client.HTTPConnection | None = None
        self._prefix = ""

    def __enter__(self) -> JSONPoller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def get(self) -> Any:
        """One poll: the endpoint's parsed JSON. Raises a :class:`voice_llm.sse.StreamError` like get_json."""
        while True:
            # http.client drops the socket itself after an answer that says "Connection: close".
            fresh = self._conn is None or self._conn.sock is None
            if fresh:
                self.close()
                self._conn, self._prefix = sse.open_connection(self.client.base_url, self.client.timeout)
                sse.connect(self._conn, self.client.base_url)
                self.connections += 1
            assert self._conn is not None
            try:
                _, body = _request(self._conn, self._prefix + self.path, self.client.api_key, self.url,
                               self.client.timeout, (200,))
            except sse.StreamTruncatedError:
                self.close()
                if fresh:
                    raise
                continue  # the kept-alive connection was closed by the server: once more on a new one
            except sse.StreamError:
                self.close()
                raise
            return _parse(body, self.url)


def _request(conn: http.client.HTTPConnection, target: str, api_key: str | None, url: str, timeout: float,
         accept_status: tuple[int, ...], body: Any = None) -> tuple[int, bytes]:
    """One GET (a POST of ``body`` as JSON, if given) on an open connection, its body read to the end (so the
    connection can be used again)."""
    headers = sse.request_headers(api_key)
    payload = None
    if body is not None:
        payload = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    try:
        conn.request("GET" if body is None else "POST", target, body=payload, headers=headers)
        resp = conn.getresponse()
        if resp.status not in accept_status:
            raise sse.error_from_response(resp, url)
        return resp.status, resp.read()
    except TimeoutError as exc:
        raise sse.StreamTimeoutError(f"{url} sent no answer within {timeout:g} s") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise sse.StreamTruncatedError(f"{url} broke the connection: {exc}") from exc


def _parse(body: bytes, url: str) -> Any:
    try:
        return sse.parse_json(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise sse.MalformedEventError(f"{url} did not answer JSON ({exc}): {body[:120]!r}") from exc
