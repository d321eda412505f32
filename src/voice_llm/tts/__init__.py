"""Text to speech for the lab: one small interface (:mod:`voice_llm.tts.engine`) and one module per engine.

The engines' own libraries (piper, onnxruntime) are imported when a voice is loaded, so ``import voice_llm.tts``
stays cheap and the CLI starts fast.
"""

from __future__ import annotations

from voice_llm.registry import Capability, CheckEntry, SectionEntry, StepEntry
from voice_llm.util.artifacts import AUDIO, AUDIO_DIR
from voice_llm.tts.engine import AudioChunk, TTSEngine
from voice_llm.tts.engines import DEFAULT_ENGINE, ENGINES, load_engine
from voice_llm.tts.piper import DEFAULT_VOICE_PACKAGE, PIPER_PACKAGE, PiperEngine, default_voice

__all__ = ["ENGINES", "DEFAULT_ENGINE", "AudioChunk", "TTSEngine", "load_engine", "SAMPLE_WIDTH", "speakable",
           "SpokenSegment", "speak_stoppable", "nothing_to_speak", "DEFAULT_CLAUSE_WORDS", "STRATEGIES", "SpeakOptions", "add_voice_flags",
           "engine_for", "options_from", "AudioPiece", "playback", "PiperEngine", "default_voice",
           "DEFAULT_VOICE_PACKAGE", "PIPER_PACKAGE"]


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


# The public face another capability may use (voice_llm.agent, which requires tts, speaks its replies with the
# speak step's engine, strategies and stoppable pipeline). Imported last: these modules import the names above.
from voice_llm.tts.engine import SAMPLE_WIDTH, speakable  # noqa: E402
from voice_llm.tts.live import SpokenSegment, nothing_to_speak, speak_stoppable  # noqa: E402
from voice_llm.tts.segmenting import DEFAULT_CLAUSE_WORDS, STRATEGIES  # noqa: E402
from voice_llm.tts.step import SpeakOptions, add_voice_flags, engine_for, options_from  # noqa: E402
from voice_llm.tts.timeline import AudioPiece, playback  # noqa: E402
