"""Vonage's WebSocket voice connection, the caller's side (what Vonage sends): a first text message
``websocket:connected`` with the content-type (audio/l16;rate=16000), then binary frames of 16-bit little-endian
PCM at 16 kHz both ways; the agent's text actions are ``clear`` (Vonage drops its buffered audio and answers
``websocket:cleared``) and ``notify`` (Vonage answers ``websocket:notify`` with the same payload once the audio sent
before it has played: the line's mark; its name here is the payload's JSON text).
https://developer.vonage.com/en/voice/voice-api/concepts/websockets; pipecat's VonageFrameSerializer sends raw
PCM and {"action": "clear"}. Vonage sends no stop: the hang-up is the close."""

from __future__ import annotations

from voice_llm.engines.line import wire
from voice_llm.engines.line.framing import CLEAR, MARK, MEDIA, OTHER, Framing, Received, Sent, register
from voice_llm.core.util.artifacts import loads_json


@register
class VonageFraming(Framing):
    protocol = wire.VONAGE

    def opening(self) -> list[Sent]:
        return [Sent(wire.dumps({"event": "websocket:connected", "content-type": f"audio/l16;rate={self.line.rate}"}),
                     "connected")]

    def media(self, index: int, payload: bytes) -> Sent:
        return Sent(payload, "media", {"frame": index})

    def mark_played(self, name: str) -> Sent:
        return Sent(wire.dumps({"event": "websocket:notify", "payload": loads_json(name, "a notify payload")}),
                    "mark")

    def cleared(self) -> Sent:
        return Sent(wire.dumps({"event": "websocket:cleared"}), "cleared")

    def parse(self, message: str | bytes) -> Received:
        if isinstance(message, bytes):
            return Received(MEDIA, message)
        parsed = wire.parse_message(message, "action")
        action = parsed["action"]
        if action == "clear":
            return Received(CLEAR)
        if action == "notify":
            return Received(MARK, name=wire.dumps(parsed.get("payload") or {}))
        return Received(OTHER, what=action)
