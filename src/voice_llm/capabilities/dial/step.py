"""`voice-llm dial URL`: one call to a voice agent, measured at the caller's ear, into OUT.

A step of the dial capability run alone (``in_lab=False``, ``needs_server=False``): it goes through the one run
session like every step (OUT's lock, run.json, the manifest; voice_llm.core.lab.pipeline.run_steps) and asks no LLM
server. Its flags (the URL among them) come from :func:`add_flags` (the capability's ``cli=``), its settings from
:func:`options_value` (``options=``).

Before the call everything that can fail without the agent is done (the caller's lines synthesized or loaded,
the STT loaded): such a failure writes nothing. The call itself writes only its live recording, under a temporary
name in dial/; at the end, when the call went through: the measurements (the heard replies transcribed), the caller
WAVs, dial/events.jsonl, dial/call.wav, and dial.json last. When the call failed: dial/partial-call.wav (a valid
WAV of what was sent and heard until then), dial/partial-events.jsonl and dial-partial.json, beside the earlier
dial.json and its files, which stay as they were; then the error, one line.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from voice_llm.capabilities.agent import AgentSettings
from voice_llm.core.errors import ArtifactError, ConfigError, OutputDirError
from voice_llm.core.run import flags
from voice_llm.core.run.flags import Between, Each, OneOf, Satisfies, setting
from voice_llm.core.run.context import LabContext
from voice_llm.engines.line import wire
from voice_llm.engines.line.playout import DEFAULT_CAP_S, DEFAULT_JITTER_MS
from voice_llm.core.run.meta import SCHEMA_VERSION as RUN_SCHEMA_VERSION, OtherRunError
from voice_llm.core.run.session import same_url
from voice_llm.capabilities.dial import call as callmod, otlp, webrtc
from voice_llm.capabilities.dial.doc import (DIAL_SCHEMA_VERSION, Agent, AgentReported, BargeIn, CutOff, DialDoc, DialerCost,
                                FalseBargeIn, Files, Floor, Heard as HeardDoc, Line, Otlp, Playout, Settings, Spread,
                                Summary, Turn, TurnCaller, Wer)
from voice_llm.capabilities.dial.call import CallLog, CallSettings, DialError, LiveRecording, run_call
from voice_llm.engines.audio.resampling import to_rate
from voice_llm.engines.audio.wav import wav_bytes
from voice_llm.capabilities.dial.caller_lines import (LOAD_LINES, PAUSE_LINES, PAUSE_MS, CallerLine, CallerVoice, load_lines, on_line,
                                   synthesize_lines, synthesize_paused)
from voice_llm.capabilities.dial.measure import (BARGE_SILENCE_RULE, CUT_OFF_RULE, FALSE_BARGE_IN_RULE, FLOOR_RULE,
                                    LATE_TICK_RULE, SILENT_AFTER_MS, TALKED_OVER_RULE, Heard, at_sample,
                                    heard_channel, late_tick_frames, ms, near_late_tick, reply_silent_from,
                                    summary_of)
from voice_llm.engines.line.playout import jitter_frames
from voice_llm.core.scenario.dialogue import DEFAULT_DIALOGUE, load_dialogue
from voice_llm.engines.speech_in.caller_audio import SAMPLE_RATE, select_turns
from voice_llm.engines.speech_in.wer import wer as word_errors
from voice_llm.engines.speech_in.stt import (DEFAULT_HEARD_STT, HEARD_STT_CHOICES, STTError, default_threads,
                                             load_transcriber)
from voice_llm.core.util.artifacts import DIAL, DIAL_DIR, DIAL_PARTIAL, jsonl_bytes, read_json, write_bytes_atomic, write_json

NAME = "dial"  # the capability's name (StepOptions.plugins key)
DEFAULT_TURNS = 4
CALL_WAV = f"{DIAL_DIR}/call.wav"
PARTIAL_CALL_WAV = f"{DIAL_DIR}/partial-call.wav"
EVENTS = f"{DIAL_DIR}/events.jsonl"
PARTIAL_EVENTS = f"{DIAL_DIR}/partial-events.jsonl"
CLOCK = ("ms since the call started: 0 is sample 0 of dial/call.wav (both channels), the start of the first uplink "
         "frame; t0_epoch_ns is the wall time (time.time_ns) of that instant; events carry the time they happened "
         "(perf_counter), ticks their frame index (frame k plays at k * frame_ms)")
LINE_CONDITIONS = ("loss: each direction its own seeded stream (numpy PCG64 of [seed, 0 up | 1 down]), one "
                   "decision per 20 ms frame: a lost uplink frame keeps its sequenceNumber/chunk/timestamp and is not "
                   "sent (the agent sees the gap; events: up 'lost'); a lost downlink 20 ms of received audio is "
                   "removed before the playout buffer (events: down 'lost'). call.wav's left channel is what the "
                   "caller put on the line, lost frames included. echo: left = codec(clip(caller + "
                   "rint(heard 60 ms earlier x 10^(echo_db/20))))")
HEARD_PAD_MS = 100.0  # audio kept around a reply for its transcription (Whisper hears the word edges)
# --caller-lines: what the synthesized caller says. clinic: the dialogue's lines (default); pause: a sentence with
# a planned mid-sentence pause of caller.PAUSE_MS, then one ordinary line (caller.PAUSE_LINES): cut-offs
CLINIC_LINES = "clinic"
PAUSE = "pause"
LOAD = "load"  # short clinic questions (caller.LOAD_LINES): many turns a minute, for load --dial
CALLER_LINES = (CLINIC_LINES, PAUSE, LOAD)
MAX_JITTER_MS = 1000.0  # a phone's jitter buffer; more is a typo (a 100 s buffer is no phone's)


def caller_wav_name(index: int) -> str:
    return f"{DIAL_DIR}/caller-{index:02d}.wav"


def _otlp_listen_refusal(text: str) -> str | None:
    """Why --otlp is no place to listen: HOST:PORT, or the agent's --otlp form http://HOST:PORT (one value works
    for both commands)."""
    try:
        otlp.parse_listen(text)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class DialOptions:
    """The call's settings, each declared once (voice_llm.core.run.flags.setting): `dial`'s flags, and the caller's
    and the line's of `converse` and the lab (add_flags), are derived from them. ``agent``: the settings of
    voice-llm's own agent the converse step starts (None: `dial` calls someone else's)."""

    url: str | None = setting(None, name="url", metavar="URL",
                              help="the agent's WebSocket: ws://HOST:PORT/PATH (or wss://); for --protocol webrtc its "
                                   "offer URL, http://HOST:PORT/api/offer (default: the --settings file's url)")
    protocol: str = setting(wire.TWILIO, rule=OneOf(wire.PROTOCOLS),
                            help=f"{wire.protocols_said()} (the phone bridges: docs/line.md \"The bridges\"; webrtc, "
                                 "the webrtc extra: docs/line.md \"WebRTC\") (default {default})")
    # pcm only; None: wire.DEFAULT_PCM_RATE
    rate: int | None = setting(None, metavar="HZ", rule=Between(1),
                               help=f"the PCM line's sample rate (default {wire.DEFAULT_PCM_RATE}; twilio is always "
                                    f"{wire.TWILIO_RATE})")
    # pcm only (pcm16 default, or mulaw bytes); a Twilio line is mu-law, always
    codec: str | None = setting(None, rule=OneOf(wire.CODECS),
                                help="the PCM line's samples: pcm16 (default) or mulaw (8-bit G.711 bytes); twilio is "
                                     "mu-law")
    # frames lost both ways, seeded (voice_llm.engines.line.conditions)
    loss_pct: float = setting(0.0, name="--loss", metavar="PCT", rule=Between(0, 100, unit="%"),
                              help="frames lost on the line, both ways, seeded (0-100 %; default {default})")
    seed: int = setting(1, metavar="N", rule=Between(0),
                        help="the seed of the line's losses (default {default}: the same seed loses the same frames)")
    # the heard audio back into the uplink 60 ms later, attenuated (None: off)
    echo_db: float | None = setting(None, metavar="DB", rule=Between(-120, 0, unit="dB"),
                                    help="a speakerphone with no echo canceller: the heard audio back into the "
                                         "caller's uplink 60 ms later, attenuated by DB (e.g. -20; default off)")
    jitter_ms: float = setting(DEFAULT_JITTER_MS, metavar="MS", rule=Between(0, MAX_JITTER_MS, unit="ms"),
                               help="the phone's jitter delay before playout starts from idle (default {default})")
    cap_s: float = DEFAULT_CAP_S
    caller_audio: Path | None = setting(None, metavar="DIR",
                                        help="the caller's own WAVs, one per turn in name order (default: the clinic "
                                             "lines, Piper)")
    # the synthesized lines: the dialogue's (clinic), the pause lines or the load lines
    caller_lines: str = setting(CLINIC_LINES, rule=OneOf(CALLER_LINES),
                                help=f"the synthesized caller's lines: clinic (the dialogue's), pause (a sentence with "
                                     f"a {PAUSE_MS:g} ms pause mid-sentence, then one ordinary line: counts cut-offs) "
                                     f"or load ({len(LOAD_LINES)} short clinic questions, about a second each: load "
                                     "--dial's callers) (default {default})")
    dialogue: str = DEFAULT_DIALOGUE
    turns: int = setting(DEFAULT_TURNS, metavar="N", rule=Between(1),
                         help="how many caller lines (default {default}; with --caller-audio every WAV)")
    deadline_s: float = setting(callmod.DEFAULT_DEADLINE_S, name="--deadline", metavar="S", rule=flags.SECONDS,
                                help="the longest wait for anything: the handshake, a reply, a reply's end, the "
                                     f"caller's pause (default {{default}}, at most {flags.MAX_SECONDS:.0f})")
    reply_wait_s: float | None = setting(None, name="--reply-wait", metavar="S", rule=Between(0, above=True),
                                         help="a turn with no heard reply within S s fails the call (default: "
                                              "--deadline)")
    barge_in_turns: tuple[int, ...] = setting(callmod.DEFAULT_BARGE_IN_TURNS, metavar="LIST",
                                              rule=Each(Between(1)),
                                              help="turns whose reply the caller cuts into with the next line "
                                                   "(default {default}, with --caller-audio its barge-in.txt if any; "
                                                   "'none')")
    # Whether --turns / --barge-in-turns were given: with --caller-audio, the user's folder decides otherwise
    # (every WAV; its barge-in.txt), and what does not fit is said (speech.caller.select_turns)
    turns_given: bool = False
    barge_in_given: bool = False
    barge_in_after_ms: float = callmod.BARGE_IN_AFTER_MS
    think_ms: float = setting(callmod.THINK_MS, metavar="MS", rule=Between(0),
                              help="the caller's pause after a reply ended before the next line (default {default})")
    # plus this share of the heard reply (callmod.CallSettings.think_share)
    think_share: float = setting(0.0, metavar="X", rule=Between(0),
                                 help="plus X times the reply's heard length (first to last sound): a longer reply, a "
                                      "longer pause (default {default}; load --dial's callers use 0.1)")
    lead_ms: float = callmod.LEAD_MS
    reply_end_ms: float = setting(callmod.REPLY_END_MS, metavar="MS", rule=Between(0, above=True),
                                  help="the reply has ended when the caller has heard silence this long and nothing "
                                       "is buffered (default {default}); an agent whose replies pause longer "
                                       "mid-reply (a slow machine, sentence-by-sentence synthesis) is otherwise "
                                       "talked over")
    # What transcribes the heard replies: faster-whisper (the words heard before a barge-in's silence need its word
    # times; Moonshine has none), or none. (converse: none when the agent's --stt is none)
    stt: str = setting(DEFAULT_HEARD_STT, rule=OneOf(HEARD_STT_CHOICES),
                       help="transcribe the heard replies with faster-whisper tiny.en (default: it gives the word "
                            "times the words heard need), or none")
    stt_threads: int | None = setting(None, metavar="N", rule=Between(1),
                                      help="faster-whisper's CPU threads (default: every core)")
    # HOST:PORT of the OTLP/HTTP receiver to start for the call (voice_llm.capabilities.dial.otlp)
    otlp: str | None = setting(None, metavar="HOST:PORT", rule=Satisfies(_otlp_listen_refusal, "HOST:PORT"),
                               help="receive the agent's OTLP/HTTP traces here during the call (its own latency per "
                                    "turn); also the agent's --otlp form, http://HOST:PORT")
    agent: AgentSettings | None = None  # converse and the lab: voice-llm's own agent, started for the call

    def __post_init__(self) -> None:
        flags.check(self)
        if self.protocol == wire.TWILIO and self.rate not in (None, wire.TWILIO_RATE):
            raise ConfigError(f"a Twilio line carries {wire.TWILIO_RATE} Hz mu-law; --rate {self.rate} is for "
                              "--protocol pcm")
        if self.protocol in (*wire.BRIDGES, wire.WEBRTC) and (self.rate, self.codec) != (None, None):
            codec, rate = wire.FIXED_FORMATS[self.protocol]
            carries = (f"Opus (as negotiated), played as {codec} at {rate} Hz" if self.protocol == wire.WEBRTC
                       else f"{codec} at {rate} Hz")
            raise ConfigError(f"a {self.protocol} line carries {carries}; --rate and --codec are for --protocol pcm")
        if self.protocol == wire.TWILIO and self.codec not in (None, wire.MULAW):
            raise ConfigError(f"a Twilio line carries mu-law only (Media Streams' audio/x-mulaw); --codec "
                              f"{self.codec} is for --protocol pcm")
        if self.caller_lines != CLINIC_LINES and self.caller_audio is not None:
            raise ConfigError(f"--caller-lines {self.caller_lines} is synthesized; --caller-audio brings the "
                              "caller's own lines: one or the other")
        # --deadline is the longest wait for anything: a wait the caller is told to make that is longer could never
        # end within it (--think-ms 1e12 ran forever under --deadline 10)
        for flag, wait_s in (("--think-ms", self.think_ms / 1000.0), ("--reply-end-ms", self.reply_end_ms / 1000.0),
                             ("--reply-wait", self.reply_wait_s)):
            if wait_s is not None and wait_s > self.deadline_s:
                raise ConfigError(f"{flag} waits {wait_s:g} s, longer than --deadline {self.deadline_s:g} s (the "
                                  "longest wait for anything)")
        if self.url is not None:
            parts = urllib.parse.urlsplit(self.url)
            if self.protocol == wire.WEBRTC:
                webrtc.check_url(self.url)
            elif parts.scheme.lower() not in ("ws", "wss"):
                more = " (an http:// offer URL is for --protocol webrtc)" if parts.scheme.lower() in ("http", "https") \
                    else ""
                raise ConfigError(f"the agent's URL must be ws:// or wss://, not {self.url!r}{more}")
            try:
                port = parts.port
            except ValueError:
                raise ConfigError(f"the agent's URL has no valid port: {self.url!r}") from None
            if port == 0:  # what `agent --listen HOST:0` asked for, not where it listens: its ready line says that
                raise ConfigError(f"port 0 in {self.url!r} is no agent's address: dial the port the agent's ready "
                                  "line names")
        try:
            self.line_format()
        except ValueError as exc:
            raise ConfigError(f"--rate: {exc}") from exc

    def line_format(self) -> wire.LineFormat:
        return wire.line_for(self.protocol, self.rate, self.codec)

    def call_settings(self, url: str) -> CallSettings:
        return CallSettings(url=url, line=self.line_format(), jitter_ms=self.jitter_ms, cap_s=self.cap_s,
                            deadline_s=self.deadline_s, reply_wait_s=self.reply_wait_s, lead_ms=self.lead_ms,
                            think_ms=self.think_ms, think_share=self.think_share,
                            reply_end_ms=self.reply_end_ms,
                            barge_in_turns=self.barge_in_turns, barge_in_after_ms=self.barge_in_after_ms,
                            loss_pct=self.loss_pct, seed=self.seed, echo_db=self.echo_db)


def options_of(ctx: LabContext) -> DialOptions:
    return ctx.options.plugin(NAME, DialOptions())


# --- the flags: derived from the settings' declarations (DialOptions here, AgentSettings for the agent) ------------

# Whose lines the caller speaks: `dial`, `converse` and the lab.
CALLER_FLAGS = flags.flags_of(DialOptions, ("caller_audio", "caller_lines", "turns"))
# The phone's side of the line and the call's barge-in plan: `dial` and `converse` (the lab keeps the defaults).
LINE_FLAGS = flags.flags_of(DialOptions, ("jitter_ms", "barge_in_turns", "loss_pct", "seed", "echo_db"))
# How the caller waits: `dial`.
WAIT_FLAGS = flags.flags_of(DialOptions, ("reply_wait_s", "reply_end_ms", "think_ms", "think_share"))
# `dial`'s own: the agent's URL, the line's format, the call's deadline, its traces and the heard replies' STT.
DIAL_FLAGS = flags.flags_of(DialOptions, ("url", "protocol", "rate", "codec", "deadline_s", "otlp", "stt",
                                          "stt_threads"))
# voice-llm's agent as the lab's and converse's call starts it: its own flags (agent --help), the same declarations;
# its --max-tokens is --reply-max-tokens here (the lab has no other --max-tokens, load's is the callers' own)
AGENT_FLAGS = flags.flags_of(AgentSettings, ("endpoint_ms", "stt", "stt_threads", "strategy", "max_tokens"),
                             max_tokens="--reply-max-tokens")
# converse's line is the agent's: it serves the protocol and the rate the caller dials with
AGENT_LINE_FLAGS = flags.flags_of(AgentSettings, ("protocol", "rate"))
CONVERSE_COMMANDS = frozenset({"lab", "converse"})
# (the parser keeps a description's line breaks: wrapped here for the help and docs/cli.md)
CONVERSE_HELP = textwrap.fill(
    "The agent's flags here are `voice-llm agent`'s own, for the agent this call starts. The caller hears every "
    "reply to its end, so --reply-max-tokens sets most of the call's length; with --stt none the heard replies are "
    "not transcribed either (faster-whisper transcribes them: it gives word times).", 96)


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The capability's ``cli=``: `dial`'s flags (the agent's URL, the line, the caller), and the lab's and the
    converse step's (voice-llm's agent and the caller)."""
    if command in CONVERSE_COMMANDS:
        group = parser.add_argument_group("the call through voice-llm's agent (converse: dial + agent on loopback)",
                                          CONVERSE_HELP)
        AGENT_FLAGS.add(group)
        CALLER_FLAGS.add(group)
        if command == "converse":
            AGENT_LINE_FLAGS.add(group)
            LINE_FLAGS.add(group)
    elif command == "dial":
        DIAL_FLAGS.add(parser)
        parser.add_argument("--settings", type=flags.path, default=None, metavar="FILE",
                            help="start from these settings, a JSON object of DialOptions' fields by name (what load "
                                 "--dial's callers hand each call); each flag given beside it wins over the file")
        group = parser.add_argument_group("the caller (dial)")
        for caller in (CALLER_FLAGS, LINE_FLAGS, WAIT_FLAGS):
            caller.add(group)


def _asked(field: str, marker: str, from_file: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
    """Whether ``field`` (--turns, --barge-in-turns) was asked for, which with --caller-audio decides over the user's
    folder: by its flag, or by the settings file, which says so in ``marker`` when it was written from DialOptions
    (every field is there then) and otherwise by naming the field."""
    return field in given or bool(from_file.get(marker, field in from_file))


def options_value(values: Mapping[str, Any]) -> DialOptions | None:
    """The dial options from a command's flags; None for a command that has none of them. `dial`'s: its declared
    defaults, then its --settings file, then the flags given (a flag beside the file wins)."""
    command = values.get("command")
    if command != "dial" and command not in CONVERSE_COMMANDS:
        return None
    given = {**CALLER_FLAGS.given(values), **LINE_FLAGS.given(values)}
    from_file: dict[str, Any] = {}
    if command == "dial":
        given |= {**DIAL_FLAGS.given(values), **WAIT_FLAGS.given(values)}
        if values.get("settings") is not None:
            from_file = flags.read_settings(DialOptions, values["settings"])
    else:
        agent = flags.build(AgentSettings, AGENT_FLAGS.given(values), AGENT_LINE_FLAGS.given(values))
        line = agent.line
        given |= {"agent": agent, "protocol": line.protocol, "rate": line.rate if line.protocol == wire.PCM else None,
                  "stt": "none" if agent.stt == "none" else DEFAULT_HEARD_STT}
        if values.get("deadline") is not None:  # the lab's and converse's --deadline, a request's: the call's too
            given["deadline_s"] = values["deadline"]
    options: DialOptions = flags.build(DialOptions, from_file, given, {
        "turns_given": _asked("turns", "turns_given", from_file, given),
        "barge_in_given": _asked("barge_in_turns", "barge_in_given", from_file, given)})
    if command == "dial" and options.url is None:  # a usage error, as the URL's absence was argparse's
        raise ConfigError("dial needs the agent's URL: voice-llm dial ws://HOST:PORT/PATH, or a --settings file "
                          "that names it (url)")
    return options


# --- the caller's lines -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    lines: tuple[CallerLine, ...]
    voice: CallerVoice | None
    source: str
    dialogue: str | None  # the bundled script the lines are; None: the user's own audio
    barge_in_turns: tuple[int, ...] | None = None  # None: the options' (--barge-in-turns)
    notes: tuple[str, ...] = ()  # what the user's folder changed about the call, one line each (also on stderr)
    folder: Mapping[str, Any] | None = None  # the user's folder as loaded (speech.caller.CallerAudio.as_dict)
    lines_set: str | None = None  # --caller-lines (clinic, pause); None: the user's own audio
    pause_ms: float | None = None  # the planned pause of the pause lines (caller.PAUSE_MS)

    def as_dict(self) -> dict[str, Any]:
        """dial.json's caller block; a planned pause per turn as [start_ms, end_ms] in its caller WAV (the silent
        run it is as sent; turns[].caller.pauses_ms has it on the call clock)."""
        return {"source": self.source, "voice": self.voice.as_dict() if self.voice else None,
                "script": self.dialogue, "folder": self.folder, "notes": list(self.notes), "lines": self.lines_set,
                "pause_ms": self.pause_ms,
                "pauses_ms": [[[ms(a, ln.rate), ms(b, ln.rate)] for a, b in ln.pauses] for ln in self.lines]}


def caller_lines(options: DialOptions) -> Caller:
    """The call's caller lines on the line (before the call: a bad folder is an error before anything is written).
    The user's own audio is scored against the user's own transcripts only (never the bundled script's lines), and
    its turn count and barge-in plan come from the folder unless the flags say otherwise."""
    line = options.line_format()
    if options.caller_audio is not None:
        audio = load_lines(options.caller_audio)
        picked = select_turns(audio, options.turns if options.turns_given else None,
                              options.barge_in_turns if options.barge_in_given else None,
                              default_turns=DEFAULT_TURNS, default_barge_in=callmod.DEFAULT_BARGE_IN_TURNS)
        return Caller(tuple(on_line(u, line) for u in picked.utterances), None, str(options.caller_audio), None,
                      picked.barge_in_turns, picked.notes, audio.as_dict())
    if options.caller_lines == PAUSE:
        # no barge-in unless asked for (--barge-in-turns): the pause lines measure cut-offs, not barge-ins
        count = min(options.turns, len(PAUSE_LINES)) if options.turns_given else len(PAUSE_LINES)
        utterances, pauses, voice = synthesize_paused(PAUSE_LINES[:count], PAUSE_MS)
        barge = tuple(t for t in options.barge_in_turns if t < count) if options.barge_in_given else ()
        notes = () if options.barge_in_given else (f"--caller-lines {PAUSE}: no barge-in (--barge-in-turns to plan one)",)
        return Caller(tuple(on_line(u, line, p) for u, p in zip(utterances, pauses)), voice, "synthesized", PAUSE,
                      barge, notes, lines_set=PAUSE, pause_ms=PAUSE_MS)
    if options.caller_lines == LOAD:
        if options.turns > len(LOAD_LINES):
            raise ConfigError(f"--caller-lines {LOAD} has {len(LOAD_LINES)} lines; --turns {options.turns} is more")
        utterances, voice = synthesize_lines(LOAD_LINES[:options.turns])
        return Caller(tuple(on_line(u, line) for u in utterances), voice, "synthesized", LOAD, lines_set=LOAD)
    dialogue = load_dialogue(options.dialogue)
    utterances, voice = synthesize_lines(dialogue.turns[:options.turns])
    # A barge-in on turn N is line N+1 cutting into reply N: on the last line (or past it) there is none to cut in
    # with, so fewer lines than the plan needs drop it, and say so (settings.barge_in_turns names only real ones).
    barge = tuple(t for t in options.barge_in_turns if t < len(utterances))
    dropped = [t for t in options.barge_in_turns if t not in barge]
    notes = (f"{len(utterances)} caller lines: no barge-in on turn {', '.join(map(str, dropped))} (it needs the next "
             "line to cut in with)",) if dropped else ()
    return Caller(tuple(on_line(u, line) for u in utterances), voice, "synthesized", dialogue.name, barge, notes,
                  lines_set=CLINIC_LINES)


# --- measuring at the ear -----------------------------------------------------------------------------------------


class _Unknown:
    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}

    def __call__(self, key: str, reason: str) -> None:
        self.reasons[key] = reason


def _transcribe(stt: Any, samples: Any, rate: int) -> str | None:
    if stt is None or len(samples) == 0:
        return None
    return stt.transcribe(to_rate(samples, rate, SAMPLE_RATE), "")


def _words(stt: Any, samples: Any, rate: int, until_s: float) -> list[str] | None:
    """The words heard: faster-whisper's words whose end is not after ``until_s`` (the heard silence)."""
    if stt is None or not hasattr(stt, "words"):
        return None
    if len(samples) == 0:
        return []
    # a word counts when it was heard to its end (20 ms of rounding: Whisper's word times are 20 ms steps);
    # punctuation Whisper emits as a word of its own is no word
    return [w for start, end, w in stt.words(to_rate(samples, rate, SAMPLE_RATE))
            if end <= until_s + 0.02 and any(ch.isalnum() for ch in w)]


def _caller_silent(speech: Sequence[tuple[int, int]], start: int, end: int) -> bool:
    return not any(s < end and e > start for s, e in speech)


def _false_barge_in(heard: Heard, clears: Sequence[tuple[float, float]], arrivals: Sequence[float],
                    idles: Sequence[float], speech: Sequence[tuple[int, int]], end: int, next_start: int,
                    first: int | None, hold: int, rate: int, frame_ms: float) -> dict[str, Any] | None:
    """The agent cut its own reply while the caller was silent (issue 29 item 4; FALSE_BARGE_IN_RULE), inside this
    turn's reply: from the first audio that arrived after the caller's speech end (the reply on the line) to the
    next line's speech start. Either a `clear` that dropped audio, or the agent's audio stopping (the playout
    buffer ran dry: ``idles``, the call-clock times of the frames after which it did; a pause inside the audio it
    sent is not a stop) with the heard channel silent for ``hold`` (200 ms) and sounding again, with no caller speech from the reply's start to the cut (the caller's speech is
    its lines' true spans: an echo of the agent is no caller speech). A clear caused by the next line comes after
    its speech start: the barge-in's, not this."""
    end_ms = end * 1000.0 / rate
    reply_ms = next((t for t in arrivals if t >= end_ms), None)
    if reply_ms is not None:
        for t_ms, dropped in clears:
            at = round(t_ms * rate / 1000)
            if reply_ms <= t_ms and at < next_start and dropped > 0 and \
                    _caller_silent(speech, round(reply_ms * rate / 1000), at + 1):
                return {"kind": "clear", "t_ms": t_ms, "dropped_ms": dropped}
    if first is None:
        return None
    loud = heard.loud(first, next_start)
    if loud.size < 2:
        return None
    for i in np.flatnonzero(np.diff(loud) - 1 >= hold):
        stop, resumed = int(loud[i]) + 1, int(loud[i + 1])
        ran_dry = any(stop * 1000.0 / rate - frame_ms - 1e-6 <= t <= resumed * 1000.0 / rate for t in idles)
        if ran_dry and _caller_silent(speech, first, resumed + 1):
            return {"kind": "stopped", "silent_ms": ms(stop, rate), "resumed_ms": ms(resumed, rate)}
    return None


def _cut_off(heard: Heard, start: int, end: int, previous: Mapping[str, Any] | None, rate: int, key: str,
             unknown: _Unknown) -> dict[str, Any] | None:
    """The agent talking while the caller is mid-utterance (CUT_OFF_RULE): the first heard sound in the caller's
    own speech span [start, end) (samples), a pause inside the line included. On a line that barges in on the
    previous reply (``previous``: that turn's row, whose ``barge_in`` is set), that reply still playing under the
    caller is the planned barge-in: the search starts at its heard silence. Returns {"t_ms",
    "caller_speech_left_ms"}, or None: no cut-off, or (with the reason put in ``unknown``) the heard channel cannot
    show it; the caller tells the two apart by ``unknown``."""
    total = len(heard.samples)
    looked_from = start
    barge = previous.get("barge_in") if previous is not None else None
    if barge is not None:
        silent_ms = barge.get("heard_silent_ms")
        if silent_ms is None:
            unknown(f"{key}.cut_off", "the reply this line barged in on never went silent: a new reply under it "
                                      "cannot be told from it")
            return None
        looked_from = max(start, round(silent_ms * rate / 1000))
        if looked_from >= end:
            unknown(f"{key}.cut_off", "the reply this line barged in on played to the line's end: a new reply under "
                                      "it cannot be told from it")
            return None
    t = heard.first_sound(looked_from, end)
    if t is not None:
        return {"t_ms": ms(t, rate), "caller_speech_left_ms": ms(end - t, rate)}
    if end > total:
        unknown(f"{key}.cut_off", "the recording ended before the caller's line did")
    return None


def measure_turns(log: CallLog, stt: Any, unknown: _Unknown, no_stt: str) -> list[dict[str, Any]]:
    """Per turn the caller's true speech, the heard reply and any barge-in, from the two channels only."""
    rate = log.settings.line.rate
    frame = log.settings.line.frame_samples
    heard = heard_channel(log.channel("right"), rate, log.events, frame, log.settings.line.frame_ms)
    total = len(heard.samples)
    pad = int(HEARD_PAD_MS * rate / 1000)
    hold = int(SILENT_AFTER_MS * rate / 1000)
    clears = [e["t_ms"] for e in log.events if e.get("event") == "clear"]
    clears_dropped = [(e["t_ms"], e.get("dropped_ms") or 0.0) for e in log.events if e.get("event") == "clear"]
    arrivals = [e["t_ms"] for e in log.events if e.get("dir") == "down" and e.get("event") == "media"]
    frame_ms = log.settings.line.frame_ms
    idles = [e["frame"] * frame_ms for e in log.events if e.get("event") == "playout_idle"]
    late_ticks = late_tick_frames(log.events)
    jitter = jitter_frames(log.settings.jitter_ms, frame_ms)
    rows: list[dict[str, Any]] = []
    turns = log.turns
    speech = [(t.offset_tick * frame + log.lines[t.index - 1].start, t.offset_tick * frame + log.lines[t.index - 1].end)
              for t in turns]  # the caller's own speech (its lines, never the echo), in samples
    for n, turn in enumerate(turns):
        line = log.lines[turn.index - 1]
        offset = turn.offset_tick * frame
        start, end = offset + line.start, offset + line.end
        nxt = turns[n + 1] if n + 1 < len(turns) else None
        next_start = nxt.offset_tick * frame + log.lines[nxt.index - 1].start if nxt else total
        next_end = nxt.offset_tick * frame + log.lines[nxt.index - 1].end if nxt else total
        key = f"turns[{n}]"
        first = heard.first_sound(end, next_start) if end < total else None
        barge: dict[str, Any] | None = None
        if first is None:
            last = None
            unknown(f"{key}.heard", "no heard sound between the end of the caller's line and the next line"
                    if nxt else "no heard sound after the caller's line before the call ended")
        elif turn.barged and nxt is not None:
            silent, resumed = reply_silent_from(heard, next_start, next_end, hold,
                                                [at_sample(t, rate) for t in clears], frame)
            last = heard.last_sound(first, silent if silent is not None else total)
            cleared = next((t for t in clears if t >= ms(next_start, rate) - log.settings.line.frame_ms), None)
            words = None
            if silent is not None:
                words = _words(stt, heard.samples[first:silent], rate, (silent - first) / rate)
            else:
                unknown(f"{key}.barge_in.heard_silent_ms",
                        f"the heard channel never stayed silent {SILENT_AFTER_MS:g} ms after the onset")
            if words is None:
                unknown(f"{key}.barge_in.words_heard", no_stt if stt is None
                        else "no heard silence to count words up to")
            barge = {"onset_ms": ms(next_start, rate),
                     "heard_silent_ms": ms(silent, rate) if silent is not None else None,
                     "heard_after_onset_ms": ms(silent - next_start, rate) if silent is not None else None,
                     "cleared_ms": cleared,
                     "resumed_ms": [[ms(a, rate), ms(b, rate)] for a, b in resumed],
                     "words_heard": " ".join(words) if words is not None else None,
                     "words_heard_count": len(words) if words is not None else None}
            if cleared is None:
                unknown(f"{key}.barge_in.cleared_ms", "no clear arrived after the onset")
        else:
            last = heard.last_sound(first, next_start)
        # TALKED_OVER_RULE: audio playing across the caller's end is no reply to the line: its gap is no gap
        over = first is not None and heard.talked_over(end, frame)
        # LATE_TICK_RULE: near a late tick the recording's places are not when the caller spoke or heard
        late = first is not None and not over and near_late_tick(late_ticks, end, first, frame, jitter)
        if over:
            unknown(f"{key}.heard.gap_ms", "talked over: the agent's audio was still playing at the caller's speech "
                                           "end (heard in the frame before it and the frame after it)")
        elif late:
            unknown(f"{key}.heard.gap_ms", "a late tick: the dialer ran more than a frame late near the caller's "
                                           "speech end or the reply's first sound (events.jsonl late_tick), so the "
                                           "recording does not show when either happened")
        transcript = None
        if first is not None and last is not None:
            transcript = _transcribe(stt, heard.samples[max(0, first - pad):min(total, last + pad)], rate)
            if transcript is None:
                unknown(f"{key}.heard.transcript", no_stt)
        rows.append({
            "index": turn.index, "script": line.script, "caller_wav": caller_wav_name(turn.index),
            "caller": {"offset_ms": ms(offset, rate), "speech_start_ms": ms(start, rate),
                       "speech_end_ms": ms(end, rate), "floor": line.floor, "source": line.source,
                       "converted_from": line.converted_from},
            "heard": {"first_sound_ms": ms(first, rate) if first is not None else None,
                      "gap_ms": ms(first - end, rate) if first is not None and not over and not late else None,
                      "talked_over": over, "late_tick": late,
                      "last_sound_ms": ms(last, rate) if last is not None else None,
                      "transcript": transcript},
            "barge_in": barge,
            "agent_reported": None, "heard_minus_reported_ms": None, "agent_breakdown": None,
            "wer": None,
        })
        rows[-1]["false_barge_in_at"] = _false_barge_in(heard, clears_dropped, arrivals, idles, speech, end,
                                                        next_start, first, hold, rate, frame_ms)
        rows[-1]["false_barge_in"] = rows[-1]["false_barge_in_at"] is not None
        cut = _cut_off(heard, start, end, rows[-2] if n else None, rate, key, unknown)
        rows[-1]["cut_off_at"] = cut
        rows[-1]["cut_off"] = True if cut is not None else (None if f"{key}.cut_off" in unknown.reasons else False)
        if line.pauses:
            rows[-1]["caller"]["pauses_ms"] = [[ms(offset + a, rate), ms(offset + b, rate)] for a, b in line.pauses]
        unknown(f"{key}.wer", "what the agent understood is not on the line: no transcript of the caller's line was "
                              "reported by the agent")
    return rows


def _apply_otlp(rows: list[dict[str, Any]], receiver: Any, t0_epoch_ns: int, address: str,
                unknown: _Unknown, call_ms: float | None = None) -> dict[str, Any]:
    spans = receiver.spans()
    speech_ends = [row["caller"]["speech_end_ms"] for row in rows]
    # the offset from the spans matched to these turns, at most the call's length (otlp's module docstring)
    clock = otlp.clock_for(spans, t0_epoch_ns, speech_ends, call_ms) if spans else None
    if clock is not None:
        reported = otlp.match(speech_ends, spans, clock)
        for position, (row, found) in enumerate(zip(rows, reported)):
            if found is None:
                continue
            row["agent_reported"] = found.as_dict()
            row["agent_breakdown"] = dict(found.breakdown) if found.breakdown else None
            for part, why in found.breakdown_unknown.items():  # a stage the agent's spans say nothing of
                unknown(f"turns[{position}].agent_breakdown.{part}", why)
            row["agent_stages"] = [stage.as_dict() for stage in found.stages]
            if found.preemptive is not None:  # the agent's preemptive replies for this turn, beside what was heard
                row["agent_preemptive"] = dict(found.preemptive)
            if found.transcript is not None and isinstance(row.get("script"), str):
                # the agent's recognition of the caller's line, scored against the line's script (the caller's
                # audio without a transcript of its own is never scored: script None)
                row["agent_transcript"] = found.transcript
                scored = word_errors(row["script"], found.transcript)
                row["wer"] = {"errors": scored.errors, "words": scored.words}
                unknown.reasons.pop(f"turns[{position}].wer", None)
            gap = row["heard"]["gap_ms"]
            row["heard_minus_reported_ms"] = round(gap - found.latency_ms, 3) if gap is not None else None
    return otlp.summary(address, receiver, clock)


def cut_offs(rows: Sequence[Mapping[str, Any]], unknown: _Unknown) -> int | None:
    """summary.cut_offs: the turns whose line the agent talked into (CUT_OFF_RULE), over the turns whose heard
    channel can show it; None when none can (the reasons are the turns' in ``unknown``); when only some can, the
    count is theirs and ``unknown`` names the others."""
    known = [row for row in rows if row.get("cut_off") is not None]
    if len(known) < len(rows):
        left_out = ", ".join(str(row["index"]) for row in rows if row.get("cut_off") is None)
        unknown("summary.cut_offs", f"turn(s) {left_out} cannot show a cut-off (their turns[].cut_off reasons): "
                                    "counted over the others" if known else "no turn's heard channel can show it")
    return sum(1 for row in known if row["cut_off"]) if known else None


def _spans(pairs: Any) -> tuple[tuple[float, float], ...]:
    return tuple((a, b) for a, b in pairs or ())


def _block(kind: type[Any], found: Mapping[str, Any] | None, *typed: str) -> Any:
    """A block of dial.json built from the measured ``found``: its typed keys by name (one it lacks is left out of the
    file), the rest kept in ``extra``."""
    if found is None:
        return None
    return kind(**{key: found[key] for key in typed if key in found},
                extra={k: v for k, v in found.items() if k not in typed},
                absent=frozenset(key for key in typed if key not in found))


def turn_of(row: Mapping[str, Any]) -> Turn:
    """One measured turn (measure_turns' row, the agent's numbers applied) as dial.json's typed turn."""
    caller, heard, barge = row["caller"], row["heard"], row["barge_in"]
    agent = row["agent_reported"]
    extras = {key: row[key] for key in ("agent_stages", "agent_preemptive", "agent_transcript") if key in row}
    return Turn(
        index=row["index"], script=row["script"], caller_wav=row["caller_wav"],
        caller=TurnCaller(offset_ms=caller["offset_ms"], speech_start_ms=caller["speech_start_ms"],
                          speech_end_ms=caller["speech_end_ms"], floor=caller["floor"], source=caller["source"],
                          converted_from=caller["converted_from"], pauses_ms=_spans(caller.get("pauses_ms"))),
        heard=HeardDoc(first_sound_ms=heard["first_sound_ms"], gap_ms=heard["gap_ms"], talked_over=heard["talked_over"],
                       late_tick=heard["late_tick"], last_sound_ms=heard["last_sound_ms"],
                       transcript=heard["transcript"]),
        barge_in=None if barge is None else BargeIn(
            onset_ms=barge["onset_ms"], heard_silent_ms=barge["heard_silent_ms"],
            heard_after_onset_ms=barge["heard_after_onset_ms"], cleared_ms=barge["cleared_ms"],
            resumed_ms=_spans(barge["resumed_ms"]), words_heard=barge["words_heard"],
            words_heard_count=barge["words_heard_count"]),
        agent_reported=_block(AgentReported, agent, "latency_ms", "source"),
        heard_minus_reported_ms=row["heard_minus_reported_ms"], agent_breakdown=row["agent_breakdown"],
        wer=None if row["wer"] is None else Wer(errors=row["wer"]["errors"], words=row["wer"]["words"]),
        false_barge_in_at=_block(FalseBargeIn, row["false_barge_in_at"], "kind", "t_ms", "silent_ms", "resumed_ms",
                                 "dropped_ms"),
        false_barge_in=row["false_barge_in"],
        cut_off_at=_block(CutOff, row["cut_off_at"], "t_ms", "caller_speech_left_ms"), cut_off=row["cut_off"],
        agent_stages=extras.get("agent_stages"), agent_preemptive=extras.get("agent_preemptive"),
        agent_transcript=extras.get("agent_transcript"))


def _spread(values: Sequence[float], p90: bool = True, talked_over: int | None = None,
            late_tick: int | None = None) -> Spread:
    """summary_of's block; ``talked_over``, ``late_tick``: the turns heard_gap_ms left out (only it counts them)."""
    found = summary_of(values)
    left_out = {key for key, count in (("talked_over", talked_over), ("late_tick", late_tick)) if count is None}
    return Spread(median=found["median"], p90=found["p90"] if p90 else None, n=int(found["n"] or 0),
                  talked_over=talked_over, late_tick=late_tick,
                  absent=frozenset(left_out if p90 else {*left_out, "p90"}))


def document(log: CallLog, options: DialOptions, caller: Caller, rows: list[dict[str, Any]],
             unknown: _Unknown, identity: Mapping[str, Any] | None, stt_info: Mapping[str, Any] | None,
             otlp_block: Mapping[str, Any] | None, otlp_files: Sequence[str]) -> DialDoc:
    """dial.json of the call, built as its type (voice_llm.capabilities.dial.doc.DialDoc): the one shape check reads back."""
    line = log.settings.line
    heard = heard_channel(log.channel("right"), line.rate, log.events, line.frame_samples, line.frame_ms)
    turns = tuple(turn_of(row) for row in rows)
    gaps = [gap for turn in turns if (gap := turn.gap_ms) is not None]
    barge = [turn.barge_in.heard_after_onset_ms for turn in turns
             if turn.barge_in is not None and turn.barge_in.heard_after_onset_ms is not None]
    diffs = [t.heard_minus_reported_ms for t in turns if t.heard_minus_reported_ms is not None]
    missing = [str(turn.index) for turn in turns if turn.agent_reported is None]
    refused = otlp_block.get("refused_values", 0) if otlp_block is not None else 0
    # the agent's numbers refused at the receiver (NaN, Inf, negative: voice_llm.capabilities.dial.otlp) leave their turn not
    # reported, with this reason, never a FAIL: a turn without a reason is what check_values refuses
    why_refused = (f"; {refused} number(s) the agent reported were refused (not a finite number >= 0: "
                   "otlp.refused_values)") if refused else ""
    if len(missing) == len(rows):
        unknown("agent_reported", ("the agent sent no traces (no --otlp, or none received)" if otlp_block is None
                                   or not otlp_block.get("spans") else "no span of the agent's matched a turn")
                + why_refused)
    elif missing:
        unknown("agent_reported", f"turn(s) {', '.join(missing)}: no span of the agent's reported on it{why_refused}")
    if identity is None:
        unknown("agent.identity", "the agent said nothing of itself (a foreign agent; voice-llm's own agent's "
                                  "identity comes from its ready line)")
    costs = log.cost_ms
    settings = log.settings
    cost = summary_of(costs)
    return DialDoc(
        schema_version=RUN_SCHEMA_VERSION,  # the run's stamp: an artifact newer than the run's is refused
        dial_schema_version=DIAL_SCHEMA_VERSION,
        agent=Agent(url=settings.url, protocol=line.protocol, headers=log.headers,
                    identity=dict(identity) if identity is not None else None),
        line=Line(protocol=line.protocol, codec=line.codec, rate=line.rate, frame_ms=line.frame_ms,
                  jitter_ms=settings.jitter_ms, loss_pct=settings.loss_pct, echo_db=settings.echo_db,
                  seed=settings.seed,
                  echo_delay_ms=settings.echo_delay_ms if settings.echo_db is not None else None,
                  lost_up_frames=log.lost_up_frames, lost_down_frames=log.lost_down_frames,
                  conditions=LINE_CONDITIONS, cap_s=settings.cap_s, stream_sid=log.stream_sid,
                  call_sid=log.call_sid,
                  extra=dict(log.line_extra)),  # what the transport adds (WebRTC: line.webrtc)
        clock=CLOCK,
        t0_epoch_ns=log.t0_epoch_ns,
        floor=Floor(rule=FLOOR_RULE, caller=max(ln.floor for ln in caller.lines), heard=heard.floor),
        caller=caller.as_dict(),
        settings=Settings(turns=len(caller.lines), barge_in_turns=tuple(settings.barge_in_turns),
                          barge_in_after_ms=settings.barge_in_after_ms, think_ms=settings.think_ms,
                          think_share=settings.think_share, reply_wait_s=settings.reply_wait,
                          deadline_s=settings.deadline_s, lead_ms=settings.lead_ms,
                          reply_end_ms=settings.reply_end_ms, silent_after_ms=SILENT_AFTER_MS,
                          false_barge_in_rule=FALSE_BARGE_IN_RULE, cut_off_rule=CUT_OFF_RULE,
                          talked_over_rule=TALKED_OVER_RULE, late_tick_rule=LATE_TICK_RULE,
                          barge_silence_rule=BARGE_SILENCE_RULE, stt=options.stt, stt_engine=stt_info),
        turns=turns,
        playout=_block(Playout, log.playout, "frames", "late_frames", "underruns", "marks_returned", "clears",
                       "max_buffered_ms", "dropped_ms", "lost_ms", "max_late_ms"),
        dialer_cost_ms=DialerCost(median=cost["median"], p90=cost["p90"],
                                  max=round(max(costs), 3) if costs else None, frames=len(costs),
                                  what="per 20 ms frame: encode + send + playout pop + record + mark echoes + "
                                       "schedule, plus the receive work (decode, push) since the previous tick"),
        summary=Summary(heard_gap_ms=_spread(gaps, talked_over=sum(1 for t in turns if t.heard and t.heard.talked_over),
                                             late_tick=sum(1 for t in turns if t.heard and t.heard.late_tick)),
                        barge_in_heard_after_onset_ms=_spread(barge, p90=False),
                        heard_minus_reported_ms=_spread(diffs) if diffs else None,
                        false_barge_ins=sum(1 for turn in turns if turn.false_barge_in),
                        cut_offs=cut_offs(rows, unknown)),
        files=Files(call_wav=CALL_WAV, events=EVENTS, caller_wavs=tuple(caller_wav_name(t.index) for t in turns),
                    otlp=tuple(otlp_files)),
        otlp=_block(Otlp, otlp_block, "bodies"),
        unknown=unknown.reasons,
        load_average=list(os.getloadavg()),
    )


# --- the step -----------------------------------------------------------------------------------------------------


def prepare(step_options: Any) -> None:
    """Before OUT is opened: the options must name a call (a URL)."""
    options = step_options.plugin(NAME, None)
    if options is None or options.url is None:
        raise ConfigError("dial needs the agent's URL: voice-llm dial ws://HOST:PORT/PATH")
    if options.protocol == wire.WEBRTC:
        webrtc.require()  # without the extra: one line, before OUT is opened or anything is synthesized


def run(ctx: LabContext) -> list[Path]:
    options = options_of(ctx)
    if options.url is None:
        raise ConfigError("dial needs the agent's URL: voice-llm dial ws://HOST:PORT/PATH")
    refuse_another_call(ctx.out, ctx.run.doc if ctx.run is not None else None, options.url)
    return dial_step(ctx, options, options.url)


def refuse_another_call(out: Path, run: Mapping[str, Any] | None, url: str) -> None:
    """A lone dial joins the run in OUT (it asks no LLM server, so the lab steps' identity rule cannot refuse it):
    a call of that run made to another agent or URL (the lab's converse call to its own agent, a dial elsewhere)
    would be replaced by this one, the run's headline then another agent's (issue 41 item 8: the lab's 3655 ms became
    355 ms and check exited 3). Refused before anything is written; the same URL is a re-measure of the same agent
    and replaces the call as any step re-run does."""
    if run is None or DIAL not in (run.get("artifacts") or {}):
        return
    try:
        agent = DialDoc.parse(read_json(out / DIAL)).agent
    except ArtifactError:
        agent = None
    other = agent.url if agent is not None else None
    if isinstance(other, str) and same_url(other, url):
        return
    made = (f"its call was made to {other}" if isinstance(other, str)
            else "it holds a call dial.json does not name the agent of")
    raise OtherRunError(f"{out} holds run {run.get('run_id')}: {made}; `voice-llm dial {url}` would replace that "
                        f"call and mix the two agents in one run: dial into another folder (--out DIR)")


@dataclass(frozen=True)
class Prepared:
    """What a call needs before it is made: the caller's lines and the STT for the heard replies."""

    caller: Caller
    stt: Any
    stt_info: Mapping[str, Any] | None


def prepare_call(ctx: LabContext, options: DialOptions, caller: Caller | None = None) -> Prepared:
    """The caller's lines (synthesized or loaded) and the STT, before any call: their failure writes nothing."""
    ctx.progress.update("dial: the caller's lines")
    caller = caller or caller_lines(options)
    stt = None
    if options.stt != "none":
        ctx.progress.update("dial: loading faster-whisper for the heard replies")
        # the dialer's decode runs after the call, on every core unless --stt-threads says otherwise
        threads = options.stt_threads or default_threads()
        stt = load_transcriber(options.stt, threads)
    return Prepared(caller, stt, stt.info() if stt is not None else None)


class Tracing:
    """The OTLP/HTTP receiver of one call (voice_llm.capabilities.dial.otlp), listening before the agent is started or
    called, stamping arrivals on the call's clock (the call sets its zero)."""

    def __init__(self, listen: str) -> None:
        host, port = otlp.parse_listen(listen)
        self.clock = callmod.ClockHolder()
        try:
            self.receiver = otlp.Receiver(host, port, self.clock.ms)
        except OSError as exc:
            raise ConfigError(f"--otlp {listen}: cannot listen there ({exc.strerror or exc})") from exc
        self.receiver.start()
        bound_host, bound_port = self.receiver.address
        self.address = f"{bound_host}:{bound_port}"
        self.stopped = False

    @property
    def endpoint(self) -> str:
        """What an OTLP exporter is pointed at (its /v1/traces is appended by the exporter)."""
        return f"http://{self.address}"

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.receiver.stop()


class LiveLines:
    """dial's lines as the call happens (issue 40 item 4: the turns were printed only when the call had ended, so a
    failing 4-turn call was seen ~30 s late): each turn's heard gap when its reply ends, the agent's own number once
    its span has come, a barge-in's heard silence, a failure at once. Live numbers (the schedule's floor, frame
    steps) are marked so; dial.json's are re-measured on the recording after the call."""

    def __init__(self, progress: Any, tracing: Tracing | None) -> None:
        self.progress, self.tracing = progress, tracing
        self.speech_ends: list[float] = []
        self.gaps: list[float | None] = []
        self.turns: list[int] = []
        self.reported: set[int] = set()

    def __call__(self, note: callmod.LiveNote) -> None:
        if note.kind == "failed":
            self.progress.note(f"the call failed: {note.message}")
        elif note.kind == "barge_in":
            self.progress.note(f"turn {note.turn}: barged in; the heard channel went silent "
                               f"{note.silent_after_onset_ms:.0f} ms after the onset (live)")
        elif note.kind == "turn" and note.speech_end_ms is not None:
            self.speech_ends.append(note.speech_end_ms)
            self.gaps.append(note.gap_ms)
            self.turns.append(note.turn)
            heard = f"heard {note.gap_ms:.0f} ms after the caller stopped" if note.gap_ms is not None \
                else "nothing heard"
            self.progress.note(f"turn {note.turn}: {heard} (live; dial.json re-measures it)")
            self._agent(note.t0_epoch_ns)

    def _agent(self, t0_epoch_ns: int) -> None:
        """The agent's own number of every turn whose span has come and was not said yet."""
        spans = self.tracing.receiver.spans() if self.tracing is not None else []
        if not spans:
            return
        clock = otlp.clock_for(spans, t0_epoch_ns, self.speech_ends, None)
        for index, found in enumerate(otlp.match(self.speech_ends, spans, clock)):
            if found is None or index in self.reported:
                continue
            self.reported.add(index)
            gap = self.gaps[index]
            share = f"; heard - reported {gap - found.latency_ms:+.0f} ms" if gap is not None else ""
            self.progress.note(f"turn {self.turns[index]}: the agent reports {found.latency_ms:.0f} ms{share}")


def dial_step(ctx: LabContext, options: DialOptions, url: str, identity: Mapping[str, Any] | None = None,
              caller: Caller | None = None, prepared: Prepared | None = None,
              tracing: Tracing | None = None, more_files: Mapping[str, str] | None = None) -> list[Path]:
    """The call to ``url`` with ``options``, measured and written (see the module's docstring). ``tracing``: a
    receiver already listening (the lab's converse step starts it before its agent); else --otlp starts one.
    ``more_files``: files of dial/ the caller of this function writes after it (the converse step's agent log),
    named under dial.json's ``files`` so that check knows them as the step's (dial.checks.check_files)."""
    prepared = prepared or prepare_call(ctx, options, caller)
    caller, stt, stt_info = prepared.caller, prepared.stt, prepared.stt_info
    folder = ctx.path(DIAL_DIR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(f"cannot create {folder}: {exc.strerror or exc}") from exc
    live = folder / f".call-live-{secrets.token_hex(4)}.wav"
    if caller.barge_in_turns is not None:  # the user's folder's plan (or the flag, checked against it)
        options = replace(options, barge_in_turns=caller.barge_in_turns)
    settings = options.call_settings(url)
    for note in caller.notes:  # what the user's folder changed, said (and kept in dial.json's caller.notes)
        print(f"voice-llm: {note}", file=sys.stderr)
    if tracing is None and options.otlp is not None:
        tracing = Tracing(options.otlp)
    recording = LiveRecording(live, settings.line.rate)
    ctx.progress.update(f"dial: calling {url} ({len(caller.lines)} lines, real time)")
    try:
        log = run_call(settings, caller.lines, recording, tracing.clock if tracing is not None else None,
                       LiveLines(ctx.progress, tracing))
    finally:
        recording.close()
    if tracing is not None:
        # the agent flushes its spans at each turn's end and at hang-up: give the last export a moment to land
        _settle(tracing, len(caller.lines))
        tracing.stop()
    receiver = tracing.receiver if tracing is not None else None
    otlp_address = tracing.address if tracing is not None else ""
    unknown = _Unknown()
    rows: list[dict[str, Any]] = []
    otlp_block = None
    otlp_files: list[str] = []
    error: Exception | None = log.error
    ctx.progress.update("dial: measuring what was heard")
    try:
        rows = measure_turns(log, stt, unknown, "not transcribed (--stt none)")
    except STTError as exc:
        # the measurements stand without the words: kept, with why, beside the earlier artifacts
        unknown = _Unknown()
        rows = measure_turns(log, None, unknown, f"not transcribed: {exc}")
        error = error or exc
    if receiver is not None:
        otlp_files = _write_otlp(ctx, receiver)
        otlp_block = _apply_otlp(rows, receiver, log.t0_epoch_ns, otlp_address, unknown,
                                 log.frames * log.settings.line.frame_ms)
    doc = document(log, options, caller, rows, unknown, identity, stt_info, otlp_block, otlp_files)
    doc = replace(doc, files=replace(doc.files, extra={**doc.files.extra, **(more_files or {})}))
    if error is not None:
        return _keep_partial(ctx, live, log, doc, error)
    written = [ctx.write_bytes(caller_wav_name(ln.index), wav_bytes(ln.samples.astype("<i2").tobytes(), ln.rate)) for ln in caller.lines]
    written.append(ctx.write_bytes(EVENTS, jsonl_bytes(log.events)))
    final = ctx.path(CALL_WAV)
    os.replace(live, final)
    ctx.record(final)
    written.append(final)
    return [ctx.write_json(DIAL, doc.as_dict()), *written]


def _keep_partial(ctx: LabContext, live: Path, log: CallLog, doc: DialDoc, error: Exception) -> list[Path]:
    """A failed call: what was sent and heard until then beside the earlier artifacts, then the error."""
    partial = ctx.path(PARTIAL_CALL_WAV)
    os.replace(live, partial)
    ctx.record(partial)  # the run's manifest changes: run.json is saved with the failed step
    write_bytes_atomic(ctx.path(PARTIAL_EVENTS), jsonl_bytes(log.events), ctx.out)
    doc = replace(doc, error=str(error), files=replace(doc.files, call_wav=PARTIAL_CALL_WAV, events=PARTIAL_EVENTS))
    write_json(ctx.path(DIAL_PARTIAL), doc.as_dict(), ctx.out)
    if log.interrupted:
        raise KeyboardInterrupt
    where = kept_where(log.connected, ctx.path(DIAL_PARTIAL), partial)
    if isinstance(error, DialError):
        raise DialError(f"{error} ({where})") from None
    error.add_note(where)
    raise error


def kept_where(connected: bool, partial_doc: Path, partial_wav: Path) -> str:
    """Where a failed call's evidence is, in words: the call so far, or, when the line never opened, that it never
    connected (nothing sent or heard: an empty recording and no event), its bytes kept all the same."""
    if connected:
        return f"the call so far is in {partial_doc} and {partial_wav}"
    return f"it never connected: nothing was sent or heard; the bytes so far kept in {partial_doc} and {partial_wav}"


# kept_where's words as dial's failure line ends in them: " (<where>)"
_KEPT_WHERE = re.compile(r" \((?:the call so far is in|it never connected:) [^)]*\)")


def without_kept_where(line: str) -> str:
    """A failure line of dial's without where it kept the call (:func:`kept_where`): a temporary folder's path
    differs every call, and load counts errors by their text."""
    return _KEPT_WHERE.sub("", line).strip()


# --- the agent's traces (voice_llm.capabilities.dial.otlp) ---------------------------------------------------------------------


def _settle(tracing: Tracing, turns: int, quiet_s: float = 0.5, cap_s: float = 10.0,
            silent_cap_s: float = 3.0) -> None:
    """Wait for the hang-up's export: until no body has arrived for ``quiet_s`` and the spans report as many turns
    as the caller spoke lines; short of that, ``cap_s``, or ``silent_cap_s`` while no body at all has arrived. Quiet
    alone is not enough: on a busy machine an agent (the preemptive test's runs at nice 10) had exported nothing
    0.5 s after the hang-up, dial stopped listening, and the turn lost the agent's numbers (seen in a `.ci/run` with
    a second pytest beside it). So an agent given an OTLP endpoint that sends no latency-reporting span per line
    costs ``silent_cap_s`` (nothing sent) or ``cap_s`` per call; every agent this repo dials (voice-llm's,
    pipecat's) sends one per turn, barged-in turns included."""
    start = time.monotonic()
    seen = tracing.receiver.received
    reported = otlp.reporting_spans(tracing.receiver.spans())  # counted again only when a body arrives
    quiet_until = start + quiet_s
    while time.monotonic() < start + (cap_s if seen else min(cap_s, silent_cap_s)):
        time.sleep(0.05)
        count = tracing.receiver.received
        if count != seen:
            seen, quiet_until = count, time.monotonic() + quiet_s
            reported = otlp.reporting_spans(tracing.receiver.spans())
        if reported >= turns and time.monotonic() >= quiet_until:
            return
        if tracing.receiver.full:  # it keeps no more bodies (otlp.Limits): nothing more can report a turn
            return


def _write_otlp(ctx: LabContext, receiver: Any) -> list[str]:
    folder = ctx.path(f"{DIAL_DIR}/otlp")
    names = []
    bodies = receiver.bodies()  # every body kept (an empty export too: 0 bytes); the refused are counted, not kept
    if bodies:
        folder.mkdir(exist_ok=True)
    for body in bodies:
        name = f"{DIAL_DIR}/otlp/{body.file_name}"
        ctx.write_bytes(name, body.data)
        names.append(name)
    return names


def install() -> str:
    return ""


__all__ = ["DialOptions", "add_flags", "caller_lines", "dial_step", "options_value", "prepare", "run"]
