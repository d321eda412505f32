"""The caller's side of the call: each scripted line as 16 kHz mono int16 speech, and where its speech truly is.

Two sources. By default the clinic call's caller lines are synthesized once per run with Piper (the capability
that speaks them does it: voice_llm.converse.voice) and resampled here from Piper's 22.05 kHz to the 16 kHz that
Silero and Whisper take (PyAV's resampler, a faster-whisper dependency). ``--caller-audio DIR`` takes the user's
own recordings instead, one WAV per turn in name order; one that is not 16-bit mono 16 kHz PCM is converted
(decoded and resampled by PyAV) and the artifact says from what.

The true start and end of an utterance come from its samples alone: the first and the last sample whose magnitude
is above the noise floor (:func:`noise_floor`). Everything downstream (VAD, endpoint) is timed against them.
"""

from __future__ import annotations

import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voice_llm.errors import ConfigError

SAMPLE_RATE = 16000  # Silero and Whisper both take 16 kHz mono
SAMPLE_WIDTH = 2  # int16
FRAME_SAMPLES = 512  # Silero's frame: 32 ms at 16 kHz
LEAD_MS = 300  # silence before each utterance: the VAD sees silence first, as on a line that was quiet
CALLER_LENGTH_SCALE = 1.1  # Piper's phoneme length factor for the caller: 10 % slower than the assistant (1.0)
# Piper's two noise terms off for the caller: the same line gives the same samples every run (its default noise
# varies the pauses: "Okay. Do you take..." paused 7-10 frames, so the 300 ms endpoint split it in some runs only).
# At 1.1 the longest pause inside lines 1-4 is 9 frames (288 ms), under the default endpoint (10 frames).
CALLER_NOISE_SCALE = 0.0
CALLER_NOISE_W_SCALE = 0.0
# The noise floor: a sample is speech-level when its magnitude is above this. 100 of 32768 is -50.3 dBFS: Piper's
# silence is digital zero and its quietest speech sounds are above -45 dBFS. For a recording with louder background
# noise the floor is raised to NOISE_FACTOR x the loudest sample of its quietest 32 ms frame, but never above
# FLOOR_MAX (-30.3 dBFS): a recording with no quiet frame at all has no background to measure (see noise_floor).
FLOOR_MIN = 100
FLOOR_MAX = 1000
NOISE_FACTOR = 2.0
MAX_UTTERANCE_S = 30.0  # Whisper's window: a longer turn would be cut by the recognizer
MAX_FILE_BYTES = 64 * 1024 * 1024


class CallerAudioError(ConfigError):
    """The caller's audio cannot be used: a DIR without WAVs, a file that is not audio, a turn with no speech."""


@dataclass(frozen=True)
class Utterance:
    """One turn's caller audio as it is fed: LEAD_MS of silence, then the speech (16 kHz mono int16)."""

    index: int  # 1-based turn number
    script: str  # what the caller says (the WER reference)
    samples: np.ndarray  # int16, lead silence included
    source: str  # "synthesized" or the file it came from
    converted_from: str | None  # the file's own format when it was not 16-bit mono 16 kHz PCM; else None
    floor: int  # the noise floor used for this utterance (|sample| > floor is speech-level)
    start: int  # first sample above the floor (index into samples)
    end: int  # one past the last sample above the floor

    @property
    def speech_start_ms(self) -> float:
        return self.start * 1000.0 / SAMPLE_RATE

    @property
    def speech_end_ms(self) -> float:
        """The end of the last sample above the floor, from the start of ``samples``."""
        return self.end * 1000.0 / SAMPLE_RATE

    @property
    def duration_ms(self) -> float:
        return len(self.samples) * 1000.0 / SAMPLE_RATE

    def speech(self) -> np.ndarray:
        return self.samples[self.start:self.end]


def noise_floor(samples: np.ndarray) -> int:
    """FLOOR_MIN, or NOISE_FACTOR x the peak of the quietest whole 32 ms frame when that is louder (a noisy
    recording: its background would otherwise count as speech to the very end), at most FLOOR_MAX."""
    whole = len(samples) // FRAME_SAMPLES
    if whole == 0:
        return FLOOR_MIN
    peaks = np.abs(samples[:whole * FRAME_SAMPLES].astype(np.int32)).reshape(whole, FRAME_SAMPLES).max(axis=1)
    return min(FLOOR_MAX, max(FLOOR_MIN, int(NOISE_FACTOR * int(peaks.min()))))


def audible_span(samples: np.ndarray, floor: int) -> tuple[int, int] | None:
    """(first sample above ``floor``, one past the last), or None when no sample is."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > floor)
    if loud.size == 0:
        return None
    return int(loud[0]), int(loud[-1]) + 1


def resample(samples: np.ndarray, rate: int, channels: int = 1, fmt: str = "s16") -> np.ndarray:
    """Interleaved ``samples`` (``fmt``: s16, s32, flt, u8) at ``rate`` -> 16 kHz mono int16, with PyAV's
    resampler (libswresample); channels are mixed down by it."""
    import av

    layout = {1: "mono", 2: "stereo"}.get(channels)
    if layout is None:
        layout = av.AudioLayout(channels).name
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples).reshape(1, -1), format=fmt, layout=layout)
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out).astype(np.int16) if out else np.zeros(0, np.int16)


def utterance(index: int, script: str, speech: np.ndarray, source: str, converted_from: str | None,
               what: str) -> Utterance:
    samples = np.concatenate([np.zeros(LEAD_MS * SAMPLE_RATE // 1000, np.int16), speech.astype(np.int16)])
    floor = noise_floor(speech)
    span = audible_span(samples, floor)
    if span is None:
        raise CallerAudioError(f"no speech detected in turn {index} ({what}: no sample above the noise floor "
                               f"of {floor} = {20 * np.log10(floor / 32768):.1f} dBFS)")
    if len(speech) > MAX_UTTERANCE_S * SAMPLE_RATE:
        raise CallerAudioError(f"turn {index} ({what}) is {len(speech) / SAMPLE_RATE:.1f} s long; a turn may be at "
                               f"most {MAX_UTTERANCE_S:.0f} s (Whisper's window)")
    return Utterance(index, script, samples, source, converted_from, floor, span[0], span[1])


# ---------------------------------------------------------------------------------------------------------------
# The user's own recordings


def caller_files(folder: Path) -> list[Path]:
    """The WAVs in ``folder`` in name order (one per turn)."""
    if not folder.is_dir():
        raise CallerAudioError(f"--caller-audio {folder} is not a folder")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".wav" and p.is_file())
    if not files:
        raise CallerAudioError(f"--caller-audio {folder} holds no .wav file (one per turn, in name order)")
    return files


def _read_pcm_wav(path: Path) -> tuple[np.ndarray, int, int, int] | None:
    """(interleaved samples, rate, channels, sample width) of a PCM WAV the wave module reads; None otherwise."""
    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            data = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError):
        return None
    if width == 1:
        samples = (np.frombuffer(data, np.uint8).astype(np.int16) - 128) << 8
    elif width == 2:
        samples = np.frombuffer(data, "<i2")
    elif width == 3:
        raw = np.frombuffer(data[:len(data) // 3 * 3], np.uint8).reshape(-1, 3).astype(np.int32)
        samples = ((raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)) << 8 >> 16).astype(np.int16)
    elif width == 4:
        samples = (np.frombuffer(data, "<i4") >> 16).astype(np.int16)
    else:
        return None
    return samples.astype(np.int16), rate, channels, width


def _decode_any(path: Path, what: str) -> tuple[np.ndarray, str]:
    """Any audio PyAV decodes (float WAV, 24-bit, another codec), as 16 kHz mono int16, and its own format."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise CallerAudioError(f"{what} holds no audio stream")
            stream = container.streams.audio[0]
            described = f"{stream.codec_context.name}, {stream.channels} channel(s), {stream.rate} Hz"
            resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            out = []
            for frame in container.decode(stream):
                out += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
            out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    except CallerAudioError:
        raise
    except Exception as exc:  # av.error.* (InvalidDataError, ...) derive from Exception only
        raise CallerAudioError(f"{what} is not a WAV or audio file PyAV can read: {str(exc)[:160]}") from exc
    return (np.concatenate(out).astype(np.int16) if out else np.zeros(0, np.int16)), described


def load_file(path: Path, index: int, script: str) -> Utterance:
    """One user recording as a turn: 16-bit mono 16 kHz PCM taken as is, anything else converted."""
    what = f"turn {index}'s file {path}"
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CallerAudioError(f"cannot read {what}: {exc.strerror or exc}") from exc
    if size > MAX_FILE_BYTES:
        raise CallerAudioError(f"{what} is {size // (1024 * 1024)} MB; at most {MAX_FILE_BYTES // (1024 * 1024)} MB")
    pcm = _read_pcm_wav(path)
    converted: str | None
    if pcm is not None:
        samples, rate, channels, width = pcm
        if rate <= 0 or channels < 1:
            raise CallerAudioError(f"{what} has {channels} channel(s) at {rate} Hz")
        if (rate, channels, width) == (SAMPLE_RATE, 1, SAMPLE_WIDTH):
            speech, converted = samples, None
        else:
            speech = resample(samples, rate, channels)
            converted = f"pcm_s{8 * width}{'u' if width == 1 else 'le'}, {channels} channel(s), {rate} Hz"
    else:
        speech, converted = _decode_any(path, what)
    return utterance(index, script, speech, str(path), converted, what)


def load_folder(folder: Path, scripts: Sequence[str]) -> list[Utterance]:
    """One utterance per WAV in ``folder``, turn i scored against ``scripts[i]``; more WAVs than lines is refused."""
    files = caller_files(folder)
    if len(files) > len(scripts):
        raise CallerAudioError(f"--caller-audio {folder} holds {len(files)} WAVs, but the dialogue has only "
                               f"{len(scripts)} caller lines (one WAV per turn, in name order)")
    return [load_file(path, i, scripts[i - 1]) for i, path in enumerate(files, start=1)]
