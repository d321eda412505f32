"""WAV files, one writer and one reader for every artifact: the speak step's WAVs, the dialer's caller lines and
its live call recording are written by :class:`WavWriter` (whole files by :func:`wav_bytes`), and every WAV a
check reads is decoded by :func:`decode_wav`. PCM is signed 16-bit little-endian, interleaved when stereo.

Python's ``wave`` does the format: a writer fixes the header's sizes when it is closed, so a file written as a call
goes is valid at its end whatever happened before.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from voice_llm.core.errors import ArtifactError
from voice_llm.core.util.artifacts import read_artifact_bytes

SAMPLE_WIDTH = 2  # bytes: signed 16-bit little-endian PCM, for every engine, line and file


@dataclass(frozen=True)
class WavInfo:
    channels: int
    sample_width: int
    sample_rate: int
    frames: int

    @property
    def duration_ms(self) -> float:
        return self.frames * 1000.0 / self.sample_rate


class WavWriter:
    """16-bit PCM at ``rate`` with ``channels`` channels into ``file`` (opened for writing; it stays the caller's
    to close), piece by piece. Each piece goes straight to the file (``writeframesraw``: no seek back per piece);
    :meth:`close` writes the sizes into the header."""

    def __init__(self, file: BinaryIO, rate: int, channels: int = 1) -> None:
        self._wav = wave.open(file, "wb")
        self._wav.setnchannels(channels)
        self._wav.setsampwidth(SAMPLE_WIDTH)
        self._wav.setframerate(rate)

    def write(self, pcm: bytes) -> None:
        """Whole frames of little-endian int16, the channels interleaved."""
        self._wav.writeframesraw(pcm)

    def close(self) -> None:
        self._wav.close()


def wav_bytes(pcm: bytes, sample_rate: int, channels: int = 1) -> bytes:
    """A complete 16-bit WAV file holding ``pcm``."""
    buf = io.BytesIO()
    writer = WavWriter(buf, sample_rate, channels)
    writer.write(pcm)
    writer.close()
    return buf.getvalue()


def silence(ms: float, sample_rate: int) -> bytes:
    """``ms`` of digital silence, mono 16-bit PCM."""
    return b"\x00" * (round(ms * sample_rate / 1000.0) * SAMPLE_WIDTH)


def decode_wav(data: bytes, name: str) -> tuple[WavInfo, bytes]:
    """A WAV file's shape and every frame of it (interleaved PCM); an ArtifactError naming ``name`` when it does
    not decode, states no sample rate, or holds fewer frames than its header says (a truncated file)."""
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            info = WavInfo(wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes())
            frames = wav.readframes(info.frames)
    except (wave.Error, EOFError, OSError) as exc:
        raise ArtifactError(f"{name} is not a readable WAV file: {exc}") from exc
    if info.sample_rate <= 0:
        raise ArtifactError(f"{name} has sample rate {info.sample_rate}")
    expected = info.frames * info.channels * info.sample_width
    if len(frames) != expected:
        raise ArtifactError(f"{name} is truncated: {len(frames)} bytes of audio, the header says {expected}")
    return info, frames


def read_wav(path: Path) -> WavInfo:
    """``path`` decoded to its last frame (:func:`decode_wav`), so a truncated file is caught too. The bytes are
    read through artifacts.read_artifact_bytes: never through a link, a FIFO or a device, and bounded."""
    if not (path.exists() or path.is_symlink()):
        raise ArtifactError(f"{path} is missing")
    return decode_wav(read_artifact_bytes(path), str(path))[0]
