"""Issue 31 item 12: an empty server answer is said as what it is ("the server sent an empty reply"), never as
the TTS engine's failure (``piper made no sound of the reply ''``). No real engine runs: an empty answer never
reaches one, and the stand-in would fail the test loudly if it were asked to speak."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeserver import FakeServer, Reply, at, llama_events

from voice_llm.core.errors import NothingToSpeakError
from voice_llm.engines.speech_out.engine import AudioChunk
from voice_llm.engines.speech_out.live import nothing_to_speak
from voice_llm.capabilities.speak import step as speak


class NeverSpeaks:
    """A stand-in named like Piper that must not be asked anything for an empty answer."""

    name, voice, sample_rate = "piper", "stand-in", 22050

    def synthesize(self, text: str) -> Iterator[AudioChunk]:
        raise AssertionError(f"the engine was asked to speak {text!r}")

    def versions(self) -> dict[str, str]:
        return {}


@pytest.mark.parametrize("texts", [[], [""], ["", "  "]])
def test_the_speak_step_says_the_server_sent_an_empty_reply(texts: list[str], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch, step_context) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "audio").mkdir()
    earlier = {"audio.json": b'{"earlier": true}\n', "audio/whole-heard.wav": b"RIFF earlier"}
    for name, data in earlier.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.setattr(speak, "load_engine", lambda *a: NeverSpeaks())
    monkeypatch.setattr(speak, "_loaded", functools.lru_cache(maxsize=2)(speak._loaded.__wrapped__))
    with FakeServer(Reply.stream(at(0.0, llama_events(texts)))) as fake:
        with pytest.raises(NothingToSpeakError) as failure:
            speak.run(step_context(fake.url))
    assert str(failure.value) == "the server sent an empty reply: the answer has no text to speak"
    assert "made no sound" not in str(failure.value)
    assert {name: (tmp_path / name).read_bytes() for name in earlier} == earlier  # earlier artifacts untouched


def test_the_three_causes_are_told_apart() -> None:
    engine = NeverSpeaks()
    assert str(nothing_to_speak(engine, "", "reply")) == "the server sent an empty reply: the reply has no text to speak"
    assert str(nothing_to_speak(engine, "... !!", "reply")) == "the reply has no speakable text: '... !!'"
    assert str(nothing_to_speak(engine, "Hello.", "reply")) == "piper made no sound of the reply 'Hello.'"
