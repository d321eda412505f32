"""Twilio Media Streams, the caller's side (what Twilio sends): ``connected``, ``start``, ``media`` (sequenceNumber,
chunk, timestamp, base64 mu-law at 8 kHz), ``mark`` echoes, ``stop``; the agent sends ``media``, ``mark`` and
``clear``. https://www.twilio.com/docs/voice/media-streams/websocket-messages (and shared/notes/line.md)."""

from __future__ import annotations

from voice_llm.engines.line import wire
from voice_llm.engines.line.framing import CLEAR, MARK, MEDIA, OTHER, Framing, Received, Sent, register


@register
class TwilioFraming(Framing):
    protocol = wire.TWILIO

    def __init__(self, line: wire.LineFormat, ids) -> None:  # type: ignore[no-untyped-def]
        super().__init__(line, ids)
        self.seq = 0  # sequenceNumber: every message after `connected`
        self.chunk = 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def opening(self) -> list[Sent]:
        sent = [Sent(wire.connected(), "connected")]
        seq = self._next()
        sent.append(Sent(wire.start(seq, self.ids.stream_id, self.ids.call_id, self.ids.account_id), "start",
                         {"seq": seq}))
        return sent

    def media(self, index: int, payload: bytes) -> Sent:
        self.chunk += 1
        seq = self._next()
        timestamp = index * self.line.frame_ms
        return Sent(wire.caller_media(seq, self.ids.stream_id, self.chunk, timestamp, payload), "media",
                    {"seq": seq, "chunk": self.chunk, "timestamp": timestamp})

    def mark_played(self, name: str) -> Sent:
        seq = self._next()
        return Sent(wire.mark_played(seq, self.ids.stream_id, name), "mark", {"seq": seq})

    def closing(self) -> list[Sent]:
        seq = self._next()
        return [Sent(wire.stop(seq, self.ids.stream_id, self.ids.call_id, self.ids.account_id), "stop", {"seq": seq})]

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
