"""The OTLP/HTTP receiver of `dial --otlp`: spans sent by the real OpenTelemetry SDK exporter arrive, are kept
raw and matched to the right turns; an agent that sends nothing is "not reported"; malformed bodies are refused with
one line each and never stop the receiver."""

from __future__ import annotations

import http.client
import json
import time

import pytest

from voice_llm.capabilities.dial import otlp

T0 = 1_700_000_000_000_000_000  # call-clock 0 in epoch ns


def _ns(ms: float) -> int:
    return T0 + int(ms * 1e6)


@pytest.fixture
def receiver():
    clock_start = time.perf_counter()
    with otlp.Receiver("127.0.0.1", 0, lambda: (time.perf_counter() - clock_start) * 1000.0 + 60_000.0) as r:
        yield r


def _export(receiver: otlp.Receiver, build, json_body: bool = False) -> None:
    """Spans made by the OpenTelemetry SDK and sent by its OTLP/HTTP exporter, as an agent would."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    host, port = receiver.address
    provider = TracerProvider(resource=Resource.create({"service.name": "test-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://{host}:{port}/v1/traces")))
    build(provider.get_tracer("test"))
    provider.shutdown()


def _turn(tracer, name: str, start_ms: float, end_ms: float, attributes: dict, children=()) -> None:
    from opentelemetry import trace

    span = tracer.start_span(name, start_time=_ns(start_ms), attributes=attributes)
    context = trace.set_span_in_context(span)
    for child, a, b in children:
        tracer.start_span(child, context=context, start_time=_ns(a)).end(end_time=_ns(b))
    span.end(end_time=_ns(end_ms))


def test_known_spans_are_matched_to_the_right_turns(receiver: otlp.Receiver) -> None:
    speech_ends = [2000.0, 9000.0, 16000.0]

    def build(tracer) -> None:
        # pipecat's shape for turn 2, voice-llm's for turns 1 and 3; sent out of order.
        _turn(tracer, "turn", 7000.0, 14500.0, {"turn.number": 2, "turn.user_bot_latency_seconds": 0.85},
              children=[("stt", 9300.0, 9700.0), ("llm", 9700.0, 9800.0), ("tts", 9800.0, 9900.0)])
        _turn(tracer, "invoke_agent", 2300.0, 6000.0, {"voice_llm.latency.reported_ms": 910.5,
                                                      "voice_llm.breakdown.stt_ms": 400.0})
        _turn(tracer, "invoke_agent", 16300.0, 19000.0, {"voice_llm.latency.reported_ms": 700.0})
        _turn(tracer, "unrelated", 100.0, 200.0, {})

    _export(receiver, build)
    spans = receiver.spans()
    assert len(spans) == 7 and {s.service for s in spans} == {"test-agent"}
    clock = otlp.clock_for(spans, T0)
    assert clock.describe() == "common"
    reported = otlp.match(speech_ends, spans, clock)
    assert [r.latency_ms if r else None for r in reported] == [910.5, 850.0, 700.0]
    assert reported[1].source.startswith("pipecat") and reported[0].source.startswith("voice-llm")
    assert reported[0].breakdown == {"stt": 400.0}
    assert [s.name for s in reported[1].stages] == ["stt", "llm", "tts"]
    assert reported[1].stages[0].start_ms == pytest.approx(9300.0, abs=0.01)
    bodies = receiver.bodies()
    assert bodies and all(b.data and b.spans for b in bodies)
    assert otlp.summary("127.0.0.1:1", receiver, clock)["spans"] == 7


def test_json_bodies_decode_like_protobuf(receiver: otlp.Receiver) -> None:
    body = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "j"}}]},
                               "scopeSpans": [{"spans": [{
                                   "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
                                   "name": "agent_turn", "startTimeUnixNano": str(_ns(1000)),
                                   "endTimeUnixNano": str(_ns(3000)),
                                   "attributes": [{"key": "lk.e2e_latency", "value": {"doubleValue": 1.25}}]}]}]}]}
    status = _post(receiver, json.dumps(body).encode(), otlp.JSON)
    assert status == 200
    spans = receiver.spans()
    assert spans[0].trace_id == "5b8efff798038103d269b633813fc60c" and spans[0].service == "j"
    assert otlp.match([500.0], spans, otlp.clock_for(spans, T0))[0].latency_ms == 1250.0
    assert receiver.bodies()[0].file_name == "0001.json"


def test_an_agent_that_sends_no_spans_is_not_reported(receiver: otlp.Receiver) -> None:
    assert otlp.match([1000.0, 5000.0], receiver.spans(), otlp.Clock(T0)) == [None, None]
    limits = {"bodies": 1024, "spans": 32768, "bytes": 64 << 20, "spans_per_body": 4096, "body_bytes": 4 << 20}
    assert otlp.summary("127.0.0.1:1", receiver, None) == {
        "listen": "127.0.0.1:1", "received": 0, "bodies": 0, "spans": 0, "refused": [], "refused_bodies": 0,
        "refused_values": 0, "refused_value_lines": [], "limits": limits, "clock": "no spans",
        "clock_offset_ms": None, "clock_offset_spans": 0, "files": []}


def _post(receiver: otlp.Receiver, data: bytes, content_type: str | None, path: str = "/v1/traces") -> int:
    host, port = receiver.address
    connection = http.client.HTTPConnection(host, port, timeout=10)
    headers = {"Content-Type": content_type} if content_type else {}
    connection.request("POST", path, body=data, headers=headers)
    status = connection.getresponse().status
    connection.close()
    return status


@pytest.mark.parametrize("data, content_type, needle", [
    (b"\xff\xff\xff garbage", otlp.PROTOBUF, "not an OTLP protobuf"),
    (b"{not json", otlp.JSON, "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, otlp.JSON, "not JSON"),
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', otlp.JSON, "not hex"),
    (b'{"resourceSpans": 3}', otlp.JSON, "not an OTLP/JSON"),
    (b"hello", "text/plain", "Content-Type text/plain"),
    (b"hello", None, "Content-Type missing"),
])
def test_malformed_bodies_are_refused_with_one_line_and_the_receiver_goes_on(
        receiver: otlp.Receiver, data: bytes, content_type: str | None, needle: str) -> None:
    assert _post(receiver, data, content_type) == 400
    refused = receiver.refused()
    assert len(refused) == 1 and needle in refused[0] and "\n" not in refused[0], refused
    assert refused[0].startswith("body 1: ")
    # and the next, good body is taken
    _export(receiver, lambda tracer: _turn(tracer, "invoke_agent", 1.0, 2.0, {"voice_llm.latency.reported_ms": 5}))
    assert len(receiver.spans()) == 1


def test_wrong_path_and_size_are_refused(receiver: otlp.Receiver) -> None:
    assert _post(receiver, b"x", otlp.PROTOBUF, path="/v1/metrics") == 404
    host, port = receiver.address
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.putrequest("POST", "/v1/traces")
    connection.putheader("Content-Type", otlp.PROTOBUF)
    connection.putheader("Content-Length", str(otlp.MAX_BODY_BYTES + 1))
    connection.endheaders()
    assert connection.getresponse().status == 413
    connection.close()
    assert [r.split(":")[0] for r in receiver.refused()] == ["body 1", "body 2"]


def test_a_sender_clock_ahead_is_estimated_from_arrivals() -> None:
    # A span "ending" 5 s after its body arrived: the sender's clock runs ahead; every span is shifted back.
    span = otlp.Span("t", "s", None, "invoke_agent", _ns(10_000), _ns(11_000), {"voice_llm.latency.reported_ms": 1},
                     None, 1, arrival_ms=6_000.0)
    clock = otlp.clock_for([span], T0)
    assert clock.offset_ms == pytest.approx(5000.0) and "offset estimated" in clock.describe()
    assert clock.ms(span.end_ns) == pytest.approx(6000.0)


REPORTED = {"voice_llm.latency.reported_ms": 900.0}
SPEECH_ENDS = [2000.0, 9000.0, 16000.0]
CALL_MS = 20_000.0
TWO_HOURS_MS = 7_200_000.0


def _span(span_id: str, start_ms: float, end_ms: float, arrival_ms: float, name: str = "invoke_agent",
          attributes: dict | None = None, trace_id: str = "t") -> otlp.Span:
    return otlp.Span(trace_id, span_id, None, name, _ns(start_ms), _ns(end_ms),
                     REPORTED if attributes is None else attributes, None, 1, arrival_ms=arrival_ms)


def _turn_spans(ahead_ms: float = 0.0) -> list[otlp.Span]:
    """One turn span per line, on a sender clock ``ahead_ms`` ahead; each body arrives 30-50 ms after its span."""
    return [_span(f"s{i}", end + 300.0 + ahead_ms, end + 3000.0 + ahead_ms, end + 3000.0 + 30.0 + 10.0 * i)
            for i, end in enumerate(SPEECH_ENDS)]


def test_a_stray_span_of_an_unknown_trace_sets_no_offset() -> None:
    """Issue 41 item 9: one span of another trace ending 2 h ahead set a 7,199,999 ms offset and erased the agent's
    numbers; the offset rests on the turn spans only."""
    stray = _span("x", TWO_HOURS_MS, TWO_HOURS_MS + 1000.0, 1000.0, name="GET /health", attributes={}, trace_id="u")
    spans = [*_turn_spans(), stray]
    clock = otlp.clock_for(spans, T0, SPEECH_ENDS, CALL_MS)
    assert clock.offset_ms == 0.0 and clock.describe() == "common" and clock.spans == 3
    assert [r.latency_ms if r else None for r in otlp.match(SPEECH_ENDS, spans, clock)] == [900.0] * 3


def test_the_offset_is_the_median_of_the_matched_turn_spans() -> None:
    """A stray turn span 2 h ahead beside three honest ones 5 s ahead: outvoted, not the offset."""
    stray = _span("x", TWO_HOURS_MS, TWO_HOURS_MS + 1000.0, 1000.0, trace_id="u")
    clock = otlp.clock_for([*_turn_spans(5000.0), stray], T0, SPEECH_ENDS, CALL_MS)
    assert clock.offset_ms == pytest.approx(5000.0 - 40.0) and clock.spans == 3
    assert "offset estimated 4960.0 ms" in clock.describe() and "median of 3 turn spans" in clock.describe()


def test_an_offset_longer_than_the_call_is_refused() -> None:
    clock = otlp.clock_for(_turn_spans(TWO_HOURS_MS), T0, SPEECH_ENDS, CALL_MS)
    assert clock.offset_ms == 0.0 and clock.spans == 3
    assert clock.refused_ms == pytest.approx(TWO_HOURS_MS - 40.0)
    assert "refused" in clock.describe() and "longer than the call (20000 ms)" in clock.describe()
    assert "\n" not in clock.describe()


def test_dial_json_states_the_offset_and_its_spans() -> None:
    """dial.json's otlp block: the offset applied and how many spans it rests on."""
    from voice_llm.capabilities.dial import step

    class Receiver:
        def spans(self) -> list[otlp.Span]:
            return [*_turn_spans(5000.0), _span("x", TWO_HOURS_MS, TWO_HOURS_MS + 1.0, 1.0, name="x", attributes={})]

        def bodies(self) -> list[otlp.Body]:
            return [otlp.Body(1, 1.0, otlp.JSON, b"{}", 4)]

        received = 1
        limits = otlp.CALL_LIMITS

        def refused(self) -> list[str]:
            return []

        def refused_count(self) -> int:
            return 0

    rows = [{"caller": {"speech_end_ms": end}, "heard": {"gap_ms": 1000.0}, "script": None} for end in SPEECH_ENDS]
    block = step._apply_otlp(rows, Receiver(), T0, "127.0.0.1:1", step._Unknown(), CALL_MS)
    assert block["clock_offset_ms"] == pytest.approx(4960.0) and block["clock_offset_spans"] == 3
    assert [row["heard_minus_reported_ms"] for row in rows] == [100.0] * 3
    assert otlp.summary("127.0.0.1:1", None, None)["clock_offset_ms"] is None


@pytest.mark.parametrize("value, expected", [("127.0.0.1:4318", ("127.0.0.1", 4318)), (":0", ("127.0.0.1", 0)),
                                             ("[::1]:9", ("::1", 9)),
                                             # the agent's --otlp form, so one value serves both commands
                                             ("http://127.0.0.1:4318", ("127.0.0.1", 4318)),
                                             ("http://localhost:4318/", ("localhost", 4318)),
                                             ("http://127.0.0.1:4318/v1/traces", ("127.0.0.1", 4318)),
                                             ("http://[::1]:9", ("::1", 9))])
def test_parse_listen(value: str, expected: tuple[str, int]) -> None:
    assert otlp.parse_listen(value) == expected


@pytest.mark.parametrize("value", ["4318", "host:port", "h:70000", "https://127.0.0.1:4318", "http://127.0.0.1",
                                   "http://127.0.0.1:4318/elsewhere"])
def test_parse_listen_refuses(value: str) -> None:
    with pytest.raises(ValueError):
        otlp.parse_listen(value)


def test_dial_takes_the_agents_otlp_form() -> None:
    """`agent --otlp http://HOST:PORT` and `dial --otlp` name the same receiver with the same value."""
    from voice_llm.cli.main import build_parser
    from voice_llm.capabilities.dial.step import options_value

    values = vars(build_parser().parse_args(["dial", "ws://127.0.0.1:9/", "--otlp", "http://127.0.0.1:4318"]))
    assert otlp.parse_listen(options_value(values).otlp) == ("127.0.0.1", 4318)


def test_the_agents_transcript_comes_with_its_turn_span() -> None:
    """voice-llm's agent puts its transcript on invoke_agent, pipecat on the turn's stt span: either way the turn
    gets what the agent understood (scored as WER by dial), and a turn span without one gives None."""
    ours = otlp.Span("t", "a1", None, "invoke_agent", _ns(2100), _ns(4000),
                     {"voice_llm.latency.reported_ms": 800.0, "voice_llm.transcript": "Do you take Medicare?"},
                     None, 1, 9000.0)
    turn = otlp.Span("t", "b1", None, "turn", _ns(5000), _ns(9000), {"turn.user_bot_latency_seconds": 0.9}, None, 1,
                     9000.0)
    stt = otlp.Span("t", "b2", "b1", "stt", _ns(6100), _ns(6400), {"transcript": "Thanks, that's all."}, None, 1,
                    9000.0)
    bare = otlp.Span("t", "c1", None, "invoke_agent", _ns(10000), _ns(11000), {"voice_llm.latency.reported_ms": 5.0},
                     None, 1, 12000.0)
    found = otlp.match([2000.0, 6000.0, 9500.0], [ours, turn, stt, bare], otlp.Clock(T0))
    assert [r.transcript for r in found] == ["Do you take Medicare?", "Thanks, that's all.", None]


def test_the_agents_preemptive_counts_come_with_its_turn_span() -> None:
    """voice-llm agent --preemptive puts its counts on invoke_agent (this turn's, and the call's as call.<count>):
    dial keeps them per turn beside what was heard; a span without them gives None."""
    counts = {"voice_llm.preemptive.started": 2, "voice_llm.preemptive.used": 1, "voice_llm.preemptive.dropped": 1,
              "voice_llm.preemptive.tokens_wasted": 7, "voice_llm.preemptive.synthesis_ms_wasted": 80.5,
              "voice_llm.preemptive.reply": True, "voice_llm.preemptive.call.dropped": 3}
    ours = otlp.Span("t", "a1", None, "invoke_agent", _ns(2100), _ns(4000),
                     {"voice_llm.latency.reported_ms": 800.0, **counts}, None, 1, 9000.0)
    bare = otlp.Span("t", "c1", None, "invoke_agent", _ns(10000), _ns(11000), {"voice_llm.latency.reported_ms": 5.0},
                     None, 1, 12000.0)
    found = otlp.match([2000.0, 9500.0], [ours, bare], otlp.Clock(T0))
    assert found[0].preemptive == {"started": 2, "used": 1, "dropped": 1, "tokens_wasted": 7,
                                   "synthesis_ms_wasted": 80.5, "reply": True, "call": {"dropped": 3}}
    assert found[1].preemptive is None


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", -5.0, 1e308])
def test_a_reported_number_that_is_not_a_finite_latency_is_refused_and_counted(receiver: otlp.Receiver,
                                                                               value: object) -> None:
    """NaN, Inf or a negative latency (pipecat's seconds of 1e308 are Inf in ms) is no latency: refused where the
    span arrives, counted in refused_values with one line each; the span and its good numbers are kept, the body
    is taken (200), the turn is not reported."""
    attributes = [{"key": "turn.user_bot_latency_seconds", "value": {"doubleValue": value}},
                  {"key": "voice_llm.breakdown.stt_ms", "value": {"doubleValue": "NaN"}},
                  {"key": "voice_llm.breakdown.llm_ms", "value": {"doubleValue": 120.0}},
                  {"key": "voice_llm.preemptive.wasted_ms", "value": {"doubleValue": "Infinity"}}]
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "turn",
        "startTimeUnixNano": str(_ns(1000)), "endTimeUnixNano": str(_ns(3000)), "attributes": attributes}]}]}]}
    assert _post(receiver, json.dumps(body).encode(), otlp.JSON) == 200
    (span,) = receiver.spans()
    assert "turn.user_bot_latency_seconds" not in span.attributes and span.attributes["voice_llm.breakdown.llm_ms"] == 120.0
    refused = receiver.refused_values()
    assert len(refused) == 3 and all(line.startswith("body 1: span turn eee19b7ec3c1b174: ") for line in refused)
    assert "turn.user_bot_latency_seconds" in refused[0] and "\n" not in "".join(refused)
    assert otlp.match([500.0], receiver.spans(), otlp.clock_for(receiver.spans(), T0)) == [None]
    block = otlp.summary("127.0.0.1:1", receiver, otlp.Clock(T0))
    assert block["refused_values"] == 3 and block["refused_value_lines"] == refused and block["refused"] == []
    assert block["spans"] == 1
    json.dumps(block, allow_nan=False)


def test_match_takes_no_latency_that_is_not_a_finite_number_at_least_zero() -> None:
    """Spans made elsewhere than the receiver (load's shared receiver shifts them) are held to the same rule."""
    spans = [otlp.Span("t", f"s{n}", None, "invoke_agent", _ns(1000), _ns(2000),
                       {"voice_llm.latency.reported_ms": bad, "voice_llm.breakdown.stt_ms": bad}, None, 1, 5000.0)
             for n, bad in enumerate([float("nan"), float("inf"), -1.0])]
    assert otlp.match([500.0], spans, otlp.Clock(T0)) == [None]
    assert otlp.reporting_spans(spans) == 0


# --- what one receiver keeps (issue 41 items 10 and 15) ------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _empty_spans_body(spans: int) -> bytes:
    """A protobuf ExportTraceServiceRequest of ``spans`` empty spans in one resource and scope, written on the wire
    by hand (field 1 resource_spans > field 2 scope_spans > field 2 spans): 2 bytes a span."""
    scope = b"\x12\x00" * spans
    resource = b"\x12" + _varint(len(scope)) + scope
    return b"\x0a" + _varint(len(resource)) + resource


def test_the_span_count_on_the_bytes_is_protobufs_own() -> None:
    """count_spans walks the wire format without decoding: on the SDK's own bodies it gives what protobuf decodes."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    for resources in range(2):
        resource = request.resource_spans.add()
        resource.resource.attributes.add(key="service.name").value.string_value = "agent"
        for scopes in range(3):
            scope = resource.scope_spans.add()
            scope.scope.name = "s"
            for n in range(resources + scopes + 1):
                span = scope.spans.add(name=f"x{n}", trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
                span.attributes.add(key="k").value.int_value = n
    data = request.SerializeToString()
    assert otlp.count_spans(data)[0] == 15 == sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    assert otlp.count_spans(_empty_spans_body(10))[0] == 10


def test_a_body_of_millions_of_empty_spans_is_refused_before_it_is_decoded(receiver: otlp.Receiver) -> None:
    """Four bodies of 4 MB of empty spans (8.4M in all) took the dialer 77 -> 2,467 MB: each is now counted on its
    bytes, refused with one line past MAX_SPANS_PER_BODY and never decoded, and the receiver takes the next body."""
    body = _empty_spans_body((otlp.MAX_BODY_BYTES - 16) // 2)
    assert len(body) <= otlp.MAX_BODY_BYTES
    for _ in range(4):
        assert _post(receiver, body, otlp.PROTOBUF) == 400
    assert receiver.spans() == [] and receiver.bodies() == [] and receiver.refused_count() == 4
    assert all("more than 4096 spans in one body" in line and "not decoded" in line for line in receiver.refused())
    _export(receiver, lambda tracer: _turn(tracer, "invoke_agent", 1.0, 2.0, {"voice_llm.latency.reported_ms": 5}))
    assert len(receiver.spans()) == 1 and receiver.received == 5


def test_a_json_body_of_too_many_objects_is_refused_before_it_is_parsed(receiver: otlp.Receiver) -> None:
    spans = ",".join(["{}"] * (otlp.MAX_JSON_OBJECTS + 1))
    data = ('{"resourceSpans": [{"scopeSpans": [{"spans": [' + spans + ']}]}]}').encode()
    assert _post(receiver, data, otlp.JSON) == 400
    assert "JSON objects in one body: not parsed" in receiver.refused()[0]
    few = ",".join(['{"name": "x"}'] * (otlp.MAX_SPANS_PER_BODY + 1))
    assert _post(receiver, ('{"resourceSpans": [{"scopeSpans": [{"spans": [' + few + ']}]}]}').encode(),
                 otlp.JSON) == 400
    assert "more than 4096 spans in one body" in receiver.refused()[1] and receiver.spans() == []


def test_a_span_keeps_the_sdks_attribute_limit() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(name="x")
    for n in range(1000):
        span.attributes.add(key=f"k{n}").value.int_value = n
    values = span.attributes.add(key="list").value.array_value.values
    for n in range(1000):
        values.add().int_value = n
    (flat,) = otlp.flatten(request, 1, 0.0)
    assert len(flat.attributes) == otlp.MAX_ATTRIBUTES and "list" not in flat.attributes
    del span.attributes[:990]
    (flat,) = otlp.flatten(request, 1, 0.0)
    assert len(flat.attributes["list"]) == otlp.MAX_VALUE_ITEMS


def _tiny_body(n: int) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "%032x" % 1, "spanId": "%016x" % (n * 10 + k), "name": f"s{n}"} for k in range(2)]}]}]}).encode()


def test_a_call_keeps_at_most_its_limits_and_counts_the_rest() -> None:
    """18,630 small bodies had become 18,630 files: a receiver keeps Limits.bodies bodies and Limits.spans spans;
    the rest are refused (413) and counted, the first REFUSED_LINES kept as lines."""
    limits = otlp.Limits(bodies=5, spans=8, bytes=1 << 20)
    with otlp.Receiver("127.0.0.1", 0, lambda: 0.0, limits) as receiver:
        statuses = [_post(receiver, _tiny_body(n), otlp.JSON) for n in range(30)]
        block = otlp.summary("127.0.0.1:1", receiver, None)
    assert statuses == [200] * 4 + [413] * 26  # the 5th body's 2 spans would be 10 > 8
    assert block["bodies"] == 4 and block["spans"] == 8 and block["received"] == 30
    assert block["refused_bodies"] == 26 and len(block["refused"]) == otlp.REFUSED_LINES
    assert "2 more spans would be over the 8 kept in this call" in block["refused"][0]
    assert block["refused"][0].startswith("body 5: ") and len(block["files"]) == 4
    limits = otlp.Limits(bodies=3, spans=100, bytes=1 << 20)
    with otlp.Receiver("127.0.0.1", 0, lambda: 0.0, limits) as receiver:
        statuses = [_post(receiver, _tiny_body(n), otlp.JSON) for n in range(6)]
        assert statuses == [200] * 3 + [413] * 3
        assert receiver.refused()[0] == "body 4: 3 bodies kept already: no more in this call"


def test_an_empty_export_is_a_body_kept_and_listed(receiver: otlp.Receiver) -> None:
    """A 0-byte protobuf body is an empty ExportTraceServiceRequest (200): kept and listed as a file like any
    other, so otlp.bodies is what files lists (check_files' relation); it was counted but not listed."""
    assert _post(receiver, b"", otlp.PROTOBUF) == 200
    block = otlp.summary("127.0.0.1:1", receiver, None)
    assert block["bodies"] == 1 == len(block["files"]) and block["spans"] == 0 and block["files"] == ["0001.bin"]
