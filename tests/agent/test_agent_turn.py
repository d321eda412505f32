"""`voice-llm agent --turn silence|smart`, the decision (voice_llm.capabilities.agent.turn.TurnTaker): VAD probabilities in
frames, the model's verdict injected as a function of the CHECK (the logic under test is what the agent does with a
verdict, not the model), delivered a set number of frames after it was asked for, as the agent's model thread
delivers it while frames keep coming. Everything is counted in 32 ms frames: deterministic, no clock. The agent's
wiring (the model on its own thread, the record, the span) with a scripted verdict, and the missing extra, are at
the end; the real model is in test_agent_turn_real.py."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import numpy as np
import pytest

from agentkit import TwilioCaller, collector, dial, fake_engines, serving, settings, silence, speech, wait_for
from fakeserver import FakeServer, Reply, at, llama_events
from voice_llm.capabilities.agent import turn as turnmod
from voice_llm.capabilities.agent.turn import CHECK, RULE_COMPLETE, RULE_FALLBACK, RULE_SILENCE, TurnTaker, Verdict
from voice_llm.cli.main import main
from voice_llm.engines.speech_in import vad as vadmod

FRAME_MS = vadmod.FRAME_MS
CHECK_FRAMES = math.ceil(turnmod.SMART_SILENCE_MS / FRAME_MS)  # 7: the CHECK is the 7th silent frame
FALLBACK_FRAMES = math.ceil(turnmod.SMART_FALLBACK_MS / FRAME_MS)  # 94
COMPLETE, INCOMPLETE = Verdict(True, 0.93, 150.0), Verdict(False, 0.12, 160.0)


def probs(*runs: tuple[int, int]) -> list[float]:
    """(speech frames, silent frames) runs as VAD probabilities."""
    out: list[float] = []
    for speaking, quiet in runs:
        out += [0.9] * speaking + [0.1] * quiet
    return out


def drive(taker: TurnTaker, probabilities: list[float], judge: Callable[[int], Verdict | None],
          latency: int = 0) -> list[tuple[int, str]]:
    """Push every frame; a CHECK at frame f gets judge(f) back after ``latency`` more frames (0: before the next
    frame). (frame index, event kind) in order."""
    seen: list[tuple[int, str]] = []
    due: list[tuple[int, int]] = []  # (deliver after frame, check frame)
    for index, p in enumerate(probabilities):
        for event in taker.push(p):
            seen.append((index, event.kind))
            if event.kind == CHECK:
                assert event.frame == index
                due.append((index + latency, event.frame))
        for when, frame in [d for d in due if d[0] == index]:
            due.remove((when, frame))
            seen += [(index, e.kind) for e in taker.verdict(frame, judge(frame))]
    return seen


def kinds(seen: list[tuple[int, str]]) -> list[str]:
    return [kind for _, kind in seen]


def test_silence_mode_is_the_core_endpointer_unchanged() -> None:
    sequence = probs((20, 5), (3, 12), (15, 40))
    core = vadmod.Endpointer(300.0)
    expected = [(i, e.kind) for i, p in enumerate(sequence) for e in core.push(p)]
    taker = TurnTaker("silence", endpoint_ms=300.0)
    assert drive(taker, sequence, lambda _f: pytest.fail("silence mode asks no model")) == expected
    assert CHECK not in kinds(expected) and kinds(expected).count(vadmod.ENDPOINT) == 2
    assert taker.decision is not None and taker.decision.rule == RULE_SILENCE
    assert taker.decision.silence_ms == pytest.approx(10 * FRAME_MS)  # ceil(300 / 32) frames
    assert taker.decision.verdict is None and taker.decision.span_attributes() == {
        "voice_llm.turn.mode": "silence", "voice_llm.turn.rule": "silence", "voice_llm.turn.silence_ms": 320.0}


@pytest.mark.parametrize("latency", [0, 3])
def test_a_complete_verdict_ends_the_turn_when_it_comes(latency: int) -> None:
    taker = TurnTaker("smart")
    seen = drive(taker, probs((20, 200)), lambda _f: COMPLETE, latency)
    check = 20 + CHECK_FRAMES - 1
    assert seen == [(0, vadmod.SPEECH_START), (20, vadmod.SPEECH_END), (check, CHECK),
                    (check + latency, vadmod.ENDPOINT)]
    decision = taker.decision
    assert decision is not None and decision.rule == RULE_COMPLETE and decision.verdict == COMPLETE
    assert decision.silence_ms == pytest.approx((CHECK_FRAMES + latency) * FRAME_MS)
    assert decision.check_frame == check and decision.checks == 1
    assert decision.span_attributes()["voice_llm.smart_turn.probability"] == 0.93
    assert decision.span_attributes()["voice_llm.smart_turn.inference_ms"] == 150.0


def test_an_incomplete_verdict_waits_for_the_fallback_silence() -> None:
    taker = TurnTaker("smart")
    seen = drive(taker, probs((20, 200)), lambda _f: INCOMPLETE, 2)
    assert kinds(seen) == [vadmod.SPEECH_START, vadmod.SPEECH_END, CHECK, vadmod.ENDPOINT]
    assert seen[-1][0] == 20 + FALLBACK_FRAMES - 1
    decision = taker.decision
    assert decision is not None and decision.rule == RULE_FALLBACK and decision.verdict == INCOMPLETE
    assert decision.silence_ms == pytest.approx(FALLBACK_FRAMES * FRAME_MS)
    assert decision.as_dict()["probability"] == 0.12 and decision.as_dict()["complete"] is False


def test_speech_resuming_after_incomplete_continues_the_utterance_and_the_next_pause_is_judged() -> None:
    taker = TurnTaker("smart")
    verdicts = iter([INCOMPLETE, COMPLETE])
    seen = drive(taker, probs((20, 30), (15, 50)), lambda _f: next(verdicts), 1)
    assert kinds(seen) == [vadmod.SPEECH_START, vadmod.SPEECH_END, CHECK, vadmod.RESUMED, vadmod.SPEECH_END,
                           CHECK, vadmod.ENDPOINT]
    second_check = 20 + 30 + 15 + CHECK_FRAMES - 1
    assert seen[-1] == (second_check + 1, vadmod.ENDPOINT)
    decision = taker.decision
    assert decision is not None and decision.rule == RULE_COMPLETE and decision.checks == 2
    assert decision.check_frame == second_check


def test_a_verdict_on_a_pause_that_is_over_changes_nothing() -> None:
    # complete, but it comes after speech resumed (2 silent frames after the CHECK, then speech): the utterance goes
    # on, and its next pause (judged incomplete) ends at the fallback
    taker = TurnTaker("smart")
    verdicts = {20 + CHECK_FRAMES - 1: COMPLETE}
    seen = drive(taker, probs((20, CHECK_FRAMES + 1), (10, 150)), lambda f: verdicts.get(f, INCOMPLETE), 5)
    assert kinds(seen) == [vadmod.SPEECH_START, vadmod.SPEECH_END, CHECK, vadmod.RESUMED, vadmod.SPEECH_END, CHECK,
                           vadmod.ENDPOINT]
    assert taker.decision is not None and taker.decision.rule == RULE_FALLBACK
    assert taker.decision.verdict == INCOMPLETE


def test_no_verdict_or_a_failed_model_falls_back_to_the_long_silence() -> None:
    late = TurnTaker("smart")  # the model slower than the fallback: its verdict comes after the turn ended
    seen = drive(late, probs((20, 200)), lambda _f: COMPLETE, FALLBACK_FRAMES + 5)
    assert kinds(seen) == [vadmod.SPEECH_START, vadmod.SPEECH_END, CHECK, vadmod.ENDPOINT]
    assert late.decision is not None and late.decision.rule == RULE_FALLBACK and late.decision.verdict is None
    assert "voice_llm.smart_turn.probability" not in late.decision.span_attributes()
    failed = TurnTaker("smart")
    assert kinds(drive(failed, probs((20, 200)), lambda _f: None)) == kinds(seen)
    assert failed.decision is not None and failed.decision.rule == RULE_FALLBACK


def test_the_next_utterance_starts_its_own_count() -> None:
    taker = TurnTaker("smart")
    seen = drive(taker, probs((20, 20), (12, 20)), lambda _f: COMPLETE)
    assert kinds(seen).count(vadmod.ENDPOINT) == 2 and taker.decision is not None and taker.decision.checks == 1


def test_endpoint_now_ends_only_a_pause() -> None:
    core = vadmod.Endpointer(3000.0)
    assert core.endpoint_now() is None  # idle
    core.push(0.9)
    assert core.endpoint_now() is None  # speaking
    core.push(0.1)
    core.push(0.1)
    event = core.endpoint_now()
    assert event == vadmod.Event(vadmod.ENDPOINT, 2, 2 * FRAME_MS) and core.state == "idle"
    assert core.push(0.1) == []  # the turn is over: silence says nothing more


def test_the_ready_line_says_the_mode_and_its_constants() -> None:
    assert turnmod.describe("silence", 300.0) == {"mode": "silence", "endpoint_ms": 300.0,
                                                  "rule": "300 ms of silence"}
    smart = turnmod.describe("smart", 300.0)
    assert smart["mode"] == "smart" and smart["endpoint_ms"] is None
    assert (smart["smart_silence_ms"], smart["fallback_ms"]) == (turnmod.SMART_SILENCE_MS, turnmod.SMART_FALLBACK_MS)


# --- the agent's wiring, with a scripted verdict -------------------------------------------------------------------


class ScriptedJudge:
    """The model's place in Engines.smart: a verdict decided by the test (the real model: test_agent_turn_real)."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict, self.lengths = verdict, []

    def judge(self, samples: np.ndarray) -> Verdict:
        self.lengths.append(len(samples))
        return self.verdict

    def info(self) -> dict[str, str]:
        return {"scripted": "yes"}


@pytest.mark.parametrize("verdict, rule", [(COMPLETE, RULE_COMPLETE), (INCOMPLETE, RULE_FALLBACK)])
def test_the_agent_ends_the_turn_by_the_verdict_and_its_record_and_span_say_so(verdict: Verdict, rule: str) -> None:
    engines = fake_engines()
    judge = ScriptedJudge(verdict)
    engines.smart = judge  # type: ignore[assignment]
    reply = Reply.stream(at(0.0, llama_events(["Sure."])))
    with collector() as found:
        with FakeServer(reply) as fake, serving(settings(fake.url, turn="smart", otlp=found.url), engines) as served:
            assert served.ready["engines"]["turn"]["mode"] == "smart"
            assert served.ready["engines"]["turn"]["model"] == {"scripted": "yes"}
            with dial(served.url) as ws:
                caller = TwilioCaller(ws)
                caller.begin()
                caller.say(speech(400))
                caller.say(silence(600))  # sent at once: the verdict may come after all of it, still in the pause
                wait_for(lambda: 1 in served.agent.calls)
                call = served.agent.calls[1]
                wait_for(lambda: any(answered is not None for _, answered in call.checked_at.values()))
                if rule == RULE_FALLBACK:
                    caller.say(silence(3000))  # the rest of the fallback's silence
                caller.echo(caller.until("mark")["mark"]["name"])
                wait_for(lambda: served.agent.records)
                caller.hang_up()
    record = served.agent.records[0]
    assert record["turn"]["mode"] == "smart" and record["turn"]["rule"] == rule
    assert record["turn"]["probability"] == verdict.probability and record["turn"]["checks"] == 1
    silence_ms = record["turn"]["silence_ms"]
    if rule == RULE_COMPLETE:  # asked at 7 silent frames; frames went on arriving while the verdict was made
        assert CHECK_FRAMES * FRAME_MS <= silence_ms <= 600 + FRAME_MS
    else:
        assert silence_ms == pytest.approx(FALLBACK_FRAMES * FRAME_MS)
    events = record["events"]
    assert events["vad_speech_end"] <= events["smart_turn_check"] <= events["smart_turn_verdict"]
    if rule == RULE_COMPLETE:
        assert events["smart_turn_verdict"] == events["endpoint"]
    assert judge.lengths and judge.lengths[0] >= 400 * 16  # the utterance so far, at 16 kHz
    turn_span, = [s for s in found.spans() if s["name"] == "invoke_agent"]
    attributes = turn_span["attributes"]
    assert attributes["voice_llm.turn.mode"] == "smart" and attributes["voice_llm.turn.rule"] == rule
    assert attributes["voice_llm.smart_turn.probability"] == verdict.probability
    assert attributes["voice_llm.smart_turn.inference_ms"] == verdict.inference_ms
    assert {"smart_turn_check", "smart_turn_verdict"} <= set(turn_span["events"])


def test_without_the_pipecat_extra_turn_smart_is_one_line_saying_how_to_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, turnmod.SMART_MODULE, None)  # as if pipecat-ai were not installed
    assert main(["agent", "--turn", "smart", "--listen", "127.0.0.1:0", "--url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("voice-llm agent: --turn smart needs pipecat's smart-turn model")
    assert "pip install 'voice-llm[pipecat]'" in last
