"""One WAV writer, one WAV reader and one resampler (voice_llm.engines.audio) in place of the three writers (tts/wav.py,
dial/step.py's caller WAVs, dial/call.py's live recording), the two readers (tts/wav.py, dial/checks.py) and the
three resamplers (agent/audio.py, speech/caller.py, dial/caller.py) they replaced (issue 42 item 2).

The digests were computed with the replaced code on the commit before the change (490445b's tree with f2552a4), on
the signals below: the one writer gives the same bytes each old writer gave, and the one resampler the same
samples each old resampler gave, so no artifact and no measurement moved.
"""

from __future__ import annotations

import hashlib
import io
import wave
from pathlib import Path

import numpy as np
import pytest

from voice_llm.engines.audio.resampling import Resampler, to_rate
from voice_llm.engines.audio.wav import WavWriter, decode_wav, read_wav, silence, wav_bytes
from voice_llm.capabilities.dial.call import LiveRecording
from voice_llm.core.errors import ArtifactError
from voice_llm.engines.speech_in import caller_audio as speech_caller

# sha256 of each old function's output on the signals below (the replaced code, run before the change)
BEFORE = {
    "tts.wav_bytes": "010f3bb89a7d538d2356d2763f17aa69c8cf4401884190dc283cb61a49e7196d",
    "dial.step._mono_wav": "5d492c29ee6bc6d1a0c273d67c85515e8f274a7af80115017e98caa24eee07bc",
    "dial.call.LiveRecording": "bd1b959a4dc6dbb94e69cbd54e6f845ae8a9df4c2d39dd74d9b92b92d71e2fa5",
    "agent.Resampler 22050->8000 streamed": "1b7be1c6974064059ddda6b1e64f6c5c4ff8266ce822d799fac6025c625b178d",
    "agent.Resampler 8000->16000 streamed": "0938bcb0514089485f352bfc34441473e07635bb2d4f6095f36a5c165ef29b11",
    "dial.caller.to_rate 16000->8000": "6c71b030b76dd7f410738783bd1040dd02bb00f7c932c6c892051320b554319b",
    "dial.caller.to_rate 8000->16000": "aa3d32538783a4db1fb80b444c576ac286de0cd04a4806ee39b976a2d55c8157",
    "speech.caller.resample 22050 mono": "ef916e185360dc52f25adaabdeea18411576381272c5d18c1a5a757adf37d0e8",
    "speech.caller.resample 44100 stereo": "4f55ba14be50c343726dcac90197c0aba56b9f1932278dc5f1fe239040149a06",
    "speech.caller.load_file 22050 wav": "86a594bb8a74c5e8cf132e9aac7c4945e0f9e62a4d5cdb15d7fe7b9a571cc74a",
}


def signal(rate: int, ms: int, seed: int) -> np.ndarray:
    """Two tones and seeded noise: every sample differs, so a changed filter or rounding changes the digest."""
    t = np.arange(rate * ms // 1000) / rate
    rng = np.random.default_rng(seed)
    x = 9000 * np.sin(2 * np.pi * 440 * t) + 3000 * np.sin(2 * np.pi * 1234 * t) + rng.normal(0, 500, t.size)
    return np.clip(x, -32768, 32767).astype(np.int16)


def digest(data: bytes | np.ndarray) -> str:
    return hashlib.sha256(data if isinstance(data, bytes) else data.astype("<i2").tobytes()).hexdigest()


# --- the one writer -------------------------------------------------------------------------------------------------


def test_the_speak_steps_wavs_are_the_bytes_they_were() -> None:
    assert digest(wav_bytes(signal(22050, 700, 1).tobytes(), 22050)) == BEFORE["tts.wav_bytes"]


def test_the_dialers_caller_wavs_are_the_bytes_they_were() -> None:
    line = signal(8000, 900, 2)
    assert digest(wav_bytes(line.astype("<i2").tobytes(), 8000)) == BEFORE["dial.step._mono_wav"]


def test_the_live_call_recording_is_the_bytes_it_was(tmp_path: Path) -> None:
    path = tmp_path / "call.wav"
    recording = LiveRecording(path, 8000)
    left, right = signal(8000, 1000, 3), signal(8000, 1000, 4)
    for i in range(0, 8000, 160):  # one 20 ms frame a tick, as a call writes it
        recording.write(left[i:i + 160], right[i:i + 160])
    recording.close()
    assert digest(path.read_bytes()) == BEFORE["dial.call.LiveRecording"]


def test_a_wav_written_piece_by_piece_is_the_wav_written_whole() -> None:
    """The streaming writer leaves the same file as the whole-file one: the header's sizes are fixed at close."""
    pcm = signal(16000, 300, 13).tobytes()
    buf = io.BytesIO()
    writer = WavWriter(buf, 16000)
    for i in range(0, len(pcm), 640):
        writer.write(pcm[i:i + 640])
    writer.close()
    assert buf.getvalue() == wav_bytes(pcm, 16000)


# --- the one reader -------------------------------------------------------------------------------------------------


def test_the_reader_gives_back_what_the_writer_wrote() -> None:
    stereo = np.column_stack((signal(8000, 200, 14), signal(8000, 200, 15))).astype("<i2").tobytes()
    info, pcm = decode_wav(wav_bytes(stereo, 8000, channels=2), "call.wav")
    assert (info.channels, info.sample_width, info.sample_rate, info.frames) == (2, 2, 8000, 1600)
    assert pcm == stereo and info.duration_ms == 200.0


def test_the_reader_refuses_a_truncated_or_foreign_file_by_name(tmp_path: Path) -> None:
    whole = wav_bytes(silence(100, 16000), 16000)
    with pytest.raises(ArtifactError, match=r"^cut\.wav is truncated: 3156 bytes of audio, the header says 3200$"):
        decode_wav(whole[:-44], "cut.wav")
    with pytest.raises(ArtifactError, match=r"^notes\.wav is not a readable WAV file"):
        decode_wav(b"not a wav at all", "notes.wav")
    (tmp_path / "a.wav").write_bytes(whole)
    assert read_wav(tmp_path / "a.wav").frames == 1600
    with pytest.raises(ArtifactError, match="is missing"):
        read_wav(tmp_path / "b.wav")


# --- the one resampler ----------------------------------------------------------------------------------------------


def _streamed(rate_in: int, rate_out: int, samples: np.ndarray, piece: int) -> np.ndarray:
    resampler = Resampler(rate_in, rate_out)
    return np.concatenate([resampler.push(samples[i:i + piece]) for i in range(0, len(samples), piece)]
                          + [resampler.flush()])


def test_the_agents_streamed_line_audio_is_the_samples_it_was() -> None:
    """Piper's 22.05 kHz to the line's 8 kHz, 20 ms at a time (the agent's speech out), and the line's 8 kHz to
    16 kHz (its ear): the filter state carried between pieces as before."""
    assert digest(_streamed(22050, 8000, signal(22050, 1000, 5), 441)) == BEFORE["agent.Resampler 22050->8000 streamed"]
    assert digest(_streamed(8000, 16000, signal(8000, 1000, 6), 160)) == BEFORE["agent.Resampler 8000->16000 streamed"]


def test_the_dialers_lines_at_the_line_rate_are_the_samples_they_were() -> None:
    assert digest(to_rate(signal(16000, 800, 7), 16000, 8000)) == BEFORE["dial.caller.to_rate 16000->8000"]
    assert digest(to_rate(signal(8000, 800, 8), 8000, 16000)) == BEFORE["dial.caller.to_rate 8000->16000"]


def test_the_callers_audio_at_16_khz_is_the_samples_it_was(tmp_path: Path) -> None:
    """Speech in: Piper's caller lines and the user's recordings (float after the mix-down, any channel count),
    whole and decoded frame by frame."""
    assert digest(speech_caller.resample(signal(22050, 900, 9), 22050)) == BEFORE["speech.caller.resample 22050 mono"]
    stereo = np.column_stack((signal(44100, 500, 10), signal(44100, 500, 11))).reshape(-1)
    assert digest(speech_caller.resample(stereo, 44100, channels=2)) == BEFORE["speech.caller.resample 44100 stereo"]
    path = tmp_path / "in22050.wav"
    with wave.open(str(path), "wb") as out:  # written apart from the writer under test
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(22050)
        out.writeframes(signal(22050, 1500, 12).tobytes())
    assert digest(speech_caller.load_file(path, 1, "x").samples) == BEFORE["speech.caller.load_file 22050 wav"]


def test_the_same_rate_passes_int16_through_and_still_rounds_float() -> None:
    """int16 at the line's own rate is not filtered (the agent's 16 kHz ear on a 16 kHz line); float, a mix-down,
    is made int16 by libswresample as at any other rate."""
    samples = signal(16000, 100, 16)
    assert np.array_equal(to_rate(samples, 16000, 16000), samples)
    as_float = samples.astype(np.float32) / 32768.0
    back = to_rate(as_float, 16000, 16000)
    assert back.dtype == np.int16 and np.abs(back.astype(np.int32) - samples).max() <= 1
