"""The WebRTC line (issue 40 item 2): the caller's peer connection to an agent that answers an SDP offer POSTed to
its HTTP URL, as pipecat's SmallWebRTC transport does (``POST /api/offer`` takes ``{sdp, type: "offer", pc_id?,
restart_pc?, request_data?}`` and answers ``{sdp, type: "answer", pc_id}``; its PATCH is trickle ICE, not needed
here: aiortc gathers every host candidate before the offer is made, so the offer carries them all).

Host candidates only: the peer connection is made with no ICE server (``RTCConfiguration(iceServers=[])``, as
pipecat's SmallWebRTCConnection makes its own with its default ``ice_servers=[]``). aiortc's default is Google's
public STUN server (aiortc.rtcicetransport.RTCIceGatherer.getDefaultIceServers): with it, each offer first resolves
stun.l.google.com and waits on a STUN transaction: on a machine with no route out (CI, a lab LAN) that costs
whatever its resolver takes to give up, inside the 10 s connect bound (here the resolver fails at once; one whose
DNS server does not answer waits seconds), and it tells a third party the caller's address. An agent reachable only through NAT traversal is not one this dialer can call.

One audio transceiver, sendrecv, transceiver 0 (pipecat's ``AUDIO_TRANSCEIVER_INDEX``); no data channel. The codec
is what the answer negotiated (aiortc offers Opus first, then PCMU and PCMA); whatever it is, the ear plays the
frames decoded from the RTP that arrived, as 16-bit PCM at 48 kHz mono (wire.WEBRTC_RATE), and the caller's frames
go to the encoder as the same. The call loop (voice_llm.capabilities.dial.call) is the one of every line: real-time playout of
what was received through the phone's jitter delay, the same recording, floor and barge-in rules.

What WebRTC does not carry is named in dial.json (``line.webrtc.not_on_this_line``): no marks, no clear (an agent
can only stop sending, so a barge-in is measured as heard silence alone); and pipecat's transport sends 10 ms of
silence when it has nothing to say, so the buffer never "runs dry": a reply's end is the heard silence (the floor
rule), with the buffer holding no sound (dial.call's schedule, Playout.holds_sound).

aiortc's receiver holds audio in a jitter buffer of its own before decoding (16 packets, 4 of them prefetched:
60-80 ms more before any audio reaches the track). The caller's ear is the dialer's playout (its --jitter-ms), so
that buffer is bypassed: each RTP packet is one Opus frame (RFC 7587 section 4.2) and goes to the decoder as it
arrives. That replaces aiortc's private ``RTCRtpReceiver.__jitter_buffer``, as pipecat's SmallWebRTC does for its
screen-share track: it holds for aiortc 1.16.0 only, which is why the ``webrtc`` extra pins it exactly.

aiortc (and its PyAV) is the optional extra ``webrtc``: imported only here, only when a call is made on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import http.client
import importlib.util
import json
import threading
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from voice_llm import __version__
from voice_llm.capabilities.dial.transport import CLOSE_TIMEOUT_S, CONNECT_TIMEOUT_S, DialError, Hangup, Transport, why
from voice_llm.core.errors import ConfigError
from voice_llm.engines.line import wire
from voice_llm.core.util.artifacts import loads_json

AIORTC_VERSION = "1.16.0"  # the jitter-buffer bypass reads a private attribute of this version (above)
EXTRA_LINE = f"pip install 'voice-llm[webrtc]' (aiortc=={AIORTC_VERSION})"
OFFER_PATH = "/api/offer"  # pipecat's runner and `voice-llm agent --engine pipecat --protocol webrtc`
MAX_ANSWER_BYTES = wire.MAX_MESSAGE_BYTES  # an SDP answer is a few KiB
# What a WebRTC line lacks beside a phone bridge's WebSocket, said in dial.json (issue 40 item 2: "say which do not
# apply"); the line conditions that do apply (--loss downlink, --echo-db) are dial's own, on the decoded audio.
NOT_ON_THIS_LINE = (
    "marks: WebRTC has no mark echo (nothing tells the agent its audio has played)",
    "clear: the agent can only stop sending; a barge-in is measured as heard silence alone",
    "uplink loss numbering: a frame --loss drops is not handed to the encoder, and aiortc numbers the RTP packets "
    "it sends, so the agent sees 20 ms less audio, no gap in sequence numbers or timestamps",
    "echo through the codec: call.wav's left channel is the caller's audio before Opus (the codec is the agent's "
    "decoder's to undo)",
)


def available() -> bool:
    """Whether aiortc is installed (without importing it: 0.3 s and PyAV)."""
    return importlib.util.find_spec("aiortc") is not None


def require() -> None:
    """--protocol webrtc without the extra: one line saying how to install it (before anything is written)."""
    if not available():
        raise ConfigError(f"--protocol webrtc needs aiortc, which is not installed: {EXTRA_LINE}")


def check_url(url: str) -> None:
    """A WebRTC agent's URL is its HTTP offer URL: http(s)://HOST:PORT/PATH (pipecat's /api/offer)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"a WebRTC agent's URL is its offer URL, http://HOST:PORT{OFFER_PATH}, not {url!r}")


# --- what the peer connection is made of (aiortc imported here only) ----------------------------------------------


def _aiortc() -> Any:
    try:
        import aiortc
    except ImportError as exc:
        raise DialError(f"--protocol webrtc needs aiortc ({exc.name or exc} is missing): {EXTRA_LINE}") from None
    return aiortc


def _caller_track(rate: int) -> Any:
    """The caller's outbound audio: each frame the call loop sends (16-bit PCM at ``rate``), handed to the
    encoder when the loop sends it (the sender awaits ``recv``: the tick paces the RTP, as a phone's packetizer)."""
    from aiortc import MediaStreamTrack
    from av import AudioFrame

    class CallerTrack(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.queue: asyncio.Queue[bytes] = asyncio.Queue()
            self.pts = 0
            self.frames = 0

        async def recv(self) -> Any:
            payload = await self.queue.get()
            samples = np.frombuffer(payload, "<i2").reshape(1, -1)
            frame = AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.sample_rate = rate
            frame.pts = self.pts
            frame.time_base = fractions.Fraction(1, rate)
            self.pts += samples.shape[1]
            self.frames += 1
            return frame

    return CallerTrack()


def _straight_through() -> Any:
    """In place of aiortc's audio jitter buffer: every packet is a whole Opus frame, decoded as it arrives (the
    module's docstring)."""
    from aiortc.jitterbuffer import JitterFrame

    class StraightThrough:
        capacity = 16  # read by nothing here; JitterBuffer's attribute, kept for its readers

        def add(self, packet: Any) -> tuple[bool, Any]:
            data = getattr(packet, "_data", b"")
            return False, (JitterFrame(data=data, timestamp=packet.timestamp) if data else None)

    return StraightThrough()


def _bypass_jitter_buffer(receiver: Any) -> None:
    name = "_RTCRtpReceiver__jitter_buffer"
    if not hasattr(receiver, name):  # another aiortc than the pinned one: the measurement would change, so say so
        raise DialError(f"aiortc {_aiortc().__version__} has no {name} to bypass; the webrtc extra pins "
                        f"aiortc=={AIORTC_VERSION}: {EXTRA_LINE}")
    setattr(receiver, name, _straight_through())


# --- the offer ------------------------------------------------------------------------------------------------------


def _post(url: str, body: bytes, wait_s: float) -> tuple[int, dict[str, str], bytes]:
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme.lower() == "https" else http.client.HTTPConnection
    connection = cls(parts.hostname or "", parts.port, timeout=wait_s)
    try:
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        connection.request("POST", path, body, {"Content-Type": "application/json",
                                                "User-Agent": f"voice-llm/{__version__} dial"})
        response = connection.getresponse()
        data = response.read(MAX_ANSWER_BYTES + 1)
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        connection.close()


async def _post_offer(url: str, body: bytes, wait_s: float) -> tuple[int, dict[str, str], bytes]:
    """POST the offer in a daemon thread of its own (an agent that never answers must not hold the dialer's exit,
    as an executor's thread would), bounded by ``wait_s``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[int, dict[str, str], bytes]] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def work() -> None:
        try:
            result = _post(url, body, wait_s)
        except BaseException as exc:  # handed to the call's loop, which says what it was
            with contextlib.suppress(RuntimeError):  # the loop has gone: nobody waits
                loop.call_soon_threadsafe(settle, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=work, name="voice-llm-webrtc-offer", daemon=True).start()
    try:
        return await asyncio.wait_for(done, wait_s + 1.0)
    except (TimeoutError, asyncio.TimeoutError):
        raise DialError(f"{url}: no answer to the WebRTC offer within {wait_s:g} s") from None


def _answer_of(url: str, status: int, data: bytes) -> dict[str, Any]:
    said = data[:120].decode("utf-8", "replace").strip()
    if status != 200:
        raise DialError(f"{url} answered the WebRTC offer with HTTP {status} ({said!r}): is it the agent's offer URL "
                        f"(http://HOST:PORT{OFFER_PATH})?")
    if len(data) > MAX_ANSWER_BYTES:
        raise DialError(f"{url}: an answer of more than {MAX_ANSWER_BYTES} bytes is no SDP answer")
    try:
        answer = loads_json(data.decode("utf-8"), "the agent's answer")
    except Exception:
        raise DialError(f"{url}: the answer to the WebRTC offer is not JSON ({said!r})") from None
    if not isinstance(answer, dict) or answer.get("type") != "answer" or not isinstance(answer.get("sdp"), str):
        raise DialError(f"{url}: the answer to the WebRTC offer is not {{sdp, type: \"answer\"}} ({said!r})")
    return answer


async def connect(url: str, deadline_s: float, ids: Any, line: wire.LineFormat) -> WebRtcLine:
    """The peer connection to the agent at ``url`` (its offer URL), connected (ICE and DTLS), or a DialError saying
    why not, within min(10 s, deadline) (the WebSocket's handshake bound)."""
    aiortc = _aiortc()
    wait = min(CONNECT_TIMEOUT_S, deadline_s)
    pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))  # host candidates only (above)
    try:
        return await asyncio.wait_for(_connect(aiortc, pc, url, wait, ids, line), wait + 2.0)
    except (TimeoutError, asyncio.TimeoutError):
        await _close(pc)
        raise DialError(f"{url}: no WebRTC connection within {wait:g} s (ICE {pc.iceConnectionState}, "
                        f"connection {pc.connectionState})") from None
    except BaseException:
        await _close(pc)
        raise


async def _connect(aiortc: Any, pc: Any, url: str, wait: float, ids: Any, line: wire.LineFormat) -> WebRtcLine:
    outbound = _caller_track(line.rate)
    transceiver = pc.addTransceiver(outbound, direction="sendrecv")
    _bypass_jitter_buffer(transceiver.receiver)
    connected = asyncio.get_running_loop().create_future()

    @pc.on("connectionstatechange")
    def _state() -> None:
        if pc.connectionState in ("connected", "failed", "closed") and not connected.done():
            connected.set_result(pc.connectionState)

    await pc.setLocalDescription(await pc.createOffer())  # every host candidate gathered: no trickle ICE
    # request_data: pipecat passes it to the bot as the call's body; voice-llm's pipecat agent tags its spans with
    # the stream id in it, as a Twilio start's streamSid (dial.json line.stream_sid attributes the spans)
    body = json.dumps({"sdp": pc.localDescription.sdp, "type": "offer",
                       "request_data": {"stream_sid": ids.stream_id, "call_sid": ids.call_id}}).encode()
    try:
        status, headers, data = await _post_offer(url, body, wait)
    except DialError:
        raise
    except OSError as exc:
        raise DialError(f"nothing answers the WebRTC offer at {url} ({urllib.parse.urlsplit(url).netloc}: "
                        f"{why(exc)})") from None
    except http.client.HTTPException as exc:
        raise DialError(f"{url} does not answer as HTTP ({why(exc)}): is it the agent's offer URL "
                        f"(http://HOST:PORT{OFFER_PATH})?") from None
    answer = _answer_of(url, status, data)
    try:
        await pc.setRemoteDescription(aiortc.RTCSessionDescription(sdp=answer["sdp"], type="answer"))
    except Exception as exc:  # aiortc's ValueError (or worse) on an SDP it cannot take
        raise DialError(f"{url}: the agent's SDP answer was refused ({why(exc)[:160]})") from None
    if transceiver.currentDirection != "sendrecv":
        raise DialError(f"{url}: the agent's answer has no two-way audio (the audio is "
                        f"{transceiver.currentDirection or 'rejected'} from the caller's side): no audio track to hear")
    state = await connected
    if state != "connected":
        raise DialError(f"{url}: the WebRTC connection {state} (ICE {pc.iceConnectionState})")
    return WebRtcLine(pc, transceiver, outbound, headers, answer, line.rate)


async def _close(pc: Any) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(pc.close(), CLOSE_TIMEOUT_S)


class WebRtcLine(Transport):
    """A connected peer connection: ``send`` hands a frame of 16-bit PCM to the encoder, ``receive`` yields each
    frame decoded from what arrived, as 16-bit PCM mono at the line's rate."""

    def __init__(self, pc: Any, transceiver: Any, outbound: Any, headers: dict[str, str], answer: dict[str, Any],
                 rate: int) -> None:
        from av import AudioResampler

        self.pc, self.transceiver, self.outbound = pc, transceiver, outbound
        self.headers = {k: v for k, v in headers.items() if k not in ("content-length", "date", "connection")}
        self.pc_id = answer.get("pc_id") if isinstance(answer.get("pc_id"), str) else None
        self.remote_sdp = answer["sdp"]
        # whatever was negotiated (Opus decodes to 48 kHz stereo, PCMU to 8 kHz mono): the ear's mono at its rate
        self.resampler = AudioResampler(format="s16", layout="mono", rate=rate)
        self.frames_received = 0
        self.ended = False

    async def send(self, message: str | bytes) -> None:
        if isinstance(message, str):  # the WebRTC framing sends audio only; nothing else has a place on RTP
            raise DialError("a text message has no place on a WebRTC line")
        self.outbound.queue.put_nowait(message)

    async def receive(self) -> AsyncIterator[str | bytes]:
        from aiortc.mediastreams import MediaStreamError

        track = self.transceiver.receiver.track
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:  # the agent's track ended: RTCP BYE, DTLS closed, ICE consent lost
                self.ended = True
                return
            self.frames_received += 1
            for out in self.resampler.resample(frame):
                yield out.to_ndarray().astype("<i2").tobytes()

    def closed(self, exc: BaseException | None) -> Hangup | None:
        if exc is not None:
            return None
        how = f"audio track ended (connection {self.pc.connectionState}, ICE {self.pc.iceConnectionState})"
        return Hangup("down", how, "the agent hung up mid-call", f" (WebRTC: its {how})")

    async def close(self) -> None:
        await _close(self.pc)

    async def describe(self) -> dict[str, Any]:
        """dial.json's ``line.webrtc``: the codec as negotiated, the RTP the caller received (packets, loss and
        RFC 3550 interarrival jitter, as aiortc's receiver counted them) and sent, the agent's pc_id."""
        codec = _negotiated(self.remote_sdp)
        received: dict[str, Any] = {}
        sent: dict[str, Any] = {}
        for stats in (await self.transceiver.receiver.getStats()).values():
            if getattr(stats, "type", None) == "inbound-rtp":
                clock = codec.get("clock_rate") or wire.WEBRTC_RATE
                received = {"packets": stats.packetsReceived, "lost": stats.packetsLost,
                            "jitter_ms": round(stats.jitter * 1000.0 / clock, 3)}
        for stats in (await self.transceiver.sender.getStats()).values():
            if getattr(stats, "type", None) == "outbound-rtp":
                sent = {"packets": stats.packetsSent, "bytes": stats.bytesSent}
        return {"webrtc": {"codec": codec, "pc_id": self.pc_id,
                           "rtp_received": received or None, "rtp_sent": sent or None,
                           "frames_decoded": self.frames_received, "frames_encoded": self.outbound.frames,
                           "jitter_buffer": "aiortc's bypassed: each packet decoded as it arrived; the ear's is "
                                            "line.jitter_ms",
                           "not_on_this_line": list(NOT_ON_THIS_LINE)}}


def _negotiated(sdp: str) -> dict[str, Any]:
    """The audio codec the answer chose (its first of the audio section's), as the SDP names it."""
    from aiortc.sdp import SessionDescription

    try:
        media = next(m for m in SessionDescription.parse(sdp).media if m.kind == "audio")
        codec = media.rtp.codecs[0]
    except (StopIteration, IndexError, ValueError):
        return {}
    return {"name": codec.mimeType, "clock_rate": codec.clockRate, "channels": codec.channels,
            "payload_type": codec.payloadType, "parameters": dict(codec.parameters or {})}


__all__ = ["AIORTC_VERSION", "EXTRA_LINE", "NOT_ON_THIS_LINE", "OFFER_PATH", "WebRtcLine", "available", "check_url",
           "connect", "require"]
