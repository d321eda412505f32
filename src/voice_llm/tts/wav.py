"""WAV files: write PCM as a WAV, read a WAV's header back (the checks use it to prove a file decodes)."""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from pathlib import Path

from voice_llm.util.artifacts import read_artifact_bytes
from voice_llm.errors import ArtifactError
from voice_llm.tts.engine import SAMPLE_WIDTH


@dataclass(frozen=True)
class WavInfo:
    channels: int
    sample_width: int
    sample_rate: int
    frames: int

    @property
    def duration_ms(self) -> float:
        return self.frames * 1000.0 / self.sample_rate


def wav_bytes(pcm: bytes, sample_rate: int) -> bytes:
    """A complete mono 16-bit WAV file holding ``pcm``."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(SAMPLE_WIDTH)
        out.setframerate(sample_rate)
        out.writeframes(pcm)
    return buf.getvalue()


def silence(ms: float, sample_rate: int) -> bytes:
    return b"\x00" * (round(ms * sample_rate / 1000.0) * SAMPLE_WIDTH)


def read_wav(path: Path) -> WavInfo:
    """Open ``path`` with the wave module and read every frame, so a truncated file is caught too. The bytes are
    read through artifacts.read_artifact_bytes: never through a link, a FIFO or a device, and bounded."""
    if not (path.exists() or path.is_symlink()):
        raise ArtifactError(f"{path} is missing")
    data = read_artifact_bytes(path)
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            info = WavInfo(wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes())
            data = wav.readframes(info.frames)
    except (wave.Error, EOFError, OSError) as exc:
        raise ArtifactError(f"{path} is not a readable WAV file: {exc}") from exc
    if info.sample_rate <= 0:
        raise ArtifactError(f"{path} has sample rate {info.sample_rate}")
    expected = info.frames * info.channels * info.sample_width
    if len(data) != expected:
        raise ArtifactError(f"{path} is truncated: {len(data)} bytes of audio, the header says {expected}")
    return info
