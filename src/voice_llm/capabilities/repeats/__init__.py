"""Capability: repeated measurements and their spread (checks on the repeats, the report's spread section)."""

from voice_llm.core.registry import Capability, CheckEntry, SectionEntry

_CHECKS = "voice_llm.capabilities.repeats.checks"


# What this capability contributes to the core (voice_llm.core.registry).
CAPABILITY = Capability(
    name="repeats",
    summary="repeated measurements: medians over repeats, their checks and the spread section",
    # Each with the core step whose repeats it reads.
    checks=tuple(CheckEntry(name, step, f"{_CHECKS}:{function}") for name, step, function in (
        ("prefill repeats: medians, prompt_n grows in each", "prefill", "check_prefill_repeats"),
        ("cache repeats: medians, hit and miss in each", "cache", "check_cache_repeats"),
        ("sentence repeats: medians, order in each", "sentence", "check_sentence_repeats"),
        ("cancel repeats: median idle, each a cut", "cancel", "check_cancel_repeats"),
    )),
    # Drawn from every metric of the folder (artifact None: the builder takes the RunFolder), after the others.
    sections=(SectionEntry("spread", "Spread over repeats", None, "voice_llm.capabilities.repeats.report:spread_section"),),
)
