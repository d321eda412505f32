"""The one interface every TTS engine offers: synthesize a text segment, yield PCM audio as it is made."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from voice_llm.engines.audio.wav import SAMPLE_WIDTH  # every engine's PCM: mono int16 little-endian

_SPEAKABLE = re.compile(r"\w")


@dataclass(frozen=True)
class AudioChunk:
    """Mono int16 PCM and the ``time.perf_counter()`` at which it was ready to play."""

    pcm: bytes
    ready_at: float

    def frames(self) -> int:
        return len(self.pcm) // SAMPLE_WIDTH


class TTSEngine(Protocol):
    name: str  # "piper", "espeak"
    voice: str  # what was loaded: a file path or an engine's voice name
    sample_rate: int

    def synthesize(self, text: str) -> Iterator[AudioChunk]:
        """Yield the audio of ``text`` piece by piece, each as soon as the engine has it. Raises
        :class:`voice_llm.core.errors.SynthesisError` when the engine fails. An engine that runs a program of its own
        bounds each run by its deadline (:class:`voice_llm.core.errors.SynthesisTimeoutError`) and starts it with
        :func:`voice_llm.core.util.children.running`, so the program and its process group are stopped however the run
        ends (closing the iterator early, an error, Ctrl-C or SIGTERM)."""
        ...

    def versions(self) -> dict[str, str]:
        """The versions of the libraries and voice that made the audio, for the artifact."""
        ...


def speakable(text: str) -> bool:
    """Whether a segment has anything to say: a letter or a digit (punctuation alone makes no speech)."""
    return bool(_SPEAKABLE.search(text))


def duration_ms(frames: int, sample_rate: int) -> float:
    return frames * 1000.0 / sample_rate
