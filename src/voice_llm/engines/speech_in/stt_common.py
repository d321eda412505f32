"""What every STT engine shares (voice_llm.engines.speech_in.stt picks one, voice_llm.engines.speech_in.moonshine is one): its errors and
the cached digest of its weights, so an artifact names the exact files."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from voice_llm.core.errors import ConfigError, VoiceLLMError


class STTError(VoiceLLMError):
    """Speech to text failed (the model cannot be loaded, or a transcription raised mid-call)."""


class STTUnavailableError(STTError, ConfigError):
    """An STT engine's package or its weights are not installed."""


@functools.lru_cache(maxsize=4)
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
