"""Moonshine tiny, the agent's default STT (voice_llm.engines.speech_in.moonshine): its vocabulary read from the wheel, the choice
of STT by name, and (slow: a real speech engine) its transcripts of the clinic lines through the telephone line held
to tiny.en's on the same audio, a speculative decode given up between two steps, the runaway-decode cap."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from transcripts import assert_as_good

from voice_llm.core.errors import ConfigError
from voice_llm.engines.speech_in import moonshine, stt


def _vocabulary() -> list[bytes]:
    try:
        folder = moonshine.model_dir()
    except stt.STTUnavailableError:
        pytest.skip("moonshine-voice==0.1.0 is not installed")
    return moonshine.read_vocabulary(folder / moonshine.TOKENIZER_FILE)


def test_the_shipped_vocabulary_is_the_tokenizer_json_s() -> None:
    """32,768 pieces in id order (the tokenizer.json's vocabulary and added tokens), the specials first, then the
    256 byte-fallback pieces, then the BPE merges with ▁ for a space."""
    pieces = _vocabulary()
    assert len(pieces) == 32768
    assert pieces[:3] == [b"<unk>", b"<s>", b"</s>"]
    assert pieces[3:259] == [bytes([b]) for b in range(256)]
    assert pieces[259] == "\u2581\u2581".encode()
    assert pieces[-1] == b"<<ST_767>>"


def test_tokens_decode_as_the_tokenizer_json_s_decoder_chain() -> None:
    pieces = _vocabulary()
    ids = {piece: i for i, piece in enumerate(pieces)}
    words = [ids["\u2581Good".encode()], ids[b"."], ids["\u2581Do".encode()], ids["\u2581I".encode()]]
    # specials and <<ST_n>> tokens are skipped; the leading space of the first word stripped
    assert moonshine.decode_tokens(pieces, [1, *words, 32767, 2]) == "Good. Do I"
    # byte fallback: the three UTF-8 bytes of "é" as three byte pieces (ids 3 + byte) join into one character
    assert moonshine.decode_tokens(pieces, [3 + b for b in "é".encode()]) == "é"
    assert moonshine.decode_tokens(pieces, [999999, -1]) == ""  # out-of-range ids never index the table


def test_a_truncated_vocabulary_is_one_clear_error(tmp_path) -> None:
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(b"\x05<unk>\x09<s")
    with pytest.raises(stt.STTError, match="truncated at piece 1"):
        moonshine.read_vocabulary(path)


def test_the_runaway_cap_follows_the_audio() -> None:
    assert moonshine.token_cap(16000) == 11  # 6.5 a second, rounded up, + 4
    assert moonshine.token_cap(0) == 4


def test_the_stt_names() -> None:
    assert stt.DEFAULT_STT == "moonshine"
    assert stt.canonical("whisper") == "faster-whisper"
    assert stt.default_threads("moonshine") == 1
    with pytest.raises(ConfigError, match="unknown STT 'vosk'"):
        stt.load_transcriber("vosk", 1)


def test_the_agent_records_whisper_as_faster_whisper() -> None:
    from voice_llm.capabilities.agent.settings import AgentSettings

    assert AgentSettings().stt == "moonshine"
    assert AgentSettings(stt="whisper").stt == "faster-whisper"
    with pytest.raises(ConfigError, match="--stt must be one of"):
        AgentSettings(stt="vosk")


def test_onnxruntime_telemetry_is_off_for_every_process_voice_llm_starts() -> None:
    import os

    import voice_llm  # noqa: F401  (sets it on import)

    assert os.environ.get("ORT_DISABLE_TELEMETRY")


# --- the real engine -----------------------------------------------------------------------------------------------


def _through_the_line(samples: np.ndarray) -> np.ndarray:
    """16 kHz -> the Twilio line (8 kHz mu-law) -> 16 kHz, as the agent hears a caller."""
    from voice_llm.engines.audio.resampling import to_rate
    from voice_llm.engines.line import wire

    heard = wire.mulaw_decode(wire.mulaw_encode(to_rate(samples, 16000, 8000)))
    return to_rate(heard, 8000, 16000)


@pytest.mark.slow  # Moonshine and Whisper
def test_moonshine_transcribes_the_clinic_lines_through_the_line_as_well_as_tiny_en(clinic_lines_16k) -> None:
    """The issue's accuracy bar: on the same audio (the Piper-voiced caller lines through 8 kHz mu-law, with the
    endpoint's silence around them), Moonshine's transcripts are held to tiny.en's by tests/transcripts.py's rule."""
    pytest.importorskip("faster_whisper")
    ours = stt.load_transcriber("moonshine", 1)
    theirs = stt.load_transcriber("faster-whisper", 2)
    assert ours.info()["cpu_threads"] == 1 and ours.info()["model"] == "moonshine-tiny-en"
    lead, tail = np.zeros(300 * 16, np.int16), np.zeros(16000, np.int16)
    scored = []
    for script, samples in clinic_lines_16k:
        heard = _through_the_line(np.concatenate([lead, samples, tail]))
        scored.append((script, ours.transcribe(heard, ""), theirs.transcribe(heard, "")))
    assert all(text for _, text, _ in scored)
    assert_as_good(scored)
    assert ours.capped == 0  # no line ran into the runaway cap


@pytest.mark.slow  # Moonshine
def test_a_dropped_speculative_decode_stops_between_two_steps(clinic_lines_16k) -> None:
    """A decode whose speculation was dropped gives up at its next decoder step (DecodeCancelled), and behind the
    agent's STT lock a decode asked after the drop never starts: the committed decode waits for one step at most."""
    from voice_llm.capabilities.agent.server import LockedSTT

    engine = stt.load_transcriber("moonshine", 1)
    _, samples = clinic_lines_16k[0]
    asked = []

    def after_three() -> bool:
        asked.append(1)
        return len(asked) >= 3

    before = engine.cancelled
    with pytest.raises(moonshine.DecodeCancelled):
        engine.transcribe(samples, "", after_three)
    assert engine.cancelled == before + 1 and len(asked) == 3  # asked before steps 1, 2 and 3, stopped there
    locked = LockedSTT(engine)
    assert locked.transcribe(samples, lambda: True) == ""  # dropped before it got the lock: nothing decoded
    dropped = threading.Event()
    dropped.set()
    assert locked.transcribe(samples, dropped.is_set) == ""
    assert locked.transcribe(samples) == engine.transcribe(samples, "")  # the committed decode: the whole line


@pytest.mark.slow  # Moonshine
def test_the_runaway_cap_stops_a_decode(monkeypatch, clinic_lines_16k) -> None:
    engine = stt.load_transcriber("moonshine", 1)
    _, samples = clinic_lines_16k[0]
    monkeypatch.setattr(moonshine, "token_cap", lambda _samples: 2)
    before = engine.capped
    text = engine.transcribe(samples, "")
    assert engine.capped == before + 1 and len(engine.last_tokens) == 2 and text
