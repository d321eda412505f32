"""Every line the dialer speaks, one framing module each (voice_llm.engines.line.framing's interface): this module imports
them all, so their registrations are made, and makes a call's framing."""

from __future__ import annotations

from voice_llm.engines.line import exotel, pcm, plivo, telnyx, twilio, vonage, webrtc, wire
from voice_llm.engines.line.framing import FRAMINGS, CallIds, Framing

MODULES = (twilio, pcm, telnyx, plivo, exotel, vonage, webrtc)  # imported for their register(): one per wire.PROTOCOLS


def framing_for(line: wire.LineFormat, ids: CallIds | None = None) -> Framing:
    """The caller-side framing of ``line``'s protocol for one call."""
    try:
        cls = FRAMINGS[line.protocol]
    except KeyError:
        raise ValueError(f"no framing for protocol {line.protocol!r}") from None
    return cls(line, ids or CallIds.new())


def capabilities(protocol: str) -> dict[str, bool]:
    """What a protocol's line carries beside audio: marks, clear (docs/line.md "The bridges")."""
    cls = FRAMINGS[protocol]
    return {"marks": cls.marks, "clear": cls.clear}


__all__ = ["MODULES", "capabilities", "framing_for"]
