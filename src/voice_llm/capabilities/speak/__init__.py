"""The speak capability: the lab's step that speaks the answer while it streams (time to first audio per
segmenting strategy), its artifact, checks, key numbers and charts, and the TTS flags.

The engine it speaks with is not here: speech out (Piper, espeak-ng, the segmenting strategies, the live and
stoppable pipelines) is the core's voice_llm.engines.speech_out, beside speech in (voice_llm.engines.speech_in), and WAV I/O and
resampling are voice_llm.engines.audio. The agent and the dialer speak through those directly, so speaking pulls in
neither this capability's step nor the lab.
"""

from __future__ import annotations

from voice_llm.core.registry import Capability, CheckEntry, SectionEntry, StepEntry
from voice_llm.core.util.artifacts import AUDIO, AUDIO_DIR
from voice_llm.engines.speech_out.piper import DEFAULT_VOICE_PACKAGE

__all__ = ["CAPABILITY", "TTSOptions", "VOICE_FLAGS"]


# What this capability contributes to the core (voice_llm.core.registry).
_CHECKS = "voice_llm.capabilities.speak.checks"
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
                     "voice_llm.capabilities.speak.report:timeline_chart", after="sentence"),
        SectionEntry("firstaudio", "First audio per segmenting strategy", AUDIO,
                     "voice_llm.capabilities.speak.report:ttfa_chart", after="speak"),
    ),
    metrics="voice_llm.capabilities.speak.numbers:metrics",
    key_numbers="voice_llm.capabilities.speak.numbers:key_numbers",
    artifacts=(AUDIO, AUDIO_DIR),
    steps=(StepEntry("speak", "time to first audio: the answer spoken while it streams", "voice_llm.capabilities.speak.step",
                     (AUDIO,), after="sentence"),),
    cli="voice_llm.capabilities.speak.step:add_flags",
    options="voice_llm.capabilities.speak.step:options_value",
    install="voice_llm.capabilities.speak.step:install",
    installs=f"load the default TTS voice (Piper's {DEFAULT_VOICE_PACKAGE}) once to verify it",
)


# The public face another capability may use: the speak step's TTS settings (--tts, --voice, --clause-words), which
# the agent speaks with and offers as its flags too. Imported last: voice_llm.capabilities.speak.step is loaded with
# this package.
from voice_llm.capabilities.speak.step import VOICE_FLAGS, TTSOptions  # noqa: E402
