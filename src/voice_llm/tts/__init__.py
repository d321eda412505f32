"""Text to speech for the lab: one small interface (:mod:`voice_llm.tts.engine`) and one module per engine.

The engines' own libraries (piper, onnxruntime) are imported when a voice is loaded, so ``import voice_llm.tts``
stays cheap and the CLI starts fast.
"""

from __future__ import annotations

from pathlib import Path

from voice_llm.errors import ConfigError
from voice_llm.registry import Capability, CheckEntry, SectionEntry, StepEntry
from voice_llm.util.artifacts import AUDIO, AUDIO_DIR
from voice_llm.tts.engine import AudioChunk, TTSEngine
from voice_llm.tts.espeak import EspeakEngine
from voice_llm.tts.piper import PiperEngine  # piper itself is imported when a voice is loaded

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
        return PiperEngine(Path(voice).expanduser() if voice else None)
    if name == "espeak":
        return EspeakEngine(str(voice) if voice else None, deadline_s=deadline_s)
    raise ConfigError(f"unknown TTS engine {name!r}; choose one of: {', '.join(ENGINES)}")


# What this capability contributes to the core (voice_llm.registry).
_CHECKS = "voice_llm.tts.checks"
CAPABILITY = Capability(
    name="tts",
    summary="text to speech: the speak step (time to first audio per segmenting strategy), its checks and charts",
    checks=tuple(CheckEntry(name, "speak", f"{_CHECKS}:{function}", AUDIO) for name, function in (
        ("audio: ttft <= first segment text <= first audio", "check_first_audio_order"),
        ("audio: segments follow from the raw stream", "check_segments_follow_stream"),
        ("audio: timeline and medians follow from the segments", "check_timeline"),
        ("audio: first segment text no later than the whole answer", "check_first_text_before_whole"),
        ("audio: TTFA whole >= TTFA sentences", "check_whole_after_sentences"),
        ("audio: WAVs decode and last as stated", "check_wavs"),
    )),
    sections=(
        SectionEntry("speak", "Time to first audio: what the caller hears", AUDIO,
                     "voice_llm.tts.report:timeline_chart", after="sentence"),
        SectionEntry("firstaudio", "First audio per segmenting strategy", AUDIO,
                     "voice_llm.tts.report:ttfa_chart", after="speak"),
    ),
    metrics="voice_llm.tts.numbers:metrics",
    key_numbers="voice_llm.tts.numbers:key_numbers",
    artifacts=(AUDIO, AUDIO_DIR),
    steps=(StepEntry("speak", "time to first audio: the answer spoken while it streams", "voice_llm.tts.step",
                     (AUDIO,), after="sentence"),),
    cli="voice_llm.tts.step:add_flags",
    options="voice_llm.tts.step:options_value",
    install="voice_llm.tts.step:install",
)
