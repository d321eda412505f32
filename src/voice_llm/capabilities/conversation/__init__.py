"""Capability: one phone call by one caller (the bundled clinic dialogue with 12 KB documents), cache on and off.

The step (voice_llm.capabilities.conversation.step) runs only when asked, `voice-llm call`, and joins the run in OUT like any step;
its checks (voice_llm.capabilities.conversation.checks) and its report section (voice_llm.capabilities.conversation.report) are registered here, so the
call is checked and drawn whatever else is left out.
"""

from voice_llm.core.registry import Capability, CheckEntry, SectionEntry, StepEntry
from voice_llm.core.util import artifacts as names

_CHECKS = "voice_llm.capabilities.conversation.checks"

CAPABILITY = Capability(
    name="call",
    summary="one call of 6 turns with 12 documents, cache on and off: the call step, its checks and section",
    steps=(StepEntry("call", "one call of 6 turns with 12 documents, cache on and off", "voice_llm.capabilities.conversation.step",
                     (names.CALL,), in_lab=False, reads_kb=True),),
    checks=tuple(CheckEntry(name, "call", f"{_CHECKS}:{function}", names.CALL) for name, function in (
        ("call: ttft <= first sentence <= total", "check_call_order"),
        ("call: both runs send the same growing prompts", "check_call_same_prompts"),
        ("call: the cache keeps later turns fast", "check_call_cache_keeps_turns_fast"),
    )),
    sections=(SectionEntry("call", "One call, six turns: does the cache keep every turn fast?", names.CALL,
                           "voice_llm.capabilities.conversation.report:call_section", after="cancel", optional=True),),
    artifacts=(names.CALL,),
)
