"""What the agent's tests share: the agent served in-process on a free port (its asyncio loop in a thread, stopped
and joined when the block ends), fake engines for protocol tests (a VAD that hears any frame louder than a floor,
a TTS that makes a tone as long as its text), a few-line caller, and a tiny OTLP/HTTP collector.

The fakes stand in only where a test is about the line (marks, clear, refusals, bad input), never about speech."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice_llm.capabilities.agent.server import Agent, Engines, LockedSTT, LockedTTS, run_agent
from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.engines.line import wire
from voice_llm.engines.speech_in.stt import ScriptTranscriber
from voice_llm.engines.speech_out.engine import AudioChunk

TONE_RATE = 16000
MS_PER_CHAR = 20  # the fake TTS: 20 ms of tone per character of its text


class LoudVAD:
    """Speech when the frame's peak is above 1000: the caller's test tone is speech, its zeros silence."""

    def __call__(self, frame: bytes) -> float:
        samples = np.frombuffer(frame, "<i2")
        return 1.0 if len(samples) and int(np.abs(samples.astype(np.int32)).max()) > 1000 else 0.0


class ToneTTS:
    """A TTS that says every text as a tone, MS_PER_CHAR per character, in one piece (as Piper yields a sentence)."""

    name = "tone"
    voice = "tone"
    sample_rate = TONE_RATE

    def __init__(self, delay_s: float = 0.0, lead_ms: int = 0) -> None:
        self.delay_s, self.lead_ms = delay_s, lead_ms
        self.texts: list[str] = []

    def synthesize(self, text: str) -> Iterator[AudioChunk]:
        self.texts.append(text)
        if self.delay_s:
            time.sleep(self.delay_s)
        n = len(text) * MS_PER_CHAR * TONE_RATE // 1000
        tone = (np.sin(np.arange(n) * 2 * np.pi * 440 / TONE_RATE) * 8000).astype("<i2")
        tone = np.concatenate([np.zeros(self.lead_ms * TONE_RATE // 1000, "<i2"), tone])  # as Piper's lead-in
        yield AudioChunk(tone.tobytes(), time.perf_counter())

    def versions(self) -> dict[str, str]:
        return {"tone": "1"}


def fake_engines(tts: ToneTTS | None = None) -> Engines:
    return Engines(LockedSTT(ScriptTranscriber()), LockedTTS(tts or ToneTTS()), LoudVAD,
                   {"vad": {"fake": "loud"}, "stt": None, "tts": {"engine": "tone"}}, {})


def settings(llm_url: str, **changes: Any) -> AgentSettings:
    # built whole (not dataclasses.replace on a built one): preemptive's default is worked out from the other fields
    # in __post_init__, so a replaced speculative_stt=False must not inherit a resolved preemptive=True
    # prefill ahead is off unless a test asks for it: its one-token requests would take the scripted replies
    base: dict[str, Any] = {"port": 0, "url": llm_url, "model": "fake", "prime": False, "docs": 0,
                            "prefill_ahead": False}
    return AgentSettings(**{**base, **changes})


@dataclass
class Served:
    agent: Agent
    ready: dict[str, Any]
    url: str


@contextmanager
def serving(agent_settings: AgentSettings, engines: Engines | None = None) -> Iterator[Served]:
    """The agent on its own loop thread; on exit it is stopped (SIGTERM's path: calls closed, spans flushed) and
    no thread of its is left."""
    agent = Agent(agent_settings, engines or fake_engines())
    loop = asyncio.new_event_loop()
    box: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> None:
        box["stop"] = asyncio.Event()

        def on_ready(doc: dict[str, Any]) -> None:
            box["ready"] = doc
            started.set()
        try:
            await run_agent(agent, box["stop"], on_ready)
        except BaseException as exc:  # raised again in the test's thread
            box["error"] = exc
            started.set()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), name="test-agent-loop", daemon=True)
    thread.start()
    assert started.wait(10), "the agent did not start"
    if "error" in box:
        thread.join(5)
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        raise box["error"]
    try:
        yield Served(agent, box["ready"], box["ready"]["listen"])
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(30)
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        assert not thread.is_alive()


def agent_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("agent-", "tts-synthesis"))]


# --- a caller in a few lines ---------------------------------------------------------------------------------------


def dial(url: str) -> Any:
    """A websockets client that buffers everything the agent sends (max_queue None): a test that stops reading does
    not hold the agent's frames, and the close handshake behind them, in the socket."""
    from websockets.sync.client import connect

    return connect(url, max_queue=None, close_timeout=5)


SID = "MZtest"


def speech(ms: int, rate: int = wire.TWILIO_RATE) -> np.ndarray:
    n = rate * ms // 1000
    return (np.sin(np.arange(n) * 2 * np.pi * 300 / rate) * 10000).astype(np.int16)


def silence(ms: int, rate: int = wire.TWILIO_RATE) -> np.ndarray:
    return np.zeros(rate * ms // 1000, np.int16)


class TwilioCaller:
    """Twilio's side of Media Streams, sent as fast as the test likes (the agent keeps no wall-clock pace)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.seq = 0
        self.chunk = 0
        self.received: list[dict[str, Any]] = []

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def begin(self) -> None:
        self.ws.send(wire.connected())
        self.ws.send(wire.start(self._next(), SID, "CAtest", "ACtest"))

    def say(self, samples: np.ndarray) -> None:
        line = wire.twilio_line()
        for frame in wire.frames(samples, line.frame_samples):
            self.chunk += 1
            self.ws.send(wire.caller_media(self._next(), SID, self.chunk, (self.chunk - 1) * 20, wire.encode(line, frame)))

    def echo(self, name: str) -> None:
        self.ws.send(wire.mark_played(self._next(), SID, name))

    def hang_up(self) -> None:
        self.ws.send(wire.stop(self._next(), SID, "CAtest", "ACtest"))

    def receive(self, timeout: float = 5.0) -> dict[str, Any]:
        message = json.loads(self.ws.recv(timeout=timeout))
        self.received.append(message)
        return message

    def until(self, event: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            message = self.receive(max(0.01, deadline - time.monotonic()))
            if message["event"] == event:
                return message

    def audio_ms(self) -> float:
        samples = sum(len(base64.b64decode(m["media"]["payload"])) for m in self.received if m["event"] == "media")
        return samples * 1000.0 / wire.TWILIO_RATE


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


# --- a tiny OTLP/HTTP collector ----------------------------------------------------------------------------------


@dataclass
class Collector:
    bodies: list[bytes] = field(default_factory=list)
    server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def spans(self) -> list[dict[str, Any]]:
        """Every span received: name, ids, bounds (epoch ns), attributes as plain values, events by name."""
        return decode_spans(self.bodies)


def decode_spans(bodies: Iterable[bytes]) -> list[dict[str, Any]]:
    """Every span of these OTLP/HTTP protobuf bodies (as the collector received them, or as dial keeps them in
    dial/otlp/NNNN.bin): name, ids, bounds (epoch ns), attributes as plain values, events by name (epoch ns)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = []
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attributes = {}
                    for kv in span.attributes:
                        value = kv.value
                        attributes[kv.key] = getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
                    out.append({"name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(), "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano, "attributes": attributes,
                                "events": {e.name: e.time_unix_nano for e in span.events}})
    return out


@contextmanager
def collector() -> Iterator[Collector]:
    found = Collector()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf":
                found.bodies.append(body)
                self.send_response(200)
            else:
                self.send_response(400)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

    found.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=found.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        found.server.shutdown()
        found.server.server_close()
        thread.join(5)


def play_out(served: Any, caller: TwilioCaller, records: int) -> None:
    """Echo every mark (the caller played the audio) until ``records`` turns are committed."""
    deadline = time.monotonic() + 10
    while len(served.agent.records) < records:
        assert time.monotonic() < deadline, "the turn was not committed"
        try:
            message = caller.receive(0.1)
        except TimeoutError:
            continue
        if message["event"] == "mark":
            caller.echo(message["mark"]["name"])
