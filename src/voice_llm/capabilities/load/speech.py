"""How fast the assistant's answers are spoken: from the measured audio when the TTS step ran, else the brief's
2.5 words per second. The callers' think time is built from it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from voice_llm.core.util.artifacts import AUDIO as AUDIO_JSON, read_json
from voice_llm.core.errors import ArtifactError
from voice_llm.capabilities.load.plan import SPEECH_WORDS_PER_S

# audio.json (the `speak` step) records each synthesized segment with its text and the audio's duration.
_DURATION_KEYS = {"audio_ms": 1e-3, "audio_duration_ms": 1e-3, "duration_ms": 1e-3, "audio_s": 1.0,
                  "duration_s": 1.0, "audio_duration_s": 1.0}


def _segments(node: Any) -> Iterator[tuple[str, float]]:
    """Every (text, seconds of audio) pair anywhere in the document."""
    if isinstance(node, dict):
        text = node.get("text")
        if isinstance(text, str):
            for key, scale in _DURATION_KEYS.items():
                value = node.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                    yield text, float(value) * scale
                    break
        for value in node.values():
            yield from _segments(value)
    elif isinstance(node, list):
        for value in node:
            yield from _segments(value)


def answer_speech_rate(out: Path) -> tuple[float, str]:
    """(words per second, where that number comes from)."""
    spoken_words = spoken_s = 0.0
    try:  # read_json: bounded, never a FIFO or link, deep nesting an ArtifactError; the walk below recurses too
        doc = read_json(out / AUDIO_JSON)
        for text, seconds in _segments(doc):
            spoken_words += len(text.split())
            spoken_s += seconds
    except (ArtifactError, RecursionError):
        return SPEECH_WORDS_PER_S, f"default {SPEECH_WORDS_PER_S:g} words/s (no readable {AUDIO_JSON})"
    if spoken_words <= 0 or spoken_s <= 0:
        return SPEECH_WORDS_PER_S, f"default {SPEECH_WORDS_PER_S:g} words/s ({AUDIO_JSON} has no timed segments)"
    return spoken_words / spoken_s, f"{AUDIO_JSON}: {spoken_words:.0f} words in {spoken_s:.1f} s of audio"
