"""Capability: repeated measurements and their spread (checks on the repeats, the report's spread section)."""

from voice_llm.registry import Capability


# What this capability contributes to the core (voice_llm.registry). Field owners while the seam is built:
# steps / cli / commands / options / install: the run-session work; checks / sections / metrics / key_numbers:
# the checks-and-report work.
CAPABILITY = Capability(
    name="repeats",
    summary="repeated measurements: medians over repeats, their checks and the spread section",
)
