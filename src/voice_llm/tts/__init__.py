"""Text to speech for the lab: one small interface (:mod:`voice_llm.tts.engine`) and one module per engine.

Engines are imported when chosen, so ``import voice_llm.tts`` stays cheap and the CLI starts fast.
"""

from __future__ import annotations

from voice_llm.registry import Capability

from pathlib import Path

from voice_llm.errors import ConfigError
from voice_llm.tts.engine import AudioChunk, TTSEngine

__all__ = ["ENGINES", "DEFAULT_ENGINE", "AudioChunk", "TTSEngine", "load_engine"]

DEFAULT_ENGINE = "piper"
ENGINES = ("piper", "espeak")


def load_engine(name: str = DEFAULT_ENGINE, voice: str | Path | None = None,
                deadline_s: float | None = None) -> TTSEngine:
    """Load ``name`` with ``voice`` (a Piper .onnx path, or an espeak-ng voice name; None: the default voice),
    warmed up once so the first measured segment does not pay for loading. ``deadline_s`` bounds each run of an
    engine that is a program of its own (espeak-ng: stopped with its process group when it runs longer); Piper
    runs in this process."""
    if name == "piper":
        from voice_llm.tts.piper import PiperEngine

        return PiperEngine(Path(voice).expanduser() if voice else None)
    if name == "espeak":
        from voice_llm.tts.espeak import EspeakEngine

        return EspeakEngine(str(voice) if voice else None, deadline_s=deadline_s)
    raise ConfigError(f"unknown TTS engine {name!r}; choose one of: {', '.join(ENGINES)}")


# What this capability contributes to the core (voice_llm.registry). Field owners while the seam is built:
# steps / cli / commands / options / install: the run-session work; checks / sections / metrics / key_numbers:
# the checks-and-report work.
CAPABILITY = Capability(
    name="tts",
    summary="text to speech: the speak step (time to first audio per segmenting strategy), its checks and charts",
)
