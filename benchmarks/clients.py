"""The streaming clients the benchmark times, each behind the same small interface.

Every client sends the identical request and records, for each content chunk (a ``data:`` event whose
``choices[0].delta.content`` is non-empty), the ``time.perf_counter()`` at which its API handed that chunk to the
caller. Its clock starts just before it sends the request, on a connection that is already open — as
``voice_llm.core.sse`` does (it connects first, then starts the clock) — so connect time is counted by no one:

* raw floor and voice_llm open a fresh TCP connection before the clock starts;
* the pooled peers (openai, httpx, requests, aiohttp) first send ``GET /health`` on their pool, so the timed
  request reuses a live keep-alive connection.

Peers are optional: a client whose library cannot be imported reports why and is skipped.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from voice_llm.core import sse

HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
CHAT_PATH = sse.CHAT_PATH


@dataclass
class Sample:
    """One timed request as one client saw it."""

    t0: float  # perf_counter just before the request was sent
    times: list[float]  # perf_counter when each content chunk was handed over (absolute)
    texts: list[str]
    rel_ms: list[float] | None = None  # the client's own relative times, when it reports them (voice_llm's t_ms)
    extra: dict[str, Any] = field(default_factory=dict)

    def relative_ms(self) -> list[float]:
        if self.rel_ms is not None:
            return list(self.rel_ms)
        return [(t - self.t0) * 1000.0 for t in self.times]

    def absolute(self) -> list[float]:
        if self.rel_ms is not None:
            return [self.t0 + ms / 1000.0 for ms in self.rel_ms]
        return list(self.times)


def content_of(data: str | bytes) -> str | None:
    """Content text of one ``data:`` payload; None for [DONE] and events without content."""
    if data in ("[DONE]", b"[DONE]"):
        return None
    obj = json.loads(data)
    choices = obj.get("choices") or []
    if not choices:
        return None
    content = (choices[0].get("delta") or {}).get("content")
    return content if isinstance(content, str) and content else None


def _line_data(line: str | bytes) -> str | bytes | None:
    if isinstance(line, bytes):
        return line[6:] if line.startswith(b"data: ") else None
    return line[6:] if line.startswith("data: ") else None


class LineCollector:
    """Content chunks from the SSE lines a peer library yields. The caller takes the time as soon as the library
    hands over a line and passes it in, so this parsing is not counted against the library."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.texts: list[str] = []

    def add(self, line: str | bytes, t: float) -> None:
        data = _line_data(line)
        if data is None:
            return
        content = content_of(data)
        if content is not None:
            self.times.append(t)
            self.texts.append(content)

    def sample(self, t0: float) -> Sample:
        return Sample(t0, self.times, self.texts)


class Client:
    """Base: ``rows`` are the table rows one request produces (voice_llm yields two views of one request)."""

    name = ""
    label = ""
    module: str | None = None  # the optional library it needs
    note = ""

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + CHAT_PATH
        self.body = body
        self.payload = json.dumps(body).encode("utf-8")

    @property
    def rows(self) -> dict[str, str]:
        return {self.name: self.label}

    def version(self) -> str:
        if self.module is None:
            return ""
        mod = __import__(self.module)
        return getattr(mod, "__version__", "")

    def request(self) -> dict[str, Sample]:
        raise NotImplementedError

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------------
# The floor: a plain socket, timestamps taken the moment recv returns the bytes that complete a data: line.
# ---------------------------------------------------------------------------------------------------------------


class _Dechunk:
    """Minimal incremental decoder of HTTP/1.1 chunked transfer encoding."""

    def __init__(self) -> None:
        self.buf = b""
        self.left = 0
        self.need_crlf = False
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = bytearray()
        while not self.done:
            if self.left:
                take = self.buf[: self.left]
                out += take
                self.buf = self.buf[len(take):]
                self.left -= len(take)
                if self.left:
                    break
                self.need_crlf = True
            if self.need_crlf:
                if len(self.buf) < 2:
                    break
                self.buf = self.buf[2:]
                self.need_crlf = False
            end = self.buf.find(b"\r\n")
            if end < 0:
                break
            size = int(self.buf[:end].split(b";")[0], 16)
            self.buf = self.buf[end + 2:]
            if size == 0:
                self.done = True
                break
            self.left = size
        return bytes(out)


class RawClient(Client):
    name = "raw"
    label = "raw socket (floor)"
    note = "written for the benchmark: one sendall, recv(65536), minimal chunked decoding"

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        super().__init__(base_url, body)
        parts = urllib.parse.urlsplit(self.base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path.rstrip("/") + CHAT_PATH
        self.last_events: list[str] = []

    def request(self) -> dict[str, Sample]:
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(self.payload)}\r\nConnection: close\r\n\r\n"
        ).encode("ascii")
        message = head + self.payload
        sock = socket.create_connection((self.host, self.port), timeout=120)
        stamped: list[tuple[float, bytes]] = []
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            recv = sock.recv
            t0 = time.perf_counter()
            sock.sendall(message)
            header = b""
            dechunk: _Dechunk | None = None
            line = b""
            done = False
            while not done:
                data = recv(65536)
                t = time.perf_counter()
                if not data:
                    break
                if dechunk is None and header is not None:
                    header += data
                    if b"\r\n\r\n" not in header:
                        continue
                    head_bytes, _, data = header.partition(b"\r\n\r\n")
                    status = head_bytes.split(b"\r\n", 1)[0]
                    if b" 200 " not in status + b" ":
                        raise RuntimeError(f"raw client: {status.decode('latin-1')}")
                    chunked = b"transfer-encoding: chunked" in head_bytes.lower()
                    dechunk = _Dechunk() if chunked else None
                    header = None  # type: ignore[assignment]
                body = dechunk.feed(data) if dechunk is not None else data
                line += body
                while True:
                    end = line.find(b"\n")
                    if end < 0:
                        break
                    text, line = line[:end], line[end + 1:]
                    if text.startswith(b"data: "):
                        stamped.append((t, text))
                        if text == b"data: [DONE]":
                            done = True
        finally:
            sock.close()
        times: list[float] = []
        texts: list[str] = []
        for t, text in stamped:
            content = content_of(text[6:])
            if content is not None:
                times.append(t)
                texts.append(content)
        self.last_events = [text.decode("utf-8") + "\n\n" for _, text in stamped]
        return {self.name: Sample(t0, times, texts)}


# ---------------------------------------------------------------------------------------------------------------
# voice_llm: the library's own stream(), two views of the same request.
# ---------------------------------------------------------------------------------------------------------------


class VoiceLLMClient(Client):
    name = "voice_llm"
    label = "voice_llm.core.sse.stream (its t_ms)"
    on_chunk_name = "voice_llm_on_chunk"
    on_chunk_label = "voice_llm on_chunk callback"
    note = ("t_ms is what voice_llm reports; on_chunk is when the callback ran (after JSON parse). "
            "The absolute start is read right after sse.connect returns, a few us before its own t0.")

    @property
    def rows(self) -> dict[str, str]:
        return {self.name: self.label, self.on_chunk_name: self.on_chunk_label}

    def version(self) -> str:
        import voice_llm

        return getattr(voice_llm, "__version__", "")

    def request(self) -> dict[str, Sample]:
        marks: dict[str, float] = {}
        delivered: list[float] = []
        original = sse.connect

        def connect(conn: Any, base_url: str, *args: Any, **kwargs: Any) -> None:
            original(conn, base_url, *args, **kwargs)  # (the wall-clock limit of the connect, when given)
            marks["t0"] = time.perf_counter()  # run_stream starts its own clock right after this returns

        def on_chunk(chunk: sse.Chunk) -> None:
            delivered.append(time.perf_counter())

        sse.connect = connect  # type: ignore[assignment]
        try:
            chunks, _total, _timings = sse.stream(
                self.body["messages"], self.body["max_tokens"], self.body["cache_prompt"],
                base_url=self.base_url, on_chunk=on_chunk,
            )
        finally:
            sse.connect = original  # type: ignore[assignment]
        t0 = marks["t0"]
        texts = [c["text"] for c in chunks]
        rel = [c["t_ms"] for c in chunks]
        return {
            self.name: Sample(t0, [t0 + ms / 1000.0 for ms in rel], texts, rel_ms=rel),
            self.on_chunk_name: Sample(t0, delivered, list(texts)),
        }


# ---------------------------------------------------------------------------------------------------------------
# Peers.
# ---------------------------------------------------------------------------------------------------------------


class OpenAIClient(Client):
    name = "openai"
    label = "openai SDK (stream=True)"
    module = "openai"
    note = "chat.completions.create(stream=True); times when the iterator yields a parsed chunk"

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        super().__init__(base_url, body)
        import openai

        self.openai = openai
        self.http = openai.DefaultHttpxClient()
        self.client = openai.OpenAI(base_url=self.base_url + "/v1", api_key="none", max_retries=0,
                                    http_client=self.http, timeout=120)
        # The body is voice_llm's body; openai wants a model name: leave it out where the SDK allows that.
        self.model: Any = getattr(openai, "omit", None) or "voice-llm-bench"

    def request(self) -> dict[str, Sample]:
        self.http.get(self.base_url + "/health").read()
        body = self.body
        times: list[float] = []
        texts: list[str] = []
        t0 = time.perf_counter()
        stream = self.client.chat.completions.create(
            model=self.model, messages=body["messages"], stream=True, max_tokens=body["max_tokens"],
            temperature=body["temperature"], seed=body["seed"], extra_body={"cache_prompt": body["cache_prompt"]},
        )
        try:
            for chunk in stream:
                t = time.perf_counter()
                if chunk.choices and chunk.choices[0].delta.content:
                    times.append(t)
                    texts.append(chunk.choices[0].delta.content)
        finally:
            stream.close()
        return {self.name: Sample(t0, times, texts)}

    def close(self) -> None:
        self.client.close()


class HttpxClient(Client):
    name = "httpx"
    label = "httpx stream + iter_lines()"
    module = "httpx"

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        super().__init__(base_url, body)
        import httpx

        self.client = httpx.Client(timeout=120)

    def request(self) -> dict[str, Sample]:
        self.client.get(self.base_url + "/health").read()
        lines = LineCollector()
        t0 = time.perf_counter()
        with self.client.stream("POST", self.url, content=self.payload, headers=HEADERS) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                lines.add(line, time.perf_counter())
        return {self.name: lines.sample(t0)}

    def close(self) -> None:
        self.client.close()


class RequestsClient(Client):
    name = "requests"
    label = "requests iter_lines() (default chunk_size=512)"
    module = "requests"
    chunk_size: int | None = 512  # requests.models.ITER_CHUNK_SIZE, the default of iter_lines

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        super().__init__(base_url, body)
        import requests

        self.session = requests.Session()

    def request(self) -> dict[str, Sample]:
        self.session.get(self.base_url + "/health", timeout=120).content
        lines = LineCollector()
        t0 = time.perf_counter()
        resp = self.session.post(self.url, data=self.payload, headers=HEADERS, stream=True, timeout=120)
        try:
            resp.raise_for_status()
            for line in resp.iter_lines(chunk_size=self.chunk_size):
                lines.add(line, time.perf_counter())
        finally:
            resp.close()
        return {self.name: lines.sample(t0)}

    def close(self) -> None:
        self.session.close()


class RequestsAnyClient(RequestsClient):
    name = "requests_none"
    label = "requests iter_lines(chunk_size=None)"
    chunk_size = None


class AiohttpClient(Client):
    name = "aiohttp"
    label = "aiohttp content.readline()"
    module = "aiohttp"
    note = "one event loop and ClientSession for the whole run; loop overhead is part of the client"

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        super().__init__(base_url, body)
        import asyncio

        import aiohttp

        self.aiohttp = aiohttp
        self.loop = asyncio.new_event_loop()

        async def make() -> Any:
            return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))

        self.session = self.loop.run_until_complete(make())

    async def _request(self) -> Sample:
        async with self.session.get(self.base_url + "/health") as warm:
            await warm.read()
        lines = LineCollector()
        t0 = time.perf_counter()
        async with self.session.post(self.url, data=self.payload, headers=HEADERS) as resp:
            resp.raise_for_status()
            while True:
                line = await resp.content.readline()
                t = time.perf_counter()
                if not line:
                    break
                lines.add(line.rstrip(b"\r\n"), t)
        return lines.sample(t0)

    def request(self) -> dict[str, Sample]:
        return {self.name: self.loop.run_until_complete(self._request())}

    def close(self) -> None:
        self.loop.run_until_complete(self.session.close())
        self.loop.close()


ALL_CLIENTS: tuple[type[Client], ...] = (
    RawClient, VoiceLLMClient, OpenAIClient, HttpxClient, RequestsClient, RequestsAnyClient, AiohttpClient,
)


def make_clients(base_url: str, body: dict[str, Any], only: set[str] | None = None) -> tuple[list[Client], dict[str, str]]:
    """Instantiate every client whose library imports; return them and ``{name: why skipped}`` for the rest."""
    made: list[Client] = []
    skipped: dict[str, str] = {}
    for cls in ALL_CLIENTS:
        if only is not None and cls.name not in only:
            continue
        try:
            made.append(cls(base_url, body))
        except ImportError as exc:
            skipped[cls.name] = f"not installed ({exc.name or exc}); pip install -r benchmarks/requirements.txt"
    return made, skipped
