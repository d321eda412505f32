"""The agent's own numbers as OpenTelemetry spans (``--otlp http://HOST:PORT``; off unless given).

Shape: the GenAI semantic conventions' voice-agent draft (shared/notes/line.md): one trace per call, a root span
``voice_llm.call`` over the whole call, one ``invoke_agent`` span per turn (``gen_ai.operation.name=invoke_agent``,
``gen_ai.agent.invocation.end_reason`` completed | interrupted | session_closed) from the VAD's speech end to the
end of the reply's audio at the caller (its last mark echoed, the barge-in, or the hang-up), with children
``speech_to_text``, ``chat`` (the LLM request) and ``text_to_speech``. Ours on the turn span:
``voice_llm.turn.number``, ``voice_llm.latency.reported_ms`` (first audio sent - VAD speech end, what pipecat and
LiveKit report from their VAD's stop), ``voice_llm.breakdown.<part>_ms``, what ended the caller's turn
(``voice_llm.turn.mode`` silence | smart, ``voice_llm.turn.rule`` silence | model_complete | fallback_silence,
``voice_llm.turn.silence_ms``; with smart ``voice_llm.smart_turn.probability`` / ``.complete`` / ``.inference_ms`` /
``.checks``: voice_llm.capabilities.agent.turn), with ``--preemptive`` its counts (``voice_llm.preemptive.started`` / ``.used`` /
``.dropped`` / ``.tokens_wasted`` / ``.synthesis_ms_wasted`` / ``.reply``, and the call's totals so far as
``voice_llm.preemptive.call.<count>``; the call span gets the totals at hang-up), and each event as a span event at its time. The draft has no attribute for perceived latency: that is the caller's to measure.

Spans are made when a turn is over, with their real bounds (epoch ns: the agent's perf_counter readings converted
with one offset taken at start), exported by a BatchSpanProcessor over OTLP/HTTP protobuf, flushed at each turn's
end and at hang-up, and shut down (flushed, its thread joined) when the agent stops.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

from voice_llm.core.util.clocks import perf_and_epoch_ns

TRACES_PATH = "/v1/traces"
FLUSH_TIMEOUT_MS = 5000
# The Twilio streamSid of the call (from its `start`), on the call span and on each turn span: one OTLP receiver
# for many concurrent calls (`voice-llm load --dial URL --otlp-listen`) matches spans to calls by it.
STREAM_SID = "voice_llm.call.stream_sid"
MAX_EXPORT_LINES = 5  # an unreachable receiver is said a few times, not once per retry for the whole call


class _ExportLog(logging.Handler):
    """The SDK's export warnings (an unreachable receiver, a refused body) as the agent's own one-liners."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(logging.WARNING)
        self.endpoint, self.said = endpoint, 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.said < MAX_EXPORT_LINES:
            self.said += 1
            more = "" if self.said < MAX_EXPORT_LINES else " (no more of these)"
            print(f"voice-llm agent: spans to {self.endpoint}: {record.getMessage()[:240]}{more}", file=sys.stderr,
                  flush=True)


class Clock:
    """perf_counter seconds -> epoch ns, with one offset measured at start (no wall-clock jump mid-call)."""

    def __init__(self) -> None:
        perf, wall = perf_and_epoch_ns()  # one instant on both clocks (voice_llm.core.util.clocks)
        self.offset_ns = wall - int(perf * 1e9)

    def epoch_ns(self, perf_s: float) -> int:
        return int(perf_s * 1e9) + self.offset_ns


class SpanExport:
    """One tracer provider for the agent process, exporting to ``endpoint`` (http://HOST:PORT)."""

    def __init__(self, endpoint: str, clock: Clock, resource: Mapping[str, Any]) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.clock = clock
        self.endpoint = endpoint.rstrip("/") + TRACES_PATH
        self.provider = TracerProvider(resource=Resource.create(dict(resource)))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=self.endpoint, timeout=5)))
        self.tracer = self.provider.get_tracer("voice_llm.agent")  # the instrumentation scope: a name on the wire, kept as readers know it
        self._log = _ExportLog(self.endpoint)
        for name in ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.sdk._shared_internal",
                     "opentelemetry.sdk.trace.export"):
            logger = logging.getLogger(name)
            logger.addHandler(self._log)
            logger.propagate = False

    def start_call(self, at: float, attributes: Mapping[str, Any]) -> Any:
        return self.tracer.start_span("voice_llm.call", start_time=self.clock.epoch_ns(at),
                                      attributes=dict(attributes))

    def end_call(self, span: Any, at: float) -> None:
        span.end(end_time=self.clock.epoch_ns(at))

    def turn(self, call_span: Any, record: Mapping[str, Any]) -> None:
        """The spans of one finished turn (``record``: voice_llm.capabilities.agent.server.Turn.record())."""
        from opentelemetry import trace

        ns = self.clock.epoch_ns
        parent = trace.set_span_in_context(call_span)
        events = record["events"]
        start, end = record["span_start"], record["span_end"]
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "voice-llm",
                      "gen_ai.agent.invocation.end_reason": record["end_reason"],
                      "voice_llm.turn.number": record["number"]}
        sid = (getattr(call_span, "attributes", None) or {}).get(STREAM_SID)
        if sid:  # on each turn too: a turn's span is exported at its end, the call's only at hang-up
            attributes[STREAM_SID] = sid
        if record.get("model"):
            attributes["gen_ai.request.model"] = record["model"]
        attributes.update(record.get("turn_attributes") or {})  # what ended the caller's turn (agent.turn.Decision)
        attributes.update(record.get("preemptive_attributes") or {})  # --preemptive's counts (agent.server)
        if record["reported_ms"] is not None:
            attributes["voice_llm.latency.reported_ms"] = record["reported_ms"]
        for part, value in (record["breakdown"] or {}).items():
            attributes[f"voice_llm.breakdown.{part}_ms"] = value
        for key in ("transcript", "reply", "heard"):
            if record.get(key) is not None:
                attributes[f"voice_llm.{key}"] = record[key]
        span = self.tracer.start_span("invoke_agent", context=parent, start_time=ns(start), attributes=attributes)
        for name, at in events.items():
            if at is not None:
                span.add_event(name, timestamp=ns(at))
        child = trace.set_span_in_context(span)
        for name, (lo, hi), extra in (
            ("speech_to_text", (events.get("stt_start"), events.get("stt_end")), record.get("stt_attributes") or {}),
            ("chat", (events.get("request_sent"), record.get("stream_end")), record.get("chat_attributes") or {}),
            ("text_to_speech", (events.get("first_segment_text"), record.get("synthesis_end")), {}),
        ):
            if lo is None or hi is None:
                continue
            self.tracer.start_span(name, context=child, start_time=ns(lo),
                                   attributes={"gen_ai.operation.name": name, **extra}).end(end_time=ns(max(lo, hi)))
        span.end(end_time=ns(max(start, end)))

    def flush(self) -> bool:
        return bool(self.provider.force_flush(FLUSH_TIMEOUT_MS))

    def shutdown(self) -> None:
        self.provider.shutdown()
        for name in ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.sdk._shared_internal",
                     "opentelemetry.sdk.trace.export"):
            logging.getLogger(name).removeHandler(self._log)
