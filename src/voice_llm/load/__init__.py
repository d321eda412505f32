"""Calls under load: many voice callers at once, on Locust (master + workers).

Importing this package never imports locust (which monkey-patches the process with gevent): only
``voice_llm.load.voice_caller`` and ``voice_llm.load.sweep`` do, and only Locust's own processes import them.
"""

from __future__ import annotations

from voice_llm.registry import Capability

from pathlib import Path


def voice_caller_path() -> str:
    """The Locust user module's file, for ``locust -f`` (a file path, so locust does not import the package)."""
    return str(Path(__file__).with_name("voice_caller.py"))


# What this capability contributes to the core (voice_llm.registry). Field owners while the seam is built:
# steps / cli / commands / options / install: the run-session work; checks / sections / metrics / key_numbers:
# the checks-and-report work.
CAPABILITY = Capability(
    name="load",
    summary="calls under load on Locust: the load command, its checks and section",
)
