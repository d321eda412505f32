"""Which TTS engines there are and how one is loaded: the table the speak step, the CLI and the agent share."""

from __future__ import annotations

from pathlib import Path

from voice_llm.core.errors import ConfigError
from voice_llm.engines.speech_out.engine import TTSEngine
from voice_llm.engines.speech_out.espeak import EspeakEngine
from voice_llm.engines.speech_out.piper import PiperEngine  # piper itself is imported when a voice is loaded

DEFAULT_ENGINE = "piper"
ENGINES = ("piper", "espeak")


def load_engine(name: str = DEFAULT_ENGINE, voice: str | Path | None = None,
                deadline_s: float | None = None, threads: int | None = None) -> TTSEngine:
    """Load ``name`` with ``voice`` (a Piper .onnx path, or an espeak-ng voice name; None: the default voice),
    warmed up once so the first measured segment does not pay for loading. ``deadline_s`` bounds each run of an
    engine that is a program of its own (espeak-ng: stopped with its process group when it runs longer); Piper
    runs in this process. ``threads``: Piper's onnxruntime intra-op threads (None: onnxruntime's default, every
    core); espeak-ng is one process of one thread."""
    if name == "piper":
        return PiperEngine(Path(voice).expanduser() if voice else None, threads)
    if name == "espeak":
        return EspeakEngine(str(voice) if voice else None, deadline_s=deadline_s)
    raise ConfigError(f"unknown TTS engine {name!r}; choose one of: {', '.join(ENGINES)}")
