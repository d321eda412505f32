"""Exotel's voicebot stream over WebSocket, the caller's side (what Exotel sends): ``connected``, ``start``
(stream_sid, call_sid, account_sid, media_format), ``media`` (sequence_number, media.chunk/timestamp/payload:
base64 16-bit little-endian PCM, "raw/slin", at 8 kHz), ``mark`` echoes, ``stop``; the agent sends ``media``
(media.payload), ``mark`` (mark.name) and ``clear``.
https://support.exotel.com/support/solutions/articles/3000108630-working-with-the-stream-and-voicebot-applet;
pipecat's ExotelFrameSerializer and parse_telephony_websocket read start.stream_sid, call_sid and account_sid."""

from __future__ import annotations

import base64

from voice_llm.engines.line import wire
from voice_llm.engines.line.framing import CLEAR, MARK, MEDIA, OTHER, Framing, Received, Sent, register


@register
class ExotelFraming(Framing):
    protocol = wire.EXOTEL

    def __init__(self, line: wire.LineFormat, ids) -> None:  # type: ignore[no-untyped-def]
        super().__init__(line, ids)
        self.seq = 0  # sequence_number: every message after `connected`
        self.chunk = 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def opening(self) -> list[Sent]:
        seq = self._next()
        start = {"event": "start", "sequence_number": seq, "stream_sid": self.ids.stream_id,
                 "start": {"stream_sid": self.ids.stream_id, "call_sid": self.ids.call_id,
                           "account_sid": self.ids.account_id, "from": "05550000001", "to": "05550000002",
                           "custom_parameters": {},
                           "media_format": {"encoding": "base64", "sample_rate": str(self.line.rate),
                                            "bit_rate": "128kbps"}}}
        return [Sent(wire.dumps({"event": "connected"}), "connected"), Sent(wire.dumps(start), "start", {"seq": seq})]

    def media(self, index: int, payload: bytes) -> Sent:
        self.chunk += 1
        seq = self._next()
        message = {"event": "media", "sequence_number": seq, "stream_sid": self.ids.stream_id,
                   "media": {"chunk": self.chunk, "timestamp": str(index * self.line.frame_ms),
                             "payload": base64.b64encode(payload).decode("ascii")}}
        return Sent(wire.dumps(message), "media", {"seq": seq, "frame": index})

    def mark_played(self, name: str) -> Sent:
        seq = self._next()
        return Sent(wire.dumps({"event": "mark", "sequence_number": seq, "stream_sid": self.ids.stream_id,
                                "mark": {"name": name}}), "mark", {"seq": seq})

    def closing(self) -> list[Sent]:
        seq = self._next()
        return [Sent(wire.dumps({"event": "stop", "sequence_number": seq, "stream_sid": self.ids.stream_id,
                                 "stop": {"call_sid": self.ids.call_id, "account_sid": self.ids.account_id,
                                          "reason": "callended"}}), "stop", {"seq": seq})]

    def parse(self, message: str | bytes) -> Received:
        parsed = self._json(message)
        kind = parsed["event"]
        if kind == "media":
            return Received(MEDIA, wire.payload_of(parsed))
        if kind == "mark":
            return Received(MARK, name=wire.mark_name(parsed))
        if kind == "clear":
            return Received(CLEAR)
        return Received(OTHER, what=kind)
