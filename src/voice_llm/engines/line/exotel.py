"""Exotel's voicebot stream over WebSocket, the caller's side (what Exotel sends): ``connected``, ``start``
(stream_sid, call_sid, account_sid, media_format), ``media`` (sequence_number, media.chunk/timestamp/payload:
base64 16-bit little-endian PCM, "raw/slin", at 8 kHz), ``mark`` echoes, ``stop``; the agent sends ``media``
(media.payload), ``mark`` (mark.name) and ``clear``.
https://support.exotel.com/support/solutions/articles/3000108630-working-with-the-stream-and-voicebot-applet;
pipecat's ExotelFrameSerializer and parse_telephony_websocket read start.stream_sid, call_sid and account_sid."""

from __future__ import annotations

import base64

from voice_llm.engines.line import wire
from voice_llm.engines.line.framing import JsonEventFraming, Sent, register


@register
class ExotelFraming(JsonEventFraming):
    protocol = wire.EXOTEL

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
        chunk, seq = self._next_chunk(), self._next()
        message = {"event": "media", "sequence_number": seq, "stream_sid": self.ids.stream_id,
                   "media": {"chunk": chunk, "timestamp": str(index * self.line.frame_ms),
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
