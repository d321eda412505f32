"""Telnyx media streaming over WebSocket, the caller's side (what Telnyx sends): ``connected``, ``start`` (stream_id,
call_control_id, media_format PCMU 8000), ``media`` (sequence_number, media.chunk/timestamp/payload: base64 mu-law at
8 kHz), ``mark`` echoes, ``stop``; the agent sends ``media`` (media.payload), ``mark`` (mark.name) and ``clear``.
https://developers.telnyx.com/docs/voice/programmable-voice/media-streaming; pipecat's TelnyxFrameSerializer and
its runner's parse_telephony_websocket read exactly these fields (stream_id, start.call_control_id,
start.media_format.encoding)."""

from __future__ import annotations

import base64

from voice_llm.engines.line import wire
from voice_llm.engines.line.framing import JsonEventFraming, Sent, register


@register
class TelnyxFraming(JsonEventFraming):
    protocol = wire.TELNYX

    def opening(self) -> list[Sent]:
        seq = self._next()
        start = {"event": "start", "sequence_number": str(seq), "stream_id": self.ids.stream_id,
                 "start": {"user_id": self.ids.account_id, "call_control_id": self.ids.call_id,
                           "client_state": "", "from": "+15550000001", "to": "+15550000002",
                           "media_format": {"encoding": "PCMU", "sample_rate": self.line.rate, "channels": 1}}}
        return [Sent(wire.dumps({"event": "connected", "version": "1.0.0"}), "connected"),
                Sent(wire.dumps(start), "start", {"seq": seq})]

    def media(self, index: int, payload: bytes) -> Sent:
        chunk, seq = self._next_chunk(), self._next()
        message = {"event": "media", "sequence_number": str(seq), "stream_id": self.ids.stream_id,
                   "media": {"track": "inbound", "chunk": str(chunk), "timestamp": str(index * self.line.frame_ms),
                             "payload": base64.b64encode(payload).decode("ascii")}}
        return Sent(wire.dumps(message), "media", {"seq": seq, "frame": index})

    def mark_played(self, name: str) -> Sent:
        seq = self._next()
        return Sent(wire.dumps({"event": "mark", "sequence_number": str(seq), "stream_id": self.ids.stream_id,
                                "mark": {"name": name}}), "mark", {"seq": seq})

    def closing(self) -> list[Sent]:
        seq = self._next()
        return [Sent(wire.dumps({"event": "stop", "sequence_number": str(seq), "stream_id": self.ids.stream_id,
                                 "stop": {"user_id": self.ids.account_id, "call_control_id": self.ids.call_id}}),
                     "stop", {"seq": seq})]
