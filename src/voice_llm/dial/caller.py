"""The caller's lines as they go on the line: spoken by Piper (the clinic lines, as converse did) or the user's own
recordings (``--caller-audio DIR`` through voice_llm.speech.caller), at 16 kHz first, then resampled to the line's
rate with PyAV (libswresample, as voice_llm.speech.caller.resample) and passed through the line's codec once, so
what dial/caller-NN.wav holds, what the left channel of dial/call.wav holds and what the agent decodes are the
same samples (mu-law is lossy: the samples sent are the decoded ones).

Where a line's speech truly is comes from those samples alone: the first and the last sample above the noise
floor (voice_llm.speech.caller.noise_floor, the same function the heard channel is measured with).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voice_llm.errors import TTSUnavailableError
from voice_llm.line import wire
from voice_llm.speech import caller as speech_caller
from voice_llm.speech.caller import (CALLER_LENGTH_SCALE, CALLER_NOISE_SCALE, CALLER_NOISE_W_SCALE, SAMPLE_RATE,
                                     CallerAudioError, Utterance, audible_span, noise_floor)
from voice_llm.tts import DEFAULT_VOICE_PACKAGE, PIPER_PACKAGE, default_voice


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


def synthesize_lines(lines: Sequence[str], length_scale: float = CALLER_LENGTH_SCALE) -> tuple[list[Utterance],
                                                                                                CallerVoice]:
    """Each line spoken by Piper's default voice at ``length_scale`` with both noise terms off (the same line gives
    the same samples every run), resampled to 16 kHz mono. Moved from converse/voice.py."""
    model, config = default_voice()
    try:
        from piper import PiperVoice, SynthesisConfig
    except ImportError as exc:
        raise TTSUnavailableError(f"Piper is not installed: pip install '{PIPER_PACKAGE}>=1.8,<1.9'") from exc
    voice = PiperVoice.load(model, config_path=config)
    rate = int(voice.config.sample_rate)
    syn = SynthesisConfig(length_scale=length_scale, noise_scale=CALLER_NOISE_SCALE, noise_w_scale=CALLER_NOISE_W_SCALE)
    utterances = []
    for index, line in enumerate(lines, start=1):
        pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(line, syn_config=syn))
        speech = speech_caller.resample(np.frombuffer(pcm, np.int16), rate)
        utterances.append(speech_caller.utterance(index, line, speech, "synthesized", None,
                                                  f"the synthesized line {index}"))
    versions = {p: importlib.metadata.version(p) for p in (PIPER_PACKAGE, "onnxruntime", DEFAULT_VOICE_PACKAGE, "av")}
    return utterances, CallerVoice("piper", model.stem, length_scale, versions)


def load_lines(folder: Path) -> speech_caller.CallerAudio:
    """The user's own recordings, one per turn in name order, with the user's transcripts and barge-in plan if the
    folder has them (voice_llm.speech.caller.load_folder)."""
    return speech_caller.load_folder(folder)


def to_rate(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Mono int16 from ``rate_in`` to ``rate_out`` with PyAV's resampler (libswresample), as speech.caller does."""
    if rate_in == rate_out:
        return samples.astype(np.int16)
    import av

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples.astype(np.int16)).reshape(1, -1), format="s16",
                                       layout="mono")
    frame.sample_rate = rate_in
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate_out)
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out).astype(np.int16) if out else np.zeros(0, np.int16)


@dataclass(frozen=True)
class CallerLine:
    """One turn's caller audio as sent: at the line's rate, through its codec once (the samples the agent gets)."""

    index: int  # 1-based turn number
    script: str | None  # what the caller says; None: the user's audio came without a transcript
    samples: np.ndarray  # int16 at the line's rate, the utterance's lead silence included
    rate: int
    source: str  # "synthesized" or the file it came from
    converted_from: str | None
    floor: int  # speech.caller.noise_floor of these samples
    start: int  # first sample above the floor
    end: int  # one past the last

    @property
    def duration_ms(self) -> float:
        return len(self.samples) * 1000.0 / self.rate

    @property
    def speech_start_ms(self) -> float:
        return self.start * 1000.0 / self.rate

    @property
    def speech_end_ms(self) -> float:
        return self.end * 1000.0 / self.rate


def on_line(utterance: Utterance, line: wire.LineFormat) -> CallerLine:
    """``utterance`` (16 kHz) as it travels on ``line``: resampled, encoded and decoded once."""
    samples = to_rate(utterance.samples, SAMPLE_RATE, line.rate)
    samples = wire.decode(line, wire.encode(line, samples))
    floor = noise_floor(samples)
    span = audible_span(samples, floor)
    if span is None:
        raise CallerAudioError(f"turn {utterance.index} ({utterance.source}) has no sample above the noise floor "
                               f"({floor}) once resampled to the line's {line.rate} Hz")
    return CallerLine(utterance.index, utterance.script, samples, line.rate, utterance.source,
                      utterance.converted_from, floor, span[0], span[1])
