"""The pipecat agent's spans carry their call's streamSid (``voice_llm.call.stream_sid``), as the built-in agent's do,
so `load --dial --otlp-listen` can attribute the spans of many concurrent calls to their calls.

Fast: the span processor the pipecat agent adds to pipecat's tracer provider (pipecat_agent.call_tagger) on the
OpenTelemetry SDK alone, with spans shaped as pipecat 1.14 makes them (a ``conversation`` root per call, ``turn``
children, ``stt``/``llm``/``tts`` under a turn), from two calls whose tasks interleave on one event loop, as two
WebSockets do on one agent. The real pipeline's spans are asserted in test_pipecat_agent_real.py (slow).
"""

from __future__ import annotations

import asyncio
import threading

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from voice_llm.capabilities.agent import pipecat_agent
from voice_llm.capabilities.agent.otel import STREAM_SID


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    provider.add_span_processor(pipecat_agent.call_tagger())  # after the exporter's, as _setup_tracing adds it
    return provider, exported


def test_every_span_of_two_interleaved_calls_carries_its_own_stream_sid() -> None:
    provider, exported = _provider()
    tracer = provider.get_tracer("pipecat")
    threaded: dict[str, object] = {}

    async def call(sid: str) -> None:
        pipecat_agent.CALL_SID.set(sid)  # what app_for's call() does in its WebSocket's task
        conversation = tracer.start_span("conversation")
        conversation.set_attribute("conversation.id", f"CA-{sid}")
        under_conversation = trace.set_span_in_context(conversation)
        for number in (1, 2):
            turn = tracer.start_span("turn", context=under_conversation)
            await asyncio.sleep(0)  # the other call runs between here and its services' spans
            under_turn = trace.set_span_in_context(turn)

            async def service(name: str) -> None:  # a task the pipeline starts: it inherits the call's context
                with tracer.start_as_current_span(name, context=under_turn):
                    await asyncio.sleep(0)

            await asyncio.gather(*(asyncio.create_task(service(n)) for n in ("stt", "llm", "tts")))
            if number == 2:
                # work handed to a plain thread: no context of the call there, only the trace it belongs to
                def in_thread() -> None:
                    with tracer.start_as_current_span("tts_thread", context=under_turn) as span:
                        threaded[sid] = span
                worker = threading.Thread(target=in_thread)
                worker.start()
                worker.join()
            turn.end()
        conversation.end()

    async def both() -> None:
        await asyncio.gather(call("MZ-one"), call("MZ-two"))

    asyncio.run(both())
    # a span outside any call (the engines warmed up at start) names no call
    tracer.start_span("warm-up").end()
    spans = exported.get_finished_spans()
    by_trace: dict[int, set[object]] = {}
    for span in spans:
        by_trace.setdefault(span.context.trace_id, set()).add(span.attributes.get(STREAM_SID))
    calls = [sids for sids in by_trace.values() if sids != {None}]
    assert sorted(next(iter(s)) for s in calls) == ["MZ-one", "MZ-two"]
    assert all(len(sids) == 1 for sids in calls), by_trace  # no span of one call's trace names the other call
    named = [s for s in spans if s.name != "warm-up"]
    assert len(named) == 2 * (1 + 2 * 4) + 2 and all(s.attributes.get(STREAM_SID) for s in named)
    assert sorted(s.attributes[STREAM_SID] for s in named if s.name == "tts_thread") == ["MZ-one", "MZ-two"]
    (warm,) = [s for s in spans if s.name == "warm-up"]
    assert STREAM_SID not in (warm.attributes or {})


def test_a_calls_trace_is_forgotten_when_its_conversation_ends() -> None:
    exported, tagger = InMemorySpanExporter(), pipecat_agent.call_tagger()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    provider.add_span_processor(tagger)
    tracer = provider.get_tracer("pipecat")
    token = pipecat_agent.CALL_SID.set("MZ-once")
    try:
        conversation = tracer.start_span("conversation")
    finally:
        pipecat_agent.CALL_SID.reset(token)
    assert list(tagger._by_trace.values()) == ["MZ-once"]
    late = tracer.start_span("turn", context=trace.set_span_in_context(conversation))  # no call context: the trace's
    late.end()
    conversation.end()
    assert tagger._by_trace == {}  # an agent serving calls for hours keeps no map of ended calls
    assert [s.attributes.get(STREAM_SID) for s in exported.get_finished_spans()] == ["MZ-once", "MZ-once"]
