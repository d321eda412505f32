"""A fake voice agent on WebRTC (aiortc, no speech engines), answering an SDP offer POSTed to /api/offer as
pipecat's SmallWebRTC does ({sdp, type: "offer", request_data} -> {sdp, type: "answer", pc_id}): it hears the
caller's frames as decoded from the RTP that arrived, answers each caller line a known delay after the last loud
frame it received with a known burst (a square wave), and stops sending when the caller talks over it (WebRTC has
no clear: a barge-in is heard as silence once the audio stops). Its audio goes out paced in real time, 20 ms a
packet, as a WebRTC sender does; when it has nothing to say it sends silence (pipecat's ``auto_silence``), or
nothing at all (``mode="dtx"``). It logs what it did on its own clock (perf_counter: the dialer's, one process),
so a test compares what the dialer heard with what the agent really did.

Written from the protocol and aiortc's API, not through voice_llm.capabilities.dial.webrtc (which this agent holds to known
truth). Like the dialer it passes each received packet to the decoder as it arrives (aiortc's own audio jitter
buffer would hold 3-4 packets first, 60-80 ms the agent would hear the caller late: not the agent's delay).

Misbehaviours for the failure paths: ``mode`` = "silent" (never replies), "http_error" (the offer answered with
HTTP 500), "not_json", "bad_sdp" (an answer whose SDP is not SDP), "no_audio" (an answer that sends no audio:
recvonly), "hang" (the offer never answered), "hangup" (closes the peer connection after ``close_after`` caller
frames).
"""

from __future__ import annotations

import asyncio
import fractions
import json
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from fakeagent import LOUD, Reply, Sent, cancel_the_rest, square, stop_loop, take_turns

RATE = 48000
FRAME = 960  # 20 ms at 48 kHz


@dataclass
class WebRtcAgent:
    replies: list[Reply]
    mode: str = "normal"
    endpoint_ms: float = 40.0
    # above this a caller frame is speech: Opus rings on after a tone's end (peaks of ~700 in the next 20 ms frame
    # were decoded from the caller's 8000-amplitude tones), which is not the caller still speaking
    loud: int = 4 * LOUD
    close_after: int = 20
    sent: list[Sent] = field(default_factory=list)
    stops: list[float] = field(default_factory=list)  # perf_counter of each reply stopped by the caller's speech
    offers: list[dict] = field(default_factory=list)  # the offers' JSON bodies as they came
    frames_in: int = 0
    heard: list[tuple[float, int]] = field(default_factory=list)  # each caller frame decoded: (perf_counter, peak)
    handed: list[tuple[float, bool]] = field(default_factory=list)  # each frame to the encoder: (perf_counter, loud)
    port: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._pcs: list = []

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> WebRtcAgent:
        self._thread.start()

        async def start() -> None:
            self._server = await asyncio.start_server(self._http, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            for pc in self._pcs:
                await pc.close()
            self._server.close()
            await cancel_the_rest()

        stop_loop(self._loop, self._thread, stop(), 10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/offer"

    # --- HTTP: one POST, one answer ------------------------------------------------------------------------------

    async def _http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode("latin-1").split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            status, answer = await self._offer(json.loads(body))
            data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                         f"Server: webrtcagent\r\nConnection: close\r\n\r\n".encode() + data)
            await writer.drain()
        finally:
            writer.close()

    async def _offer(self, offer: dict) -> tuple[int, dict | bytes]:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        self.offers.append(offer)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "http_error":
            return 500, {"detail": "fake agent: no"}
        if self.mode == "not_json":
            return 200, b"<html>not an answer</html>"
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates only, as the dialer's
        self._pcs.append(pc)
        out = _AgentTrack(self)
        self.out = out

        @pc.on("track")
        def on_track(track) -> None:
            if track.kind == "audio":
                asyncio.ensure_future(self._hear(pc, track))

        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer["sdp"], type=offer["type"]))
        transceiver = pc.getTransceivers()[0]  # the audio (pipecat's AUDIO_TRANSCEIVER_INDEX)
        receiver = transceiver.receiver
        receiver._RTCRtpReceiver__jitter_buffer = _AsItComes()
        if self.mode == "no_audio":
            transceiver.direction = "recvonly"
        else:
            transceiver.sender.replaceTrack(out)
            transceiver.direction = "sendrecv"
        await pc.setLocalDescription(await pc.createAnswer())
        sdp = pc.localDescription.sdp
        if self.mode == "bad_sdp":
            sdp = "this is not SDP"
        return 200, {"sdp": sdp, "type": "answer", "pc_id": f"fake-{uuid.uuid4().hex[:8]}"}

    # --- one call ----------------------------------------------------------------------------------------------

    async def _hear(self, pc, track) -> None:
        self.turn = 0
        self.speaking = False
        self.last_loud = 0.0
        self.task: asyncio.Task | None = None
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            now = time.perf_counter()
            self.frames_in += 1
            if self.mode == "hangup" and self.frames_in >= self.close_after:
                await pc.close()
                return
            samples = frame.to_ndarray()
            peak = int(np.abs(samples.astype(np.int32)).max())
            self.heard.append((now, peak))
            loud = peak > self.loud
            if loud and not self.speaking and self.out.playing():  # the caller talks over the reply: stop sending
                self.out.stop()
                self.stops.append(now)
            take_turns(self, now, loud)

    async def _reply(self, turn: int, last_loud: float) -> None:
        reply = self.replies[min(turn, len(self.replies)) - 1]
        wait = last_loud + reply.delay_ms / 1000.0 - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        audio = square(reply.burst_ms, RATE)
        pieces = [audio[i:i + FRAME] for i in range(0, len(audio), FRAME)]
        pieces[-1] = np.concatenate([pieces[-1], np.zeros(FRAME - len(pieces[-1]), np.int16)])
        first = await self.out.play(pieces)  # perf_counter when its first frame went to the encoder
        self.sent.append(Sent(turn, last_loud, first, len(pieces)))


class _AsItComes:
    """aiortc's receiver's jitter buffer replaced: each packet (one Opus frame) straight to the decoder."""

    capacity = 16

    def add(self, packet):
        from aiortc.jitterbuffer import JitterFrame

        data = getattr(packet, "_data", b"")
        return False, (JitterFrame(data=data, timestamp=packet.timestamp) if data else None)


def _AgentTrack(agent: WebRtcAgent):  # noqa: N802 - a class made where aiortc is imported
    from aiortc import MediaStreamTrack
    from av import AudioFrame

    class AgentTrack(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.queue: deque[np.ndarray] = deque()
            self.first: asyncio.Future | None = None
            self.start: float | None = None
            self.pts = 0
            self.more = asyncio.Event()

        def playing(self) -> bool:
            return bool(self.queue)

        def stop(self) -> None:
            self.queue.clear()

        async def play(self, pieces: list[np.ndarray]) -> float:
            self.first = asyncio.get_running_loop().create_future()
            self.queue.extend(pieces)
            self.more.set()
            return await self.first

        async def recv(self):
            if self.start is None:
                self.start = time.perf_counter()
            wait = self.start + self.pts / RATE - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if not self.queue and agent.mode == "dtx":  # nothing to say: no packet at all until there is
                self.more.clear()
                await self.more.wait()
                self.start = time.perf_counter() - self.pts / RATE  # the pacing resumes from now
            samples = self.queue.popleft() if self.queue else np.zeros(FRAME, np.int16)
            now = time.perf_counter()
            agent.handed.append((now, bool(samples.any())))
            if self.first is not None and not self.first.done() and samples.any():
                self.first.set_result(now)
            frame = AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = RATE
            frame.pts = self.pts
            frame.time_base = fractions.Fraction(1, RATE)
            self.pts += FRAME
            return frame

    return AgentTrack()
