"""One real call on a real llama-server: the caller's two short lines fed in real time through Silero and
faster-whisper, the replies spoken by Piper; the caller barges in on the first reply. No time is asserted: only
that the events are in order on one clock, the breakdown sums to the gap, the recording holds what was fed, and
the history holds only what was heard. The STT failing mid-call keeps the evidence and leaves the earlier
artifact untouched."""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import numpy as np
import pytest

from voice_llm.client.api import ServerClient
from voice_llm.converse import step
from voice_llm.speech.stt import STTError, ScriptTranscriber
from voice_llm.scenario.kb import default_kb_dir
from voice_llm.lab.context import LabContext

pytestmark = pytest.mark.server
DATA = Path(__file__).parent / "data"
SHORT = step.ConverseOptions(dialogue=str(DATA / "short-call.json"), turns=2, max_tokens=8, docs=0,
                             barge_in_turns=(1,), barge_in_after_ms=300.0, barge_in_max_tokens=32)
ORDER = ("speech_start", "speech_end", "turn_detected", "stt_start", "stt_end", "request_sent", "first_token",
         "first_segment_text", "first_audio_ready", "playback_start", "playback_end")


def context(server, out: Path) -> LabContext:  # type: ignore[no-untyped-def]
    return LabContext(out=out, client=ServerClient(server.url), kb_dir=default_kb_dir(), server_log=server.log)


def read_stereo(path: Path) -> tuple[int, int, np.ndarray]:
    with wave.open(io.BytesIO(path.read_bytes())) as wav:
        return wav.getnchannels(), wav.getframerate(), np.frombuffer(wav.readframes(wav.getnframes()), "<i2")


@pytest.fixture(scope="module")
def call(module_server, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("converse")
    written = step.converse_step(context(module_server, out), SHORT)
    assert out / step.CONVERSE in written
    return out


def test_events_in_order_and_breakdown_sums_to_the_gap(call: Path) -> None:
    doc = json.loads((call / step.CONVERSE).read_text())
    assert len(doc["turns"]) == 2 and doc["engines"]["stt"]["model"] == "tiny.en"
    for turn in doc["turns"]:
        events = turn["events"]
        times = [events[key] for key in ORDER]
        assert all(t is not None for t in times), events
        assert times == sorted(times), events
        assert events["turn_detected"] <= events["endpoint"] <= events["playback_start"]
        assert events["vad_speech_start"] >= events["speech_start"]
        assert turn["gap_ms"] == pytest.approx(events["playback_start"] - events["speech_end"], abs=0.01)
        assert sum(turn["breakdown_ms"].values()) == pytest.approx(turn["gap_ms"], abs=0.01)
        assert turn["wer"]["errors"] <= 2, turn["transcript"]
    assert doc["summary"]["mouth_to_ear_ms"]["n"] == 2


def test_barge_in_stops_the_reply_and_history_holds_only_what_was_heard(call: Path) -> None:
    doc = json.loads((call / step.CONVERSE).read_text())
    first, second = doc["turns"]
    barge = first["barge_in"]
    assert barge is not None and doc["summary"]["barge_ins"] == 1
    assert barge["onset_true"] <= barge["onset_detected"] <= barge["stop_called"]
    assert barge["playback_silent"] is None or barge["playback_silent"] <= barge["cut_at"]
    assert barge["words_heard"] <= barge["words_generated"]
    assert first["reply"]["text"].startswith(first["reply"]["heard_text"])
    # what the second request carried of the first reply: only the heard words (or no assistant turn at all)
    assistant = [m["content"] for m in second["sent_history"] if m["role"] == "assistant"]
    assert assistant == ([first["reply"]["heard_text"].strip()] if first["reply"]["heard_text"].strip() else [])
    assert second["sent_history"][0] == {"role": "user", "content": first["transcript"]}


def test_recording_holds_the_caller_as_fed_and_the_assistant_after_its_playback_start(call: Path) -> None:
    doc = json.loads((call / step.CONVERSE).read_text())
    channels, rate, samples = read_stereo(call / "converse" / "call.wav")
    assert (channels, rate) == (2, 16000)
    stereo = samples.reshape(-1, 2)
    assert len(stereo) == doc["recording"]["frames"]
    for turn in doc["turns"]:
        with wave.open(str(call / turn["caller_wav"])) as wav:
            assert (wav.getnchannels(), wav.getframerate(), wav.getsampwidth()) == (1, 16000, 2)
            fed = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
        at = round(turn["caller_offset_ms"] * 16)
        assert np.array_equal(stereo[at:at + len(fed), 0], fed)
    first_play = round(doc["turns"][0]["events"]["playback_start"] * 16)
    assert not stereo[:first_play, 1].any() and stereo[first_play:, 1].any()
    assert (call / first_reply_raw(doc)).is_file()


def first_reply_raw(doc: dict) -> str:  # type: ignore[type-arg]
    return doc["turns"][0]["reply"]["raw"]


class FailingOnTurn2(ScriptTranscriber):
    name = "faster-whisper"
    calls = 0

    def transcribe(self, samples: np.ndarray, script: str) -> str:
        FailingOnTurn2.calls += 1
        if script == "Where do I park?":
            raise STTError("faster-whisper failed: RuntimeError: out of memory")
        return script


def test_stt_failing_mid_call_keeps_the_evidence_and_the_earlier_artifact(
        module_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    earlier = b'{"earlier": true}'
    (tmp_path / step.CONVERSE).write_bytes(earlier)
    monkeypatch.setattr("voice_llm.converse.step.load_transcriber", lambda name, threads: FailingOnTurn2())
    with pytest.raises(STTError) as info:
        step.converse_step(context(module_server, tmp_path), step.ConverseOptions(
            dialogue=SHORT.dialogue, turns=2, max_tokens=8, docs=0, barge_in_turns=()))
    assert str(info.value) == "faster-whisper failed: RuntimeError: out of memory"
    assert (tmp_path / step.CONVERSE).read_bytes() == earlier
    partial = json.loads((tmp_path / step.CONVERSE_PARTIAL).read_text())
    assert partial["error"].startswith("STTError") and partial["turns"][0]["gap_ms"] is not None
    assert (tmp_path / step.PARTIAL_CALL_WAV).is_file()
