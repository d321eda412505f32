"""The built-in voice agent served over the line: one websockets (asyncio) server, one :class:`Call` per connection.

Per call its own VAD, endpointer and history; the engines (Whisper, Piper) are loaded and warmed once at start and
shared, each behind a lock. Inbound audio (Twilio: 8 kHz mu-law ``media``; PCM: binary 16-bit frames at the line's
rate) is resampled to 16 kHz, cut into Silero's 512-sample frames and fed through the VAD and the endpointer
(voice_llm.engines.speech_in.vad). At the endpoint a turn thread transcribes the utterance (STT lock), streams the reply from
the LLM server through the one reader (voice_llm.core.sse via voice_llm.core.client: cache_prompt on, the call's history) and
speaks it with speech out's stoppable pipeline (clauses); each piece of audio is resampled to the line's rate and sent in
20 ms frames: on a Twilio line at once (the caller's playout paces it; a ``clear`` stops it), with a ``mark`` after
each spoken segment; on a PCM line, which has neither marks nor clear, at most PCM_LEAD_S ahead of real time.

Rules, in one place (moved from converse's call.py, adapted to a line):
- A VAD speech start while the reply's audio may still be playing at the caller (a mark not yet echoed, a PCM
  line's estimated end not reached, or the reply still being made after its first audio) is a barge-in: ``clear``
  is sent (Twilio), no more audio is sent, the LLM stream is closed (sse.StreamCancel), synthesis stopped; the
  history keeps only what was heard (voice_llm.capabilities.agent.heard).
- A speech start after an endpoint whose reply has sent no audio yet means the caller went on: that reply is dropped
  and the utterance continues in the same buffer, so the next endpoint transcribes all of it.
- ``--preemptive`` (issue 28 item 3; implies ``--speculative-stt``): when the speculative transcript is ready before
  the endpoint, the reply is started from it (the LLM stream and the synthesis of its first clause) but every byte of
  its audio is held on the agent (nothing is sent on the line). The endpoint confirms it: the held audio goes out at
  once and the reply goes on as any turn's. A speech start (RESUMED, SPEECH_START) before the endpoint drops it: the
  stream is closed (the server stops generating), synthesis stopped, the held audio thrown away, the history gets
  nothing of it. What it cost is counted (tokens streamed and synthesis time of the dropped replies). It starts only
  when the transcript ends a sentence (not on "to."; voice_llm.capabilities.agent.preemptive) and the LLM server
  has two idle slots (its /slots): a dropped request holds llama-server's slot until its first token or its next
  1 s poll and the batch under way, and the endpoint's own request must never wait behind it. What each gate kept
  from starting is counted too.
- ``--prefill-ahead`` (the default; implies ``--speculative-stt``): when no preemptive reply starts from a ready
  speculative transcript (a gate, or ``--no-preemptive``), the conversation with it as the caller's turn is sent for
  one token, never closed early, with an idle slot on /slots and one per call at a time: the server's slot then holds
  the turn's prompt, and the endpoint's request for the same messages prefills one token (Call._prefill_ahead).
- Anything on the line that is not the protocol (not JSON, a payload that is not base64, a wrong codec, media
  before start) ends that call with one line in the agent's log; the agent goes on serving.

The per-turn breakdown is on the agent's clock (perf_counter): vad_speech_end (the first silent frame processed),
endpoint, stt_start, stt_end, request_sent, first_token, first_segment_text, first_audio_ready, first_audio_sent;
the reported latency is first_audio_sent - vad_speech_end. Its parts are the critical path after the endpoint: each
stage's share that lies after the endpoint (a stage a speculative decode or a preemptive reply did before it is
off that path), so they add up to the reported latency whichever mode ran.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.metadata
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice_llm.capabilities.agent import preemptive
from voice_llm.capabilities.agent import turn as turnmod
from voice_llm.capabilities.agent.echo import DEFAULT_WINDOW_S, EchoGate
from voice_llm.capabilities.agent.audio import Framer
from voice_llm.engines.audio.resampling import Resampler
from voice_llm.capabilities.agent.heard import SentSegment, heard_prefix, played_s, playing_until, words_heard
from voice_llm.capabilities.agent.otel import STREAM_SID, Clock, SpanExport
from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.core.client.api import ServerClient
from voice_llm.core.client.capabilities import model_ids
from voice_llm.core.errors import VoiceLLMError
from voice_llm.engines.line import wire
from voice_llm.core.scenario.dialogue import load_dialogue, system_prompt
from voice_llm.core.scenario.kb import default_kb_dir, load_kb
from voice_llm.engines.speech_in import vad as vadmod
from voice_llm.engines.speech_in.caller_audio import FRAME_SAMPLES, SAMPLE_RATE
from voice_llm.engines.speech_in import moonshine
from voice_llm.engines.speech_in.stt import Transcriber, default_threads, load_transcriber
from voice_llm.core.sse import Chunk, StreamCancel, StreamError, StreamResult
from voice_llm.engines.speech_out.engine import AudioChunk, TTSEngine
from voice_llm.engines.speech_out.engines import load_engine
from voice_llm.engines.speech_out.live import SpokenSegment, nothing_to_speak, speak_stoppable
from voice_llm.core.util.artifacts import write_bytes_atomic

PRE_ROLL_FRAMES = 5  # frames kept before the VAD's speech start (its onset lags the true start by 24-110 ms)
MAX_UTTERANCE_FRAMES = int(30 * SAMPLE_RATE / FRAME_SAMPLES)  # Whisper's window
NO_STT_TEXT = "(the caller spoke; --stt none: no transcript)"
CLOSE_BAD_DATA = 1007  # RFC 6455 7.4.1: data inconsistent with the message type
CLOSE_TRY_AGAIN = 1013  # "try again later" (IANA WebSocket close code registry)
CLOSE_GOING_AWAY = 1001
# A call whose line has closed is still hanging up (its turns cancelled and joined, its spans exported) for a moment:
# a caller connecting then waits up to this long for its slot instead of being refused 1013 (issue 41 item 16: a
# caller reconnecting within ~50 ms of a 1007 close was told "at its limit"). Long enough for a hang-up on a busy
# 2-core machine (joining a turn thread mid-request), short against a WebSocket client's own open timeout.
HANG_UP_WAIT_S = 3.0
# A PCM line has no clear: the agent sends its audio at most this far ahead of the caller's (estimated) playout, so
# a barge-in is heard stopping within it. Twilio lines get audio as fast as it is made, and a clear.
PCM_LEAD_S = 0.1
SOUND_FLOOR = 100  # speech.caller.FLOOR_MIN: a sample above it is sound (-50.3 dBFS)
LEAD_KEEP_MS = 10
# A Twilio mark not echoed this long after its audio should have played (by the agent's estimate) is taken as lost.
MARK_SLACK_S = 1.0
JOIN_S = 30.0  # the longest a turn thread is waited for at hang-up (an STT decode cannot be stopped)
EXECUTOR_THREADS = 2
# --turn smart: the frames of the utterance handed to the model, enough for its window (the last 8 s)
SMART_WINDOW_FRAMES = -(-turnmod.MODEL_WINDOW_S * SAMPLE_RATE // FRAME_SAMPLES)

# /slots is asked at most this long before a preemptive reply starts (llama-server answers it from its HTTP thread
# while a slot decodes: measured on loopback beside a 1-slot A/B at load 4.9, median 7.8 ms, p90 44, max 54 ms, on
# the STT thread after the decode: on a turn's critical path only when its endpoint comes during the request); no
# answer within it gates that pause (the server is busy), a 404 or a document that is not a slots list all pauses.
SLOTS_CAP_S = 0.5


class AgentError(VoiceLLMError):
    """The agent cannot start (the port is taken, the LLM server does not answer, an engine does not load)."""


def log(line: str) -> None:
    """The agent's log: one line each, on stderr (stdout carries only the ready line)."""
    print(f"voice-llm agent: {line}", file=sys.stderr, flush=True)


# --- engines ---------------------------------------------------------------------------------------------------


class LockedTTS:
    """A TTS engine shared by every call: one synthesis at a time (the lock is held while a segment's pieces are
    made and released when the caller of ``synthesize`` closes the iterator or reaches its end)."""

    def __init__(self, engine: TTSEngine) -> None:
        self.engine = engine
        self.name, self.voice, self.sample_rate = engine.name, engine.voice, engine.sample_rate
        self.lock = threading.Lock()

    def synthesize(self, text: str) -> Any:
        with self.lock:
            yield from self.engine.synthesize(text)

    def versions(self) -> dict[str, str]:
        return self.engine.versions()


class LockedSTT:
    def __init__(self, stt: Transcriber) -> None:
        self.stt, self.name = stt, stt.name
        self.lock = threading.Lock()

    def transcribe(self, samples: np.ndarray, cancelled: Callable[[], bool] | None = None) -> str:
        """The transcript; with ``cancelled`` (a speculative decode) an engine that can stop between its decoder
        steps (Moonshine) gives up as soon as it turns true, and a decode still waiting for the lock never starts:
        a dropped speculation must not hold the STT while the committed decode waits for it. Such a decode's
        text is "" (nobody reads it: the speculation was dropped)."""
        with self.lock:
            if cancelled is not None and cancelled():
                return ""
            if cancelled is not None and isinstance(self.stt, moonshine.MoonshineTranscriber):
                try:
                    return self.stt.transcribe(samples, NO_STT_TEXT, cancelled)
                except moonshine.DecodeCancelled:
                    return ""
            return self.stt.transcribe(samples, NO_STT_TEXT)

    def info(self) -> dict[str, Any] | None:
        return self.stt.info()


@dataclass
class Engines:
    """What every call shares: STT, TTS (each behind its lock), how to make a call's own VAD, and the identity."""

    stt: LockedSTT
    tts: LockedTTS
    new_vad: Callable[[], Callable[[bytes], float]]
    engines: dict[str, Any]
    versions: dict[str, str]
    smart: turnmod.SmartTurnModel | None = None  # --turn smart: pipecat's smart-turn model, shared by every call


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_engines(settings: AgentSettings) -> Engines:
    """Silero (one per call; one made here for its identity), Whisper and Piper, each loaded and warmed up once;
    with --turn smart pipecat's smart-turn model first (a missing extra is one line before anything else loads)."""
    smart = turnmod.SmartTurnModel() if settings.turn == turnmod.SMART else None
    vad = vadmod.SileroVAD()
    vad(bytes(FRAME_SAMPLES * 2))  # warm
    stt = load_transcriber(settings.stt, settings.stt_threads or default_threads(settings.stt),
                           settings.stt_window_s)
    tts = load_engine(settings.speech.engine, settings.speech.voice, settings.deadline_s, settings.tts_threads)
    session = getattr(getattr(tts, "_voice", None), "session", None)
    tts_threads = session.get_session_options().intra_op_num_threads if session is not None else None
    engines = {"vad": vad.info(), "stt": stt.info(),
               "tts": {"engine": tts.name, "voice": tts.voice, "versions": tts.versions(), "threads": tts_threads,
                       "threads_note": "onnxruntime's intra-op threads; 0 is its default, one per physical core"}}
    versions = {"pipecat-ai": smart.version, "onnxruntime": _version("onnxruntime") or ""} if smart else {}
    return Engines(LockedSTT(stt), LockedTTS(tts), vadmod.SileroVAD, engines, versions, smart)


def identity_versions() -> dict[str, str | None]:
    return {p: _version(p) for p in ("voice-llm", "websockets", "numpy", "av", "opentelemetry-sdk",
                                     "opentelemetry-exporter-otlp-proto-http")}


# --- one turn --------------------------------------------------------------------------------------------------


@dataclass
class SegmentSent:
    """One spoken segment as it left (agent clock, perf_counter s)."""

    index: int  # the reply's segment (SpokenSegment.index) whose audio this is
    mark: str
    first_sent: float
    samples: int = 0
    echoed: float | None = None


@dataclass
class Speculation:
    """The caller's utterance transcribed from the VAD's speech end, before the endpoint (``--speculative-stt``,
    issue 28 item 2): Whisper works while the endpointer waits out its silence. The endpoint commits the transcript
    (waiting for it if the decode is still running); a speech start before the endpoint drops it (the caller went
    on: the next speech end decodes the whole utterance again). Started and ended on the agent's clock."""

    frames: int  # the utterance's 32 ms frames when the decode was asked for
    future: Future[str] | None  # set as soon as the decode is handed to the STT thread
    asked: float  # the speech end's moment on the loop, when the decode was handed to the STT thread
    started: float | None = None
    ended: float | None = None
    dropped: bool = False  # speech resumed first: a Moonshine decode still running stops at its next token
    # --preemptive: why no reply may start from this transcript (a GATE_* reason), or None: it may; decided on the
    # STT thread right after the decode (agent.preemptive's gates), read on the loop by Call._preempt
    gate: str | None = None
    # llama-server's idle slots asked on the STT thread with the gate (None: not asked, no answer, or no slots list):
    # --prefill-ahead needs one
    idle: int | None = None


# Why a speculative transcript ready before the endpoint started no preemptive reply (agent.preemptive's gates)
GATE_TRANSCRIPT = "transcript"  # it does not look like a finished utterance (no sentence end, or "... to.")
GATE_SLOT = "slot"  # no spare llama-server slot (preemptive.MIN_IDLE_SLOTS idle), or no slots list at all
GATES = (GATE_TRANSCRIPT, GATE_SLOT)
GATE_WHY = {GATE_TRANSCRIPT: "the transcript does not end a sentence",
            GATE_SLOT: f"the LLM server has fewer than {preemptive.MIN_IDLE_SLOTS} idle slots, or lists none"}
PREEMPTIVE_KEYS = ("started", "used", "dropped", "tokens_wasted", "synthesis_ms_wasted",
                   *(f"gated_{gate}" for gate in GATES),
                   # --prefill-ahead: requests sent, and the prompt tokens llama-server prefilled for them (its
                   # timings.prompt_n; a server without timings adds none)
                   "prefilled_ahead", "prefill_ahead_tokens")


def no_preemption() -> dict[str, float]:
    """--preemptive's counts (all 0): replies started before the endpoint, used (the answered turn was one), dropped
    (speech resumed first), tokens streamed by the dropped ones, their synthesis time (ms, each segment's start to
    end on the synthesis thread), and the ready transcripts a gate kept from starting one (gated_<reason>); and
    --prefill-ahead's: its requests and the prompt tokens they prefilled."""
    return {key: 0 for key in PREEMPTIVE_KEYS}


PREEMPTIVE_ATTRIBUTE = "voice_llm.preemptive."


def preemptive_attributes(turn: dict[str, float], call: dict[str, float], used: bool) -> dict[str, Any]:
    """The turn span's --preemptive attributes: this turn's counts (since the turn before), whether its reply was
    one started before the endpoint, and the call's totals so far (``voice_llm.preemptive.call.<key>``)."""
    found: dict[str, Any] = {f"{PREEMPTIVE_ATTRIBUTE}{key}": value for key, value in turn.items()}
    found[f"{PREEMPTIVE_ATTRIBUTE}reply"] = used
    found.update({f"{PREEMPTIVE_ATTRIBUTE}call.{key}": value for key, value in call.items()})
    return found


@dataclass
class Turn:
    """One endpoint's answer: STT, the reply stream, its audio on the line. Its state changes only on the loop."""

    attempt: int
    samples: np.ndarray
    events: dict[str, float | None]
    number: int | None = None  # the call's answered turn number (1, 2, ...), given at its first audio
    state: str = "pending"  # pending -> speaking -> done; pending -> dropped; --preemptive: held -> pending | dropped
    stop: threading.Event = field(default_factory=threading.Event)
    cancel: StreamCancel = field(default_factory=StreamCancel)
    committed: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    thread_ended: bool = False
    transcript: str | None = None
    messages: list[dict[str, str]] | None = None
    result: StreamResult | None = None
    segments: tuple[SpokenSegment, ...] = ()
    error: str | None = None
    sent: list[SegmentSent] = field(default_factory=list)
    framer: Framer | None = None
    end_reason: str | None = None
    ended_at: float | None = None  # the invoke_agent span's end: audio played out, the barge-in, or the hang-up
    heard_text: str | None = None
    synthesis_end: float | None = None
    decision: turnmod.Decision | None = None  # what ended the caller's turn (--turn silence | smart)
    speculation: Speculation | None = None  # --speculative-stt: the transcript started at the speech end
    preemptive: bool = False  # --preemptive: started from the speculative transcript before the endpoint
    holding: bool = False  # --preemptive: its audio is kept here (nothing sent) until the endpoint confirms it
    held: list[tuple[Any, ...]] = field(default_factory=list)  # the outbound items kept while holding
    tokens: int = 0  # content chunks streamed so far
    unconfirmed: bool = False  # --preemptive: dropped before the endpoint (speech resumed): all of it was waste

    def breakdown(self) -> tuple[float | None, dict[str, float] | None]:
        """(reported latency ms, parts ms) from the events; None where an event is missing."""
        e = self.events
        names = ("vad_speech_end", "endpoint", "stt_start", "stt_end", "request_sent", "first_token",
                 "first_segment_text", "first_audio_ready", "first_audio_sent")
        if any(e.get(n) is None for n in names):
            return None, None

        endpoint = e["endpoint"]
        assert endpoint is not None

        def ms(a: str, b: str) -> float:
            # each stage's share after the endpoint: a plain turn's stages all lie after it (unchanged); a speculative
            # decode or a preemptive reply began before it, and only what is left of them then is on the turn's
            # critical path, so the parts add up to the reported latency in every mode (audio is never sent before
            # the endpoint)
            return round((max(e[b], endpoint) - max(e[a], endpoint)) * 1000.0, 1)  # type: ignore[type-var]

        stt = ms("stt_start", "stt_end")
        # endpoint -> STT start (the lock, the thread) and STT end -> request sent (history, body)
        handoff = round(ms("endpoint", "stt_start") + ms("stt_end", "request_sent"), 1)
        parts = {"endpoint_wait": round((endpoint - e["vad_speech_end"]) * 1000.0, 1), "stt": stt,  # type: ignore[operator]
                 "request_to_first_token": ms("request_sent", "first_token"),
                 "first_token_to_first_segment": ms("first_token", "first_segment_text"),
                 "segment_to_first_audio": ms("first_segment_text", "first_audio_ready"),
                 "audio_to_sent": ms("first_audio_ready", "first_audio_sent"), "handoff": handoff}
        return round((e["first_audio_sent"] - e["vad_speech_end"]) * 1000.0, 1), parts  # type: ignore[operator]


# --- one call --------------------------------------------------------------------------------------------------


class Call:
    """One connection: the receive loop, the sender, and the turns."""

    def __init__(self, agent: Agent, ws: Any, number: int) -> None:
        self.agent, self.ws, self.number = agent, ws, number
        self.settings = agent.settings
        self.line = agent.settings.line
        self.loop = asyncio.get_running_loop()
        self.vad = agent.engines.new_vad()
        self.turning = turnmod.TurnTaker(self.settings.turn, self.settings.endpoint_ms, self.settings.vad_threshold)
        self.checked_at: dict[int, tuple[float, float | None]] = {}  # smart: CHECK frame -> (asked, verdict) times
        self.inbound = Resampler(self.line.rate, SAMPLE_RATE)
        self.echo_gate = EchoGate(self.line.rate, self.settings.echo_gate_db)  # its own voice back is not the caller
        self.pending = np.zeros(0, np.int16)
        self.recent: collections.deque[np.ndarray] = collections.deque(maxlen=PRE_ROLL_FRAMES)
        self.utterance: list[np.ndarray] | None = None  # the frames of the utterance being collected
        self.last_speech_end: float | None = None
        self.speculation: Speculation | None = None  # --speculative-stt: the decode of the pause in progress
        self.speculations_dropped = 0  # decodes thrown away because the caller went on before the endpoint
        self.preempted = no_preemption()  # --preemptive: the call's counts
        self.preempted_turn = no_preemption()  # the same since the last committed turn (what its record says)
        self.prefilling: Future[None] | None = None  # --prefill-ahead: this call's request in flight
        self.turns: list[Turn] = []
        self.answered = 0
        self.history: list[dict[str, str]] = [{"role": "system", "content": agent.system}]
        self.outbound: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.stream_sid: str | None = None
        self.started = self.line.protocol == wire.PCM  # a PCM line has no start message
        self.closing: str | None = None
        self.hung_up = False
        # the receive loop is over (the caller hung up, or the agent is closing the line): no caller is on it, and
        # the call's slot is as good as free (Agent._wait_for_hang_ups), though its hang-up has not finished
        self.line_closed = False
        self.span: Any = None
        self.unknown_events: set[str] = set()
        self.marks: dict[str, tuple[Turn, int]] = {}
        self.timers: list[asyncio.TimerHandle] = []
        self.play_end = 0.0  # PCM: when the audio sent so far will have played at the caller (estimated)

    # -- receiving ------------------------------------------------------------------------------------------

    async def run(self) -> None:
        from websockets.exceptions import ConnectionClosed

        if self.agent.spans is not None:
            self.span = self.agent.spans.start_call(time.perf_counter(), {
                "voice_llm.call.number": self.number, "voice_llm.line.protocol": self.line.protocol})
        sender = asyncio.create_task(self._sender())
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    self._on_binary(message)
                else:
                    if self._on_text(message):
                        break
        except wire.LineError as exc:
            self.closing, self.line_closed = str(exc), True
            log(f"call {self.number}: {exc}; call closed")
            await self.ws.close(CLOSE_BAD_DATA, _reason(str(exc)))
        except ConnectionClosed:
            pass
        except Exception as exc:  # a fault of ours: this call ends with one line, the agent goes on serving
            self.line_closed = True
            log(f"call {self.number}: internal error {exc.__class__.__name__}: {str(exc)[:200]}; call closed")
            await self.ws.close(1011, "voice-llm agent: internal error")
        finally:
            self.line_closed = True
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            await self._hang_up()

    def _on_binary(self, data: bytes) -> None:
        if self.line.protocol != wire.PCM:
            raise wire.LineError(f"a binary frame of {len(data)} bytes on a Twilio line (Media Streams are JSON text)")
        self._on_audio(wire.decode(self.line, data))

    def _on_text(self, text: str) -> bool:
        """One text message; True at the caller's ``stop``."""
        message = wire.parse_message(text)
        event = message["event"]
        if event == "media" and self.line.protocol == wire.TWILIO:
            if not self.started:
                raise wire.LineError("a media message before start")
            self._on_audio(wire.decode(self.line, wire.payload_of(message)))
        elif event == "start":
            self._on_start(message)
        elif event == "mark":
            self._on_mark(wire.mark_name(message))
        elif event == "stop":
            return True
        elif event not in ("connected", "dtmf") and event not in self.unknown_events:
            self.unknown_events.add(event)  # Twilio may add events: said once, not fatal
            log(f"call {self.number}: ignored an unknown event {event[:40]!r}")
        return False

    def _on_start(self, message: dict[str, Any]) -> None:
        if self.line.protocol != wire.TWILIO:
            return
        start = message.get("start") if isinstance(message.get("start"), dict) else {}
        sid = message.get("streamSid") or start.get("streamSid")
        if not isinstance(sid, str) or not sid:
            raise wire.LineError("a start message without a streamSid")
        fmt = start.get("mediaFormat") if isinstance(start.get("mediaFormat"), dict) else {}
        encoding, rate = fmt.get("encoding", wire.TWILIO_ENCODING), fmt.get("sampleRate", wire.TWILIO_RATE)
        # A value of the wrong JSON type is refused naming the type: a "8000" (a string) was refused as "announces
        # 8000 Hz; this agent takes 8000 Hz", which contradicts itself. Refused, not read as a number: Twilio sends
        # a number there, and a caller that does not is not speaking Twilio's protocol.
        for key, value, wanted in (("encoding", encoding, wire.TWILIO_ENCODING),
                                   ("sampleRate", rate, wire.TWILIO_RATE)):
            if _json_type(value) != _json_type(wanted):
                raise wire.LineError(f"start's mediaFormat.{key} is {_json_type(value)} ({json.dumps(value)[:20]}), "
                                     f"where Twilio sends {_json_type(wanted)} ({json.dumps(wanted)})")
        if encoding != wire.TWILIO_ENCODING or rate != wire.TWILIO_RATE:
            raise wire.LineError(f"start announces {str(encoding)[:30]!r} at {str(rate)[:10]} Hz; this agent's "
                                 f"Twilio line takes {wire.TWILIO_ENCODING} at {wire.TWILIO_RATE} Hz (a wrong codec)")
        self.stream_sid, self.started = sid, True
        if self.span is not None:  # the call's id on its trace: a load run's one receiver tells its calls apart by it
            self.span.set_attribute(STREAM_SID, sid)

    def _on_audio(self, samples: np.ndarray) -> None:
        data = self.inbound.push(samples)
        self.pending = np.concatenate([self.pending, data]) if len(self.pending) else data
        while len(self.pending) >= FRAME_SAMPLES:
            frame, self.pending = self.pending[:FRAME_SAMPLES], self.pending[FRAME_SAMPLES:]
            self._on_frame(frame)

    def _on_frame(self, frame: np.ndarray) -> None:
        probability = self.vad(frame.astype("<i2").tobytes())
        now = time.perf_counter()
        if probability >= self.settings.vad_threshold and self.echo_gate.is_echo(frame, now):
            probability = 0.0  # speech no louder than an echo of what the caller just heard (agent.echo)
        events = self.turning.push(probability)
        if self.utterance is not None and len(self.utterance) < MAX_UTTERANCE_FRAMES:
            self.utterance.append(frame)
        self.recent.append(frame)
        for event in events:
            self._on_event(event, now)

    def _on_event(self, event: vadmod.Event, now: float) -> None:
        if event.kind in (vadmod.SPEECH_START, vadmod.RESUMED) and self.speculation is not None:
            # the caller went on inside the pause (RESUMED) or after an endpoint: that decode ends before the words
            self.speculation.dropped = True
            self.speculation = None
            self.speculations_dropped += 1
        if event.kind in (vadmod.SPEECH_START, vadmod.RESUMED) and self.turns and self.turns[-1].state == "held":
            self._drop_preemptive(self.turns[-1])  # before the endpoint: the caller was not done
        if event.kind == vadmod.SPEECH_START:
            merge = False
            last = self.turns[-1] if self.turns else None
            if last is not None and last.state == "pending":
                self._drop(last)  # no audio of it sent yet: the caller went on; the same utterance continues
                log(f"call {self.number}: turn attempt {last.attempt} dropped, the caller went on "
                    f"({_decided(last.decision)})")
                merge = self.utterance is not None
            elif last is not None and last.state == "speaking":
                if self._playing(last, now):
                    self._barge_in(last, now)
                else:
                    self._complete(last, now)
            if not merge:
                self.utterance = list(self.recent)
        elif event.kind == vadmod.SPEECH_END:
            self.last_speech_end = now
            self.checked_at = {}
            if self.agent.speculating is not None and self.utterance:
                self._speculate()
        elif event.kind == turnmod.CHECK and self.utterance:
            self._check(event.frame, now)
        elif event.kind == vadmod.ENDPOINT and self.utterance:
            self._start_turn(now)

    def _check(self, frame: int, now: float) -> None:
        """--turn smart: the model on the utterance so far, on its own thread; the verdict comes back to the loop."""
        judge = self.agent.engines.smart
        assert judge is not None and self.agent.judging is not None and self.utterance is not None
        samples = np.concatenate(self.utterance[-SMART_WINDOW_FRAMES:])
        self.checked_at[frame] = (now, None)
        future = self.agent.judging.submit(judge.judge, samples)

        def done(f: Any) -> None:
            try:
                verdict = f.result()
            except Exception as exc:  # the model failing: as incomplete (the fallback silence ends the turn)
                log(f"call {self.number}: smart turn failed: {exc.__class__.__name__}: {str(exc)[:200]}")
                verdict = None
            try:
                self.loop.call_soon_threadsafe(self._on_verdict, frame, verdict)
            except RuntimeError:
                pass  # the loop is closed: the agent stopped, nobody waits for this verdict
        future.add_done_callback(done)

    def _speculate(self) -> None:
        """--speculative-stt: the utterance so far (its speech ends here) decoded on the agent's STT thread."""
        assert self.agent.speculating is not None and self.utterance is not None
        samples = np.concatenate(self.utterance)
        stt = self.agent.engines.stt
        speculation = Speculation(len(self.utterance), None, time.perf_counter())

        def decode() -> str:
            speculation.started = time.perf_counter()  # before the STT lock, as a plain turn's stt_start is
            try:
                text = stt.transcribe(samples, lambda: speculation.dropped)
            finally:
                speculation.ended = time.perf_counter()
            # only a pause still in progress (the endpoint or the caller's words have not come first) is gated
            if self._ahead and not speculation.dropped and speculation is self.speculation:
                # here, off the loop: the server's slots, asked only when a start could follow
                if self.settings.prefill_ahead or preemptive.looks_finished(text):
                    speculation.idle = self.agent.idle_slots()
                speculation.gate = self.agent.preemptive_gate(text, speculation.idle)
            return text
        self.speculation = speculation  # before the decode can end: its gate asks whether it is still the pause's
        speculation.future = self.agent.speculating.submit(decode)
        if self._ahead:
            def ready(_future: Any) -> None:
                try:
                    self.loop.call_soon_threadsafe(self._preempt, speculation)
                except RuntimeError:
                    pass  # the loop is closed: the agent stopped
            speculation.future.add_done_callback(ready)

    @property
    def _ahead(self) -> bool:
        """Whether a ready speculative transcript may start anything before the endpoint (Call._preempt)."""
        return bool(self.settings.preemptive or self.settings.prefill_ahead)

    def _preempt(self, speculation: Speculation) -> None:
        """--preemptive: the speculative transcript is ready. Still before the endpoint (the speculation is the pause
        in progress), the reply starts from it, held: its audio stays here until the endpoint confirms it. When no
        reply may start (a gate, or --no-preemptive), --prefill-ahead prefills the turn instead (_prefill_ahead)."""
        if speculation is not self.speculation or self.closing is not None or self.hung_up or not self.utterance:
            return  # the endpoint came first (its turn waits for this decode), or the caller went on, or hung up
        assert speculation.future is not None
        if speculation.future.exception() is not None:
            return  # the endpoint's turn says the error
        if self.turns and self.turns[-1].state in ("held", "pending", "speaking"):
            return  # a reply still in the making or playing: one turn at a time (the endpoint decides)
        if not self.settings.preemptive or speculation.gate is not None:
            if self.settings.preemptive and speculation.gate is not None:
                self._count(f"gated_{speculation.gate}", 1)
                if self.agent.slots_listed is not False:  # a server with no slots list was said once (idle_slots)
                    log(f"call {self.number}: no preemptive reply from this pause ({GATE_WHY[speculation.gate]})")
            if self.settings.prefill_ahead:
                self._prefill_ahead(speculation)
            return
        turn = Turn(attempt=len(self.turns) + 1, samples=np.concatenate(self.utterance[:speculation.frames]),
                    events={"vad_speech_end": self.last_speech_end, "endpoint": None}, state="held",
                    speculation=speculation, preemptive=True, holding=True)
        self._count("started", 1)
        self._launch(turn)

    def _prefill_ahead(self, speculation: Speculation) -> None:
        """--prefill-ahead: the conversation with the speculative transcript as the caller's turn, sent for one token
        on its own thread, so the server's slot holds that prompt when the endpoint's request comes (its prefix
        is the same when the caller was done). Never closed early: a request closed in its prefill holds
        llama-server's slot until the server notices (agent.preemptive's MIN_IDLE_SLOTS); this one only prefills the
        caller's turn and stops, and a caller who goes on makes the endpoint wait out another silence. Sent only
        with an idle slot (it must not queue behind other calls' requests), when the history is final (the turn
        before committed), and one at a time per call."""
        assert speculation.future is not None
        transcript = speculation.future.result()
        if not transcript.strip() or speculation.idle is None or speculation.idle < 1:
            return
        if any(turn.state != "dropped" and not turn.committed.is_set() for turn in self.turns):
            return  # the history is not final: a prompt with it would not be the endpoint's
        if self.prefilling is not None and not self.prefilling.done():
            return  # the one before still runs; the endpoint's request shares its prefix
        messages = [*self.history, {"role": "user", "content": transcript}]
        self._count("prefilled_ahead", 1)

        def prefilled(tokens: int) -> None:
            try:
                self.loop.call_soon_threadsafe(self._count, "prefill_ahead_tokens", tokens)
            except RuntimeError:
                pass  # the loop is closed: the agent stopped, the call's counts are written
        self.prefilling = self.agent.prefill_ahead(messages, prefilled)

    def _drop_preemptive(self, turn: Turn) -> None:
        """Speech before the endpoint: the held reply goes (stream closed, synthesis stopped), its audio unsent."""
        self._drop(turn)
        turn.unconfirmed = True
        ended = any(item[0] == "end" for item in turn.held)
        turn.held.clear()
        if ended:  # its thread was already over (the whole reply made, held): its end is handled as any dropped turn's
            self.outbound.put_nowait(("end", turn))
        self._count("dropped", 1)
        log(f"call {self.number}: preemptive reply (attempt {turn.attempt}) dropped: the caller went on before the "
            f"endpoint; nothing of it was sent")

    def _count(self, key: str, value: float) -> None:
        self.preempted[key] += value
        self.preempted_turn[key] += value

    def _on_verdict(self, frame: int, verdict: turnmod.Verdict | None) -> None:
        now = time.perf_counter()
        if frame in self.checked_at:
            self.checked_at[frame] = (self.checked_at[frame][0], now)
        if self.closing is not None or self.hung_up:
            return  # the call is over: a verdict starts no turn
        for event in self.turning.verdict(frame, verdict):
            self._on_event(event, now)

    # -- turns ----------------------------------------------------------------------------------------------

    def _start_turn(self, now: float) -> None:
        assert self.utterance is not None
        decision = self.turning.decision
        events: dict[str, float | None] = {"vad_speech_end": self.last_speech_end, "endpoint": now}
        if decision is not None and decision.check_frame in self.checked_at:
            # the model's run that decided (or that said incomplete before the fallback): asked, and answered
            events["smart_turn_check"], events["smart_turn_verdict"] = self.checked_at[decision.check_frame]
        held = self.turns[-1] if self.turns and self.turns[-1].state == "held" else None
        if held is not None and held.speculation is self.speculation:
            # --preemptive, confirmed: the held reply is this turn's (its transcript is the one the endpoint commits);
            # the sender lets its held audio out at once, in order, then the rest as it comes
            held.events.update(events)
            held.decision, held.state = decision, "pending"
            self.speculation = None
            self.outbound.put_nowait(("release", held))
            return
        turn = Turn(attempt=len(self.turns) + 1, samples=np.concatenate(self.utterance), events=events,
                    decision=decision, speculation=self.speculation)
        self.speculation = None
        self._launch(turn)

    def _launch(self, turn: Turn) -> None:
        turn.framer = Framer(self.line.frame_samples)
        previous = [t for t in self.turns if t.state != "dropped"]
        self.turns.append(turn)
        turn.thread = threading.Thread(target=self._run_turn, args=(turn, previous[-1] if previous else None),
                                       name=f"agent-call{self.number}-turn{turn.attempt}", daemon=True)
        turn.thread.start()

    def _run_turn(self, turn: Turn, previous: Turn | None) -> None:
        """The turn thread: STT, then the reply streamed and spoken. Its audio goes to the loop as it is made."""
        try:
            if turn.speculation is not None:  # decoded from the speech end: wait for what is left of it
                assert turn.speculation.future is not None
                transcript = turn.speculation.future.result()
                turn.events["stt_start"], turn.events["stt_end"] = turn.speculation.started, turn.speculation.ended
            else:
                turn.events["stt_start"] = time.perf_counter()
                transcript = self.agent.engines.stt.transcribe(turn.samples)
                turn.events["stt_end"] = time.perf_counter()
            turn.transcript = transcript
            if turn.stop.is_set():
                return
            if previous is not None:
                previous.committed.wait(JOIN_S)  # its heard text is in the history by then
            turn.messages = [*self.history, {"role": "user", "content": transcript}]
            self._speak(turn)
        except (StreamError, VoiceLLMError, OSError) as exc:
            turn.error = f"{exc.__class__.__name__}: {str(exc)[:300]}"
        except Exception as exc:  # an engine failing mid-call: this turn is lost, the call and the agent go on
            turn.error = f"{exc.__class__.__name__}: {str(exc)[:300]}"
        finally:
            self.loop.call_soon_threadsafe(self.outbound.put_nowait, ("end", turn))

    def _speak(self, turn: Turn) -> None:
        settings, client = self.settings, self.agent.client
        assert turn.messages is not None

        def request(on_chunk: Callable[[Chunk], None]) -> StreamResult:
            def seen(chunk: Chunk) -> None:
                turn.tokens += 1
                if turn.events.get("first_token") is None:
                    turn.events["first_token"] = time.perf_counter()
                on_chunk(chunk)
            turn.events["request_sent"] = time.perf_counter()
            return client.chat(turn.messages, settings.max_tokens, True, model=self.agent.model, on_chunk=seen,
                               include_usage=settings.include_usage,
                               should_stop=lambda _chunk: turn.stop.is_set(), cancel=turn.cancel)

        def on_audio(index: int, chunk: AudioChunk) -> None:
            pcm = np.frombuffer(chunk.pcm, "<i2")
            if turn.events.get("first_audio_ready") is None:
                turn.events["first_audio_ready"] = chunk.ready_at
                pcm = trim_lead(pcm, self.agent.engines.tts.sample_rate)
            # Each piece on its own (flushed): a filter's tail never crosses into the next segment, after its mark.
            # Piper's pieces are sentences that begin and end in silence, so nothing is heard at the seams.
            resampler = Resampler(self.agent.engines.tts.sample_rate, self.line.rate)
            samples = np.concatenate([resampler.push(pcm), resampler.flush()])
            self.loop.call_soon_threadsafe(self.outbound.put_nowait, ("audio", turn, index, samples))
        tts: Any = self.agent.engines.tts  # a LockedTTS: the TTSEngine protocol, behind the shared lock
        result, segments = speak_stoppable(tts, settings.strategy, request, turn.stop, settings.speech.clause_words, on_audio)
        turn.result, turn.segments = result, segments
        turn.synthesis_end = time.perf_counter()
        if not turn.stop.is_set() and not any(s.audio for s in segments):
            # no sound to send: the turn is dropped (nobody heard it), and the log says why in the speak step's
            # words (an empty server reply is not the engine's failure; moved from converse's interrupt.py)
            turn.error = str(nothing_to_speak(tts, result.text, "reply"))
        if result.started_at is not None:  # the reader's own stamps: one clock for the stream's events
            turn.events["request_sent"] = result.started_at
            if result.chunks:
                turn.events["first_token"] = result.started_at + result.chunks[0].t_ms / 1000.0
            if segments:
                turn.events["first_segment_text"] = result.started_at + segments[0].text_ready_ms / 1000.0

    def _playing(self, turn: Turn, now: float) -> bool:
        """Whether the caller may still hear ``turn``'s reply at ``now``."""
        if not turn.thread_ended:
            return True  # more audio may come
        end = playing_until(self._sent(turn))
        if self.line.protocol == wire.TWILIO and any(s.echoed is None for s in turn.sent):
            # a mark not echoed yet: still playing, unless its audio should have played long ago (a caller that
            # echoes no marks would otherwise have every next line taken for a barge-in)
            return end is None or now < end + MARK_SLACK_S
        return end is not None and end > now

    def _sent(self, turn: Turn) -> list[SentSegment]:
        rate = self.line.rate
        echo = self.line.protocol == wire.TWILIO
        return [SentSegment(s.first_sent, s.samples / rate, s.echoed if echo else None) for s in turn.sent]

    def _drop(self, turn: Turn) -> None:
        turn.state = "dropped"
        turn.stop.set()
        turn.cancel.cancel()
        turn.committed.set()

    def _barge_in(self, turn: Turn, now: float) -> None:
        turn.stop.set()
        turn.cancel.cancel()
        if self.line.protocol == wire.TWILIO:
            self._send_now(wire.clear(self.stream_sid or ""))
            self.echo_gate.cleared(now)
        # A PCM line has no clear (binary audio only): its audio is paced PCM_LEAD_S ahead of the caller's
        # playout (see _frames), so the caller hears at most that much (and its jitter delay) after the stop.
        self._finish(turn, "interrupted", now)

    def _complete(self, turn: Turn, now: float) -> None:
        if turn.state != "speaking":
            return
        end = playing_until(self._sent(turn))
        self._finish(turn, "completed", min(now, end) if end is not None else now)

    def _finish(self, turn: Turn, reason: str, at: float) -> None:
        turn.state, turn.end_reason, turn.ended_at = "done", reason, at
        if turn.thread_ended:
            self._commit(turn)

    def _maybe_complete(self, turn: Turn) -> None:
        """A finished reply whose audio has all played (Twilio: every mark echoed; PCM: its estimated end)."""
        if turn.state != "speaking" or not turn.thread_ended:
            return
        if not turn.sent:
            self._finish(turn, "completed", time.perf_counter())
            return
        if self.line.protocol == wire.TWILIO:
            if all(s.echoed is not None for s in turn.sent):
                self._finish(turn, "completed", max(s.echoed for s in turn.sent if s.echoed is not None))
            return
        end = playing_until(self._sent(turn)) or time.perf_counter()
        delay = max(0.0, end - time.perf_counter())
        self.timers.append(self.loop.call_later(delay, self._complete, turn, end))

    def _commit(self, turn: Turn) -> None:
        """The turn is over and its thread has ended: what was heard goes into the history; its spans out."""
        if turn.committed.is_set():
            return
        text = turn.result.text if turn.result is not None else ""
        if turn.end_reason == "completed":
            heard = text
        else:
            played = played_s(self._sent(turn), turn.ended_at or time.perf_counter())
            rate = self.line.rate
            counts = []
            by_index = {s.index: (s, p) for s, p in zip(turn.sent, played)}
            for segment in turn.segments:
                sent, seconds = by_index.get(segment.index, (None, 0.0))
                total = sent.samples if sent is not None else 0
                counts.append(words_heard(segment.text, total, int(seconds * rate)))
            heard = heard_prefix(text, [s.text for s in turn.segments], counts)
        turn.heard_text = heard
        if turn.preemptive:
            self._count("used", 1)  # the answered turn was a reply started before its endpoint
        if turn.transcript is not None:
            self.history.append({"role": "user", "content": turn.transcript})
            if heard.strip():
                self.history.append({"role": "assistant", "content": heard.strip()})
        turn.committed.set()
        record = self._record(turn)
        self.preempted_turn = no_preemption()
        self.agent.records.append({"call": self.number, **record})
        reported = record["reported_ms"]
        parts = " ".join(f"{k} {v:.0f}" for k, v in (record["breakdown"] or {}).items())
        pre = record["preemptive"]
        said = (f"; preemptive: {'used' if turn.preemptive else 'not used'}, {pre['dropped']} dropped "
                f"({pre['tokens_wasted']} tokens, {pre['synthesis_ms_wasted']:.0f} ms of synthesis wasted)"
                if self.settings.preemptive else "")
        if self.settings.prefill_ahead:
            said += f"; prefilled ahead {pre['prefilled_ahead']}x ({pre['prefill_ahead_tokens']:.0f} prompt tokens)"
        log(f"call {self.number} turn {turn.number}: {turn.end_reason}; reported "
            f"{'-' if reported is None else f'{reported:.0f} ms'} ({parts}); {_decided(turn.decision)}; "
            f"heard {heard[:60]!r}{said}")
        if self.agent.spans is not None and self.span is not None:
            spans, span = self.agent.spans, self.span
            self.agent.exports.add(self.loop.run_in_executor(None, lambda: (spans.turn(span, record), spans.flush())))

    def _record(self, turn: Turn) -> dict[str, Any]:
        reported, parts = turn.breakdown()
        result = turn.result
        stream_end = None
        chat: dict[str, Any] = {}
        if result is not None and result.started_at is not None:
            stream_end = result.started_at + result.total_ms / 1000.0
            chat = {"gen_ai.usage.output_tokens": len(result.chunks), "voice_llm.closed_early": result.closed_early}
            if self.agent.model:
                chat["gen_ai.request.model"] = self.agent.model
        stt_info = self.agent.engines.stt.info() or {}
        return {"number": turn.number, "end_reason": turn.end_reason, "reported_ms": reported, "breakdown": parts,
                "events": dict(turn.events), "span_start": turn.events["vad_speech_end"] or turn.events["endpoint"],
                "span_end": turn.ended_at or time.perf_counter(), "stream_end": stream_end,
                "synthesis_end": turn.synthesis_end, "model": self.agent.model, "transcript": turn.transcript,
                "reply": result.text if result is not None else None, "heard": turn.heard_text,
                "chat_attributes": chat,
                "turn": turn.decision.as_dict() if turn.decision is not None else None,
                "turn_attributes": turn.decision.span_attributes() if turn.decision is not None else {},
                "stt": {"speculative": turn.speculation is not None,
                        "decode_ms": (round((turn.events["stt_end"] - turn.events["stt_start"]) * 1000.0, 1)
                                      if turn.events.get("stt_end") is not None
                                      and turn.events.get("stt_start") is not None else None),
                        "speculations_dropped": self.speculations_dropped,
                        "asked": turn.speculation.asked if turn.speculation is not None else None},
                "stt_attributes": {"gen_ai.request.model": stt_info.get("model", self.agent.engines.stt.name),
                                   "voice_llm.stt.speculative": turn.speculation is not None},
                "preemptive": {**self.preempted_turn, "reply": turn.preemptive, "on": self.settings.preemptive,
                               "call": dict(self.preempted)},
                "preemptive_attributes": (preemptive_attributes(self.preempted_turn, self.preempted, turn.preemptive)
                                          if self._ahead else {})}

    # -- sending --------------------------------------------------------------------------------------------

    def _send_now(self, message: str | bytes) -> None:
        self.loop.create_task(self._send(message))

    async def _send(self, message: str | bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(message)
        except ConnectionClosed:
            pass

    async def _sender(self) -> None:
        while True:
            await self._deliver(await self.outbound.get())

    async def _deliver(self, item: tuple[Any, ...]) -> None:
        kind, turn = item[0], item[1]
        if kind == "release":  # --preemptive: the endpoint confirmed the held reply
            turn.holding = False
            held, turn.held = turn.held, []
            for kept in held:
                await self._deliver(kept)
            return
        if turn.holding and turn.state != "dropped":
            turn.held.append(item)  # before the endpoint: nothing of a preemptive reply goes on the line
            return
        if kind == "end":
            turn.thread_ended = True
            await self._end_of_audio(turn)
            if turn.error is not None:
                log(f"call {self.number}: turn attempt {turn.attempt} failed: {turn.error}")
            if turn.state == "pending":  # it made no sound (an error, nothing to say): nobody heard it
                turn.state = "dropped"
                turn.committed.set()
            elif turn.state == "done":
                self._commit(turn)
            else:
                self._maybe_complete(turn)
            if turn.unconfirmed:
                # its thread is over: what the dropped reply streamed and synthesized is known now
                self._count("tokens_wasted", turn.tokens)
                self._count("synthesis_ms_wasted", round(sum(seg.synth_end_ms - seg.synth_start_ms
                                                                 for seg in turn.segments), 1))
            return
        _, _, index, samples = item
        if turn.state == "pending":
            if turn.stop.is_set():
                return
            turn.state = "speaking"
            self.answered += 1
            turn.number = self.answered
            self.utterance = None  # the caller's turn is answered: a new speech start is a new utterance
        if turn.state != "speaking":
            return  # dropped or stopped: its audio is never sent
        if turn.sent and index != turn.sent[-1].index:
            await self._close_segment(turn)
        if not turn.sent or index != turn.sent[-1].index:
            turn.sent.append(SegmentSent(index, f"t{turn.number}-s{index + 1}", 0.0))
        assert turn.framer is not None
        await self._frames(turn, turn.framer.push(samples))

    async def _frames(self, turn: Turn, frames: list[np.ndarray]) -> None:
        segment = turn.sent[-1]
        for frame in frames:
            if self.line.protocol == wire.PCM:
                ahead = self.play_end - time.perf_counter()
                if ahead > PCM_LEAD_S:
                    await asyncio.sleep(ahead - PCM_LEAD_S)
                    if turn.state != "speaking":
                        return  # stopped while it waited: the rest is never sent
                self.play_end = max(self.play_end, time.perf_counter()) + len(frame) / self.line.rate
            payload = wire.encode(self.line, frame)
            await self.ws.send(wire.agent_media(self.stream_sid or "", payload) if self.line.protocol == wire.TWILIO
                               else payload)
            now = time.perf_counter()
            self.echo_gate.sent(frame, now)
            if not segment.samples:
                segment.first_sent = now
            if turn.events.get("first_audio_sent") is None:
                turn.events["first_audio_sent"] = now
            segment.samples += len(frame)

    async def _close_segment(self, turn: Turn) -> None:
        """The last frame of the segment being sent (padded), then its mark (Twilio)."""
        assert turn.framer is not None
        await self._frames(turn, turn.framer.flush())
        segment = turn.sent[-1]
        if self.line.protocol == wire.TWILIO:
            self.marks[segment.mark] = (turn, len(turn.sent) - 1)
            await self.ws.send(wire.agent_mark(self.stream_sid or "", segment.mark))

    async def _end_of_audio(self, turn: Turn) -> None:
        if turn.state == "speaking" and turn.sent:
            await self._close_segment(turn)

    def _on_mark(self, name: str) -> None:
        found = self.marks.pop(name, None)
        if found is None:
            return  # not ours, or a mark echoed twice: nothing to learn from it
        turn, index = found
        if turn.state == "speaking":  # after a clear Twilio echoes the pending marks: those were not played
            turn.sent[index].echoed = time.perf_counter()
            self._maybe_complete(turn)

    # -- hang-up ------------------------------------------------------------------------------------------------

    async def _hang_up(self) -> None:
        self.hung_up = True
        now = time.perf_counter()
        for timer in self.timers:
            timer.cancel()
        for turn in self.turns:
            turn.stop.set()
            turn.cancel.cancel()
            if turn.state == "speaking":
                turn.state, turn.end_reason, turn.ended_at = "done", "session_closed", now
        threads = [t.thread for t in self.turns if t.thread is not None]
        await self.loop.run_in_executor(None, _join, threads)
        for turn in self.turns:
            turn.thread_ended = True
            if turn.state == "done":
                self._commit(turn)
            turn.committed.set()
        if self.agent.spans is not None and self.span is not None:
            spans, span = self.agent.spans, self.span
            if self.settings.preemptive:  # the call's totals, dropped replies after the last answered turn included
                for key, value in self.preempted.items():
                    span.set_attribute(f"{PREEMPTIVE_ATTRIBUTE}call.{key}", value)
            await asyncio.gather(*self.agent.exports, return_exceptions=True)
            await self.loop.run_in_executor(None, lambda: (spans.end_call(span, time.perf_counter()), spans.flush()))


def _decided(decision: turnmod.Decision | None) -> str:
    """The log's words for what ended the caller's turn."""
    if decision is None:
        return "turn -"
    said = f"turn {decision.mode} {decision.rule} after {decision.silence_ms:.0f} ms of silence"
    if decision.verdict is not None:
        said += f" (P(complete) {decision.verdict.probability:.2f}, inference {decision.verdict.inference_ms:.0f} ms)"
    return said


def trim_lead(samples: np.ndarray, rate: int) -> np.ndarray:
    """A reply's first piece without its lead-in silence (Piper starts each sentence with 46-61 ms of it, measured
    here), keeping LEAD_KEEP_MS before the first sample above the floor: the caller hears the reply that much sooner.
    Only the reply's first piece: the pauses between sentences are speech."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > SOUND_FLOOR)
    if not loud.size:
        return samples
    return samples[max(0, int(loud[0]) - rate * LEAD_KEEP_MS // 1000):]


def _join(threads: list[threading.Thread]) -> None:
    deadline = time.monotonic() + JOIN_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _json_type(value: Any) -> str:
    """What a JSON value is, as a message says it."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "an array" if isinstance(value, list) else "an object"


def _reason(text: str) -> str:
    """A close reason fits in 123 bytes of UTF-8 (RFC 6455 5.5: a control frame's payload is at most 125)."""
    data = text.encode("utf-8")[:120]
    return data.decode("utf-8", "ignore")


# --- the agent ---------------------------------------------------------------------------------------------------


class Agent:
    """The server: the engines, the LLM client, the system prompt, the calls."""

    def __init__(self, settings: AgentSettings, engines: Engines) -> None:
        self.settings, self.engines = settings, engines
        self.client = ServerClient(settings.url, settings.api_key, settings.timeout, settings.deadline_s)
        dialogue = load_dialogue(settings.dialogue)
        docs = load_kb(settings.kb_dir or default_kb_dir(), need=settings.docs)[:settings.docs] if settings.docs else []
        self.system = system_prompt(dialogue, docs)
        self.model = settings.model
        self.clock = Clock()
        self.spans: SpanExport | None = None
        self.exports: set[asyncio.Future[Any]] = set()  # span exports running in the executor
        self.calls: dict[int, Call] = {}
        self.records: list[dict[str, Any]] = []  # every finished turn's record (its breakdown), in order
        self.count = 0
        self.refused = 0
        self.slot_freed = asyncio.Event()  # set each time a call has ended (its slot free): _wait_for_hang_ups
        self.primed_slots = 0  # the LLM server's slots holding the system prompt before the first call (_prime)
        self.slots_listed: bool | None = None  # --preemptive: whether the LLM server answers /slots (None: not asked)
        self.port: int | None = None
        # --turn smart: the model's one thread (one run at a time, as pipecat's analyzer has; shut down in close)
        self.judging: ThreadPoolExecutor | None = None
        # --speculative-stt: the decodes started at a speech end, one at a time (the STT lock serializes them anyway)
        self.speculating: ThreadPoolExecutor | None = None
        if settings.speculative_stt and settings.stt != "none":
            self.speculating = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-speculative-stt")
        # --prefill-ahead: its requests, one per call at a time (Call._prefill_ahead)
        self.prefilling: ThreadPoolExecutor | None = None
        if settings.prefill_ahead:
            self.prefilling = ThreadPoolExecutor(max_workers=settings.max_calls, thread_name_prefix="agent-prefill")
        if settings.turn == turnmod.SMART:
            if engines.smart is None:
                raise AgentError("--turn smart: no smart-turn model was loaded")
            self.judging = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-smart-turn")

    def idle_slots(self) -> int | None:
        """The LLM server's idle slots now (its /slots, read by agent.preemptive.idle_slots), or None: no answer in
        time (a busy server; asked again at the next pause) or no slots list. Runs on the STT thread. A server with
        no /slots list (not llama-server, or --no-slots) is asked once: nothing starts before the endpoint on it."""
        if self.slots_listed is False:
            return None
        try:
            status, doc = self.client.get_json("/slots", accept_status=(200, 404, 501), cap_s=SLOTS_CAP_S)
        except (StreamError, VoiceLLMError, ValueError):
            return None
        idle = preemptive.idle_slots(doc) if status == 200 else None
        if idle is None:
            self.slots_listed = False
            log("the LLM server lists no slots (/slots): no preemptive reply or prefill ahead starts on it")
        else:
            self.slots_listed = True
        return idle

    @staticmethod
    def preemptive_gate(transcript: str, idle: int | None) -> str | None:
        """--preemptive: why no reply may start from this speculative transcript (GATE_*), or None. The transcript's
        gate first (pure, agent.preemptive.looks_finished); then the server's idle slots (Agent.idle_slots;
        agent.preemptive.slots_allow: one idle slot for the guess and one left for the endpoint's request, which
        would otherwise wait behind a dropped guess llama-server has not let go of yet)."""
        if not preemptive.looks_finished(transcript):
            return GATE_TRANSCRIPT
        return None if preemptive.slots_allow(idle) else GATE_SLOT

    def prefill_ahead(self, messages: list[dict[str, str]], prefilled: Callable[[int], None]) -> Future[None]:
        """--prefill-ahead's request (Call._prefill_ahead) on its own thread: one token of ``messages``, the prompt
        kept in the server's cache; ``prefilled`` gets the prompt tokens the server says it computed (its
        timings.prompt_n). A failure is one log line: the endpoint's request says the server's state."""
        assert self.prefilling is not None

        def run() -> None:
            try:
                result = self.cache_prompt_of(messages)
            except (StreamError, VoiceLLMError, OSError) as exc:
                log(f"prefill ahead failed: {exc.__class__.__name__}: {str(exc)[:200]}")
                return
            tokens = (result.timings or {}).get("prompt_n")
            if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
                prefilled(tokens)
        return self.prefilling.submit(run)

    def prepare(self) -> None:
        """Before listening: the model name (when not given) and one request priming the system prompt's cache."""
        if self.model is None:
            try:
                _, doc = self.client.get_json("/v1/models")
                ids = model_ids(doc)
                self.model = ids[0] if ids else None
            except (StreamError, VoiceLLMError):
                self.model = None  # llama-server needs no name; a server that does will say so on the first turn
        if self.settings.prime:
            self.primed_slots = self._prime()
        if self.settings.otlp:
            self.spans = SpanExport(self.settings.otlp, self.clock,
                                    {"service.name": "voice-llm-agent", "service.version": _version("voice-llm") or "",
                                     "voice_llm.agent.engine": "builtin"})

    def _prime(self) -> int:
        """The system prompt's prefix computed once in every slot a call may land in, before the first call; how
        many slots were primed.

        Why every slot: a call's first turn on a slot that never held the system prompt prefills all of it (about
        1000 tokens with 4 KB documents: 4 s on an idle 2-core machine, 14 s under load). `load --dial` on a 4-slot
        server measured it as the worst turn at 2 callers (first token after 5491 ms, heard 6246 ms; BENCHMARKS.md
        "Speech-in rerun, one session"). One priming request fills one slot; llama-server's host-memory cache
        (--cache-ram) restores a prompt only once another slot's state was saved to it, so a fresh server's second
        slot stays cold (measured 2026-12-07 on a 2-slot server: the second of two concurrent calls prefilled 1003
        tokens after one prime; after a prime per slot both calls prefilled 11). llama-server says its slots in
        /props (total_slots) and takes a slot by ``id_slot``; a server that says none gets the one request of
        before, with no field it may not know. No more slots than calls served at once (--max-calls): a call takes
        the slot whose prompt is most like its own, so one call at a time stays on the primed slot."""
        try:
            slots = self.client.server_props(cap_s=5.0).total_slots
        except (StreamError, VoiceLLMError):
            slots = None
        messages = [{"role": "system", "content": self.system}, {"role": "user", "content": "Hello."}]
        targets: list[int | None] = list(range(min(slots, self.settings.max_calls))) if slots else [None]

        def prime(slot: int | None) -> None:
            self.cache_prompt_of(messages, slot)

        try:
            with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="agent-prime") as pool:
                list(pool.map(prime, targets))
        except StreamError as exc:
            raise AgentError(f"the LLM server at {self.settings.url} does not answer: {exc}") from exc
        return len(targets)

    def cache_prompt_of(self, messages: list[dict[str, str]], slot: int | None = None) -> StreamResult:
        """One token of ``messages`` with cache_prompt, so the server's slot (``slot``: llama-server's id_slot, or
        the one it picks) holds their prompt: the priming request (_prime) and a prefill ahead (prefill_ahead)."""
        return self.client.chat(messages, 1, True, model=self.model, include_usage=self.settings.include_usage,
                                extra={"id_slot": slot} if slot is not None else None)

    def ready(self) -> dict[str, Any]:
        s = self.settings
        return {"listen": f"ws://{s.host}:{self.port}/", "protocol": s.protocol, "rate": s.line.rate,
                "codec": s.line.codec, "engine": "builtin",
                "engines": {**self.engines.engines,
                            "stt": ({**self.engines.engines["stt"], "speculative": self.speculating is not None}
                                    if isinstance(self.engines.engines.get("stt"), dict)
                                    else self.engines.engines.get("stt")),
                            "llm": {"url": s.url, "model": self.model, "max_tokens": s.max_tokens,
                                    "cache_prompt": True, "primed_slots": self.primed_slots,
                                    "preemptive": self.speculating is not None and s.preemptive,
                                    "prefill_ahead": self.speculating is not None and bool(s.prefill_ahead)},
                            "turn": {**turnmod.describe(s.turn, s.endpoint_ms, self.engines.smart),
                                     "vad_threshold": s.vad_threshold, "strategy": s.strategy,
                                     "clause_words": s.speech.clause_words,
                                     "echo_gate": ({"margin_db": s.echo_gate_db, "window_ms": DEFAULT_WINDOW_S * 1000,
                                                    "rule": "a caller frame margin_db below the loudest audio the "
                                                            "caller heard in the window is its echo (not speech)"}
                                                   if s.echo_gate_db > 0 else None)}},
                "versions": {**identity_versions(), **self.engines.versions},
                "pacing": ("as synthesized; clear on a barge-in" if s.protocol == wire.TWILIO
                           else f"at most {PCM_LEAD_S * 1000:.0f} ms ahead of real time (a PCM line has no clear)"),
                "max_calls": s.max_calls, "otlp": s.otlp, "pid": os.getpid()}

    async def handle(self, ws: Any) -> None:
        await self._wait_for_hang_ups()
        if len(self.calls) >= self.settings.max_calls:
            self.refused += 1
            reason = f"voice-llm agent: at its limit of {self.settings.max_calls} call(s) (--max-calls)"
            log(f"refused a call: {len(self.calls)} in progress, --max-calls {self.settings.max_calls}")
            await ws.close(CLOSE_TRY_AGAIN, reason)
            return
        self.count += 1
        call = Call(self, ws, self.count)
        self.calls[call.number] = call
        log(f"call {call.number}: connected from {_peer(ws)}")
        try:
            await call.run()
        finally:
            self.calls.pop(call.number, None)
            self.slot_freed.set()
            log(f"call {call.number}: ended ({call.answered} turns answered)")

    async def _wait_for_hang_ups(self) -> None:
        """At the limit with a call whose line has closed (hanging up): wait for it to end, at most
        HANG_UP_WAIT_S; a limit held by calls still on their line is refused at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HANG_UP_WAIT_S
        while len(self.calls) >= self.settings.max_calls and any(c.line_closed for c in self.calls.values()):
            self.slot_freed.clear()
            try:
                await asyncio.wait_for(self.slot_freed.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return

    async def serve(self, stop: asyncio.Event, on_ready: Callable[[dict[str, Any]], None]) -> None:
        from websockets.asyncio.server import serve

        try:
            server = await serve(self.handle, self.settings.host, self.settings.port, max_size=wire.MAX_MESSAGE_BYTES,
                                 server_header=f"voice-llm-agent/{_version('voice-llm') or '0'}")
        except OSError as exc:
            raise AgentError(f"cannot listen on {self.settings.host}:{self.settings.port}: "
                             f"{exc.strerror or exc}") from exc
        self.port = server.sockets[0].getsockname()[1] if server.sockets else self.settings.port
        on_ready(self.ready())
        try:
            await stop.wait()
        finally:
            server.close(close_connections=False)
            for call in list(self.calls.values()):
                await call.ws.close(CLOSE_GOING_AWAY, "voice-llm agent: shutting down")
            await server.wait_closed()

    def close(self) -> None:
        """After the last call: every span exported and the exporter's thread joined."""
        if self.spans is not None:
            self.spans.shutdown()
        if self.judging is not None:
            self.judging.shutdown(wait=True, cancel_futures=True)
        if self.speculating is not None:
            self.speculating.shutdown(wait=True, cancel_futures=True)
        if self.prefilling is not None:  # a prefill ahead is one token: waited for, as the server will answer it
            self.prefilling.shutdown(wait=True, cancel_futures=True)


def _peer(ws: Any) -> str:
    address = getattr(ws, "remote_address", None)
    return f"{address[0]}:{address[1]}" if address else "?"


def write_ready(settings: AgentSettings, doc: dict[str, Any]) -> None:
    line = json.dumps(doc, separators=(",", ":"))
    if settings.ready_file is not None:
        write_bytes_atomic(settings.ready_file, (line + "\n").encode("utf-8"))
    print(line, flush=True)


async def run_agent(agent: Agent, stop: asyncio.Event, on_ready: Callable[[dict[str, Any]], None]) -> None:
    """Prepare, serve until ``stop`` is set, then every call closed, every span exported and the exporter closed."""
    loop = asyncio.get_running_loop()
    # A bounded pool of its own for the blocking work (priming, joining turn threads, exporting spans): the idle
    # threads it keeps are at most these, and asyncio.run joins them at the end.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=EXECUTOR_THREADS, thread_name_prefix="agent-io"))
    try:
        await loop.run_in_executor(None, agent.prepare)
        await agent.serve(stop, on_ready)
    finally:
        await asyncio.gather(*agent.exports, return_exceptions=True)
        await loop.run_in_executor(None, agent.close)


async def _main(settings: AgentSettings, engines: Engines) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run_agent(Agent(settings, engines), stop, lambda doc: write_ready(settings, doc))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def serve(settings: AgentSettings) -> int:
    """`voice-llm agent --engine builtin`: load the engines, listen, serve until SIGTERM/SIGINT; exit 0."""
    log(f"loading the engines (VAD, STT {settings.stt}, TTS {settings.speech.engine})")
    engines = load_engines(settings)
    try:
        asyncio.run(_main(settings, engines))
    finally:
        if settings.ready_file is not None:
            try:
                settings.ready_file.unlink()
            except OSError:
                pass
    log("stopped")
    return 0
