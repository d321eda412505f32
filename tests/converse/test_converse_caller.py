"""The caller's audio: the user's WAVs taken as is, converted, or refused with one line; true speech span from
the samples; the real Piper caller voice, Silero and faster-whisper on the clinic lines."""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import numpy as np
import pytest

from voice_llm.speech import caller as c
from voice_llm.converse.voice import synthesize_lines
from voice_llm.converse.step import ConverseOptions, caller_utterances
from voice_llm.speech.vad import SileroVAD, probabilities
from voice_llm.errors import ConfigError

SCRIPTS = ("one line", "two line", "three line")


def tone(rate: int, seconds: float = 1.0, amplitude: float = 8000.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * 220 * t) * amplitude).astype(np.int16)


def write_wav(path: Path, samples: np.ndarray, rate: int, channels: int = 1, width: int = 2) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        if width == 1:
            data = ((samples.astype(np.int32) >> 8) + 128).astype(np.uint8).tobytes()
        else:
            data = samples.astype("<i2").tobytes()
        out.writeframes(data)
    return path


def float_wav(path: Path, samples: np.ndarray, rate: int) -> Path:
    """A WAVE_FORMAT_IEEE_FLOAT file (format 3), which the wave module cannot read."""
    data = (samples.astype(np.float32) / 32768.0).tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


def test_16k_mono_pcm_is_taken_as_is(tmp_path: Path) -> None:
    samples = np.concatenate([np.zeros(1600, np.int16), tone(16000), np.zeros(800, np.int16)])
    u = c.load_file(write_wav(tmp_path / "a.wav", samples, 16000), 1, "x")
    assert u.converted_from is None
    lead = c.LEAD_MS * 16
    assert np.array_equal(u.samples[lead:], samples)
    # the true span: first and last sample above the floor (a sine's first sample is 0)
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > u.floor)
    assert (u.start, u.end) == (lead + loud[0], lead + loud[-1] + 1)


@pytest.mark.parametrize("rate,channels,width", [(44100, 1, 2), (16000, 2, 2), (22050, 2, 2), (16000, 1, 1)])
def test_other_pcm_is_converted_and_says_from_what(tmp_path: Path, rate: int, channels: int, width: int) -> None:
    mono = tone(rate)
    samples = np.repeat(mono, channels) if channels > 1 else mono
    u = c.load_file(write_wav(tmp_path / "a.wav", samples, rate, channels, width), 2, "x")
    assert u.converted_from is not None and f"{rate} Hz" in u.converted_from and f"{channels} channel" in u.converted_from
    assert u.samples.dtype == np.int16
    assert abs(len(u.samples) - c.LEAD_MS * 16 - 16000) <= 64  # one second at 16 kHz, give or take the filter


def test_float_wav_is_decoded_by_pyav(tmp_path: Path) -> None:
    u = c.load_file(float_wav(tmp_path / "f.wav", tone(48000), 48000), 1, "x")
    assert u.converted_from is not None and "48000 Hz" in u.converted_from
    assert u.end > u.start


def test_silent_wav_is_refused_naming_the_turn(tmp_path: Path) -> None:
    folder = tmp_path / "calls"
    folder.mkdir()
    write_wav(folder / "01.wav", tone(16000), 16000)
    write_wav(folder / "02.wav", np.zeros(16000, np.int16), 16000)
    with pytest.raises(c.CallerAudioError, match="^no speech detected in turn 2 "):
        c.load_folder(folder)


def test_noise_without_speech_is_refused_by_the_vad(tmp_path: Path) -> None:
    folder = tmp_path / "calls"
    folder.mkdir()
    noise = (np.random.default_rng(1).standard_normal(16000) * 300).astype(np.int16)
    write_wav(folder / "01.wav", noise, 16000)
    with pytest.raises(c.CallerAudioError, match="^no speech detected in turn 1 "):
        caller_utterances(ConverseOptions(caller_audio=folder), SCRIPTS, SileroVAD())


@pytest.mark.parametrize("content", [b"", b"not audio at all" * 10, b"RIFF\x00\x00\x00\x00WAVEjunk"])
def test_not_audio_is_one_config_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        c.load_file(path, 1, "x")
    assert "\n" not in str(info.value) and "bad.wav" in str(info.value)


def test_folder_rules(tmp_path: Path) -> None:
    with pytest.raises(c.CallerAudioError, match="not a folder"):
        c.caller_files(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(c.CallerAudioError, match="no .wav file"):
        c.caller_files(tmp_path)
    for name in ("b.wav", "a.WAV", "c.wav", "d.wav"):
        write_wav(tmp_path / name, tone(16000), 16000)
    assert [p.name for p in c.caller_files(tmp_path)] == ["a.WAV", "b.wav", "c.wav", "d.wav"]
    with pytest.raises(c.CallerAudioError, match="4 WAVs, but the dialogue has only 3"):
        c.load_folder_scored(tmp_path, SCRIPTS)


def test_noise_floor_rises_with_background_noise() -> None:
    quiet = np.zeros(16000, np.int16)
    assert c.noise_floor(quiet) == c.FLOOR_MIN
    noisy = (np.random.default_rng(0).standard_normal(16000) * 400).astype(np.int16)
    assert c.noise_floor(noisy) > c.FLOOR_MIN


# --- the real engines ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clinic() -> list[c.Utterance]:
    from voice_llm.scenario.dialogue import load_dialogue

    utterances, voice = synthesize_lines(load_dialogue().turns)
    assert voice.engine == "piper" and voice.length_scale == c.CALLER_LENGTH_SCALE
    return utterances


def test_synthesized_lines_are_16k_with_lead_silence_and_a_true_span(clinic: list[c.Utterance]) -> None:
    for u in clinic:
        assert u.samples.dtype == np.int16
        assert not u.samples[:c.LEAD_MS * 16].any()
        assert c.LEAD_MS * 16 <= u.start < u.end <= len(u.samples)
        assert abs(int(u.samples[u.end - 1])) > u.floor and not (np.abs(u.samples[u.end:].astype(int)) > u.floor).any()


def test_caller_voice_is_deterministic() -> None:
    a, _ = synthesize_lines(["Where do I park when I get there?"])
    b, _ = synthesize_lines(["Where do I park when I get there?"])
    assert np.array_equal(a[0].samples, b[0].samples)


def test_silero_hears_each_line_and_not_the_lead_silence(clinic: list[c.Utterance]) -> None:
    vad = SileroVAD()
    for u in clinic:
        vad.reset()
        probs = probabilities(vad, u.samples)
        speech = [i for i, p in enumerate(probs) if p >= 0.5]
        assert speech, u.script
        assert speech[0] * 512 + 512 > u.start  # no speech frame wholly before the true start
        assert speech[-1] * 512 < u.end + 3 * 512  # Silero holds on for at most a frame or two after the end


def test_whisper_transcribes_the_clinic_lines_within_a_few_words(clinic: list[c.Utterance]) -> None:
    from voice_llm.speech.stt import load_transcriber
    from voice_llm.speech.wer import total, wer

    stt = load_transcriber("faster-whisper", 2)
    info = stt.info()
    assert info is not None and info["model"] == "tiny.en" and len(info["model_sha256"]) == 64
    scores = [wer(u.script, stt.transcribe(u.samples, u.script)) for u in clinic]
    assert total(scores).errors <= 3, scores
