"""The speak step's failure paths against a scripted server: each a clear error, the raw stream of the answer
kept, earlier audio artifacts untouched. The engine is the real Piper voice (wrapped to fail on cue)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeserver import FakeServer, Reply, at, llama_events

from voice_llm.core.errors import NothingToSpeakError, SynthesisError
from voice_llm.capabilities.speak import step as speak
from voice_llm.engines.speech_out.engine import AudioChunk
from voice_llm.engines.speech_out.engines import load_engine
from voice_llm.engines.speech_out.live import speak_live

ANSWER = ["Fast", " for", " 8", " hours,", " drinking", " only", " water.", " Take", " your", " usual",
          " medicines.", " Arrive", " early."]


@pytest.fixture(scope="module")
def piper():  # type: ignore[no-untyped-def]
    return load_engine("piper")


class FailsOn:
    """The real engine, failing like a crashed runtime on any segment that holds ``word``."""

    def __init__(self, engine, word: str) -> None:  # type: ignore[no-untyped-def]
        self._engine, self._word = engine, word
        self.name, self.voice, self.sample_rate = engine.name, engine.voice, engine.sample_rate

    def synthesize(self, text: str) -> Iterator[AudioChunk]:
        if self._word in text:
            raise SynthesisError(f"piper failed on {text[:60]!r}: RuntimeError: simulated")
        yield from self._engine.synthesize(text)

    def versions(self) -> dict[str, str]:
        return self._engine.versions()


def _earlier_audio(out: Path) -> dict[str, bytes]:
    (out / "audio").mkdir(parents=True)
    files = {"audio.json": b'{"earlier": true}\n', "audio/whole-heard.wav": b"RIFF earlier"}
    for name, data in files.items():
        (out / name).write_bytes(data)
    return files


@pytest.mark.slow
def test_synthesis_overlaps_the_stream(piper, tmp_path: Path, step_context) -> None:  # type: ignore[no-untyped-def]
    """The first sentence is being synthesized while later tokens are still arriving."""
    with FakeServer(Reply.stream(at(0.08, llama_events(ANSWER)))) as fake:
        ctx = step_context(fake.url)
        answer = speak_live(piper, "sentences", speak._request(ctx, "speak-sentences-1"))
    first = answer.segments[0]
    assert first.text == "Fast for 8 hours, drinking only water."
    assert first.text_ready_ms < first.synth_start_ms < answer.stream.total_ms
    assert answer.stream.ttft_ms <= first.text_ready_ms <= answer.playback.ttfa_ms
    assert [s.text for s in answer.segments] == [first.text, "Take your usual medicines.", "Arrive early."]
    assert (tmp_path / "raw" / "speak-sentences-1.sse").is_file()


@pytest.mark.slow
def test_tts_failing_mid_answer(piper, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_context) -> None:  # type: ignore[no-untyped-def]
    earlier = _earlier_audio(tmp_path)
    monkeypatch.setattr(speak, "load_engine", lambda *a: FailsOn(piper, "medicines"))
    # engine_for keeps loaded engines per process: a fresh cache here, so an engine loaded by an earlier test
    # (the session lab, another test) is not the one this test meant to replace
    monkeypatch.setattr(speak, "_loaded", functools.lru_cache(maxsize=2)(speak._loaded.__wrapped__))
    with FakeServer(Reply.stream(at(0.0, llama_events(ANSWER)))) as fake:
        with pytest.raises(SynthesisError, match=r"piper failed on 'Fast for 8 hours") as failure:
            speak.run(step_context(fake.url))
    raw = tmp_path / "raw" / "speak-whole-1.sse"
    assert failure.value.__notes__ == [f"speak whole, run 1: the answer's stream is kept in {raw}"]
    assert b"medicines" in raw.read_bytes() and raw.read_bytes().rstrip().endswith(b"data: [DONE]")
    assert {name: (tmp_path / name).read_bytes() for name in earlier} == earlier


@pytest.mark.slow
def test_answer_with_nothing_speakable(piper, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_context) -> None:  # type: ignore[no-untyped-def]
    earlier = _earlier_audio(tmp_path)
    monkeypatch.setattr(speak, "load_engine", lambda *a: piper)
    # engine_for keeps loaded engines per process: a fresh cache here, so an engine loaded by an earlier test
    # (the session lab, another test) is not the one this test meant to replace
    monkeypatch.setattr(speak, "_loaded", functools.lru_cache(maxsize=2)(speak._loaded.__wrapped__))
    with FakeServer(Reply.stream(at(0.0, llama_events(["...", " ", "!!"])))) as fake:
        with pytest.raises(NothingToSpeakError, match="no speakable text: '... !!'"):
            speak.run(step_context(fake.url))
    assert (tmp_path / "raw" / "speak-whole-1.sse").read_bytes().count(b"data: ") >= 4
    assert {name: (tmp_path / name).read_bytes() for name in earlier} == earlier


# --- the same through the CLI: one line, exit 1, earlier audio untouched -----------------------------------------


def test_cli_missing_voice_file(tmp_path: Path, env: dict[str, str]) -> None:
    from clihelpers import assert_clean_failure, cli
    from fakeserver import unused_port

    out = tmp_path / "out"
    earlier = _earlier_audio(out)
    result = cli("speak", "--url", f"http://127.0.0.1:{unused_port()}", "--out", str(out), "-q",
                 "--voice", str(tmp_path / "missing.onnx"), env=env)
    assert_clean_failure(result, "voice-llm speak: voice file not found:", "missing.onnx")
    assert {name: (out / name).read_bytes() for name in earlier} == earlier


def test_cli_espeak_absent_says_how_to_install(tmp_path: Path, env: dict[str, str]) -> None:
    from clihelpers import assert_clean_failure, cli
    from fakeserver import unused_port

    out = tmp_path / "out"
    earlier = _earlier_audio(out)
    bare = tmp_path / "bin"  # a PATH with python but without espeak-ng
    bare.mkdir()
    result = cli("speak", "--url", f"http://127.0.0.1:{unused_port()}", "--out", str(out), "-q", "--tts", "espeak",
                 env={**env, "PATH": str(bare)})
    assert_clean_failure(result, "espeak-ng is not installed: apt-get install espeak-ng")
    assert {name: (out / name).read_bytes() for name in earlier} == earlier


@pytest.mark.slow
def test_cli_nothing_speakable_keeps_the_stream(tmp_path: Path, env: dict[str, str]) -> None:
    from clihelpers import assert_clean_failure, cli

    out = tmp_path / "out"
    earlier = _earlier_audio(out)
    with FakeServer(Reply.stream(at(0.0, llama_events(["...", " ", "!!"])))) as fake:  # /props gets it too: ignored
        result = cli("speak", "--url", fake.url, "--out", str(out), "-q", env=env)
    # The failed step's stream keeps its .partial name: raw/speak-whole-1.sse of an earlier audio.json stays.
    err = assert_clean_failure(result, "voice-llm speak: the answer has no speakable text", "speak-whole-1.sse.partial")
    assert "data: [DONE]" in (out / "raw" / "speak-whole-1.sse.partial").read_text(), err
    assert not (out / "raw" / "speak-whole-1.sse").exists()
    assert {name: (out / name).read_bytes() for name in earlier} == earlier


def test_clause_words_reach_the_step_and_zero_is_refused(tmp_path: Path, env: dict[str, str], step_context) -> None:
    from clihelpers import assert_clean_failure, cli
    from fakeserver import unused_port

    from voice_llm.core.run.context import StepOptions

    ctx = step_context(options=StepOptions(plugins={"tts": speak.TTSOptions(clause_words=7)}))
    assert speak.options_of(ctx).clause_words == 7
    out = tmp_path / "out"
    earlier = _earlier_audio(out)
    result = cli("speak", "--url", f"http://127.0.0.1:{unused_port()}", "--out", str(out), "-q",
                 "--clause-words", "0", env=env)
    assert_clean_failure(result, "--clause-words must be at least 1, not 0", one_line=False)
    assert result.returncode == 2  # a usage error, before anything is asked or written
    assert {name: (out / name).read_bytes() for name in earlier} == earlier
