"""Calls under load: many voice callers at once, on Locust (master + workers).

Importing this package never imports locust (which monkey-patches the process with gevent): only
``voice_llm.capabilities.load.locust_users`` and ``voice_llm.capabilities.load.sweep`` do, and only Locust's own processes import them.
"""

from __future__ import annotations

from pathlib import Path

from voice_llm.core.registry import Capability, CheckEntry, SectionEntry
from voice_llm.core.util.artifacts import LOAD, LOAD_SAMPLES


def locust_users_path() -> str:
    """The Locust user module's file, for ``locust -f`` (a file path, so locust does not import the package)."""
    return str(Path(__file__).with_name("locust_users.py"))


# What this capability contributes to the core (voice_llm.core.registry).
_CHECKS = "voice_llm.capabilities.load.checks"
CAPABILITY = Capability(
    name="load",
    summary="calls under load on Locust: the load command, its checks and section",
    # dial's OTLP receiver: the agent's spans for every dialing call of a sweep (load --dial --otlp-listen); the
    # agent's settings: what a local agent asks, read from its command line as it reads it (load.proccpu)
    requires=("dial", "agent"),
    checks=tuple(CheckEntry(name, "load", f"{_CHECKS}:{function}", LOAD) for name, function in (
        ("load: every step recomputed from the raw samples", "check_load_matches_samples"),
        ("load: verdict and stop rule follow from the steps", "check_load_verdict"),
        ("load: warm-up dropped, turns in their windows", "check_load_windows"),
        # text callers: ttft <= first sentence <= end; dialing callers: heard gap = first sound - speech end,
        # and a refused or failed turn carries no gap
        ("load: each turn's times in order on one clock", "check_load_turn_order"),
    )),
    # After the core's cancellation section (behind call's, which is registered first, when call is there).
    sections=(SectionEntry("load", "Calls under load: how many callers within the first-sentence budget", LOAD,
                           "voice_llm.capabilities.load.report:load_section", after="cancel", optional=True),),
    artifacts=(LOAD, LOAD_SAMPLES),
    # a dialing sweep's caller's number (its first step's heard gap): the line report.html opens with
    headline="voice_llm.capabilities.load.report:headline",
    commands="voice_llm.capabilities.load.cli:add_commands",
    compare="voice_llm.capabilities.load.compare:compare_load",
    # compare.html's section of two load runs, drawn from what compare_load returned
    compare_sections=(SectionEntry("load", "Calls under load, B against A", None,
                                   "voice_llm.capabilities.load.report:compare_section"),),
)
