"""What travels on the line, both ways: 20 ms frames as Twilio Media Streams messages (JSON text frames, base64
mu-law at 8 kHz) or as binary frames of 16-bit little-endian PCM at a stated rate.

Twilio's side (the caller's, which voice-llm plays): ``connected``, ``start`` (streamSid, callSid, mediaFormat),
``media`` (sequenceNumber, chunk, timestamp, payload), ``mark`` (echoed when the audio before it was played),
``stop``. The agent's side: ``media`` (payload), ``mark`` (name), ``clear``.
Spec: https://www.twilio.com/docs/voice/media-streams/websocket-messages (and shared/notes/line.md).

mu-law is ITU-T G.711 (the segment encoding with bias 0x84, every bit inverted on the wire), computed with numpy:
https://www.itu.int/rec/T-REC-G.711
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from voice_llm.core.errors import VoiceLLMError
from voice_llm.core.util.artifacts import loads_json

TWILIO = "twilio"
PCM = "pcm"
# the phone bridges beside Twilio (issue 40 item 1), each its framing module in voice_llm.engines.line: the bridges pipecat
# 1.14 ships serializers for and that carry a call over a WebSocket of their own messages
TELNYX = "telnyx"
PLIVO = "plivo"
EXOTEL = "exotel"
VONAGE = "vonage"
BRIDGES = (TELNYX, PLIVO, EXOTEL, VONAGE)
# issue 40 item 2: WebRTC (an SDP offer POSTed to the agent's HTTP URL, pipecat SmallWebRTC's /api/offer; audio as
# RTP, Opus as negotiated). Not a WebSocket: voice_llm.capabilities.dial.webrtc is its transport; what the caller's ear plays is
# the decoded audio, 16-bit PCM at 48 kHz (Opus's own rate, RFC 7587 section 4.1: the RTP clock is 48000 whatever
# the encoder's rate), so the line's codec and rate are those of the frames decoded from what arrives.
WEBRTC = "webrtc"
WEBRTC_RATE = 48000
WEBSOCKET_PROTOCOLS = (TWILIO, PCM, *BRIDGES)  # the lines carried over a WebSocket (voice_llm.capabilities.dial.transport)
PROTOCOLS = (*WEBSOCKET_PROTOCOLS, WEBRTC)  # what the dialer speaks
AGENT_PROTOCOLS = (TWILIO, PCM)  # what voice-llm's own agent serves (pipecat's: voice_llm.capabilities.agent.pipecat_agent)
# What each line is, in the words of a --protocol help line (dial's and the agent's both say it from here; a new
# protocol is named here once)
PROTOCOL_WORDS = {TWILIO: "Media Streams JSON, 8 kHz mu-law", PCM: "binary 16-bit frames at --rate",
                  TELNYX: "JSON, 8 kHz mu-law", PLIVO: "JSON, 8 kHz mu-law", EXOTEL: "JSON, 8 kHz 16-bit PCM",
                  VONAGE: "binary 16 kHz 16-bit PCM, JSON actions",
                  WEBRTC: "an SDP offer POSTed to http://HOST:PORT/api/offer (pipecat's SmallWebRTC), Opus as "
                          "negotiated"}
MULAW = "mulaw"
PCM16 = "pcm16"
CODECS = (MULAW, PCM16)
TWILIO_RATE = 8000  # Media Streams carry 8 kHz mu-law, mono, always
TWILIO_ENCODING = "audio/x-mulaw"
DEFAULT_PCM_RATE = 16000
FRAME_MS = 20  # one media message, one binary frame: 20 ms (160 mu-law bytes at 8 kHz)
MAX_MESSAGE_BYTES = 1 << 20  # a text or binary frame larger than this is not a 20 ms frame of any rate we take


# A bridge's one codec and rate: what its media messages carry (the documented default each pipecat serializer
# takes; a bridge line with another codec or rate is no line that exists here):
# Twilio https://www.twilio.com/docs/voice/media-streams/websocket-messages (audio/x-mulaw 8000);
# Telnyx https://developers.telnyx.com/docs/voice/programmable-voice/media-streaming (PCMU 8000 by default);
# Plivo https://www.plivo.com/docs/voice/xml/the-stream-element (audio/x-mulaw;rate=8000 by default);
# Exotel https://support.exotel.com/support/solutions/articles/3000108630 (raw/slin: 16-bit PCM, 8 kHz, base64);
# Vonage https://developer.vonage.com/en/voice/voice-api/concepts/websockets (audio/l16;rate=16000, binary frames).
FIXED_FORMATS: dict[str, tuple[str, int]] = {TWILIO: (MULAW, 8000), TELNYX: (MULAW, 8000), PLIVO: (MULAW, 8000),
                                             EXOTEL: (PCM16, 8000), VONAGE: (PCM16, 16000),
                                             WEBRTC: (PCM16, WEBRTC_RATE)}


def protocols_said(protocols: tuple[str, ...] = PROTOCOLS) -> str:
    """The lines, each with what it is ("twilio: Media Streams JSON, 8 kHz mu-law; pcm: ..."), for a help line."""
    return "; ".join(f"{protocol}: {PROTOCOL_WORDS[protocol]}" for protocol in protocols)


class LineError(VoiceLLMError):
    """Something on the line is not what the protocol says: not JSON, an unknown event, a payload that is not
    base64 or not whole samples. The message says what arrived (shortened)."""


@dataclass(frozen=True)
class LineFormat:
    """How audio travels: the protocol, the codec of its payloads, the sample rate, the frame length."""

    protocol: str = TWILIO
    codec: str = MULAW
    rate: int = TWILIO_RATE
    frame_ms: int = FRAME_MS

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {self.protocol!r}")
        if self.codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}, not {self.codec!r}")
        # Twilio Media Streams carry audio/x-mulaw at 8000 Hz and nothing else (the start message's mediaFormat):
        # a Twilio line with 16-bit PCM, or at another rate, is no line that exists; each bridge likewise carries
        # its one format (FIXED_FORMATS). --codec and --rate are for pcm lines.
        if self.protocol == TWILIO and self.codec != MULAW:
            raise ValueError(f"Twilio Media Streams carry mu-law only, not {self.codec} (--codec is for --protocol pcm)")
        if self.protocol == TWILIO and self.rate != TWILIO_RATE:
            raise ValueError(f"Twilio Media Streams carry mu-law at {TWILIO_RATE} Hz, not {self.rate}")
        if self.protocol in (*BRIDGES, WEBRTC) and (self.codec, self.rate) != FIXED_FORMATS[self.protocol]:
            codec, rate = FIXED_FORMATS[self.protocol]
            raise ValueError(f"a {self.protocol} line carries {codec} at {rate} Hz, not {self.codec} at {self.rate} "
                             "(--codec and --rate are for --protocol pcm)")
        if not 4000 <= self.rate <= 48000:
            raise ValueError(f"the line's rate must be 4000-48000 Hz, not {self.rate}")

    @property
    def frame_samples(self) -> int:
        return self.rate * self.frame_ms // 1000

    def as_dict(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "codec": self.codec, "rate": self.rate, "frame_ms": self.frame_ms}


def twilio_line() -> LineFormat:
    return LineFormat(TWILIO, MULAW, TWILIO_RATE)


def line_for(protocol: str, rate: int | None = None, codec: str | None = None) -> LineFormat:
    """The line a protocol carries: a bridge's (and Twilio's) one format; a pcm line at ``rate`` with ``codec``."""
    if protocol in FIXED_FORMATS:
        fixed_codec, fixed_rate = FIXED_FORMATS[protocol]
        return LineFormat(protocol, codec or fixed_codec, rate or fixed_rate)
    return pcm_line(rate or DEFAULT_PCM_RATE, codec or PCM16)


def pcm_line(rate: int = DEFAULT_PCM_RATE, codec: str = PCM16) -> LineFormat:
    """Binary frames at ``rate``: 16-bit little-endian PCM (default), or 8-bit G.711 mu-law bytes (one a sample)."""
    return LineFormat(PCM, codec, rate)


# --- G.711 mu-law ---------------------------------------------------------------------------------------------------

_BIAS = 0x84
_CLIP = 32635


def _decode_table() -> np.ndarray:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = (((mantissa << 3) + _BIAS) << exponent) - _BIAS
    return np.where(sign != 0, -magnitude, magnitude).astype(np.int16)


_DECODE = _decode_table()


def _encode_table() -> np.ndarray:
    values = np.arange(-32768, 32768, dtype=np.int32)
    sign = np.where(values < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(values), _CLIP) + _BIAS
    exponent = np.floor(np.log2(magnitude)).astype(np.int32) - 7  # magnitude >= 0x84: exponent 0..7
    exponent = np.clip(exponent, 0, 7)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


_ENCODE = _encode_table()  # indexed by sample + 32768


def mulaw_encode(samples: np.ndarray) -> bytes:
    """int16 samples -> mu-law bytes, one per sample."""
    return _ENCODE[samples.astype(np.int32) + 32768].tobytes()


def mulaw_decode(data: bytes) -> np.ndarray:
    """mu-law bytes -> int16 samples."""
    return _DECODE[np.frombuffer(data, np.uint8)]


def encode(line: LineFormat, samples: np.ndarray) -> bytes:
    """int16 samples at the line's rate -> the payload bytes of its codec."""
    if line.codec == MULAW:
        return mulaw_encode(samples)
    return samples.astype("<i2").tobytes()


def decode(line: LineFormat, payload: bytes) -> np.ndarray:
    """A payload of the line's codec -> int16 samples at its rate. A PCM payload of an odd byte count is not whole
    samples: a LineError, never a silent truncation."""
    if line.codec == MULAW:
        return mulaw_decode(payload)
    if len(payload) % 2:
        raise LineError(f"a PCM16 payload of {len(payload)} bytes is not whole 16-bit samples (a wrong codec?)")
    return np.frombuffer(payload, "<i2").astype(np.int16)


# --- Twilio Media Streams messages ----------------------------------------------------------------------------------


def parse_message(text: str | bytes, key: str = "event") -> dict[str, Any]:
    """One text frame as a message: JSON (through the one guarded parser: a body nested thousands deep is a
    LineError, not a crash) that is an object with a string ``event`` (Vonage's agent side names it ``action``)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LineError(f"a text frame that is not UTF-8: {text[:60]!r}") from exc
    if len(text) > MAX_MESSAGE_BYTES:
        raise LineError(f"a message of {len(text)} characters; at most {MAX_MESSAGE_BYTES}")
    try:
        message = loads_json(text, "a message on the line")
    except Exception as exc:  # ArtifactError (not JSON, too deep) from the guarded parser
        raise LineError(f"not a JSON message: {text[:80]!r}") from exc
    if not isinstance(message, dict) or not isinstance(message.get(key), str):
        raise LineError(f"a message without an {key}: {text[:80]!r}")
    return message


def payload_of(message: Mapping[str, Any]) -> bytes:
    """The audio bytes of a ``media`` message (base64 in media.payload)."""
    media = message.get("media")
    payload = media.get("payload") if isinstance(media, Mapping) else None
    if not isinstance(payload, str):
        raise LineError("a media message without media.payload")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise LineError(f"a media payload that is not base64: {payload[:40]!r}") from exc


def mark_name(message: Mapping[str, Any]) -> str:
    mark = message.get("mark")
    name = mark.get("name") if isinstance(mark, Mapping) else None
    if not isinstance(name, str):
        raise LineError("a mark message without mark.name")
    return name


def dumps(message: Mapping[str, Any]) -> str:
    """A message as the line carries it: compact JSON."""
    return json.dumps(message, separators=(",", ":"))


# The caller's side (what Twilio sends).

def connected() -> str:
    return dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})


def start(sequence: int, stream_sid: str, call_sid: str, account_sid: str,
          custom: Mapping[str, str] | None = None) -> str:
    return dumps({"event": "start", "sequenceNumber": str(sequence), "streamSid": stream_sid,
                   "start": {"accountSid": account_sid, "callSid": call_sid, "streamSid": stream_sid,
                             "tracks": ["inbound"], "customParameters": dict(custom or {}),
                             "mediaFormat": {"encoding": TWILIO_ENCODING, "sampleRate": TWILIO_RATE, "channels": 1}}})


def caller_media(sequence: int, stream_sid: str, chunk: int, timestamp_ms: int, payload: bytes) -> str:
    return dumps({"event": "media", "sequenceNumber": str(sequence), "streamSid": stream_sid,
                   "media": {"track": "inbound", "chunk": str(chunk), "timestamp": str(timestamp_ms),
                             "payload": base64.b64encode(payload).decode("ascii")}})


def mark_played(sequence: int, stream_sid: str, name: str) -> str:
    return dumps({"event": "mark", "sequenceNumber": str(sequence), "streamSid": stream_sid, "mark": {"name": name}})


def stop(sequence: int, stream_sid: str, call_sid: str, account_sid: str) -> str:
    return dumps({"event": "stop", "sequenceNumber": str(sequence), "streamSid": stream_sid,
                   "stop": {"accountSid": account_sid, "callSid": call_sid}})


# The agent's side.

def agent_media(stream_sid: str, payload: bytes) -> str:
    return dumps({"event": "media", "streamSid": stream_sid,
                   "media": {"payload": base64.b64encode(payload).decode("ascii")}})


def agent_mark(stream_sid: str, name: str) -> str:
    return dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear(stream_sid: str) -> str:
    return dumps({"event": "clear", "streamSid": stream_sid})


def frames(samples: np.ndarray, frame_samples: int) -> list[np.ndarray]:
    """``samples`` cut into frames of ``frame_samples``, the last padded with silence."""
    count = -(-len(samples) // frame_samples)
    padded = np.zeros(count * frame_samples, np.int16)
    padded[:len(samples)] = samples
    return [padded[i * frame_samples:(i + 1) * frame_samples] for i in range(count)]
