"""The speak step's rows in the core's tables: its metrics (voice_llm.core.analysis.metrics: every sample of the time
to first audio, for the spread chart, the noise warning and compare) and its key numbers (report.json's
``ttfa_<strategy>_ms`` and ``stall_ms_<strategy>``). Registered as ``metrics=`` and ``key_numbers=`` in
voice_llm.capabilities.speak.CAPABILITY, so the core's tables hold no TTS row and lose these when tts is left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from voice_llm.core.analysis.keynumbers import KeyNumber
from voice_llm.core.analysis.metrics import Metric, number
from voice_llm.engines.speech_out.segmenting import STRATEGY_LABELS
from voice_llm.core.util.artifacts import AUDIO


def _ttfa(strategy: str) -> Callable[[Any], tuple[float, list[float]]]:
    """audio.json: a strategy's median time to first audio and its runs' (voice_llm.capabilities.speak.artifact)."""
    def read(doc: Any) -> tuple[float, list[float]]:
        found = doc["strategies"][strategy]
        return number(found["summary"]["ttfa_ms"]["median"]), [number(run["ttfa_ms"]) for run in found["runs"]]
    return read


def metrics() -> tuple[Metric, ...]:
    """What the caller hears first, per strategy; report.json's ttfa_<strategy>_ms are these medians."""
    return tuple(Metric(f"ttfa_{s}_ms", f"first audio, {label}", "ms", AUDIO, True, _ttfa(s))
                 for s, label in STRATEGY_LABELS.items())


def key_numbers() -> tuple[KeyNumber, ...]:
    """Time to first audio and silence after it, medians per strategy (only when audio.json is there)."""
    return (
        *(KeyNumber(f"ttfa_{s}_ms", f"first audio, {label} (median)", "ms", AUDIO,
                    ("strategies", s, "summary", "ttfa_ms", "median"), optional=True)
          for s, label in STRATEGY_LABELS.items()),
        *(KeyNumber(f"stall_ms_{s}", f"silence after first audio, {label} (median)", "ms", AUDIO,
                    ("strategies", s, "summary", "stall_ms", "median"), optional=True)
          for s, label in STRATEGY_LABELS.items()),
    )
