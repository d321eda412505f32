"""Twilio Media Streams, the caller's side (what Twilio sends): ``connected``, ``start``, ``media`` (sequenceNumber,
chunk, timestamp, base64 mu-law at 8 kHz), ``mark`` echoes, ``stop``; the agent sends ``media``, ``mark`` and
``clear``. https://www.twilio.com/docs/voice/media-streams/websocket-messages (and shared/notes/line.md)."""

from __future__ import annotations

from voice_llm.engines.line import wire
from voice_llm.engines.line.framing import JsonEventFraming, Sent, register


@register
class TwilioFraming(JsonEventFraming):
    protocol = wire.TWILIO

    def opening(self) -> list[Sent]:
        sent = [Sent(wire.connected(), "connected")]
        seq = self._next()
        sent.append(Sent(wire.start(seq, self.ids.stream_id, self.ids.call_id, self.ids.account_id), "start",
                         {"seq": seq}))
        return sent

    def media(self, index: int, payload: bytes) -> Sent:
        chunk, seq = self._next_chunk(), self._next()
        timestamp = index * self.line.frame_ms
        return Sent(wire.caller_media(seq, self.ids.stream_id, chunk, timestamp, payload), "media",
                    {"seq": seq, "chunk": chunk, "timestamp": timestamp})

    def mark_played(self, name: str) -> Sent:
        seq = self._next()
        return Sent(wire.mark_played(seq, self.ids.stream_id, name), "mark", {"seq": seq})

    def closing(self) -> list[Sent]:
        seq = self._next()
        return [Sent(wire.stop(seq, self.ids.stream_id, self.ids.call_id, self.ids.account_id), "stop", {"seq": seq})]
