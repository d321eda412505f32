"""The caller's gap measured on the recording itself: end of caller energy -> start of assistant energy.

converse/call.wav is what a recorder on the line heard (left = caller, right = assistant, sample 0 = call clock
0 ms). This module measures, from its samples alone, where each channel carries sound; ``check`` compares that
with the times converse.json reports, so a gap, a breakdown or a recording that disagree cannot all pass.

The rule (pure functions on int16 arrays; :func:`read_call` is the only reader), the same levels the run uses
for its own events (converse/caller.py: "the last sample above the noise floor"), measured per turn:

* **Frames of 32 ms** (512 samples at 16 kHz) on the grid of sample 0: the frames the VAD was fed, and the one
  unit of time the comparisons allow.
* **Background** of a turn's window: the peak of its quietest 32 ms frame that is not digital zero (the
  recorder's own padding is exact zeros and says nothing of the line): the recording's own noise, a few units for
  synthesized audio. The **silence level** is 0 when the window holds a frame of exact zeros (a digitally silent
  line, as the assistant's channel always is: any sample off zero is sound), else the background.
* **Noise floor** (speech level): FLOOR_MIN (100 of 32768, -50.3 dBFS) or NOISE_FACTOR x the background when
  that is louder, at most FLOOR_MAX (-30.3 dBFS): converse/caller.py's rule and constants (one rule, imported);
  where converse.json states the floor the run used on a turn's utterance (``noise_floor``), that one. A frame
  carries energy when its loudest sample is above the floor (peak against a floor made of peaks: like with like;
  a frame's RMS sits 10-20 dB under its peak and would hide a soft consonant). The edges are then placed to the
  sample, not to the frame grid: the run's own speech_end is a sample, and an edge rounded to 32 ms would use up
  the whole one-frame tolerance of the comparison before any disagreement.
* **End of caller energy**: one past the last caller sample above the floor in the turn's window (the
  utterance's true end as the run defines it; Piper's inaudible fade below -50 dBFS is not speech).
* **Start of assistant energy**: the first assistant sample above the floor after the caller's end, walked back
  to where that sound leaves silence (the first sample above the silence level, at most ONSET_FRAMES frames
  earlier): the assistant's audio is put on the line from its first sample, and Piper's first ~40 ms rise from
  -90 dBFS before they reach speech level. If the assistant was already sounding when the caller stopped (the
  pipeline committed early), the start of that sound, so the measured gap is negative like the reported one.

A turn's caller window runs from its ``caller_offset_ms`` (where its audio began to be fed: an input of the run,
not a measurement) to the next turn's, or the end of the recording; its reply is searched from the caller's end to
the end of the caller's next utterance (an early barge-in feeds the next line's lead silence before the reply
starts).
"""

from __future__ import annotations

import io
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voice_llm.util.artifacts import read_artifact_bytes
from voice_llm.speech.caller import FLOOR_MAX, FLOOR_MIN, NOISE_FACTOR  # the run's floor rule: one rule, not two
from voice_llm.speech.caller import FRAME_SAMPLES, SAMPLE_RATE  # 512 samples = 32 ms at 16 kHz: the VAD's frame
from voice_llm.errors import ArtifactError

ONSET_FRAMES = 2  # how far before reaching speech level an assistant sound may begin (Piper: up to ~45 ms)
FULL_SCALE = 32768.0


@dataclass(frozen=True)
class Call:
    """call.wav decoded: one int16 array per channel, on the call clock (sample 0 = 0 ms)."""

    caller: np.ndarray
    assistant: np.ndarray
    sample_rate: int

    @property
    def frames(self) -> int:
        return len(self.caller)

    def ms(self, sample: float) -> float:
        return sample * 1000.0 / self.sample_rate

    def sample(self, ms: float) -> int:
        return round(ms * self.sample_rate / 1000.0)


@dataclass(frozen=True)
class Level:
    """The levels of one stretch of a channel: its silence (background peak) and its noise floor (speech level)."""

    silence: int
    floor: int


@dataclass(frozen=True)
class TurnGap:
    """One turn measured on the recording: None where the channel had no sound in the turn's window."""

    index: int
    caller_end_ms: float | None  # one past the last caller sample above the floor
    assistant_start_ms: float | None  # the first sample of the assistant sound that follows
    caller_floor: int
    assistant_floor: int

    @property
    def gap_ms(self) -> float | None:
        if self.caller_end_ms is None or self.assistant_start_ms is None:
            return None
        return self.assistant_start_ms - self.caller_end_ms


def frame_peaks(samples: np.ndarray, frame_samples: int = FRAME_SAMPLES) -> np.ndarray:
    """The loudest |sample| of each whole frame on the grid of ``samples[0]`` (a partial last frame is left out)."""
    whole = len(samples) // frame_samples
    if whole == 0:
        return np.zeros(0, dtype=np.int32)
    return np.abs(samples[: whole * frame_samples].astype(np.int32)).reshape(whole, frame_samples).max(axis=1)


def level(samples: np.ndarray) -> Level:
    """The silence level and the noise floor of ``samples``, by the rule in the module docstring."""
    peaks = frame_peaks(samples)
    heard = peaks[peaks > 0]
    background = int(heard.min()) if len(heard) else 0
    silence = 0 if len(heard) < len(peaks) else background  # a digitally silent line: any sample off zero is sound
    return Level(silence, min(FLOOR_MAX, max(FLOOR_MIN, int(NOISE_FACTOR * background))))


def _above(samples: np.ndarray, threshold: int, start: int, end: int) -> np.ndarray:
    """Indices (absolute) of the samples in [start, end) whose magnitude is above ``threshold``."""
    start, end = max(start, 0), min(end, len(samples))
    if end <= start:
        return np.zeros(0, dtype=np.int64)
    return start + np.flatnonzero(np.abs(samples[start:end].astype(np.int32)) > threshold)


def energy_end(samples: np.ndarray, floor: int, start: int, end: int) -> int | None:
    """One past the last sample above ``floor`` in [start, end); None when there is none."""
    found = _above(samples, floor, start, end)
    return int(found[-1]) + 1 if len(found) else None


def energy_start(samples: np.ndarray, levels: Level, start: int, end: int) -> int | None:
    """The first sample of the first sound above the floor in [start, end), walked back to where it leaves
    silence (at most ONSET_FRAMES frames, never before ``start``); None when nothing is above the floor."""
    found = _above(samples, levels.floor, start, end)
    if not len(found):
        return None
    loud = int(found[0])
    quiet = _above(samples, levels.silence, max(start, loud - ONSET_FRAMES * FRAME_SAMPLES), loud + 1)
    if not len(quiet):
        return loud
    # the sound's own beginning: the start of the last run of non-silent samples before ``loud`` with no
    # frame-long silence inside it
    gaps = np.flatnonzero(np.diff(quiet) > FRAME_SAMPLES)
    return int(quiet[gaps[-1] + 1]) if len(gaps) else int(quiet[0])


def _sounding_since(samples: np.ndarray, levels: Level, at: int, start: int) -> int | None:
    """When the assistant sound that is under way at sample ``at`` began (not before ``start``); None when the
    channel is silent (nothing above the floor) in the frame that ends at ``at``."""
    if not len(_above(samples, levels.floor, at - FRAME_SAMPLES, at + 1)):
        return None
    heard = _above(samples, levels.silence, start, at + 1)
    breaks = np.flatnonzero(np.diff(heard) > FRAME_SAMPLES)  # a frame of silence ends a sound
    begin = int(heard[breaks[-1] + 1]) if len(breaks) else int(heard[0])
    return energy_start(samples, levels, begin, at + 1)


def utterance_bounds(samples: np.ndarray) -> tuple[int, int] | None:
    """(first sample, one past the last) above the noise floor of a mono utterance; None when it is silent."""
    return audible_bounds(samples, level(samples).floor)


def audible_bounds(samples: np.ndarray, floor: int) -> tuple[int, int] | None:
    """(first sample, one past the last) whose magnitude is above ``floor``; None when none is."""
    found = _above(samples, floor, 0, len(samples))
    return (int(found[0]), int(found[-1]) + 1) if len(found) else None


def _windows(call: Call, offsets_ms: Sequence[float]) -> list[tuple[int, int]]:
    bounds = [min(max(call.sample(ms), 0), call.frames) for ms in offsets_ms] + [call.frames]
    return list(zip(bounds, bounds[1:]))


def measure_turns(call: Call, offsets_ms: Sequence[float],
                  floors: Sequence[int | None] | None = None) -> list[TurnGap]:
    """Each turn's end of caller energy (in the window ``offsets_ms`` open: its own samples) and the start of the
    assistant energy that follows it, searched up to the end of the caller's *next* utterance: the reply to a
    turn starts before the caller has said the next line, but the next line may begin to be fed (its lead
    silence) before the reply starts when the caller barges in early. ``floors``: each turn's caller noise floor
    as the run computed it on the utterance alone (None: from the window's own samples, by the same rule)."""
    windows = _windows(call, offsets_ms)
    ends: list[int | None] = []
    levels = []
    for index, (start, end) in enumerate(windows):
        caller = level(call.caller[start:end])
        stated = floors[index] if floors is not None and index < len(floors) else None
        if stated is not None:
            caller = Level(caller.silence, stated)
        levels.append(caller)
        ends.append(energy_end(call.caller, caller.floor, start, end))
    gaps = []
    for index, ((start, end), caller_end) in enumerate(zip(windows, ends)):
        later = [e for e in ends[index + 1:index + 2] if e is not None]
        until = later[0] if later else call.frames
        assistant = level(call.assistant[start:until])
        assistant_start = None
        if caller_end is not None:  # already sounding when the caller stopped: that sound's start (negative gap)
            assistant_start = _sounding_since(call.assistant, assistant, caller_end - 1, start)
            if assistant_start is None:
                assistant_start = energy_start(call.assistant, assistant, caller_end, until)
        gaps.append(TurnGap(index + 1, None if caller_end is None else call.ms(caller_end),
                            None if assistant_start is None else call.ms(assistant_start),
                            levels[index].floor, assistant.floor))
    return gaps


def last_sound_ms(call: Call, start_ms: float, end_ms: float) -> float | None:
    """One past the last assistant sample off silence in [start_ms, end_ms), or None when the stretch is silent.
    Silence is the assistant channel's own silence level over the whole call (digital zero for a synthesized
    line), not that of the stretch: a stretch holding only a quiet sound would otherwise be its own silence."""
    start, end = max(call.sample(start_ms), 0), min(call.sample(end_ms), call.frames)
    if end <= start:
        return None
    found = energy_end(call.assistant, level(call.assistant).silence, start, end)
    return None if found is None else call.ms(found)


def caller_onset_ms(call: Call, start_ms: float, end_ms: float, floor: int | None = None) -> float | None:
    """The first caller sample above ``floor`` (None: the caller channel's own) in [start_ms, end_ms) (a
    barge-in's true onset, by the same rule as an utterance's start), or None when the caller is silent there."""
    start, end = max(call.sample(start_ms), 0), min(call.sample(end_ms), call.frames)
    found = _above(call.caller, level(call.caller).floor if floor is None else floor, start, end)
    return call.ms(int(found[0])) if len(found) else None


def decode_call(data: bytes, what: str = "call.wav") -> Call:
    """A stereo 16-bit WAV's bytes as a :class:`Call`; anything else is an ArtifactError naming ``what``."""
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            channels, width, rate, frames = wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()
            pcm = wav.readframes(frames)
    except (wave.Error, EOFError, OSError) as exc:
        raise ArtifactError(f"{what} is not a readable WAV file: {exc}") from exc
    if (channels, width) != (2, 2) or rate <= 0:
        raise ArtifactError(f"{what}: {channels} channels, {8 * width}-bit, {rate} Hz; expected stereo 16-bit PCM")
    if len(pcm) != frames * 4:
        raise ArtifactError(f"{what} is truncated: {len(pcm)} bytes of audio, the header says {frames * 4}")
    samples = np.frombuffer(pcm, dtype="<i2").reshape(-1, 2)
    return Call(samples[:, 0].copy(), samples[:, 1].copy(), rate)


def read_call(path: Path) -> Call:
    """converse/call.wav, read through artifacts.read_artifact_bytes (never a link, a FIFO or a device)."""
    return decode_call(read_artifact_bytes(path), path.name)


def stereo_wav_bytes(caller: np.ndarray, assistant: np.ndarray, sample_rate: int = SAMPLE_RATE) -> bytes:
    """A stereo 16-bit WAV of two equally long channels (for fixtures and tampered copies)."""
    if len(caller) != len(assistant):
        raise ValueError(f"channels of {len(caller)} and {len(assistant)} samples")
    interleaved = np.empty(2 * len(caller), dtype="<i2")
    interleaved[0::2], interleaved[1::2] = caller, assistant
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(interleaved.tobytes())
    return buf.getvalue()
