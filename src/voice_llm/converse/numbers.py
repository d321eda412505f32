"""The caller's turn in the core's tables: its metric (every turn's mouth-to-ear gap, for the spread chart, the
noise warning and compare) and its key numbers (report.json's ``mouth_to_ear_ms`` median and p90). Registered as
``metrics=`` and ``key_numbers=`` in voice_llm.converse.CAPABILITY."""

from __future__ import annotations

from typing import Any

from voice_llm.analysis.keynumbers import KeyNumber
from voice_llm.analysis.metrics import Metric, number
from voice_llm.util.artifacts import CONVERSE


def _mouth_to_ear(doc: Any) -> tuple[float, list[float]]:
    """converse.json: the summary's median and every heard turn's gap (end of caller speech -> first sound)."""
    gaps = [number(turn["gap_ms"]) for turn in doc["turns"] if turn.get("gap_ms") is not None]
    return number(doc["summary"]["mouth_to_ear_ms"]["median"]), gaps


def metrics() -> tuple[Metric, ...]:
    return (Metric("mouth_to_ear_ms", "mouth to ear (end of caller speech -> first sound)", "ms", CONVERSE, True,
                   _mouth_to_ear),)


def key_numbers() -> tuple[KeyNumber, ...]:
    return (
        KeyNumber("mouth_to_ear_ms", "mouth to ear, median over turns", "ms", CONVERSE,
                  ("summary", "mouth_to_ear_ms", "median"), optional=True),
        KeyNumber("mouth_to_ear_p90_ms", "mouth to ear, p90 over turns", "ms", CONVERSE,
                  ("summary", "mouth_to_ear_ms", "p90"), optional=True),
    )
