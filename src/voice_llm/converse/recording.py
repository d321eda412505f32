"""The call as a recorder on the line hears it: converse/call.wav, 16 kHz 16-bit stereo, caller on the left (as
fed to the VAD), assistant on the right (each piece of its audio at the time the player played it), sample 0 =
call clock 0; and the caller's turns as converse/caller-NN.wav (16 kHz mono, exactly the samples fed)."""

from __future__ import annotations

import io
import wave
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from voice_llm.speech.caller import SAMPLE_RATE, SAMPLE_WIDTH, resample
from voice_llm.util.artifacts import CONVERSE_DIR

CALL_WAV = f"{CONVERSE_DIR}/call.wav"


def caller_wav_name(index: int) -> str:
    return f"{CONVERSE_DIR}/caller-{index:02d}.wav"


def sample_at(ms: float) -> int:
    return round(ms * SAMPLE_RATE / 1000.0)


@dataclass(frozen=True)
class PlacedAudio:
    """Assistant audio (16 kHz mono int16) that starts playing at ``start_ms`` on the call clock."""

    start_ms: float
    samples: np.ndarray


def to_line_rate(pcm: bytes, rate: int) -> np.ndarray:
    """The assistant's PCM (Piper: 22.05 kHz) at the line's 16 kHz."""
    samples = np.frombuffer(pcm, "<i2")
    return samples.astype(np.int16) if rate == SAMPLE_RATE else resample(samples, rate)


def mono_wav(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(SAMPLE_WIDTH)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()


def stereo(left: np.ndarray, pieces: Sequence[PlacedAudio], frames: int) -> np.ndarray:
    """(frames, 2) int16: ``left`` (cut or padded to ``frames``) and the pieces mixed on the right at their
    start sample (a piece that would run past ``frames`` is cut there)."""
    out = np.zeros((frames, 2), np.int32)
    n = min(frames, len(left))
    out[:n, 0] = left[:n]
    for piece in pieces:
        at = sample_at(piece.start_ms)
        hi = min(frames, at + len(piece.samples))
        if hi > at:
            out[at:hi, 1] += piece.samples[:hi - at]
    return np.clip(out, -32768, 32767).astype(np.int16)


def stereo_wav(channels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(SAMPLE_WIDTH)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(channels.astype("<i2").tobytes())
    return buf.getvalue()
