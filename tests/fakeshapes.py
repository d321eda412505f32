"""OpenAI-compatible servers that are not llama-server, shaped after vLLM and Ollama, for running the whole lab.

Unlike :class:`fakeserver.FakeServer` (a script of replies, for failure paths), these answer by route, as the
real servers do, and generate a plausible stream for every chat request:

* the first token comes after a prefill time proportional to the prompt's characters that are not a prefix of
  the previous prompt (one KV state, like a single-slot server, kept whatever ``cache_prompt`` says: only
  llama-server knows that field), so documents cost time and a repeated prompt is fast;
* then one token every ``token_s``, up to ``max_tokens``: one sentence, three sentences, or the numbers the
  cancel step asks for, after the system and user prompts of voice_llm.core.scenario.prompts;
* no ``timings``; ``usage`` only when the request asks for it with ``stream_options.include_usage``.

Shapes (what the real servers answered; vLLM 0.6+ and Ollama 0.5+ documentation and sources):

* ``VLLM``: ``/health`` 200 with an empty body, no ``/props`` or ``/slots`` (404), ``/v1/models``,
  ``Server: uvicorn``; first chunk ``{"role": "assistant", "content": ""}``.
* ``OLLAMA``: no ``/health`` (404 ``404 page not found``), ``/v1/models`` and ``/api/tags``, no Server header;
  every chunk carries ``"role": "assistant"`` beside its content, so there is no role-only first chunk.

    with ShapedServer(VLLM, model="m-a") as fake:
        run_lab(LabSettings(out=out, url=fake.url, ...))
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from voice_llm.core.scenario import prompts

MAX_WAIT_S = 10.0


@dataclass(frozen=True)
class Shape:
    name: str
    health: str  # "empty": 200 with no body; "missing": 404; "text": 200 text/plain "OK"; "json": {} at 200
    server_header: str | None
    role_chunk: bool  # a role-only first chunk (vLLM, llama-server); False: role beside every content (Ollama)
    extra_routes: tuple[str, ...] = ()


VLLM = Shape("vllm", "empty", "uvicorn", True)
OLLAMA = Shape("ollama", "missing", None, False, ("/api/tags",))

ONE_SENTENCE = "Please bring a photo ID, your insurance card and a list of your medicines."
THREE_SENTENCES = ("Do not eat or drink anything but water for twelve hours before the test. "
                   "Take your usual medicines unless your doctor said otherwise. "
                   "Come in the morning and bring your lab form.")


def _tokens(text: str) -> list[str]:
    words = text.split(" ")
    return [words[0], *(" " + word for word in words[1:])]


def answer_tokens(messages: list[dict[str, Any]], max_tokens: int) -> tuple[list[str], str]:
    """The answer a small instruct model would give to the lab's prompts, token by token, and its finish reason."""
    system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
    user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    if user == prompts.CANCEL_REQUEST:
        tokens = ["1", *(f", {n}" for n in range(2, 301))]
    elif system.startswith(prompts.THREE_SENTENCES_SYSTEM):
        tokens = _tokens(THREE_SENTENCES)
    elif user == "Say OK.":
        tokens = ["OK", "."]
    else:
        tokens = _tokens(ONE_SENTENCE)
    if len(tokens) > max_tokens:
        return tokens[:max_tokens], "length"
    return tokens, "stop"


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ShapedServer:
    """``with ShapedServer(VLLM, model="m") as fake:`` — ``fake.url`` answers like the shape's server.
    ``fake.requests`` records (method, path, JSON body or None) of every request."""

    def __init__(self, shape: Shape, model: str = "fake-model", *, prefill_s_per_char: float = 0.00006,
                 base_s: float = 0.01, token_s: float = 0.025, fail_chats_after: int | None = None,
                 cold_start_s: float = 0.0) -> None:
        """``fail_chats_after``: chat requests after that many answer HTTP 500 (a server that breaks down);
        ``cold_start_s``: added to the first answer asked with ``cache_prompt: false`` (the ttft step's first
        request: slow as llama-server's first ttft run right after ``up``, 0.8-2.3 s against 0.11 s later)."""
        self.fail_chats_after = fail_chats_after
        self.cold_start_s = cold_start_s
        self.chats = 0
        self.shape = shape
        self.model = model
        self.prefill_s_per_char = prefill_s_per_char
        self.base_s = base_s
        self.token_s = token_s
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._last_prompt = ""
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None, "use ShapedServer as a context manager"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [body for method, path, body in self.requests if method == "POST" and isinstance(body, dict)]

    def __enter__(self) -> ShapedServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"shaped-{self.shape.name}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=MAX_WAIT_S)

    # -- what a chat request costs ---------------------------------------------------------------------------

    def prefill_s(self, prompt: str) -> float:
        """One KV state: the characters after the longest common prefix with the previous prompt are computed."""
        with self.lock:
            cached = _common_prefix(prompt, self._last_prompt)
            self._last_prompt = prompt
        return self.base_s + (len(prompt) - cached) * self.prefill_s_per_char


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = MAX_WAIT_S
    fake: ShapedServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes, content_type: str | None) -> None:
        self.send_response_only(status)
        if self.fake.shape.server_header:
            self.send_header("Server", self.fake.shape.server_header)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _json(self, status: int, value: Any) -> None:
        self._reply(status, json.dumps(value).encode(), "application/json")

    def _not_found(self) -> None:
        if self.fake.shape.name == "ollama":  # Go's net/http
            self._reply(404, b"404 page not found", "text/plain; charset=utf-8")
        else:  # FastAPI
            self._json(404, {"detail": "Not Found"})

    def do_GET(self) -> None:
        fake, shape = self.fake, self.fake.shape
        path = self.path.split("?")[0]
        with fake.lock:
            fake.requests.append(("GET", path, None))
        if path == "/health":
            if shape.health == "empty":
                return self._reply(200, b"", None)
            if shape.health == "text":
                return self._reply(200, b"OK", "text/plain")
            if shape.health == "json":
                return self._json(200, {})
            return self._not_found()
        if path == "/v1/models":
            return self._json(200, {"object": "list", "data": [
                {"id": fake.model, "object": "model", "created": 1732890000, "owned_by": shape.name}]})
        if path == "/api/tags" and "/api/tags" in shape.extra_routes:
            return self._json(200, {"models": [{"name": fake.model, "model": fake.model, "size": 1}]})
        if path == "/" and shape.name == "ollama":
            return self._reply(200, b"Ollama is running", "text/plain; charset=utf-8")
        return self._not_found()

    def do_POST(self) -> None:
        fake = self.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        path = self.path.split("?")[0]
        with fake.lock:
            fake.requests.append(("POST", path, body))
        if path != "/v1/chat/completions" or not isinstance(body, dict):
            return self._not_found()
        with fake.lock:
            fake.chats += 1
            broken = fake.fail_chats_after is not None and fake.chats > fake.fail_chats_after
        if broken:
            return self._json(500, {"object": "error", "message": "engine died", "type": "InternalServerError",
                                    "code": 500})
        if body.get("model") not in (None, fake.model):
            return self._json(404, {"object": "error", "message": f"The model `{body.get('model')}` does not exist.",
                                    "type": "NotFoundError", "code": 404})
        self._stream(body)

    def _events(self, body: dict[str, Any]) -> Iterator[tuple[float, bytes]]:
        fake, shape = self.fake, self.fake.shape
        messages = body.get("messages") or []
        prompt = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)
        tokens, finish = answer_tokens(messages, int(body.get("max_tokens") or 16))
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1732890000, "model": fake.model}
        if shape.name == "ollama":
            base["system_fingerprint"] = "fp_ollama"

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            payload = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        prefill = fake.prefill_s(prompt)
        with fake.lock:
            if fake.cold_start_s and body.get("cache_prompt") is False:
                prefill += fake.cold_start_s
                fake.cold_start_s = 0.0
        if shape.role_chunk:
            yield 0.0, chunk({"role": "assistant", "content": ""})
        for i, token in enumerate(tokens):
            delta = {"role": "assistant", "content": token} if not shape.role_chunk else {"content": token}
            yield (prefill if i == 0 else fake.token_s), chunk(delta)
        yield 0.0, chunk({}, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": max(1, len(prompt) // 4), "completion_tokens": len(tokens),
                     "total_tokens": max(1, len(prompt) // 4) + len(tokens)}
            yield 0.0, b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n"
        yield 0.0, b"data: [DONE]\n\n"

    def _stream(self, body: dict[str, Any]) -> None:
        self.send_response_only(200)
        if self.fake.shape.server_header:
            self.send_header("Server", self.fake.shape.server_header)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for delay, data in self._events(body):
                if delay and self.fake.stopping.wait(min(delay, MAX_WAIT_S)):
                    return
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client closed (the cancel step): stop generating
            return
