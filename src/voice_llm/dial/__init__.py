"""The caller on a real line: ``voice-llm dial URL`` calls a voice agent over a WebSocket (Twilio Media Streams or
binary PCM), plays its audio out in real time through a phone's playout buffer, records what the caller heard and
measures there: the heard gap after each line, barge-in to heard silence, the words heard. The lab's ``converse``
step is dial against voice-llm's own agent on loopback. Heavy libraries are imported by the modules that use them.
"""

from __future__ import annotations

from voice_llm.registry import Capability
from voice_llm.util.artifacts import DIAL, DIAL_DIR, DIAL_PARTIAL

# What this capability contributes to the core (voice_llm.registry).
CAPABILITY = Capability(
    name="dial",
    summary="the caller on a real line: heard mouth-to-ear and barge-in at the caller's ear, for any voice agent",
    requires=("tts",),
    artifacts=(DIAL, DIAL_DIR, DIAL_PARTIAL),
)
