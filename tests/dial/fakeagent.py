"""A fake voice agent on a real websockets server (no speech engines): it hears the caller's frames, answers each
caller line a known delay after the last loud frame it received with a known burst (a square wave, every sample
loud, sent all at once in 10 ms chunks), sends a mark after each burst, and clears when the caller talks while its
audio may still be playing (a mark not yet echoed). It logs what it did on its own clock, so a test compares what
the dialer heard with what the agent really did (its actual delay, not the intended one, on a loaded machine).

Misbehaviours for the failure paths: ``mode`` = "silent" (never answers), "close" (hangs up after ``close_after``
frames), "flood" (answers with ``flood_s`` of audio at once), "garbage" (a text frame that is not JSON),
"bad_base64" (a media payload that is not base64), "odd_pcm" (a PCM frame of an odd byte count), "binary" (a binary
frame on a Twilio line), "self_clear" (clears its own reply ``self_clear_ms`` after sending it, the caller
silent: a false barge-in), "pause" (sends each reply in two halves, the second ``pause_ms`` after the first half
has played: a reply that stops and resumes without caller speech), "gap_inside" (a ``pause_ms`` silence inside the
reply's audio, all sent at once: a pause, not a stop), "mark_halves" (a mark after each half of the reply, both
sent at once: two marks pending together, of the same name when the reply's mark is reused), "huge" (one text
message of ``huge_bytes`` after the reply's audio: over the dialer's message cap), "mark_flood" / "empty_flood" /
"byte_flood" (after the reply, ``flood_messages`` marks, empty media messages or 1-byte media messages as fast as
the line takes them: issue 41 item 12's floods), "slow_marks" (a mark every ``mark_every_ms`` for the rest of the
call, under the 1 s window's bound but over the call's allowance).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice_llm.engines.line import wire
from voice_llm.core.util.clocks import epoch_ns_of

LOUD = 500  # a caller frame is speech when its peak is above this (the caller's tones are at 8000)


def _b64(payload: bytes) -> str:
    return base64.b64encode(payload).decode("ascii")


# The agent's side of each phone bridge, written by hand from the providers' documents (not through
# voice_llm.engines.line's framings, which this agent holds to known truth): its media, mark and clear messages, where the
# caller's start names the stream, and how the caller's side echoes a mark (issue 40 item 5).
# Telnyx: https://developers.telnyx.com/docs/voice/programmable-voice/media-streaming
# Plivo: https://www.plivo.com/docs/voice/xml/the-stream-element
# Exotel: https://support.exotel.com/support/solutions/articles/3000108630
# Vonage: https://developer.vonage.com/en/voice/voice-api/concepts/websockets
BRIDGE_SIDES = {
    "telnyx": {"media": lambda sid, p: json.dumps({"event": "media", "media": {"payload": _b64(p)}}),
               "mark": lambda sid, n: json.dumps({"event": "mark", "mark": {"name": n}}),
               "clear": lambda sid: json.dumps({"event": "clear"}),
               "sid": lambda m: m["stream_id"], "echo": ("mark", lambda m: m["mark"]["name"])},
    "plivo": {"media": lambda sid, p: json.dumps({"event": "playAudio", "media": {
                  "contentType": "audio/x-mulaw", "sampleRate": 8000, "payload": _b64(p)}}),
              "mark": lambda sid, n: json.dumps({"event": "checkpoint", "streamId": sid, "name": n}),
              "clear": lambda sid: json.dumps({"event": "clearAudio", "streamId": sid}),
              "sid": lambda m: m["start"]["streamId"], "echo": ("playedStream", lambda m: m["name"])},
    "exotel": {"media": lambda sid, p: json.dumps({"event": "media", "stream_sid": sid, "media": {"payload": _b64(p)}}),
               "mark": lambda sid, n: json.dumps({"event": "mark", "stream_sid": sid, "mark": {"name": n}}),
               "clear": lambda sid: json.dumps({"event": "clear", "stream_sid": sid}),
               "sid": lambda m: m["start"]["stream_sid"], "echo": ("mark", lambda m: m["mark"]["name"])},
    "vonage": {"media": lambda sid, p: p,  # binary 16-bit PCM
               "mark": lambda sid, n: json.dumps({"action": "notify", "payload": {"name": n}}),
               "clear": lambda sid: json.dumps({"action": "clear"}),
               "sid": None, "echo": ("websocket:notify", lambda m: m["payload"]["name"])},
}


@dataclass(frozen=True)
class Reply:
    delay_ms: float
    burst_ms: float
    mark: str | None = None


@dataclass
class Sent:
    turn: int
    last_loud: float  # perf_counter of the arrival of the caller's last loud frame
    sent: float  # perf_counter when the burst's first message was sent
    messages: int

    @property
    def delay_ms(self) -> float:
        return (self.sent - self.last_loud) * 1000.0


def square(ms: float, rate: int, amplitude: int = 6000, hz: int = 400) -> np.ndarray:
    n = int(round(ms * rate / 1000))
    period = rate // hz
    return np.where((np.arange(n) // (period // 2)) % 2 == 0, amplitude, -amplitude).astype(np.int16)


@dataclass
class FakeAgent:
    replies: list[Reply]
    protocol: str = wire.TWILIO
    rate: int = wire.TWILIO_RATE
    mode: str = "normal"
    endpoint_ms: float = 40.0
    close_after: int = 20
    flood_s: float = 3.0
    sent: list[Sent] = field(default_factory=list)
    clears: list[float] = field(default_factory=list)  # perf_counter of each clear sent
    marks_back: list[str] = field(default_factory=list)
    received: list[str] = field(default_factory=list)  # the events of the caller's text messages, in order
    otlp: str | None = None  # http://HOST:PORT: each reply's invoke_agent span (its delay as the reported latency)
    # per turn (1-based), the reported latency to send instead of the delay: a foreign agent's bad number, as the
    # OTLP/JSON doubleValue it would write ("NaN", "Infinity", a negative number)
    reported: dict[int, float | str] = field(default_factory=dict)
    port: int = 0  # 0: a free one; a port given: the same URL as an earlier agent (a re-dial of "the same agent")
    codec: str = wire.PCM16  # a pcm line's codec
    loud: int = LOUD  # above this a caller frame is speech (raised for an echo the agent must not take as speech)
    self_clear_ms: float = 100.0
    pause_ms: float = 300.0
    huge_bytes: int = 50 << 20
    flood_messages: int = 200_000
    mark_every_ms: float = 4.0
    flood_sent: int = 0  # the flood's messages the line took before it closed
    media_numbers: list[tuple[int, int, int]] = field(default_factory=list)  # (sequenceNumber, chunk, timestamp)

    def __post_init__(self) -> None:
        pcm = self.protocol == wire.PCM
        self.line = wire.line_for(self.protocol, self.rate if pcm else None, self.codec if pcm else None)
        self.rate = self.line.rate
        self.side = BRIDGE_SIDES.get(self.protocol)  # None: Twilio (voice_llm.engines.line.wire's messages) or PCM
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server = None

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> FakeAgent:
        from websockets.asyncio.server import serve

        self._thread.start()

        async def start() -> None:
            self._server = await serve(self._handle, "127.0.0.1", self.port, compression=None, ping_interval=None,
                                       close_timeout=1)
            self.port = self._server.sockets[0].getsockname()[1]

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            task = getattr(self, "task", None)
            if task is not None:
                task.cancel()  # a flood still being sent to a caller that hung up
            self._server.close()
            try:
                await asyncio.wait_for(self._server.wait_closed(), 3)
            except asyncio.TimeoutError:
                pass
            await cancel_the_rest()

        stop_loop(self._loop, self._thread, stop())

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/stream"

    # --- one call ----------------------------------------------------------------------------------------------

    async def _handle(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        self.ws = ws
        self.sid = "MZfake"
        self.turn = 0
        self.speaking = False
        self.last_loud = 0.0
        self.pending_marks: set[str] = set()
        self.frames = 0
        self.task: asyncio.Task | None = None
        if self.mode == "refuse":
            await ws.close(1013, "fake agent: at its limit of 1 call(s)")
            return
        try:
            async for message in ws:
                await self._take(message)
        except ConnectionClosed:
            pass
        if self.task is not None:
            self.task.cancel()

    def _media(self, samples: np.ndarray) -> str | bytes:
        payload = wire.encode(self.line, samples)
        if self.side is not None:
            return self.side["media"](self.sid, payload)
        return wire.agent_media(self.sid, payload) if self.protocol == wire.TWILIO else payload

    async def _flood(self) -> None:
        tiny = {"mark_flood": lambda n: self._mark(f"f{n}"), "slow_marks": lambda n: self._mark(f"s{n}"),
                "empty_flood": lambda n: self._media(np.zeros(0, np.int16)),
                "byte_flood": lambda n: self._media(np.zeros(1, np.int16))}[self.mode]
        try:
            for number in range(self.flood_messages):
                await self.ws.send(tiny(number))
                self.flood_sent += 1
                if self.mode == "slow_marks":
                    await asyncio.sleep(self.mark_every_ms / 1000.0)
                elif number % 100 == 0:
                    await asyncio.sleep(0)
        except Exception:  # the dialer closed the line: the flood ends there
            return

    def _mark(self, name: str) -> str:
        return self.side["mark"](self.sid, name) if self.side is not None else wire.agent_mark(self.sid, name)

    def _clear(self) -> str:
        return self.side["clear"](self.sid) if self.side is not None else wire.clear(self.sid)

    @property
    def _has_marks(self) -> bool:
        return self.protocol != wire.PCM

    async def _take(self, message: str | bytes) -> None:
        now = time.perf_counter()
        if isinstance(message, str):
            parsed = json.loads(message)
            event = parsed["event"]
            self.received.append(event)
            if event == "start":
                self.sid = parsed["streamSid"] if self.side is None else self.side["sid"](parsed)
                return
            echo, name_of = self.side["echo"] if self.side is not None else ("mark", lambda m: m["mark"]["name"])
            if event == echo:
                name = name_of(parsed)
                self.marks_back.append(name)
                self.pending_marks.discard(name)
                return
            if event != "media":
                return
            samples = wire.decode(self.line, base64.b64decode(parsed["media"]["payload"]))
            if self.protocol == wire.TWILIO:
                self.media_numbers.append((int(parsed["sequenceNumber"]), int(parsed["media"]["chunk"]),
                                           int(parsed["media"]["timestamp"])))
        else:
            samples = wire.decode(self.line, message)
        self.frames += 1
        if self.mode == "close" and self.frames >= self.close_after:
            await self.ws.close(1000, "bye")
            return
        loud = int(np.abs(samples.astype(np.int32)).max()) > self.loud
        if loud and not self.speaking and self.pending_marks and self._has_marks:
            # the caller talks over audio that may still be playing: clear it (barge-in)
            await self.ws.send(self._clear())
            self.clears.append(time.perf_counter())
            self.pending_marks.clear()
        take_turns(self, now, loud)

    def _export(self, turn: int, start: float, end: float) -> None:
        assert self.otlp is not None
        _post(self.otlp, span_body(turn, start, end, self.reported.get(turn)))

    async def _reply(self, turn: int, last_loud: float) -> None:
        reply = self.replies[min(turn, len(self.replies)) - 1]
        wait = last_loud + reply.delay_ms / 1000.0 - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        sent = time.perf_counter()
        if self.mode == "garbage":
            await self.ws.send("{this is not json")
            return
        if self.mode == "bad_base64":
            await self.ws.send(json.dumps({"event": "media", "streamSid": self.sid, "media": {"payload": "%%%"}}))
            return
        if self.mode == "odd_pcm":
            await self.ws.send(b"\x01\x02\x03")
            return
        if self.mode == "binary":
            await self.ws.send(b"\x00" * 160)
            return
        burst_ms = self.flood_s * 1000.0 if self.mode == "flood" else reply.burst_ms
        chunk = self.line.rate // 100  # 10 ms
        audio = square(burst_ms, self.rate)
        if self.mode == "gap_inside":  # a pause inside the audio sent (digital silence), all sent at once
            half = square(burst_ms / 2, self.rate)
            audio = np.concatenate([half, np.zeros(int(self.pause_ms * self.rate / 1000), np.int16), half])
        pieces = [audio[i:i + chunk] for i in range(0, len(audio), chunk)]
        if self.mode == "pause":  # the first half at once; the second pause_ms after the first has played
            half = len(pieces) // 2
            for piece in pieces[:half]:
                await self.ws.send(self._media(piece))
            await asyncio.sleep((half * 10.0 + self.pause_ms) / 1000.0)
            pieces = pieces[half:]
        for number, piece in enumerate(pieces, 1):
            await self.ws.send(self._media(piece))
            if self.mode == "mark_halves" and number == len(pieces) // 2 and reply.mark:
                self.pending_marks.add(reply.mark)
                await self.ws.send(self._mark(reply.mark))
        self.sent.append(Sent(turn, last_loud, sent, len(pieces)))
        if self.mode == "huge":
            await self.ws.send(" " * self.huge_bytes)
            return
        if self.mode in ("mark_flood", "empty_flood", "byte_flood", "slow_marks"):
            await self._flood()
            return
        if self.otlp is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._export, turn, last_loud, sent)
        if reply.mark and self._has_marks:
            self.pending_marks.add(reply.mark)
            await self.ws.send(self._mark(reply.mark))
        if self.mode == "self_clear" and turn == 1:  # the agent cuts its own reply: no caller speech caused it
            await asyncio.sleep(self.self_clear_ms / 1000.0)
            await self.ws.send(self._clear())
            self.clears.append(time.perf_counter())
            self.pending_marks.clear()


def take_turns(agent: Any, now: float, loud: bool) -> None:
    """A fake agent's turn-taking on one caller frame heard at ``now``: the caller speaking cancels a reply still
    being made; ``endpoint_ms`` after its last loud frame the turn is the agent's, and it replies (``_reply``)."""
    if loud:
        if not agent.speaking and agent.task is not None and not agent.task.done():
            agent.task.cancel()
        agent.speaking = True
        agent.last_loud = now
    elif agent.speaking and (now - agent.last_loud) * 1000.0 >= agent.endpoint_ms:
        agent.speaking = False
        agent.turn += 1
        if agent.mode != "silent":
            agent.task = asyncio.ensure_future(agent._reply(agent.turn, agent.last_loud))


async def cancel_the_rest() -> None:
    """Every other task of the running loop ended, not left pending (a handler still sending to a caller that left)."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for other in others:
        other.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread, stopping: object, timeout_s: float = 5) -> None:
    """Run ``stopping`` (a coroutine) on a fake agent's loop in its thread, then stop and close both."""
    asyncio.run_coroutine_threadsafe(stopping, loop).result(timeout_s)  # type: ignore[arg-type]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _epoch_ns(perf: float) -> int:
    return epoch_ns_of(perf)  # the dialer's own pairing of the two clocks (voice_llm.core.util.clocks)


def span_body(turn: int, start: float, end: float, reported: float | str | None = None) -> bytes:
    """One OTLP/JSON ExportTraceServiceRequest with voice-llm's agent span for ``turn`` (ids in hex, as OTLP/JSON);
    ``reported``: the latency it states, else the span's length."""
    latency = (end - start) * 1000.0 if reported is None else reported
    span = {"traceId": "%032x" % 1, "spanId": "%016x" % turn, "name": "invoke_agent",
            "startTimeUnixNano": str(_epoch_ns(start)), "endTimeUnixNano": str(_epoch_ns(end)),
            "attributes": [{"key": "voice_llm.latency.reported_ms", "value": {"doubleValue": latency}},
                           {"key": "voice_llm.turn.number", "value": {"intValue": str(turn)}}]}
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                          "scopeSpans": [{"spans": [span]}]}]}).encode()


def _post(url: str, body: bytes) -> None:
    import urllib.request

    request = urllib.request.Request(url + "/v1/traces", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        answer.read()

