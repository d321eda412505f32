"""What a server exposes, probed once before the lab's steps, and what each measurement can therefore rest on.

llama-server answers /health, /props, /slots (and /metrics with --metrics) and puts its own ``timings``
(``prompt_n``, ``cache_n``, ...) in the last chunk of a stream. Other OpenAI-compatible servers
(llama-cpp-python, vLLM, Ollama, hosted APIs) have some of these or none: then a step still runs on the client
clock and writes ``null`` with the reason for what it cannot know, and ``check`` says "not checkable" instead of
passing. The probe's findings and the inferences drawn from them are the artifact ``capabilities.json``.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.core import sse
from voice_llm.core.client.api import ServerClient, ServerProps
from voice_llm.core.util.artifacts import write_bytes_atomic

# Where a measured number comes from; every artifact names one of these for each number it holds.
SOURCE_TIMINGS = "server timings"
SOURCE_USAGE = "usage"
SOURCE_CLIENT = "client clock"
SOURCE_CHUNK_COUNT = "client count of content chunks"
SOURCE_SLOTS = "/slots"
SOURCE_METRICS = "/metrics"

PROBED_PATHS = ("/health", "/props", "/slots", "/v1/models", "/metrics")
# Prometheus gauges that say how many requests a server is working on (llama-server --metrics, vLLM).
BUSY_GAUGES = ("llamacpp:requests_processing", "vllm:num_requests_running")
PROBE_MESSAGES = ({"role": "user", "content": "Say OK."},)
PROBE_MAX_TOKENS = 4
PROBE_TIMEOUT_S = 10.0
INCLUDE_USAGE = {"stream_options": {"include_usage": True}}
# Sent with the probe's GETs, so a server log (or a test's scripted server) can tell them from the steps' requests.
PROBE_HEADER = ("X-Voice-LLM-Probe", "capabilities")


@dataclass(frozen=True)
class EndpointProbe:
    """One GET: the HTTP status (None when nothing answered) and a short note (an error, a content type)."""

    path: str
    status: int | None
    note: str = ""
    server: str | None = None  # the HTTP Server header, when sent (uvicorn, ...)
    timed_out: bool = False  # nothing whole came within the GET's limit (the probe then asks no more)

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass(frozen=True)
class StreamProbe:
    """What one tiny streaming request showed about the stream's shape."""

    timings_fields: tuple[str, ...]  # keys of the server's ``timings`` object; empty when it sent none
    usage_fields: tuple[str, ...]  # keys of ``usage``; empty when none came
    include_usage_accepted: bool  # the request with stream_options.include_usage was answered 200
    line_ending: str  # "LF", "CRLF", "CR" or "mixed": how the raw bytes end their lines
    comment_lines: int  # lines starting with ':' (keep-alive / ping comments)
    role_chunk_first: bool  # the first event is delta.role without content
    done: bool  # data: [DONE] came
    content_chunks: int

    @property
    def timings(self) -> bool:
        return bool(self.timings_fields)


@dataclass(frozen=True)
class Capabilities:
    """The probe's findings for one base URL, and the model name sent in every request."""

    base_url: str
    endpoints: tuple[EndpointProbe, ...]
    model_ids: tuple[str, ...]
    model: str | None
    model_source: str  # "--model", "/v1/models" or "none"
    stream: StreamProbe | None
    stream_error: str | None = None
    busy_gauge: str | None = None  # the /metrics gauge that counts requests in flight, when there is one
    n_ctx: int | None = None  # from /props

    @property
    def informative(self) -> bool:
        """The probe learned something: a stream, /v1/models or /health answered. When nothing did, the steps
        behave as for llama-server and fail on what is missing with their own clear errors."""
        return self.stream is not None or self.has("/v1/models") or self.has("/health")

    def endpoint(self, path: str) -> EndpointProbe | None:
        return next((e for e in self.endpoints if e.path == path), None)

    def has(self, path: str) -> bool:
        found = self.endpoint(path)
        return found is not None and found.ok

    def _why_not(self, path: str) -> str:
        found = self.endpoint(path)
        if found is None or found.status is None:
            return f"{path} did not answer" + (f" ({found.note})" if found and found.note else "")
        return f"{path} answered HTTP {found.status}"

    # -- what each measurement can rest on -------------------------------------------------------------

    def timing_field(self, name: str) -> bool:
        return self.stream is not None and name in self.stream.timings_fields

    @property
    def ask_usage(self) -> bool:
        """Send stream_options.include_usage: only where the stream lacks timings and the server accepts it
        (llama-server's timings already hold the counts, and its request stays the brief's)."""
        return self.stream is not None and not self.stream.timings and self.stream.include_usage_accepted

    @property
    def usage(self) -> bool:
        return self.stream is not None and "prompt_tokens" in self.stream.usage_fields

    def request_options(self) -> dict[str, Any]:
        """The reader's keywords every lab request takes for this server: the model name, and the usage request."""
        return {"model": self.model, "include_usage": self.ask_usage}

    def request_extra(self) -> dict[str, Any]:
        """The fields those keywords add to a request body (recorded in capabilities.json)."""
        return {**({"model": self.model} if self.model else {}), **(INCLUDE_USAGE if self.ask_usage else {})}

    def prompt_tokens_source(self) -> tuple[str | None, str]:
        """(source, reason when None) of a request's prompt token count."""
        if self.timing_field("prompt_n"):
            return SOURCE_TIMINGS, ""
        if self.usage:
            return SOURCE_USAGE, ""
        return None, "the stream carries no timings.prompt_n and no usage.prompt_tokens"

    def cache_source(self) -> tuple[str | None, str]:
        if self.timing_field("cache_n") and self.timing_field("prompt_n"):
            return SOURCE_TIMINGS, ""
        return None, "no timings.cache_n in the stream: cache reuse is seen on the client clock only"

    def stop_source(self) -> tuple[str | None, str]:
        """How the server's stop after a closed connection can be observed."""
        if self.has("/slots"):
            return SOURCE_SLOTS, ""
        if self.busy_gauge:
            return SOURCE_METRICS, ""
        return None, (f"server stop not observable: {self._why_not('/slots')} and /metrics has no "
                      "requests-in-flight gauge")

    def health_source(self) -> tuple[str | None, str]:
        if self.has("/health"):
            return "/health", ""
        if self.has("/v1/models"):
            return "/v1/models", f"{self._why_not('/health')}; the server answered /v1/models"
        return None, f"{self._why_not('/health')} and {self._why_not('/v1/models')}"

    def n_ctx_source(self) -> tuple[str | None, str]:
        if self.n_ctx:
            return "/props", ""
        return None, f"{self._why_not('/props')}: the context size is not published"

    def tokens_source(self) -> str:
        if self.timing_field("predicted_n"):
            return SOURCE_TIMINGS
        if self.stream is not None and "completion_tokens" in self.stream.usage_fields:
            return SOURCE_USAGE
        return SOURCE_CHUNK_COUNT

    def cache_off_known(self) -> tuple[bool, str]:
        """Whether ``cache_prompt: false`` can be shown to have worked (cache_n 0 in the timings)."""
        if self.timing_field("cache_n"):
            return True, ""
        return False, ("cache_prompt is a llama-server field and this stream has no timings.cache_n: the server "
                       "may reuse the previous prompt's KV cache, so 'cache off' is not guaranteed")

    def inferred(self) -> dict[str, Any]:
        """What the lab concludes from the findings, one entry per kind of evidence, with the reason when absent."""
        def entry(pair: tuple[str | None, str]) -> dict[str, Any]:
            source, reason = pair
            return {"source": source, "reason": reason or None}

        llama_server = self.has("/props") and self.timing_field("cache_n")
        cache_off, why = self.cache_off_known()
        return {
            "server": "llama.cpp llama-server" if llama_server else "OpenAI-compatible server (not llama-server)",
            "model": {"name": self.model, "source": self.model_source},
            "ttft": {"source": SOURCE_CLIENT, "reason": None},
            "health": entry(self.health_source()),
            "n_ctx": entry(self.n_ctx_source()),
            "prompt_tokens": entry(self.prompt_tokens_source()),
            "generated_tokens": {"source": self.tokens_source(), "reason": None},
            "cache_reuse": entry(self.cache_source()),
            "cache_off": {"shown": cache_off, "reason": why or None},
            "cancel_stop": entry(self.stop_source()),
            "request_extra": self.request_extra(),
        }

    def as_dict(self) -> dict[str, Any]:
        stream = None if self.stream is None else {
            "timings_fields": list(self.stream.timings_fields),
            "usage_fields": list(self.stream.usage_fields),
            "include_usage_accepted": self.stream.include_usage_accepted,
            "line_ending": self.stream.line_ending,
            "comment_lines": self.stream.comment_lines,
            "role_chunk_first": self.stream.role_chunk_first,
            "done": self.stream.done,
            "content_chunks": self.stream.content_chunks,
        }
        return {
            "base_url": self.base_url,
            "found": {
                "endpoints": {e.path: {"status": e.status, "note": e.note or None} for e in self.endpoints},
                "server_header": next((e.server for e in self.endpoints if e.server), None),
                "model_ids": list(self.model_ids),
                "n_ctx": self.n_ctx,
                "busy_gauge": self.busy_gauge,
                "stream": stream,
                "stream_error": self.stream_error,
            },
            "inferred": self.inferred(),
        }


# ---------------------------------------------------------------------------------------------------------------
# The probe.
# ---------------------------------------------------------------------------------------------------------------


def fetch(client: ServerClient, path: str, *, probing: bool = False) -> tuple[EndpointProbe, bytes]:
    """GET ``path``; never raises for an answer, only records it (the body of a 200, at most
    ``api.MAX_ANSWER_BYTES``; of any other status its first ``sse.ERROR_BODY_LIMIT`` bytes). The GET is bounded on the wall clock by ``--timeout`` and ``--deadline`` and at
    most PROBE_TIMEOUT_S (these endpoints answer in milliseconds). An https URL whose server does not speak TLS
    is not an answer but a wrong URL: NotTLSError ends the command at once."""
    headers = {"Accept": "*/*", **({PROBE_HEADER[0]: PROBE_HEADER[1]} if probing else {})}
    try:
        answer = client.answer("GET", path, headers=headers, accept_status=None, cap_s=PROBE_TIMEOUT_S)
    except sse.NotTLSError:
        raise
    except sse.StreamTimeoutError as exc:
        return EndpointProbe(path, None, str(exc), timed_out=True), b""
    except sse.StreamError as exc:
        return EndpointProbe(path, None, str(exc)), b""
    return EndpointProbe(path, answer.status, answer.content_type.split(";")[0], answer.server), answer.body


def _json(body: bytes) -> Any:
    """A probed answer through the one guarded parser; None when it is not JSON (or nested too deeply)."""
    try:
        return sse.parse_json(body)
    except (ValueError, UnicodeDecodeError):
        return None


def model_ids(doc: Any) -> tuple[str, ...]:
    """The ids of an OpenAI ``/v1/models`` answer (``{"data": [{"id": ...}]}``), in the server's order."""
    data = doc.get("data") if isinstance(doc, dict) else None
    return tuple(m["id"] for m in data or () if isinstance(m, dict) and isinstance(m.get("id"), str))


def busy_gauge(metrics_text: str) -> str | None:
    for name in BUSY_GAUGES:
        if re.search(rf"^{re.escape(name)}(\{{[^}}]*\}})? ", metrics_text, re.MULTILINE):
            return name
    return None


def requests_in_flight(metrics_text: str, gauge: str) -> float | None:
    """The value of ``gauge`` (summed over its label sets) in a Prometheus text page, or None if absent. A value
    that is not a number raises ValueError saying so (a server's page is not trusted to be well formed)."""
    values = []
    for match in re.finditer(rf"^{re.escape(gauge)}(\{{[^}}]*\}})? (\S+)", metrics_text, re.MULTILINE):
        try:
            values.append(float(match.group(2)))
        except ValueError:
            raise ValueError(f"the gauge {gauge} has a value that is not a number: {match.group(2)[:40]!r}") from None
    return sum(values) if values else None


def line_ending(raw: bytes) -> str:
    crlf = raw.count(b"\r\n")
    lf = raw.count(b"\n") - crlf
    cr = raw.count(b"\r") - crlf
    kinds = [name for name, n in (("CRLF", crlf), ("LF", lf), ("CR", cr)) if n]
    return kinds[0] if len(kinds) == 1 else ("mixed" if kinds else "none")


def comment_lines(raw: bytes) -> int:
    return sum(1 for line in re.split(rb"\r\n|\r|\n", raw) if line.startswith(b":"))


def _stream_probe(client: ServerClient, model: str | None, raw_out: Path | None) -> tuple[StreamProbe | None, str | None]:
    """One tiny stream, asking for usage; a server that refuses stream_options gets the plain request."""
    accepted = True
    raw = io.BytesIO()
    result: sse.StreamResult | None = None
    for include_usage in (True, False):
        raw = io.BytesIO()
        try:
            result = _probe_request(client, model, include_usage, raw)
            break
        except sse.HTTPStatusError as exc:
            if not include_usage or exc.status not in (400, 422):
                return None, str(exc)
            accepted = False  # it rejected stream_options: retry without
        except sse.NotTLSError:
            raise  # a wrong URL, not a finding about the stream
        except sse.StreamError as exc:
            return None, str(exc)
    assert result is not None
    data = raw.getvalue()
    if raw_out is not None:
        raw_out.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(raw_out, data)  # never through a link planted at raw_out
    events = sse.SSEDecoder().feed(data)
    delta = _first_delta(_json(events[0].data.encode()) if events else None)
    return StreamProbe(
        timings_fields=tuple(sorted(result.timings or {})),
        usage_fields=tuple(sorted(result.usage or {})),
        include_usage_accepted=accepted,
        line_ending=line_ending(data),
        comment_lines=comment_lines(data),
        role_chunk_first=delta.get("role") == "assistant" and not delta.get("content"),
        done=result.done,
        content_chunks=len(result.chunks),
    ), None


def _first_delta(event: Any) -> dict[str, Any]:
    """``choices[0].delta`` of a stream's first event, or {} when the event has no such object (any shape)."""
    choices = event.get("choices") if isinstance(event, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    delta = choice.get("delta") if isinstance(choice, dict) else None
    return delta if isinstance(delta, dict) else {}


def _probe_request(client: ServerClient, model: str | None, include_usage: bool, raw: io.BytesIO) -> sse.StreamResult:
    return client.chat(list(PROBE_MESSAGES), PROBE_MAX_TOKENS, True, raw_out=raw, model=model,
                       include_usage=include_usage)


def probe(client: ServerClient, model: str | None = None, raw_out: Path | None = None) -> Capabilities:
    """Ask the server what it exposes. ``model`` (the user's --model) wins over the first id of /v1/models.
    Makes GETs and one streaming request of a few tokens; never raises for a missing endpoint."""
    endpoints: list[EndpointProbe] = []
    bodies: dict[str, bytes] = {}
    silent: str | None = None
    for path in PROBED_PATHS:
        if silent is not None:  # a server that let one GET run out of time is not asked again: one limit, not six
            endpoints.append(EndpointProbe(path, None, f"not asked: {silent}"))
            bodies[path] = b""
            continue
        found, body = fetch(client, path, probing=True)
        endpoints.append(found)
        bodies[path] = body
        if found.status is None and found.timed_out:
            silent = found.note or f"{path} did not answer in time"
    by_path = {e.path: e for e in endpoints}
    ids = model_ids(_json(bodies["/v1/models"])) if by_path["/v1/models"].ok else ()
    chosen, source = (model, "--model") if model else ((ids[0], "/v1/models") if ids else (None, "none"))
    props = _json(bodies["/props"]) if by_path["/props"].ok else None
    n_ctx = ServerProps.parse(props).n_ctx
    gauge = busy_gauge(bodies["/metrics"].decode("utf-8", "replace")) if by_path["/metrics"].ok else None
    stream, error = _stream_probe(client, chosen, raw_out) if silent is None else (None, f"not asked: {silent}")
    return Capabilities(
        base_url=client.base_url, endpoints=tuple(endpoints), model_ids=ids, model=chosen, model_source=source,
        stream=stream, stream_error=error, busy_gauge=gauge, n_ctx=n_ctx,
    )
