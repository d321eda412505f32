"""--speculative-stt (issue 28 item 2): the built-in agent transcribes from the VAD's speech end, before the
endpoint, and commits that transcript at the endpoint; a caller who goes on before the endpoint has that decode
dropped, and the turn is the whole utterance's. Fake engines (a loud-frame VAD, a tone TTS) and a transcriber that
says how many samples it was given and takes a known time, so what the agent decoded, and when, is visible. That
a speculative and a plain decode give the same words on real speech is the last test here."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from agentkit import ToneTTS, TwilioCaller, agent_threads, dial, play_out, serving, settings, silence, speech
from fakeserver import FakeServer, Reply, at, llama_events
from transcripts import assert_as_good
from voice_llm.capabilities.agent.server import Engines, LockedSTT, LockedTTS

DECODE_S = 0.25  # the fake decode's time: under the 300 ms endpoint, as tiny.en is not but a short line may be


class CountingSTT:
    """Says how many 16 kHz samples it was given ("N samples"), after DECODE_S; records each call."""

    name = "counting"

    def __init__(self) -> None:
        self.calls: list[tuple[float, int]] = []
        self.lock = threading.Lock()

    def transcribe(self, samples: np.ndarray, script: str) -> str:
        with self.lock:
            self.calls.append((time.perf_counter(), len(samples)))
        time.sleep(DECODE_S)
        return f"{len(samples)} samples"

    def info(self) -> dict[str, Any] | None:
        return {"model": "counting"}


def engines(stt: CountingSTT) -> Engines:
    from agentkit import LoudVAD

    return Engines(LockedSTT(stt), LockedTTS(ToneTTS()), LoudVAD,
                   {"vad": {"fake": "loud"}, "stt": stt.info(), "tts": {"engine": "tone"}}, {})


def answer() -> Reply:
    return Reply.stream(at(0.0, llama_events(["Sure.", " Anything else?"])))


@contextlib.contextmanager
def call(served: Any, *pieces: np.ndarray) -> Iterator[TwilioCaller]:
    """The pieces sent in real time, 20 ms a frame: the speech end comes before the endpoint on the agent's clock
    as on a line (sent at once, the 300 ms of silence would reach the endpointer within a millisecond)."""
    with dial(served.url) as ws:
        caller = TwilioCaller(ws)
        caller.begin()
        frame = 160  # 20 ms at 8 kHz
        for piece in pieces:
            for start in range(0, len(piece), frame):
                caller.say(piece[start:start + frame])
                time.sleep(0.02)
        yield caller


def finish(served: Any, caller: TwilioCaller) -> dict[str, Any]:
    """Every mark echoed (the reply played), the turn's record once it is committed, then the hang-up."""
    play_out(served, caller, 1)
    caller.hang_up()
    caller.ws.close()
    return served.agent.records[0]


def test_the_decode_starts_at_the_speech_end_and_the_endpoint_commits_it() -> None:
    stt = CountingSTT()
    with FakeServer(answer()) as fake, serving(settings(fake.url, speculative_stt=True), engines(stt)) as served:
        assert served.ready["engines"]["stt"]["speculative"] is True
        with call(served, speech(400), silence(600)) as caller:
            record = finish(served, caller)
        events = record["events"]
        # one decode, asked for at the speech end: before the endpoint fired (the loop's own order), not after it
        assert len(stt.calls) == 1
        assert events["vad_speech_end"] <= record["stt"]["asked"] < events["endpoint"]
        assert record["stt"]["asked"] <= events["stt_start"] <= events["stt_end"]
        assert record["stt"]["speculative"] is True and record["stt"]["decode_ms"] >= DECODE_S * 1000 - 1
        # only what was left of the decode after the endpoint is on the critical path; the parts add up
        left = max(0.0, (events["stt_end"] - events["endpoint"]) * 1000)
        assert record["breakdown"]["stt"] == pytest.approx(left, abs=0.2)
        assert sum(record["breakdown"].values()) == pytest.approx(record["reported_ms"], abs=1.0)
        # the committed transcript is the speculative one, and it is what the LLM was asked
        assert record["transcript"] == f"{stt.calls[0][1]} samples"
        assert fake.requests[-1].json["messages"][-1] == {"role": "user", "content": record["transcript"]}
    assert agent_threads() == []


def test_a_caller_who_goes_on_drops_the_speculative_decode_and_the_turn_is_the_whole_utterance() -> None:
    stt = CountingSTT()
    with FakeServer(answer()) as fake, serving(settings(fake.url, speculative_stt=True), engines(stt)) as served:
        # a 120 ms pause (a speech end, no endpoint: 300 ms), then more words, then the end
        with call(served, speech(400), silence(120), speech(400), silence(600)) as caller:
            record = finish(served, caller)
        assert len(served.agent.records) == 1
        # two decodes: the first (at the pause) dropped, the second (at the true end) committed, and longer
        assert len(stt.calls) == 2 and stt.calls[1][1] > stt.calls[0][1]
        assert record["stt"]["speculations_dropped"] == 1
        assert record["transcript"] == f"{stt.calls[1][1]} samples"
        # nothing of the dropped decode reached the LLM or the history
        sent = [m["content"] for r in fake.requests for m in r.json["messages"] if m["role"] == "user"]
        assert f"{stt.calls[0][1]} samples" not in sent
    assert agent_threads() == []


def test_speculation_is_the_default() -> None:
    assert settings("http://127.0.0.1:1").speculative_stt is True  # since Moonshine: BENCHMARKS.md


def test_with_no_speculative_stt_the_decode_starts_at_the_endpoint() -> None:
    stt = CountingSTT()
    with FakeServer(answer()) as fake, serving(settings(fake.url, speculative_stt=False), engines(stt)) as served:
        assert served.ready["engines"]["stt"]["speculative"] is False
        with call(served, speech(400), silence(600)) as caller:
            record = finish(served, caller)
        assert record["stt"]["speculative"] is False
        assert record["events"]["stt_start"] >= record["events"]["endpoint"]
        assert record["breakdown"]["stt"] >= DECODE_S * 1000 - 1
    assert agent_threads() == []


def test_speculation_is_off_with_no_stt() -> None:
    with FakeServer(answer()) as fake, serving(settings(fake.url, speculative_stt=True, stt="none")) as served:
        assert served.agent.speculating is None


@pytest.mark.slow  # Piper, Silero and Whisper
def test_on_real_speech_the_speculative_transcript_is_as_good_as_the_plain_one(clinic_lines_16k) -> None:
    """The clinic caller lines (Piper, as dial speaks them, 300 ms of silence before and 1 s after), framed as the
    agent frames them: Silero and the 300 ms endpointer, the utterance from 5 frames before the speech start. The
    decode at the last speech end before the endpoint (what --speculative-stt commits) and the decode at the endpoint
    (the plain path, 300 ms more silence) are as good a transcript of the line (tests/transcripts.py's rule)."""
    pytest.importorskip("faster_whisper")
    from voice_llm.capabilities.agent.server import PRE_ROLL_FRAMES
    from voice_llm.engines.speech_in import caller_audio as c
    from voice_llm.engines.speech_in import stt as sttmod
    from voice_llm.engines.speech_in import vad as vadmod

    whisper = sttmod.load_transcriber("faster-whisper", 1)
    scored: list[tuple[str, str, str]] = []
    lead, tail = np.zeros(c.LEAD_MS * 16, np.int16), np.zeros(16000, np.int16)
    for line, samples in clinic_lines_16k:
        audio = np.concatenate([lead, samples, tail])
        frames = [audio[i:i + c.FRAME_SAMPLES] for i in range(0, len(audio) - c.FRAME_SAMPLES + 1, c.FRAME_SAMPLES)]
        silero, endpointer = vadmod.SileroVAD(), vadmod.Endpointer(300)
        start = last_end = endpoint = None
        for n, frame in enumerate(frames):
            for event in endpointer.push(silero(frame.astype("<i2").tobytes())):
                if event.kind == vadmod.SPEECH_START and start is None:
                    start = max(0, n - PRE_ROLL_FRAMES)
                elif event.kind == vadmod.SPEECH_END:
                    last_end = n
                elif event.kind == vadmod.ENDPOINT and endpoint is None:
                    endpoint = n
            if endpoint is not None:
                break
        assert start is not None and last_end is not None and endpoint is not None and last_end < endpoint, line
        speculative = whisper.transcribe(np.concatenate(frames[start:last_end + 1]), "")
        plain = whisper.transcribe(np.concatenate(frames[start:endpoint + 1]), "")
        scored.append((line, speculative, plain))
    assert len(scored) == len(clinic_lines_16k)
    assert_as_good(scored)
