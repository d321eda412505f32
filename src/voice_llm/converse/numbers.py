"""The caller's turn in the core's tables: its key numbers (report.json's ``mouth_to_ear_ms`` median and p90),
registered as ``key_numbers=`` in voice_llm.converse.CAPABILITY, and marked as the report's headline (the caller's
number; dial's heard mouth-to-ear takes the mark when it measures at the caller's ear on a real line). No metric: the metrics' samples are repeats of one
measurement (the noise warning and compare read their spread), and the turns of a call are different lines."""

from __future__ import annotations

from voice_llm.analysis.keynumbers import KeyNumber
from voice_llm.util.artifacts import CONVERSE


def key_numbers() -> tuple[KeyNumber, ...]:
    return (
        KeyNumber("mouth_to_ear_ms", "mouth to ear, median over turns", "ms", CONVERSE,
                  ("summary", "mouth_to_ear_ms", "median"), optional=True, headline="median"),
        KeyNumber("mouth_to_ear_p90_ms", "mouth to ear, p90 over turns", "ms", CONVERSE,
                  ("summary", "mouth_to_ear_ms", "p90"), optional=True, headline="p90"),
    )
