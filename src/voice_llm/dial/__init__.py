"""The caller on a real line: ``voice-llm dial URL`` calls a voice agent over a WebSocket (Twilio Media Streams or
binary PCM), plays its audio out in real time through a phone's playout buffer, records what the caller heard and
measures there: the heard gap after each line, barge-in to heard silence, the words heard. The lab's ``converse``
step is dial against voice-llm's own agent on loopback. Heavy libraries are imported by the modules that use them.
"""

from __future__ import annotations

from voice_llm.registry import CAPABILITIES, Capability, StepEntry
from voice_llm.util.artifacts import DIAL, DIAL_DIR, DIAL_PARTIAL

# The lab's converse step (dial against voice-llm's agent) replaces the old converse capability's: while that one is
# still registered, its step and its flags keep the name, and dial adds only `dial`. Removing
# "voice_llm.converse" from registry.CAPABILITIES is all it takes to switch (voice_llm.dial.step reads this too).
REPLACES_CONVERSE = "voice_llm.converse" not in CAPABILITIES
CONVERSE_STEP = StepEntry("converse", "the call as heard: dial against voice-llm's agent on loopback",
                          "voice_llm.dial.converse", (DIAL,), after="speak", reads_kb=True)

# What this capability contributes to the core (voice_llm.registry).
CAPABILITY = Capability(
    name="dial",
    summary="the caller on a real line: heard mouth-to-ear and barge-in at the caller's ear, for any voice agent",
    requires=("tts",),
    # `voice-llm dial URL`: a step run alone (not in the lab), asking no LLM server; its URL and flags come from
    # cli=, its settings from options= (voice_llm.dial.step)
    steps=(StepEntry("dial", "a call to a voice agent, measured at the caller's ear", "voice_llm.dial.step",
                     (DIAL,), in_lab=False, needs_server=False),
           # the lab's call: dial against voice-llm's own agent (a subprocess on loopback, on the lab's server)
           *((CONVERSE_STEP,) if REPLACES_CONVERSE else ())),
    cli="voice_llm.dial.step:add_flags",
    options="voice_llm.dial.step:options_value",
    artifacts=(DIAL, DIAL_DIR, DIAL_PARTIAL),
)
