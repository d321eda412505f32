"""The caller on a real line: ``voice-llm dial URL`` calls a voice agent over a WebSocket (Twilio Media Streams or
binary PCM), plays its audio out in real time through a phone's playout buffer, records what the caller heard and
measures there: the heard gap after each line, barge-in to heard silence, the words heard. The lab's ``converse``
step is dial against voice-llm's own agent on loopback. Heavy libraries are imported by the modules that use them.
"""

from __future__ import annotations

# The OTLP/HTTP trace receiver and its span-to-turn matching, for another capability that receives an agent's spans
# for many calls at once (load --dial --otlp-listen): standard library only at import.
# dial.json as one type, for another capability that reads a call's file (load --dial's callers)
from voice_llm.capabilities.dial.doc import DialDoc, DialPartialDoc
from voice_llm.capabilities.dial.otlp import RUN_LIMITS as OTLP_RUN_LIMITS, Receiver as OTLPReceiver, Span as OTLPSpan
from voice_llm.capabilities.dial.otlp import clock_for as otlp_clock_for
from voice_llm.capabilities.dial.otlp import match as otlp_match, parse_listen as parse_otlp_listen
from voice_llm.core.registry import Capability, CheckEntry, SectionEntry, StepEntry
from voice_llm.core.util.artifacts import DIAL, DIAL_DIR, DIAL_PARTIAL

# The lab's converse step: dial against voice-llm's agent (it replaced the old in-process converse capability, whose
# self-comparing checks went with it, issue 27 item 7); `voice-llm converse` is the short command for it.
CONVERSE_STEP = StepEntry("converse", "the call as heard: dial against voice-llm's agent on loopback",
                          "voice_llm.capabilities.dial.converse", (DIAL,), after="speak", reads_kb=True,
                          partial=DIAL_PARTIAL)


# --- dial's checks, report sections, key numbers and metrics (D2: dial/checks.py, report.py, numbers.py) -------
_CHECKS = "voice_llm.capabilities.dial.checks"
# The steps that write dial.json get the same checks: `voice-llm dial URL`, and the lab's `converse`.
# tests/dial/test_dial_checks.py holds every dial.json step of this capability to it.
_STEPS = ("dial", "converse")
HEARD_TITLE = "The call as heard: from the end of the caller's speech to the first sound they heard"
WAVE_TITLE = "The call as recorded at the caller's ear (caller left, heard right)"
_DIAL_CHECKS = tuple(CheckEntry(name, step, f"{_CHECKS}:{function}", DIAL) for step in _STEPS for name, function in (
    ("dial: every value in dial.json is possible", "check_values"),
    ("dial: the files in dial/ are exactly those dial.json names", "check_files"),
    ("dial: call.wav holds every frame; its caller channel is the caller WAVs", "check_recording"),
    ("dial: heard gaps re-measured on call.wav = dial.json (one sample)", "check_heard_gaps"),
    ("dial: barge-in heard silence re-measured on call.wav (one sample)", "check_barge_in"),
    ("dial: the caller spoke as scheduled", "check_schedule"),
    ("dial: events in order on the call clock", "check_event_order"),
    ("dial: uplink sequence numbers, chunks and timestamps continuous", "check_uplink"),
    ("dial: nothing heard before it arrived; every clear honoured within a frame", "check_clears"),
    ("dial: marks echoed only after their audio played, or on a clear", "check_marks"),
    ("dial: false barge-ins (the agent cut itself, the caller silent) counted from the files", "check_false_barge_ins"),
    ("dial: cut-offs (the agent heard inside the caller's line) counted from the files", "check_cut_offs"),
    ("dial: summary recomputed from the turns", "check_summary"),
    ("dial: WER recomputed from the agent's transcripts", "check_wer"),
    ("dial: heard minus agent-reported within the line's jitter + 2 frames", "check_agent_reported"),
    ("dial: the dialer kept up with real time", "check_real_time"),
    ("dial: median heard mouth-to-ear within the 1.2 s target", "check_target"),
))
# Only for a folder with a dial call of this run (optional: another run's leftover dial.json is not drawn; the
# waveform, which reads the folder, draws nothing without one): the lab's converse step writes it, `voice-llm dial`
# outside the lab.
_DIAL_SECTIONS = (
    SectionEntry("dial", HEARD_TITLE, DIAL, "voice_llm.capabilities.dial.report:heard_chart", after="firstaudio", optional=True),
    SectionEntry("dial-wave", WAVE_TITLE, None, "voice_llm.capabilities.dial.report:waveform_section", after="dial"),
)
_DIAL_KEY_NUMBERS = "voice_llm.capabilities.dial.numbers:key_numbers"
_DIAL_METRICS = "voice_llm.capabilities.dial.numbers:metrics"
# --- end of D2's part ---------------------------------------------------------------------------------------

# What this capability contributes to the core (voice_llm.core.registry).
CAPABILITY = Capability(
    name="dial",
    summary="the caller on a real line: heard mouth-to-ear and barge-in at the caller's ear, for any voice agent",
    # tts: the caller's lines are spoken with it; agent: the converse step starts voice-llm's agent with its
    # settings (AgentSettings, whose declarations give the lab's and converse's flags for it)
    requires=("tts", "agent"),
    # `voice-llm dial URL`: a step run alone (not in the lab), asking no LLM server; its URL and flags come from
    # cli=, its settings from options= (voice_llm.capabilities.dial.step)
    steps=(StepEntry("dial", "a call to a voice agent, measured at the caller's ear", "voice_llm.capabilities.dial.step",
                     (DIAL,), in_lab=False, needs_server=False, out_dir="dial",
                     partial=DIAL_PARTIAL),
           # the lab's call: dial against voice-llm's own agent (a subprocess on loopback, on the lab's server)
           CONVERSE_STEP),
    cli="voice_llm.capabilities.dial.step:add_flags",
    options="voice_llm.capabilities.dial.step:options_value",
    artifacts=(DIAL, DIAL_DIR, DIAL_PARTIAL),
    checks=_DIAL_CHECKS,
    sections=_DIAL_SECTIONS,
    key_numbers=_DIAL_KEY_NUMBERS,
    metrics=_DIAL_METRICS,
)


# The call's settings, for another capability that places calls (load --dial's callers hand each call its
# DialOptions as JSON: `dial --settings FILE`). Imported last: voice_llm.capabilities.dial.step loads with this
# package (the CLI resolves its flags from it on every start anyway).
from voice_llm.capabilities.dial.step import DialOptions, without_kept_where  # noqa: E402

__all__ = ["CAPABILITY", "CONVERSE_STEP", "DialDoc", "DialOptions", "DialPartialDoc", "OTLP_RUN_LIMITS", "OTLPReceiver",
           "OTLPSpan", "otlp_clock_for", "otlp_match", "parse_otlp_listen", "without_kept_where"]
