"""Capability: one phone call by one caller (the bundled clinic dialogue with 12 KB documents), cache on and off.

The step (voice_llm.call.step) runs only when asked, `voice-llm call`, and joins the run in OUT like any step.
"""

from voice_llm.registry import Capability, StepEntry
from voice_llm.util import artifacts as names

CAPABILITY = Capability(
    name="call",
    summary="one call of 6 turns with 12 documents, cache on and off: the call step",
    steps=(StepEntry("call", "one call of 6 turns with 12 documents, cache on and off", "voice_llm.call.step",
                     (names.CALL,), in_lab=False, reads_kb=True),),
    artifacts=(names.CALL,),
)
