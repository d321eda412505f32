"""The caller's lines as they go on the line: spoken by Piper (the clinic lines, as converse did) or the user's own
recordings (``--caller-audio DIR`` through voice_llm.engines.speech_in.caller_audio), at 16 kHz first, then resampled to the line's
rate (voice_llm.engines.audio.resampling, the resampler voice_llm.engines.speech_in.caller_audio.resample uses) and passed through the line's codec once, so
what dial/caller-NN.wav holds, what the left channel of dial/call.wav holds and what the agent decodes are the
same samples (mu-law is lossy: the samples sent are the decoded ones).

Where a line's speech truly is comes from those samples alone: the first and the last sample above the noise
floor (voice_llm.engines.speech_in.caller_audio.noise_floor, the same function the heard channel is measured with).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voice_llm.engines.audio.resampling import to_rate
from voice_llm.capabilities.dial.measure import caller_sound
from voice_llm.core.errors import TTSUnavailableError
from voice_llm.engines.line import wire
from voice_llm.engines.speech_in import caller_audio as speech_caller
from voice_llm.engines.speech_in.caller_audio import (CALLER_LENGTH_SCALE, CALLER_NOISE_SCALE, CALLER_NOISE_W_SCALE, SAMPLE_RATE,
                                     CallerAudioError, Utterance, audible_span, noise_floor)
from voice_llm.engines.speech_out.piper import DEFAULT_VOICE_PACKAGE, PIPER_PACKAGE, default_voice


@dataclass(frozen=True)
class CallerVoice:
    """What spoke the caller's lines (dial.json's caller.voice)."""

    engine: str
    voice: str
    length_scale: float
    versions: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "voice": self.voice, "length_scale": self.length_scale,
                "noise_scale": CALLER_NOISE_SCALE, "noise_w_scale": CALLER_NOISE_W_SCALE,
                "sample_rate_in": 22050, "resampled_to": SAMPLE_RATE, "resampler": "av.AudioResampler",
                "versions": self.versions}


# The caller lines with a planned mid-sentence pause (`--caller-lines pause`, issue 29 item 5 and issue 28's "no
# cut-off on the pause line"): the first line is one sentence spoken in two parts with PAUSE_MS of digital silence
# between them (a caller who stops to think mid-sentence; an agent whose endpoint is shorter than the pause answers
# into it: a cut-off), then one ordinary clinic line with no pause (the same call's control turn).
PAUSE_MS = 600.0
PAUSE_LINES: tuple[tuple[str, ...], ...] = (
    ("I need to move my appointment to", "next Tuesday afternoon, if you have anything."),
    ("Okay. Do you take Medicare?",),
)


# The caller lines of load (`--caller-lines load`, issue 30 item 4): short clinic questions, about a second of speech
# each, so that a turn of a call under load is mostly the agent's (its gap and its reply), not the caller's line: a
# load step gets its judged turns in minutes. A call says the first N (--turns).
LOAD_LINES: tuple[str, ...] = (
    "Do you take Medicare?",
    "Are you open on Saturday?",
    "Where do I park?",
    "Can I come in Monday?",
    "Do I need to fast?",
    "How do I cancel?",
)


def _piper(length_scale: float) -> tuple[Any, Any, Path]:
    model, config = default_voice()
    try:
        from piper import PiperVoice, SynthesisConfig
    except ImportError as exc:
        raise TTSUnavailableError(f"Piper is not installed: pip install '{PIPER_PACKAGE}>=1.8,<1.9'") from exc
    voice = PiperVoice.load(model, config_path=config)
    syn = SynthesisConfig(length_scale=length_scale, noise_scale=CALLER_NOISE_SCALE, noise_w_scale=CALLER_NOISE_W_SCALE)
    return voice, syn, model


def _speak(voice: Any, syn: Any, text: str) -> np.ndarray:
    """``text`` spoken by ``voice``, resampled to 16 kHz mono int16."""
    pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(text, syn_config=syn))
    return speech_caller.resample(np.frombuffer(pcm, np.int16), int(voice.config.sample_rate))


def _versions() -> dict[str, str]:
    return {p: importlib.metadata.version(p) for p in (PIPER_PACKAGE, "onnxruntime", DEFAULT_VOICE_PACKAGE, "av")}


def synthesize_lines(lines: Sequence[str], length_scale: float = CALLER_LENGTH_SCALE) -> tuple[list[Utterance],
                                                                                                CallerVoice]:
    """Each line spoken by Piper's default voice at ``length_scale`` with both noise terms off (the same line gives
    the same samples every run), resampled to 16 kHz mono. Moved from converse/voice.py."""
    voice, syn, model = _piper(length_scale)
    utterances = [speech_caller.utterance(index, line, _speak(voice, syn, line), "synthesized", None,
                                          f"the synthesized line {index}")
                  for index, line in enumerate(lines, start=1)]
    return utterances, CallerVoice("piper", model.stem, length_scale, _versions())


def join_parts(parts: Sequence[np.ndarray], pause_ms: float) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The parts of one sentence (16 kHz) joined by ``pause_ms`` of digital silence, each join's quiet edges (the
    synthesizer's own lead and tail silence, under the part's floor) trimmed so the caller is silent for the pause
    and no longer; returns the line and where each pause is in it (samples, [start, end))."""
    pause = np.zeros(round(pause_ms * SAMPLE_RATE / 1000), np.int16)
    pieces: list[np.ndarray] = []
    pauses = []
    for i, part in enumerate(parts):
        span = audible_span(part, noise_floor(part)) or (0, len(part))
        lo = span[0] if i > 0 else 0
        hi = span[1] if i < len(parts) - 1 else len(part)
        if i > 0:
            at = sum(len(p) for p in pieces)
            pauses.append((at, at + len(pause)))
            pieces.append(pause)
        pieces.append(part[lo:hi].astype(np.int16))
    return np.concatenate(pieces), pauses


def synthesize_paused(lines: Sequence[Sequence[str]], pause_ms: float = PAUSE_MS,
                      length_scale: float = CALLER_LENGTH_SCALE) -> tuple[list[Utterance], list[list[tuple[int, int]]],
                                                                          CallerVoice]:
    """Lines given in parts, each part spoken by Piper as :func:`synthesize_lines` does and the parts of a line
    joined by ``pause_ms`` of digital silence (:func:`join_parts`); one turn each, its script the whole sentence.
    Returns the utterances, each one's planned pauses (16 kHz samples of the utterance, its lead silence counted)
    and the voice."""
    voice, syn, model = _piper(length_scale)
    utterances, pauses = [], []
    lead = speech_caller.LEAD_MS * SAMPLE_RATE // 1000
    for index, parts in enumerate(lines, start=1):
        speech, gaps = join_parts([_speak(voice, syn, part) for part in parts], pause_ms)
        utterances.append(speech_caller.utterance(index, " ".join(parts), speech, "synthesized", None,
                                                  f"the synthesized line {index}"))
        pauses.append([(lead + a, lead + b) for a, b in gaps])
    return utterances, pauses, CallerVoice("piper", model.stem, length_scale, _versions())


def load_lines(folder: Path) -> speech_caller.CallerAudio:
    """The user's own recordings, one per turn in name order, with the user's transcripts and barge-in plan if the
    folder has them (voice_llm.engines.speech_in.caller_audio.load_folder)."""
    return speech_caller.load_folder(folder)


@dataclass(frozen=True)
class CallerLine:
    """One turn's caller audio as sent: at the line's rate, through its codec once (the samples the agent gets)."""

    index: int  # 1-based turn number
    script: str | None  # what the caller says; None: the user's audio came without a transcript
    samples: np.ndarray  # int16 at the line's rate, the utterance's lead silence included
    rate: int
    source: str  # "synthesized" or the file it came from
    converted_from: str | None
    floor: int  # dial.measure.caller_sound: speech.caller.noise_floor of these samples after their lead-in
    start: int  # first sample above the floor
    end: int  # one past the last
    # planned pauses inside the speech, as sent: each the run of samples at or under the floor around the pause
    # the line was made with ([start, end) samples; `--caller-lines pause`); () for a line without one
    pauses: tuple[tuple[int, int], ...] = ()

    @property
    def duration_ms(self) -> float:
        return len(self.samples) * 1000.0 / self.rate

    @property
    def speech_start_ms(self) -> float:
        return self.start * 1000.0 / self.rate

    @property
    def speech_end_ms(self) -> float:
        return self.end * 1000.0 / self.rate


def quiet_run(samples: np.ndarray, floor: int, at: int) -> tuple[int, int]:
    """The run of samples at or under ``floor`` around sample ``at`` ([start, end)); (at, at) when ``at`` sounds."""
    if not 0 <= at < len(samples) or abs(int(samples[at])) > floor:
        return at, at
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > floor)
    before, after = loud[loud < at], loud[loud > at]
    return (int(before[-1]) + 1 if before.size else 0), (int(after[0]) if after.size else len(samples))


def on_line(utterance: Utterance, line: wire.LineFormat,
            pauses: Sequence[tuple[int, int]] = ()) -> CallerLine:
    """``utterance`` (16 kHz) as it travels on ``line``: resampled, encoded and decoded once. ``pauses``: the
    planned pauses in the utterance (16 kHz samples); each is kept as the silent run it became on the line (the
    resampler's edges and the codec move it by a few samples)."""
    samples = to_rate(utterance.samples, SAMPLE_RATE, line.rate)
    samples = wire.decode(line, wire.encode(line, samples))
    floor, span = caller_sound(samples, line.rate, line.frame_samples)  # the heard channel's rule (dial.measure)
    if span is None:
        raise CallerAudioError(f"turn {utterance.index} ({utterance.source}) has no sample above the noise floor "
                               f"({floor}) once resampled to the line's {line.rate} Hz")
    scale = line.rate / SAMPLE_RATE
    kept = tuple(quiet_run(samples, floor, round((a + b) / 2 * scale)) for a, b in pauses)
    return CallerLine(utterance.index, utterance.script, samples, line.rate, utterance.source,
                      utterance.converted_from, floor, span[0], span[1], tuple(p for p in kept if p[1] > p[0]))
