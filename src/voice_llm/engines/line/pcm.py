"""Raw PCM: binary WebSocket frames of the line's codec (16-bit little-endian PCM, or mu-law bytes) at its rate,
both ways, and nothing else: no start, no marks, no clear (a barge-in's silence comes when the agent stops sending
and the caller's buffer runs dry)."""

from __future__ import annotations

from voice_llm.engines.line import wire
from voice_llm.engines.line.framing import MEDIA, Framing, Received, Sent, register


def _short(data: str | bytes, n: int = 80) -> str:
    return repr(data[:n]) + ("..." if len(data) > n else "")


@register
class PcmFraming(Framing):
    protocol = wire.PCM
    marks = False
    clear = False

    def media(self, index: int, payload: bytes) -> Sent:
        return Sent(payload, "media", {"frame": index})

    def parse(self, message: str | bytes) -> Received:
        if isinstance(message, str):
            raise wire.LineError(f"a text frame on a PCM line (binary 16-bit frames expected): {_short(message)}")
        return Received(MEDIA, message)

