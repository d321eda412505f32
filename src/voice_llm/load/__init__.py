"""Calls under load: many voice callers at once, on Locust (master + workers).

Importing this package never imports locust (which monkey-patches the process with gevent): only
``voice_llm.load.voice_caller`` and ``voice_llm.load.sweep`` do, and only Locust's own processes import them.
"""

from __future__ import annotations

from pathlib import Path


def voice_caller_path() -> str:
    """The Locust user module's file, for ``locust -f`` (a file path, so locust does not import the package)."""
    return str(Path(__file__).with_name("voice_caller.py"))
