"""Plivo audio streams over WebSocket, the caller's side (what Plivo sends): ``start`` (start.streamId, callId,
mediaFormat audio/x-mulaw 8000), ``media`` (sequenceNumber, media.track/timestamp/chunk/payload: base64 mu-law at
8 kHz), ``playedStream`` when the audio before a checkpoint has played, ``clearedAudio`` after a clear, ``stop``;
the agent sends ``playAudio`` (media.payload), ``checkpoint`` (name) and ``clearAudio``.
https://www.plivo.com/docs/voice/xml/the-stream-element and .../concepts/audio-streaming; pipecat's
PlivoFrameSerializer and parse_telephony_websocket read start.streamId and start.callId."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from voice_llm.engines.line import wire
from voice_llm.engines.line.framing import CLEAR, MARK, MEDIA, JsonEventFraming, Sent, register


@register
class PlivoFraming(JsonEventFraming):
    protocol = wire.PLIVO

    first_seq = 0  # sequenceNumber: from 0, every message the caller's side sends
    agent_events = {"playAudio": MEDIA, "checkpoint": MARK, "clearAudio": CLEAR}

    def opening(self) -> list[Sent]:
        seq = self._next()
        start = {"event": "start", "sequenceNumber": seq,
                 "start": {"callId": self.ids.call_id, "streamId": self.ids.stream_id,
                           "accountId": self.ids.account_id, "tracks": ["inbound"],
                           "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": self.line.rate}}}
        return [Sent(wire.dumps(start), "start", {"seq": seq})]

    def media(self, index: int, payload: bytes) -> Sent:
        chunk, seq = self._next_chunk(), self._next()
        message = {"event": "media", "sequenceNumber": seq, "streamId": self.ids.stream_id,
                   "media": {"track": "inbound", "timestamp": str(index * self.line.frame_ms), "chunk": chunk,
                             "payload": base64.b64encode(payload).decode("ascii")}}
        return Sent(wire.dumps(message), "media", {"seq": seq, "frame": index})

    def mark_played(self, name: str) -> Sent:
        seq = self._next()
        return Sent(wire.dumps({"event": "playedStream", "sequenceNumber": seq, "streamId": self.ids.stream_id,
                                "name": name}), "mark", {"seq": seq})

    def cleared(self) -> Sent:
        seq = self._next()
        return Sent(wire.dumps({"event": "clearedAudio", "sequenceNumber": seq, "streamId": self.ids.stream_id}),
                    "cleared", {"seq": seq})

    def closing(self) -> list[Sent]:
        seq = self._next()
        return [Sent(wire.dumps({"event": "stop", "sequenceNumber": seq, "streamId": self.ids.stream_id,
                                 "stop": {"callId": self.ids.call_id}}), "stop", {"seq": seq})]

    def mark_name(self, message: Mapping[str, Any]) -> str:
        """A checkpoint's name is top-level (``name``), not mark.name."""
        name = message.get("name")
        if not isinstance(name, str):
            raise wire.LineError("a checkpoint message without a name")
        return name
