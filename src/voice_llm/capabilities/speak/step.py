"""Step speak, the tts capability's step: time to first audio. Stream the sentence step's answer and speak it
through a real TTS while it streams, once per segmenting strategy and repeat; write audio.json and the WAVs the
caller would hear. Also what the capability adds to the CLI (its flags, its options value, `install`'s voice).

Runs are interleaved (round 1: every strategy, round 2: every strategy, ...) so a drift in machine load falls on
all strategies alike. Each run's raw stream is kept as ``raw/speak-<strategy>-<run>.sse``.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.core.scenario import brief, prompts
from voice_llm.core.util.artifacts import AUDIO, AUDIO_DIR
from voice_llm.core.errors import OutputDirError, TTSError
from voice_llm.core.run import flags
from voice_llm.core.run.flags import Between, OneOf, setting
from voice_llm.core.run.context import RAW_DIR, LabContext, StepOptions
from voice_llm.core.sse import Chunk, StreamResult
from voice_llm.engines.speech_out.engine import TTSEngine
from voice_llm.engines.speech_out.engines import DEFAULT_ENGINE, ENGINES, load_engine
from voice_llm.capabilities.speak.artifact import PLAYBACK_MODEL, heard_pcm, median_run, run_dict, summary, wav_entry
from voice_llm.engines.speech_out.live import SpokenAnswer, first_audio_alone_ms, speak_live
from voice_llm.engines.speech_out.segmenting import DEFAULT_CLAUSE_WORDS, STRATEGIES
from voice_llm.engines.audio.wav import SAMPLE_WIDTH, wav_bytes

MAX_TOKENS = brief.SENTENCE_MAX_TOKENS  # the sentence step's request
DEFAULT_REPEAT = 3
NAME = "tts"  # this capability's name: its options are StepOptions.plugins["tts"]
# The commands that take the TTS flags: the lab (it runs speak) and the speak step alone.
TTS_COMMANDS = frozenset({"lab", "speak"})


@dataclass(frozen=True)
class TTSOptions:
    """This capability's options (the CLI's --tts, --voice, --clause-words), kept in StepOptions.plugins["tts"];
    the agent speaks with the same settings (its AgentSettings.speech), so they are declared once, here."""

    engine: str = setting(DEFAULT_ENGINE, name="--tts", rule=OneOf(ENGINES),
                          help="speak step's TTS engine (default {default} with the registry voice en_US-joe-medium)")
    # None: the engine's default voice
    voice: str | None = setting(None, help="a Piper voice .onnx (its .onnx.json beside it), or an espeak-ng voice name")
    clause_words: int = setting(DEFAULT_CLAUSE_WORDS, metavar="N", rule=Between(1),
                                help="strategy clauses: the first segment ends at the first , ; : or dash after N words")

    def __post_init__(self) -> None:
        flags.check(self)


VOICE_FLAGS = flags.flags_of(TTSOptions)


@dataclass(frozen=True)
class SpeakOptions:
    engine: str = DEFAULT_ENGINE
    voice: str | None = None
    repeat: int = DEFAULT_REPEAT
    clause_words: int = DEFAULT_CLAUSE_WORDS


# --- what the capability contributes (voice_llm.capabilities.speak.CAPABILITY) ------------------------------------------------


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of the lab and of the speak step: the engine, its voice, the clause strategy's words; the speak
    step alone also repeats its measurement (--repeat, the core's flag)."""
    if command == "speak":
        flags.repeat_option(parser)
    if command in TTS_COMMANDS:
        VOICE_FLAGS.add(parser)


def options_value(values: Mapping[str, Any]) -> TTSOptions:
    """This capability's options from a command's parsed flags (those it did not offer keep their defaults)."""
    return flags.build(TTSOptions, VOICE_FLAGS.given(values))


def install() -> str:
    """What `voice-llm install` fetches for speak: the default voice, loaded and warmed up once to verify it."""
    return f"voice: {load_engine().voice}"


def tts_options(options: StepOptions) -> TTSOptions:
    return options.plugin(NAME, TTSOptions())


def options_from(options: StepOptions) -> SpeakOptions:
    """The step's options from the lab's (the CLI's --tts, --voice, --repeat, --clause-words)."""
    tts = tts_options(options)
    return SpeakOptions(engine=tts.engine, voice=tts.voice, repeat=options.repeat, clause_words=tts.clause_words)


def options_of(ctx: LabContext) -> SpeakOptions:
    return options_from(ctx.options)


@functools.lru_cache(maxsize=2)
def _loaded(engine: str, voice: str | None, deadline_s: float | None) -> TTSEngine:
    return load_engine(engine, voice, deadline_s)


def forget_loaded_engines() -> None:
    """Drops the engines loaded so far: the next command loads (and looks for its program) anew."""
    _loaded.cache_clear()


def engine_for(options: SpeakOptions, deadline_s: float | None = None) -> TTSEngine:
    """The engine and voice the options name, loaded and warmed up once per process: the pipeline loads it before
    it asks the server anything (a bad --voice fails there, leaving no file), and the step uses the same one."""
    return _loaded(options.engine, options.voice, deadline_s)


def prepare(options: StepOptions) -> None:
    """Before the lab asks anything or writes a file (voice_llm.core.lab.steps): the engine and voice must load."""
    engine_for(options_from(options), options.deadline_s)


def raw_name(strategy: str, run: int) -> str:
    return f"speak-{strategy}-{run}"


def _request(ctx: LabContext, name: str) -> Callable[[Callable[[Chunk], None]], StreamResult]:
    messages = prompts.chat(prompts.THREE_SENTENCES_SYSTEM, prompts.FASTING_QUESTION)
    return lambda on_chunk: ctx.request(name, messages, max_tokens=MAX_TOKENS, cache_prompt=True, on_chunk=on_chunk)


@dataclass(frozen=True)
class LiveRun:
    answer: SpokenAnswer
    alone_ms: float  # the first segment's first audio, synthesized alone right after the live run


def speak_all(ctx: LabContext, engine: TTSEngine, options: SpeakOptions) -> dict[str, list[LiveRun]]:
    runs: dict[str, list[LiveRun]] = {strategy: [] for strategy in STRATEGIES}
    for run in range(1, options.repeat + 1):
        for strategy in STRATEGIES:
            name = raw_name(strategy, run)
            ctx.progress.update(f"speak: {strategy}, run {run} of {options.repeat}")
            try:
                answer = speak_live(engine, strategy, _request(ctx, name), options.clause_words)
            except TTSError as exc:
                exc.add_note(f"speak {strategy}, run {run}: the answer's stream is kept in {ctx.stream_path(name)}")
                raise
            # The engine's own time for the same text with the LLM idle, measured at once so that a change in
            # machine load between runs falls on both numbers of the pair.
            runs[strategy].append(LiveRun(answer, first_audio_alone_ms(engine, answer.segments[0].text)))
    return runs


def _wavs(strategy: str, runs: list[LiveRun], rate: int) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The median run's first segment and whole heard answer: their audio.json entries and WAV bytes."""
    index = median_run([{"ttfa_ms": run.answer.playback.ttfa_ms} for run in runs])
    answer = runs[index].answer
    entries, files = {}, {}
    for kind, pcm in (("first_segment", b"".join(answer.segments[0].pcm)), ("heard", heard_pcm(answer, rate))):
        relative = f"{AUDIO_DIR}/{strategy}-{kind.replace('_', '-')}.wav"
        files[relative] = wav_bytes(pcm, rate)
        entries[kind] = wav_entry(relative, index + 1, len(pcm) // SAMPLE_WIDTH, rate)
    return entries, files


def audio_document(ctx: LabContext, engine: TTSEngine, options: SpeakOptions,
                   answers: dict[str, list[LiveRun]]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """audio.json and the WAV files it names (relative path -> bytes), nothing written yet."""
    strategies: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    for strategy, runs in answers.items():
        rows = [run_dict(i, f"{RAW_DIR}/{raw_name(strategy, i)}.sse", run.answer, run.alone_ms)
                for i, run in enumerate(runs, start=1)]
        wavs, wav_files = _wavs(strategy, runs, engine.sample_rate)
        files.update(wav_files)
        strategies[strategy] = {"summary": summary(rows), "wavs": wavs, "runs": rows}
    doc = {
        "engine": engine.name,
        "voice": engine.voice,
        "voice_option": options.voice,  # what --voice said (None: the engine's default voice)
        "sample_rate": engine.sample_rate,
        "versions": engine.versions(),
        "prompt": {"system": prompts.THREE_SENTENCES_SYSTEM, "user": prompts.FASTING_QUESTION,
                   "max_tokens": MAX_TOKENS},
        "repeat": options.repeat,
        "clause_words": options.clause_words,
        "playback_model": PLAYBACK_MODEL,
        "ttfa_ms": {strategy: doc["summary"]["ttfa_ms"]["median"] for strategy, doc in strategies.items()},
        "strategies": strategies,
    }
    return doc, files


def run(ctx: LabContext) -> list[Path]:
    options = options_of(ctx)
    ctx.progress.update(f"speak: loading {options.engine}")
    # A bad voice fails here at the latest, before any request; the engine's program is bounded by the deadline.
    engine = engine_for(options, ctx.client.deadline_s)
    answers = speak_all(ctx, engine, options)
    doc, files = audio_document(ctx, engine, options, answers)
    # Everything is measured before anything is written: a failure above leaves the earlier audio untouched.
    folder = ctx.path(AUDIO_DIR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(f"cannot create {folder}: {exc.strerror or exc}") from exc
    written = [ctx.write_bytes(relative, data) for relative, data in files.items()]
    return [ctx.write_json(AUDIO, doc), *written]
