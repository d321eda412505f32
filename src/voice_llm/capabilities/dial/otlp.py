"""The agent's own numbers, as it reports them: an OTLP/HTTP trace receiver for ``voice-llm dial --otlp HOST:PORT``.

An agent (pipecat with tracing, LiveKit, voice-llm's own) exports its spans to ``POST /v1/traces`` while the call
runs. Each body is an ``ExportTraceServiceRequest``, as ``application/x-protobuf`` or ``application/json``
(OTLP/HTTP: https://opentelemetry.io/docs/specs/otlp/#otlphttp), decoded with ``opentelemetry-proto``'s message
classes. Every body is kept as received (the dialer writes them to ``dial/otlp/NNNN.bin|.json``) with its arrival
on the call clock; one that is not OTLP is answered 400 and recorded as one line in ``refused``; nothing a sender
does stops the call.

Clocks: spans carry epoch nanoseconds. ``t0_epoch_ns`` (the wall time of call-clock 0, taken by the dialer at the
same instant as its perf_counter zero) turns them into call-clock ms. On one machine the clocks are the same
("common"). When a span ends later than the body that carried it arrived, the sender's clock runs ahead: the offset
is estimated from the turn spans matched to dial turns only (a stray span of another trace, say one ending 2 h
ahead, once set a 7,199,999 ms offset and erased every number of the agent), as the median of their excesses, and
an offset longer than the call is refused (no clock of a real call is hours off while its spans answer its turns):
every span is shifted back by the offset applied, and dial.json's otlp block states it (clock_offset_ms) and how
many spans it rests on (clock_offset_spans).

Matching: a *turn span* carries the agent's self-reported latency (pipecat ``turn`` with
``turn.user_bot_latency_seconds``; LiveKit ``lk.e2e_latency`` on ``agent_turn``/``user_turn``; voice-llm's agent
``invoke_agent`` with ``voice_llm.latency.reported_ms``). It belongs to the dial turn whose caller speech ended
last at or before the span's end (a reply ends after its question and before the next question ends). A turn with
no turn span is "not reported", never zero.

Numbers: a latency, a breakdown part or a preemptive count the dialer would read off a span must be a finite
number of at least 0. NaN, Inf or a negative one is no measurement (and NaN/Infinity are not JSON: dial.json
must stay parseable): the receiver drops that attribute from the span as it arrives and records one line in
``refused_values`` (the body and the span's other numbers are kept), so the turn is "not reported" by it, never a
check FAIL for the agent's bad number.
"""

from __future__ import annotations

import base64
import dataclasses
import http.server
import math
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from voice_llm.core.util.artifacts import loads_json

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 4 << 20  # one export batch; a larger body is refused (413), the call goes on
REFUSED_VALUE_LINES = 10  # dial.json's otlp block keeps this many lines of the values refused (all are counted)
REFUSED_LINES = 10  # and this many lines of the bodies refused (all are counted: refused_bodies)
# What a body may hold, counted on its bytes before it is decoded (issue 41 item 10: 4 bodies of 4 MB, 8.4M empty
# spans, took the dialer 77 -> 2,467 MB with 431 late frames: each span became a protobuf object, then a Span).
# The OpenTelemetry SDK's BatchSpanProcessor exports 512 spans a batch by default
# (https://opentelemetry.io/docs/specs/otel/trace/sdk/#batching-processor), so 8 times that is no real agent's.
MAX_SPANS_PER_BODY = 4096
MAX_FIELDS_PER_BODY = 65536  # the fields walked above the spans (resources, scopes, their attributes): the same bound
MAX_JSON_OBJECTS = 262144  # an OTLP/JSON body's "{" before it is parsed (a real span is some 10-40 objects)
# What a flattened span keeps: the SDK's own default span attribute count limit is 128
# (https://opentelemetry.io/docs/specs/otel/common/#attribute-limits); an array or kvlist value keeps 128 items
MAX_ATTRIBUTES = 128
MAX_VALUE_ITEMS = 128


@dataclass(frozen=True)
class Limits:
    """What one receiver keeps in memory and (the dialer) on disk; beyond it a body is refused (413), counted, one
    line kept: ``bodies`` kept (each a file of dial/otlp/: 18,630 small bodies had become 18,630 files), their
    ``spans`` and their ``bytes``."""

    bodies: int
    spans: int
    bytes: int


# one call (dial --otlp): a 1 h call exporting every 5 s (the SDK's schedule) is 720 bodies; a 4-turn pipecat call
# some 40 spans
CALL_LIMITS = Limits(bodies=1024, spans=32768, bytes=64 << 20)
# the run's one receiver of load --dial --otlp-listen (every call of every sweep; nothing written to disk)
RUN_LIMITS = Limits(bodies=65536, spans=262144, bytes=256 << 20)
# A span ending this much after its body's arrival is still "the same clock": on one machine, with both sides
# pairing perf_counter and the wall clock as one instant (voice_llm.core.util.clocks), the test agent's spans still ended
# up to 2.3 ms after their arrival under a concurrent `make lab` (69.6 ms before that pairing; 2.0 ms was the slack
# then, and the test saw an "offset"). A quarter of a frame: an offset this small is below what a turn can show.
CLOCK_SLACK_MS = 5.0

PIPECAT_SOURCE = "pipecat turn.user_bot_latency_seconds"
# Where each framework puts its self-reported per-turn latency: (span names, attribute, factor to ms, source text).
LATENCY_SOURCES: tuple[tuple[frozenset[str], str, float, str], ...] = (
    (frozenset({"turn"}), "turn.user_bot_latency_seconds", 1000.0, PIPECAT_SOURCE),
    (frozenset({"agent_turn", "user_turn"}), "lk.e2e_latency", 1000.0, "LiveKit lk.e2e_latency"),
    (frozenset({"invoke_agent"}), "voice_llm.latency.reported_ms", 1.0,
     "voice-llm agent voice_llm.latency.reported_ms (VAD speech end -> first audio sent)"),
)
BREAKDOWN_PREFIX = "voice_llm.breakdown."
# voice-llm agent --preemptive's counts on its turn span (voice_llm.capabilities.agent.server.preemptive_attributes): replies
# started before the endpoint, used, dropped, tokens and synthesis ms wasted; ``call.<count>``: the call's totals
PREEMPTIVE_PREFIX = "voice_llm.preemptive."
# Stage spans drawn under the heard gap: pipecat's, the GenAI draft's (voice-llm's agent), LiveKit's.
STAGE_NAMES = frozenset({"stt", "llm", "tts", "speech_to_text", "chat", "text_to_speech", "llm_node", "tts_node",
                         "eou_detection"})


@dataclass(frozen=True)
class Span:
    """One received span, flattened: ids in hex, times in epoch ns as sent, attributes as plain values."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    service: str | None
    body: int  # the index of the body that carried it (1-based, as its file name)
    arrival_ms: float  # when that body arrived, on the call clock


@dataclass(frozen=True)
class Body:
    """One POST as received."""

    index: int
    arrival_ms: float
    content_type: str
    data: bytes
    spans: int
    refused_values: tuple[str, ...] = ()  # one line per number refused off its spans (see the module's docstring)
    refused_value_count: int = 0  # all of them (the lines stop at REFUSED_VALUE_LINES)

    @property
    def file_name(self) -> str:
        return f"{self.index:04d}.{'json' if self.content_type == JSON else 'bin'}"


class OTLPError(ValueError):
    """A body that is not an OTLP trace export; the message is the one line kept in ``refused``."""


def _hex_to_b64(value: Any) -> Any:
    # OTLP/JSON writes trace and span ids as hex, where protobuf's JSON mapping expects base64
    # (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding).
    if not isinstance(value, str) or not value:
        return value
    try:
        return base64.b64encode(bytes.fromhex(value)).decode("ascii")
    except ValueError as exc:
        raise OTLPError(f"an id that is not hex: {value[:40]!r}") from exc


def _ids_to_b64(document: Any) -> Any:
    for resource in document.get("resourceSpans") or []:
        for scope in (resource or {}).get("scopeSpans") or []:
            for span in (scope or {}).get("spans") or []:
                if not isinstance(span, dict):
                    continue
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _hex_to_b64(span[key])
                for link in span.get("links") or []:
                    for key in ("traceId", "spanId"):
                        if isinstance(link, dict) and key in link:
                            link[key] = _hex_to_b64(link[key])
    return document


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise OTLPError(f"not an OTLP protobuf ExportTraceServiceRequest ({len(data)} bytes): a truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _length_fields(data: bytes, start: int, end: int, walked: list[int]) -> Any:
    """(field number, start, end) of each length-delimited field in ``data[start:end]``, on the protobuf wire format
    (https://protobuf.dev/programming-guides/encoding/); every field walked counts in ``walked[0]``."""
    at = start
    while at < end:
        key, at = _varint(data, at)
        walked[0] += 1
        kind = key & 7
        if kind == 0:
            _, at = _varint(data, at)
        elif kind == 1:
            at += 8
        elif kind == 5:
            at += 4
        elif kind == 2:
            length, at = _varint(data, at)
            if at + length > end:
                break  # truncated: protobuf's own decode says so
            yield key >> 3, at, at + length
            at += length
        else:
            break  # groups (deprecated) or garbage: protobuf's own decode says what it is
        if walked[0] > MAX_FIELDS_PER_BODY:
            return


def count_spans(data: bytes) -> tuple[int, int]:
    """(spans, fields walked) of a protobuf ExportTraceServiceRequest, counted on its bytes without decoding it:
    resource_spans = 1, its scope_spans = 2, their spans = 2 (opentelemetry-proto's trace.proto); the count stops
    past MAX_SPANS_PER_BODY or MAX_FIELDS_PER_BODY, so a hostile body costs its walk up to there, never its size."""
    spans, walked = 0, [0]
    for number, start, end in _length_fields(data, 0, len(data), walked):
        if number != 1:
            continue
        for scope_number, scope_start, scope_end in _length_fields(data, start, end, walked):
            if scope_number != 2:
                continue
            for span_number, _, _ in _length_fields(data, scope_start, scope_end, walked):
                spans += span_number == 2
                if spans > MAX_SPANS_PER_BODY:
                    return spans, walked[0]
    return spans, walked[0]


def _json_spans(document: Mapping[str, Any]) -> int:
    """The spans an OTLP/JSON document lists (what is not a list or an object is not counted: ParseDict refuses it)."""
    def items(value: Any, key: str) -> list[Any]:
        found = value.get(key) if isinstance(value, dict) else None
        return found if isinstance(found, list) else []

    return sum(len(items(scope, "spans")) for resource in items(document, "resourceSpans")
               for scope in items(resource, "scopeSpans"))


def _too_many(spans: int, fields: int = 0) -> str | None:
    if spans > MAX_SPANS_PER_BODY:
        return f"more than {MAX_SPANS_PER_BODY} spans in one body (the SDK's batch is 512): not decoded"
    if fields > MAX_FIELDS_PER_BODY:
        return f"more than {MAX_FIELDS_PER_BODY} fields around its spans: not decoded"
    return None


def decode_request(data: bytes, content_type: str) -> Any:
    """The ExportTraceServiceRequest in ``data``; OTLPError (one line) when it is not one, or when it holds more
    than a body may (counted before it is decoded: the MAX_* above)."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    if content_type == PROTOBUF:
        too_many = _too_many(*count_spans(data))
        if too_many is not None:
            raise OTLPError(too_many)
        try:
            return ExportTraceServiceRequest.FromString(data)
        except (DecodeError, RuntimeWarning, ValueError) as exc:
            raise OTLPError(f"not an OTLP protobuf ExportTraceServiceRequest ({len(data)} bytes): {exc}") from exc
    if content_type == JSON:
        if data.count(b"{") > MAX_JSON_OBJECTS:
            raise OTLPError(f"more than {MAX_JSON_OBJECTS} JSON objects in one body: not parsed")
        try:
            document = loads_json(data.decode("utf-8"), "an OTLP/JSON body")  # the guarded parser: no deep nesting
        except Exception as exc:
            raise OTLPError(f"not JSON ({len(data)} bytes): {str(exc)[:120]}") from exc
        if not isinstance(document, dict):
            raise OTLPError("an OTLP/JSON body that is not an object")
        too_many = _too_many(_json_spans(document))
        if too_many is not None:
            raise OTLPError(too_many)
        try:
            return json_format.ParseDict(_ids_to_b64(document), ExportTraceServiceRequest(),
                                         ignore_unknown_fields=True)
        except (json_format.ParseError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise OTLPError(f"not an OTLP/JSON ExportTraceServiceRequest: {str(exc)[:160]}") from exc
    raise OTLPError(f"Content-Type {content_type or 'missing'}; OTLP/HTTP is {PROTOBUF} or {JSON}")


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":  # MAX_VALUE_ITEMS kept: what the dialer reads is a number or a string
        return [_value(v) for v in any_value.array_value.values[:MAX_VALUE_ITEMS]]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values[:MAX_VALUE_ITEMS]}
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, kind)


def flatten(request: Any, body: int, arrival_ms: float) -> list[Span]:
    """Every span of a decoded request as a :class:`Span`."""
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        service = resource.get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(Span(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex() or None, name=span.name,
                    start_ns=int(span.start_time_unix_nano), end_ns=int(span.end_time_unix_nano),
                    attributes={kv.key: _value(kv.value) for kv in span.attributes[:MAX_ATTRIBUTES]},
                    service=service if isinstance(service, str) else None, body=body, arrival_ms=arrival_ms))
    return spans


def _measurement(value: Any, factor: float = 1.0) -> float | None:
    """``value`` (times ``factor``) as a finite float of at least 0, or None: an int or float only (a bool is not a
    number here), and nothing NaN, infinite (also after the factor: 1e308 s is Inf ms) or negative."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    number = float(value) * factor
    return number if math.isfinite(number) and number >= 0 else None


def _read_numbers(span: Span) -> dict[str, float]:
    """The attributes of ``span`` the dialer turns into numbers, each with the factor it is read with: its latency
    attribute (whatever was sent there), and its breakdown parts and preemptive counts that are numbers (a
    preemptive flag is a bool, read as it is)."""
    found = {attribute: factor for names, attribute, factor, _ in LATENCY_SOURCES
             if span.name in names and attribute in span.attributes}
    for key, value in span.attributes.items():
        if key.startswith((BREAKDOWN_PREFIX, PREEMPTIVE_PREFIX)) and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            found[key] = 1.0
    return found


def refuse_values(span: Span) -> tuple[Span, list[str]]:
    """``span`` without the numbers the dialer would read that are no measurement (NaN, Inf, negative, or no
    number where a latency goes), and one line per number dropped (the receiver puts its body's index first)."""
    bad = [key for key, factor in _read_numbers(span).items() if _measurement(span.attributes[key], factor) is None]
    if not bad:
        return span, []
    lines = [f"span {span.name[:60]} {span.span_id}: {key} = {str(span.attributes[key])[:40]} is not a finite "
             f"number >= 0: refused" for key in bad]
    kept = {key: value for key, value in span.attributes.items() if key not in bad}
    return dataclasses.replace(span, attributes=kept), lines


def _response(content_type: str) -> bytes:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    response = ExportTraceServiceResponse()
    if content_type == JSON:
        return json_format.MessageToJson(response).encode("utf-8")
    return response.SerializeToString()


class Receiver:
    """An OTLP/HTTP trace receiver on ``host:port`` (port 0: any free one) for the length of a call.

    ``clock`` gives the call clock in ms (the dialer's); bodies arriving before the call started get the clock's
    value then (it may be negative). Thread-safe: the HTTP server runs in a thread of its own."""

    def __init__(self, host: str, port: int, clock: Callable[[], float], limits: Limits = CALL_LIMITS) -> None:
        self._clock = clock
        self.limits = limits
        self._lock = threading.Lock()
        # one body decoded at a time: ten 4 MB bodies at once must not be ten decodes in memory at once
        self._decoding = threading.Lock()
        self._bodies: list[Body] = []  # the bodies kept (the refused are counted, their first lines kept)
        self._spans: list[Span] = []
        self._kept_bytes = 0
        self._received = 0
        self._refused_lines: list[str] = []
        self._refused_count = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # the headers and the body of an answer go out as two writes: with Nagle's algorithm on, the second
            # waited for the sender's delayed ACK (40 ms a body on Linux; 1,124 bodies on one connection took 61 s)
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                return  # the artifact records what arrived; nothing on the dialer's terminal

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                receiver._post(self)

            def do_GET(self) -> None:  # noqa: N802
                self._refuse(405, "OTLP/HTTP takes POST /v1/traces")

            def _refuse(self, status: int, text: str) -> None:
                payload = text.encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                return  # a sender that resets its connection: nothing of it on the dialer's terminal, the call goes on

        self._handler = Handler
        self._server = Server((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _post(self, request: http.server.BaseHTTPRequestHandler) -> None:
        arrival = self._clock()
        content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        path = request.path.split("?")[0]
        try:
            length = int(request.headers.get("Content-Length") or "")
        except ValueError:
            length = -1
        if path != TRACES_PATH:
            self._record(arrival, content_type, b"", None, f"POST {path[:60]}: OTLP traces go to {TRACES_PATH}")
            request._refuse(404, f"not found; OTLP traces go to {TRACES_PATH}")  # type: ignore[attr-defined]
            return
        if length < 0:
            self._record(arrival, content_type, b"", None, "a body without Content-Length")
            request._refuse(411, "Content-Length required")  # type: ignore[attr-defined]
            return
        if length > MAX_BODY_BYTES:
            self._record(arrival, content_type, b"", None, f"a body of {length} bytes; at most {MAX_BODY_BYTES}")
            request.close_connection = True
            request._refuse(413, f"at most {MAX_BODY_BYTES} bytes")  # type: ignore[attr-defined]
            return
        data = request.rfile.read(length)
        full = self._full(len(data))
        if full is not None:  # refused before it is decoded: a full receiver costs a sender nothing more
            self._record(arrival, content_type, b"", None, full)
            request._refuse(413, full)  # type: ignore[attr-defined]
            return
        with self._decoding:
            try:
                decoded = decode_request(data, content_type)
            except OTLPError as exc:
                self._record(arrival, content_type, b"", None, str(exc))
                request._refuse(400, str(exc))  # type: ignore[attr-defined]
                return
            refused = self._record(arrival, content_type, data, decoded, None)
            del decoded
        if refused is not None:
            request._refuse(413, refused)  # type: ignore[attr-defined]
            return
        payload = _response(content_type)
        request.send_response(200)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    def _full(self, size: int, spans: int = 0) -> str | None:
        """Why a body of ``size`` bytes and ``spans`` spans is not kept (the receiver's Limits), or None."""
        with self._lock:
            if len(self._bodies) >= self.limits.bodies:
                return f"{self.limits.bodies} bodies kept already: no more in this call"
            if self._kept_bytes + size > self.limits.bytes:
                return f"over {self.limits.bytes} bytes received in this call: not kept"
            if len(self._spans) + spans > self.limits.spans:
                return f"{spans} more spans would be over the {self.limits.spans} kept in this call: not kept"
            return None

    def _record(self, arrival: float, content_type: str, data: bytes, decoded: Any, refused: str | None) -> str | None:
        """Keep a body (``refused`` None and ``decoded``) or count a refused one; why it was refused, or None."""
        if refused is None and decoded is not None:
            count = sum(len(scope.spans) for resource in decoded.resource_spans for scope in resource.scope_spans)
            refused = self._full(len(data), count)
        with self._lock:
            self._received += 1
            index = self._received
            if refused is not None:
                self._refused_count += 1
                if len(self._refused_lines) < REFUSED_LINES:
                    self._refused_lines.append(f"body {index}: {refused}")
                return refused
            spans = flatten(decoded, index, arrival)
            values: list[str] = []
            for position, span in enumerate(spans):  # bad numbers refused here, as they arrive: never stored
                spans[position], lines = refuse_values(span)
                values.extend(f"body {index}: {line}" for line in lines)
            self._kept_bytes += len(data)
            self._bodies.append(Body(index, arrival, content_type, data, len(spans),
                                     tuple(values[:REFUSED_VALUE_LINES]), len(values)))
            self._spans.extend(spans)
            return None

    @property
    def full(self) -> bool:
        """No further body can be kept (Limits.bodies reached): waiting for one is waiting for nothing."""
        with self._lock:
            return len(self._bodies) >= self.limits.bodies

    @property
    def received(self) -> int:
        """Every body that came, kept or refused."""
        with self._lock:
            return self._received

    def refused_count(self) -> int:
        with self._lock:
            return self._refused_count

    def bodies(self) -> list[Body]:
        with self._lock:
            return list(self._bodies)

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def refused(self) -> list[str]:
        """The first REFUSED_LINES bodies refused, one line each (refused_count: all of them)."""
        with self._lock:
            return list(self._refused_lines)

    def refused_values(self) -> list[str]:
        return [line for body in self.bodies() for line in body.refused_values]


# --- from spans to turns ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clock:
    """How the spans' epoch times were put on the call clock."""

    t0_epoch_ns: int
    offset_ms: float = 0.0  # subtracted from every span time: the sender's clock ahead of ours by this much
    spans: int = 0  # the turn spans the estimate rests on
    refused_ms: float | None = None  # an estimate longer than the call: not applied (offset_ms stays 0)
    limit_ms: float | None = None  # the bound it broke (the call's length)

    def ms(self, epoch_ns: int) -> float:
        return (epoch_ns - self.t0_epoch_ns) / 1e6 - self.offset_ms

    def describe(self) -> str:
        if self.refused_ms is not None:
            return (f"common: an offset of {self.refused_ms:.1f} ms (median of {self.spans} turn spans) is longer "
                    f"than the call ({self.limit_ms:.0f} ms): refused, not applied")
        if self.offset_ms == 0.0:
            return "common"
        return (f"offset estimated {self.offset_ms:.1f} ms from arrivals (median of {self.spans} turn spans "
                "ending after the body carrying them arrived): every span shifted back by it")


def _estimate(spans: Sequence[Span], t0_epoch_ns: int, limit_ms: float | None) -> Clock:
    """The median excess (span end minus its body's arrival) of ``spans``: the median, so one stray span cannot
    move it; the common clock within CLOCK_SLACK_MS; refused above ``limit_ms``."""
    plain = Clock(t0_epoch_ns, spans=len(spans))
    if not spans:
        return plain
    excesses = sorted(plain.ms(span.end_ns) - span.arrival_ms for span in spans)
    middle = len(excesses) // 2
    excess = excesses[middle] if len(excesses) % 2 else (excesses[middle - 1] + excesses[middle]) / 2
    if excess <= CLOCK_SLACK_MS:
        return plain
    if limit_ms is not None and excess > limit_ms:
        return Clock(t0_epoch_ns, 0.0, len(spans), round(excess, 3), limit_ms)
    return Clock(t0_epoch_ns, round(excess, 3), len(spans))


def clock_for(spans: Sequence[Span], t0_epoch_ns: int, speech_ends_ms: Sequence[float | None] | None = None,
              limit_ms: float | None = None) -> Clock:
    """The common clock, or the offset the turn spans' arrivals show (see the module's docstring). Only spans that
    report a turn count (other traces say nothing of this call's turns); with ``speech_ends_ms`` only those
    ``match`` gives a dial turn under a first estimate. ``limit_ms``: the longest offset taken (the call's length;
    by default the last arrival on the call clock, how long the receiver heard the call)."""
    if limit_ms is None:
        limit_ms = max((span.arrival_ms for span in spans), default=None)
    turn_spans = [span for span in spans if _latency(span) is not None]
    first = _estimate(turn_spans, t0_epoch_ns, limit_ms)
    if speech_ends_ms is None or first.refused_ms is not None:
        return first  # refused: under no offset taken do these spans fall on the call's turns to match them
    matched = {found.span for found in match(speech_ends_ms, turn_spans, first) if found is not None}
    return _estimate([span for span in turn_spans if f"{span.name} {span.span_id}" in matched], t0_epoch_ns,
                     limit_ms)


@dataclass(frozen=True)
class StageSpan:
    name: str
    start_ms: float
    end_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "start_ms": round(self.start_ms, 3), "end_ms": round(self.end_ms, 3)}


@dataclass(frozen=True)
class Reported:
    """What the agent said of one dial turn."""

    latency_ms: float
    source: str
    span: str  # "<name> <span id>"
    start_ms: float
    end_ms: float
    breakdown: Mapping[str, float | None] | None
    stages: tuple[StageSpan, ...] = field(default=())
    transcript: str | None = None  # what the agent understood of the caller's line, when its spans say so
    preemptive: Mapping[str, Any] | None = None  # voice-llm agent --preemptive's counts for this turn, when sent
    # a stage of ``breakdown`` left null, and why (pipecat's spans say nothing of it): dial.json's unknown
    breakdown_unknown: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"latency_ms": round(self.latency_ms, 3), "source": self.source, "span": self.span,
                "start_ms": round(self.start_ms, 3), "end_ms": round(self.end_ms, 3)}


def _latency(span: Span) -> tuple[float, str] | None:
    # the receiver refused bad numbers already; spans made elsewhere (load shifts the receiver's) get the same rule
    for names, attribute, factor, source in LATENCY_SOURCES:
        value = _measurement(span.attributes.get(attribute), factor) if span.name in names else None
        if value is not None:
            return value, source
    return None


def _preemptive(span: Span) -> dict[str, Any] | None:
    found = {key[len(PREEMPTIVE_PREFIX):]: value for key, value in span.attributes.items()
             if key.startswith(PREEMPTIVE_PREFIX) and (isinstance(value, bool) or _measurement(value) is not None)}
    if not found:
        return None
    turn = {key: value for key, value in found.items() if not key.startswith("call.")}
    turn["call"] = {key[len("call."):]: value for key, value in found.items() if key.startswith("call.")}
    return turn


def _breakdown(span: Span) -> dict[str, float] | None:
    parts = {key[len(BREAKDOWN_PREFIX):].removesuffix("_ms"): number
             for key, value in span.attributes.items()
             if key.startswith(BREAKDOWN_PREFIX) and (number := _measurement(value)) is not None}
    return parts or None


# pipecat's turn, in the built-in agent's stages (issue 40 item 3), from its stage spans and their metrics.ttfb
# (seconds; pipecat's own TTFB metrics, https://docs.pipecat.ai/server/utilities/opentelemetry): the reply heard is
# the first `llm` span starting at or after the caller's speech end (the dial turn's, call clock); its stt the last
# `stt` span ending before that llm starts; its speech the first `tts` span starting after it. pipecat's
# segmented STT times its TTFB from the VAD's stop, so that stop is the stt span's end minus its ttfb, and
# turn.user_bot_latency_seconds runs from it too (measured here: a 2-turn call's parts from that anchor came to
# within 9-35 ms of the reported latency, the rest being the transport's send). Each part is pipecat's own timing:
#   stt = stt.metrics.ttfb; handoff = llm.start - stt.end; request_to_first_token = llm.metrics.ttfb;
#   first_token_to_first_segment = tts.start - (llm.start + llm.metrics.ttfb); segment_to_first_audio =
#   tts.metrics.ttfb; audio_to_sent = the reported latency - (first audio - VAD stop).
# endpoint_wait stays null: pipecat's spans carry no end-of-turn event (its turn-end wait runs beside the STT).
PIPECAT_ENDPOINT_UNKNOWN = ("pipecat's spans carry no end-of-turn event: its latency starts at the VAD's stop and "
                            "the turn-end wait runs beside its STT (inside stt and handoff)")


def _ttfb_ms(span: Span | None) -> float | None:
    return _measurement(span.attributes.get("metrics.ttfb"), 1000.0) if span is not None else None


def pipecat_breakdown(latency_ms: float, below: Sequence[Span], clock: Clock,
                      speech_end_ms: float) -> tuple[dict[str, float | None], dict[str, str]]:
    """pipecat's turn in the built-in agent's stages (the rule above): (parts, the reason of each null part)."""
    def ms(ns: int) -> float:
        return clock.ms(ns)

    llm = min((sp for sp in below if sp.name == "llm" and ms(sp.start_ns) >= speech_end_ms),
              key=lambda sp: sp.start_ns, default=None)
    why: dict[str, str] = {"endpoint_wait": PIPECAT_ENDPOINT_UNKNOWN}
    parts: dict[str, float | None] = dict.fromkeys(
        ("endpoint_wait", "stt", "handoff", "request_to_first_token", "first_token_to_first_segment",
         "segment_to_first_audio", "audio_to_sent"))
    if llm is None:
        for key in parts:
            why.setdefault(key, "no llm span of pipecat's starts after the caller's speech end in this turn")
        return parts, why
    stt = max((sp for sp in below if sp.name == "stt" and sp.end_ns <= llm.start_ns), key=lambda sp: sp.end_ns,
              default=None)
    tts = min((sp for sp in below if sp.name == "tts" and sp.start_ns >= llm.start_ns), key=lambda sp: sp.start_ns,
              default=None)
    stt_ttfb, llm_ttfb, tts_ttfb = _ttfb_ms(stt), _ttfb_ms(llm), _ttfb_ms(tts)
    first_token = ms(llm.start_ns) + llm_ttfb if llm_ttfb is not None else None
    vad_stop = ms(stt.end_ns) - stt_ttfb if stt is not None and stt_ttfb is not None else None
    first_audio = ms(tts.start_ns) + tts_ttfb if tts is not None and tts_ttfb is not None else None

    def part(key: str, value: float | None, missing: str) -> None:
        if value is None:
            why[key] = missing
        elif value < 0:  # spans out of order: no stage of a real turn is negative
            why[key] = f"pipecat's spans give {value:.1f} ms (negative: spans out of order)"
        else:
            parts[key] = round(value, 1)

    no_stt = "no stt span of pipecat's ends before the reply's llm span" if stt is None else \
        "pipecat's stt span has no metrics.ttfb (a finite number >= 0)"
    no_tts = "no tts span of pipecat's starts after the reply's llm span" if tts is None else \
        "pipecat's tts span has no metrics.ttfb (a finite number >= 0)"
    no_llm = "pipecat's llm span has no metrics.ttfb (a finite number >= 0)"
    part("stt", stt_ttfb, no_stt)
    part("handoff", ms(llm.start_ns) - ms(stt.end_ns) if stt is not None else None, no_stt)
    part("request_to_first_token", llm_ttfb, no_llm)
    part("first_token_to_first_segment", ms(tts.start_ns) - first_token if tts is not None and first_token is not None
         else None, no_tts if tts is None else no_llm)
    part("segment_to_first_audio", tts_ttfb, no_tts)
    part("audio_to_sent", latency_ms - (first_audio - vad_stop) if first_audio is not None and vad_stop is not None
         else None, "the VAD's stop or the first audio is not known from pipecat's spans (stt or tts above)")
    return parts, why


# Where an agent's spans carry its transcript of the caller's line: voice-llm's agent on invoke_agent, pipecat on its
# stt span (``transcript``).
TRANSCRIPT_ATTRIBUTES = ("voice_llm.transcript", "transcript")


def _reply_llm(spans: Sequence[Span], clock: Clock, speech_end_ms: float | None) -> Span | None:
    """pipecat's llm span that made the reply heard after a caller's line: the first starting at or after the line's
    speech end (an earlier one answered a pause inside the line, and was cut by the rest of it)."""
    if speech_end_ms is None:
        return None
    return min((sp for sp in spans if sp.name == "llm" and clock.ms(sp.start_ns) >= speech_end_ms),
               key=lambda sp: sp.start_ns, default=None)


def pipecat_transcript(spans: Sequence[Span], clock: Clock, speech_ends_ms: Sequence[float | None],
                       turn: int) -> str | None:
    """What pipecat understood of the caller's line ``turn``: every `stt` span's transcript ending after the previous
    line's reply llm started and by the time this line's reply llm started, in order, joined. pipecat ends its
    turn at a pause inside a line and transcribes each segment on its own (a real call's spans,
    tests/fixtures/pipecat_call_spans: "Hi." at the comma, then "I'd like to come in ... patient?", both in its
    context before the reply; the pause's "Okay." of line 2 inside the turn span of line 1), so neither one stt span
    nor pipecat's turn span is the line. None: no reply llm, or no transcript in that window (``match`` then takes
    the turn span's own stt's)."""
    reply = _reply_llm(spans, clock, speech_ends_ms[turn])
    if reply is None:
        return None
    earlier = next((_reply_llm(spans, clock, end) for end in reversed(speech_ends_ms[:turn]) if end is not None), None)
    after_ns = earlier.start_ns if earlier is not None else None
    parts = [sp for sp in spans if sp.name == "stt" and sp.end_ns <= reply.start_ns
             and (after_ns is None or sp.end_ns > after_ns)
             and isinstance(sp.attributes.get("transcript"), str) and str(sp.attributes["transcript"]).strip()]
    return " ".join(str(sp.attributes["transcript"]).strip() for sp in sorted(parts, key=lambda sp: sp.start_ns)) or None


def _transcript(span: Span, descendants: Sequence[Span]) -> str | None:
    for candidate in (span, *descendants):
        for attribute in TRANSCRIPT_ATTRIBUTES:
            value = candidate.attributes.get(attribute)
            if isinstance(value, str) and value.strip():
                return value
    return None


def _descendants(root: Span, spans: Sequence[Span]) -> list[Span]:
    children: dict[str, list[Span]] = {}
    for span in spans:
        if span.parent_id:
            children.setdefault(span.parent_id, []).append(span)
    found, todo = [], [root.span_id]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.span_id)
    return found


def reporting_spans(spans: Sequence[Span]) -> int:
    """How many spans report a turn's latency (the spans ``match`` can give a turn): dial waits for one per line."""
    return sum(1 for span in spans if _latency(span) is not None)


def match(speech_ends_ms: Sequence[float | None], spans: Sequence[Span], clock: Clock) -> list[Reported | None]:
    """Per dial turn (by its caller speech end on the call clock), the agent's turn span that reported on it:
    the span belongs to the turn whose speech ended last at or before the span's end; the earliest-starting such
    span when several do. None: not reported."""
    found: list[Reported | None] = [None] * len(speech_ends_ms)
    candidates = sorted((span for span in spans if _latency(span) is not None), key=lambda s: s.start_ns)
    for span in candidates:
        end = clock.ms(span.end_ns)
        turn = None
        for index, speech_end in enumerate(speech_ends_ms):
            if speech_end is not None and speech_end <= end:
                if turn is None or speech_end >= speech_ends_ms[turn]:  # type: ignore[operator]
                    turn = index
        if turn is None or found[turn] is not None:
            continue
        latency, source = _latency(span)  # type: ignore[misc]
        below = _descendants(span, spans)
        stages = tuple(sorted((StageSpan(child.name, clock.ms(child.start_ns), clock.ms(child.end_ns))
                               for child in below if child.name in STAGE_NAMES),
                              key=lambda stage: stage.start_ms))
        breakdown: Mapping[str, float | None] | None = _breakdown(span)
        unknown: dict[str, str] = {}
        transcript = _transcript(span, below)
        if source == PIPECAT_SOURCE:
            if breakdown is None:
                breakdown, unknown = pipecat_breakdown(latency, below, clock, speech_ends_ms[turn])  # type: ignore[arg-type]
            # the line's segments when pipecat's reply llm is among the spans, else its turn span's own stt
            transcript = pipecat_transcript(spans, clock, speech_ends_ms, turn) or transcript
        found[turn] = Reported(latency, source, f"{span.name} {span.span_id}", clock.ms(span.start_ns), end,
                               breakdown, stages, transcript, _preemptive(span), unknown)
    return found


def summary(receiver_address: str, receiver: Any, clock: Clock | None) -> dict[str, Any]:
    """dial.json's ``otlp`` block, of a :class:`Receiver` (or None: nothing received). ``bodies`` are those kept
    (each a file of ``files``); those refused are counted in ``refused_bodies``, the first REFUSED_LINES in
    ``refused``, one line each (since dial_schema_version 4: ``received``, ``refused_bodies``, ``limits``; before it
    ``bodies`` counted the refused too and ``refused`` had a line for each)."""
    bodies = receiver.bodies() if receiver is not None else []
    values = [line for body in bodies for line in body.refused_values]
    limits = receiver.limits if receiver is not None else CALL_LIMITS
    return {"listen": receiver_address, "received": receiver.received if receiver is not None else 0,
            "bodies": len(bodies), "spans": sum(body.spans for body in bodies),
            "refused": receiver.refused() if receiver is not None else [],
            "refused_bodies": receiver.refused_count() if receiver is not None else 0,
            # numbers refused off the spans: the count, and the first lines (a flood of them stays small)
            "refused_values": sum(body.refused_value_count for body in bodies),
            "refused_value_lines": values[:REFUSED_VALUE_LINES],
            "limits": {"bodies": limits.bodies, "spans": limits.spans, "bytes": limits.bytes,
                       "spans_per_body": MAX_SPANS_PER_BODY, "body_bytes": MAX_BODY_BYTES},
            "clock": clock.describe() if clock is not None else "no spans",
            # the offset applied to every span time, and the turn spans it rests on (the median of theirs)
            "clock_offset_ms": clock.offset_ms if clock is not None else None,
            "clock_offset_spans": clock.spans if clock is not None else 0,
            "files": [body.file_name for body in bodies]}


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, loopback) for --otlp; also the agent's --otlp form ``http://HOST:PORT`` (with
    ``/`` or ``/v1/traces`` after it), so the one value a user gives the agent works here too (it failed with "Name
    or service not known": the host was taken as ``http://HOST``). ValueError with the reason."""
    if "://" in value:
        parts = urllib.parse.urlsplit(value.strip())
        if parts.scheme != "http":  # the receiver speaks plain OTLP/HTTP, no TLS
            raise ValueError(f"--otlp takes HOST:PORT or http://HOST:PORT (the receiver has no TLS), not {value!r}")
        if parts.path.rstrip("/") not in ("", TRACES_PATH) or parts.query or parts.fragment:
            raise ValueError(f"--otlp takes HOST:PORT or http://HOST:PORT (it receives on {TRACES_PATH}), "
                             f"not {value!r}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"--otlp port must be 0-65535, in {value!r}") from None
        if port is None or not parts.hostname:
            raise ValueError(f"--otlp takes http://HOST:PORT with both, not {value!r}")
        return parts.hostname, port
    host, sep, port = value.rpartition(":")
    if not sep:
        raise ValueError(f"--otlp takes HOST:PORT, not {value!r}")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--otlp takes HOST:PORT; {port!r} is not a port") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--otlp port must be 0-65535, not {number}")
    return (host.strip("[]") or "127.0.0.1"), number


__all__ = ["CALL_LIMITS", "RUN_LIMITS", "Body", "Clock", "Limits", "OTLPError", "Receiver", "Reported", "Span", "StageSpan", "clock_for", "count_spans", "decode_request",
           "flatten", "match", "parse_listen", "refuse_values", "reporting_spans", "summary"]
