"""The echo gate (agent.echo, issue 39 item 4): the agent's own voice coming back up the line is not a barge-in; the
caller talking over the reply still is. The gate's rule on its own, then on the line with fake engines (a loud-frame
VAD, a tone TTS, a fake LLM server) and a caller that sends back what it hears, attenuated, as a speakerphone does."""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest

from agentkit import ToneTTS, TwilioCaller, dial, fake_engines, serving, settings, silence, speech, wait_for
from fakeserver import FakeServer, Reply, at, llama_events
from voice_llm.capabilities.agent.echo import EchoGate, rms
from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.core.errors import ConfigError
from voice_llm.engines.line import wire

RATE = 8000
FRAME = 160  # 20 ms at 8 kHz


def tone(level: float, n: int = FRAME) -> np.ndarray:
    return (np.sin(np.arange(n) * 2 * np.pi * 440 / RATE) * level).astype(np.int16)


def test_a_frame_20_db_below_what_the_caller_heard_is_echo_and_one_at_its_level_is_not() -> None:
    gate = EchoGate(RATE, margin_db=10.0, window_s=0.6)
    for k in range(25):  # half a second of reply, sent at once (Twilio: as synthesized); played back to back
        gate.sent(tone(8000), 100.0)
    assert gate.play_end == pytest.approx(100.5)
    assert gate.is_echo(tone(800), 100.2)  # -20 dB: a phone's echo
    assert not gate.is_echo(tone(8000), 100.2)  # the caller at the reply's level
    assert not gate.is_echo(tone(4000), 100.2)  # -6 dB: still louder than the margin allows for an echo
    assert gate.is_echo(tone(800), 101.0)  # the echo of the reply's end, 0.5 s after it played
    assert not gate.is_echo(tone(800), 101.2)  # more than the window after the last sound: nothing to echo
    assert gate.gated == 2


def test_before_anything_was_played_no_frame_is_echo() -> None:
    gate = EchoGate(RATE)
    assert gate.reference(5.0) == 0.0 and not gate.is_echo(tone(10), 5.0)


def test_a_clear_drops_what_the_caller_never_played() -> None:
    gate = EchoGate(RATE, margin_db=10.0, window_s=0.6)
    for _ in range(50):
        gate.sent(tone(8000), 10.0)  # 1 s of reply queued at the caller
    gate.cleared(10.1)  # the barge-in: the caller's playout dropped the rest
    assert gate.play_end == pytest.approx(10.1)
    assert not gate.is_echo(tone(800), 10.8)  # what was dropped was never heard, so it has no echo


def test_margin_zero_is_off_and_out_of_range_is_refused() -> None:
    gate = EchoGate(RATE, margin_db=0.0)
    gate.sent(tone(8000), 1.0)
    assert not gate.enabled and not gate.is_echo(tone(1), 1.01)
    with pytest.raises(ConfigError, match="--echo-gate-db"):
        AgentSettings(echo_gate_db=-3)
    assert rms(np.zeros(0, np.int16)) == 0.0 and rms(np.full(4, 100, np.int16)) == pytest.approx(100.0)


REPLY = ["Sure, I can help ", "you with that today. "] + ["More words to say here. "] * 6


def _echoing_call(served, seconds: float, gain_db: float, then_talk: bool) -> TwilioCaller:
    """A caller that says a line, then, while the reply plays, sends back what it received ``gain_db`` down, 20 ms
    a frame in real time (a speakerphone), then, with ``then_talk``, talks over the reply at its own level."""
    gain = 10 ** (gain_db / 20)
    line = wire.twilio_line()
    with dial(served.url) as ws:
        caller = TwilioCaller(ws)
        caller.begin()
        caller.say(speech(400))
        caller.say(silence(500))
        first = caller.until("media", timeout=10)
        heard = [wire.decode(line, base64.b64decode(first["media"]["payload"]))]
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            while True:  # everything the agent sent so far, without waiting
                try:
                    message = caller.receive(timeout=0.001)
                except TimeoutError:
                    break
                if message["event"] == "media":
                    heard.append(wire.decode(line, base64.b64decode(message["media"]["payload"])))
            frame = heard.pop(0) if heard else np.zeros(FRAME, np.int16)
            caller.say((frame.astype(np.float64) * gain).astype(np.int16))
            time.sleep(0.02)
        if then_talk:
            caller.say(speech(400))
            caller.until("clear", timeout=5)
        caller.say(silence(400))
    return caller


def _answer() -> Reply:
    return Reply.stream(at(0.02, llama_events(REPLY)))


@pytest.mark.parametrize("gate_db, cut_by_echo", [(10.0, False), (0.0, True)])
def test_the_reply_heard_back_at_minus_12_db_is_no_barge_in_unless_the_gate_is_off(gate_db: float,
                                                                                    cut_by_echo: bool) -> None:
    # -12 dB keeps the echo's peaks (~2000) above the fake VAD's speech level (1000): without the gate it is speech.
    with FakeServer([_answer(), _answer()]) as fake, \
            serving(settings(fake.url, echo_gate_db=gate_db), fake_engines(ToneTTS())) as served:
        caller = _echoing_call(served, 1.0, -12.0, then_talk=False)
        cleared = [m for m in caller.received if m["event"] == "clear"]
        assert bool(cleared) == cut_by_echo
        wait_for(lambda: len(served.agent.records) >= 1, timeout=10)
        record = served.agent.records[0]
        assert (record["end_reason"] == "interrupted") == cut_by_echo
        assert served.ready["engines"]["turn"]["echo_gate"] == (
            None if gate_db == 0 else {**served.ready["engines"]["turn"]["echo_gate"], "margin_db": gate_db})


def test_the_caller_talking_over_the_echo_still_barges_in() -> None:
    with FakeServer([_answer(), _answer()]) as fake, \
            serving(settings(fake.url), fake_engines(ToneTTS())) as served:
        caller = _echoing_call(served, 0.6, -12.0, then_talk=True)
        clears = [k for k, m in enumerate(caller.received) if m["event"] == "clear"]
        assert len(clears) == 1
        wait_for(lambda: len(served.agent.records) >= 1, timeout=10)
        assert served.agent.records[0]["end_reason"] == "interrupted"
