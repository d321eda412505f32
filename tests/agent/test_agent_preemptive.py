"""--preemptive (issue 28 item 3): the built-in agent starts its reply from the speculative transcript before the
endpoint and holds every byte of its audio until the endpoint confirms the turn; speech before the endpoint drops it
(stream closed, synthesis stopped, nothing sent, no history). Fake engines (a loud-frame VAD, a tone TTS, a
transcriber that says how many samples it got) and a scripted LLM server. The caller sends its speech at once and
its silence frame by frame, and waits, sending nothing, until the agent holds audio: the endpointer counts frames, so
no endpoint can fire while the caller waits, and no test depends on the machine's speed. What the real engines do on
a line with a mid-sentence pause is in test_agent_preemptive_real.py."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import numpy as np
import pytest

from agentkit import (LoudVAD, ToneTTS, TwilioCaller, agent_threads, dial, play_out, serving, settings, silence, speech,
                      wait_for)
from fakeserver import SLOTS_NOT_LISTED, TIMINGS, FakeServer, Reply, at, chunk_payload, event, llama_events
from voice_llm.capabilities.agent.server import Engines, LockedSTT, LockedTTS
from voice_llm.engines.line import wire

ENDPOINT_MS = 300.0
HELD = "This reply is held back. "  # the preemptive reply's first clause: made (synthesized) before the endpoint
LATER = "And then more."  # what the stream sends after a stall: after the endpoint, or never (dropped)
# the stream's stall after HELD: the reply is still streaming when the caller goes on (dropped: closed in the stall)
# or when the endpoint comes (about 300 ms after the test sees the held audio)
STALL_S = 3.0
RELEASE_STALL_S = 1.0
SYNTH_S = 0.02  # the tone TTS's time per segment: a dropped reply's synthesis is more than nothing
# llama-server's /slots with two idle slots: the preemptive reply's gate lets it start (agent.preemptive)
IDLE = [{"id": 0, "is_processing": False}, {"id": 1, "is_processing": False}]


class CountingSTT:
    """Says how many 16 kHz samples it was given ("N samples.": a sentence, so the preemptive gate lets it start a
    reply; ``text`` instead when given); records each call."""

    name = "counting"

    def __init__(self, text: str | None = None) -> None:
        self.calls: list[int] = []
        self.lock = threading.Lock()
        self.text = text

    def transcribe(self, samples: np.ndarray, script: str) -> str:
        with self.lock:
            self.calls.append(len(samples))
        return self.text if self.text is not None else f"{len(samples)} samples."

    def info(self) -> dict[str, Any] | None:
        return {"model": "counting"}


def engines(stt: CountingSTT, tts: ToneTTS) -> Engines:
    return Engines(LockedSTT(stt), LockedTTS(tts), LoudVAD,
                   {"vad": {"fake": "loud"}, "stt": stt.info(), "tts": {"engine": "tone"}}, {})


def stalled(stall_s: float = STALL_S) -> Reply:
    """HELD at once (4 content chunks), then the stall, then LATER: the reply in the making when the caller acts."""
    first = [event(chunk_payload({"role": "assistant", "content": None}))]
    first += [event(chunk_payload({"content": text})) for text in ("This reply ", "is held ", "back. ", "And")]
    rest = llama_events([" then more."])[1:]
    return Reply.stream(at(0.0, first) + [(stall_s, rest[0])] + at(0.0, rest[1:]))


def quick(text: str) -> Reply:
    return Reply.stream(at(0.0, llama_events([text])))


def send_silence(caller: TwilioCaller, ms: int) -> None:
    """Silence in real time (20 ms a frame): the agent's clock sees the pause as a line would carry it."""
    pause = silence(ms)
    for start in range(0, len(pause), 160):
        caller.say(pause[start:start + 160])
        time.sleep(0.02)


def live_call(served: Any) -> Any:
    wait_for(lambda: served.agent.calls)
    return next(iter(served.agent.calls.values()))


def holding(call: Any) -> Any:
    """The preemptive turn once it holds audio (its first clause synthesized, nothing sent)."""
    def held() -> bool:
        return bool(call.turns) and call.turns[-1].state == "held" and any(i[0] == "audio" for i in call.turns[-1].held)
    wait_for(held, 10)
    return call.turns[-1]


def nothing_received(caller: TwilioCaller) -> bool:
    try:
        caller.receive(0.1)
    except TimeoutError:
        return True
    return False


def media_payloads(caller: TwilioCaller) -> list[bytes]:
    return [base64.b64decode(m["media"]["payload"]) for m in caller.received if m["event"] == "media"]


def paused_caller(served: Any) -> TwilioCaller:
    """A caller on the line that said 400 ms of speech and paused 100 ms: the speech end (the speculative decode,
    then the preemptive reply), no endpoint yet (ENDPOINT_MS)."""
    # entered as a context manager (websockets 17.1 deprecates a bare sync connect()); each test closes it itself
    caller = TwilioCaller(dial(served.url).__enter__())
    caller.begin()
    caller.say(speech(400))
    send_silence(caller, 100)
    return caller


def test_speech_before_the_endpoint_drops_the_preemptive_reply_unheard_and_unremembered() -> None:
    stt, tts = CountingSTT(), ToneTTS(SYNTH_S)
    with FakeServer([stalled(), quick("Sure."), quick("Okay.")], slots=IDLE) as fake, \
            serving(settings(fake.url, preemptive=True, endpoint_ms=ENDPOINT_MS), engines(stt, tts)) as served:
        assert served.ready["engines"]["llm"]["preemptive"] is True
        assert served.ready["engines"]["stt"]["speculative"] is True  # --preemptive implies it
        caller = paused_caller(served)
        call = live_call(served)
        turn = holding(call)
        assert tts.texts == [HELD.strip()]  # its first clause was synthesized: audio existed, held
        assert nothing_received(caller)  # and none of it went on the line
        caller.say(speech(400))  # the caller goes on before the endpoint
        send_silence(caller, 600)
        play_out(served, caller, 1)
        # the first stream was closed while it stalled (llama-server would stop generating), its audio never sent:
        # everything heard is the second reply's tone ("Sure.": 5 characters, 20 ms each, in 20 ms frames)
        assert fake.wait_finished(0).client_closed
        assert turn.state == "dropped" and turn.held == [] and turn.sent == []
        assert caller.audio_ms() == pytest.approx(len("Sure.") * 20, abs=20)
        record = served.agent.records[0]
        assert record["reply"] == "Sure."
        # two decodes: the pause's (its reply dropped) and the whole utterance's (the turn)
        assert len(stt.calls) == 2 and record["transcript"] == f"{stt.calls[1]} samples."
        counts = record["preemptive"]
        # the whole utterance's decode may start a preemptive reply of its own, which its endpoint confirms
        assert counts["dropped"] == 1 and counts["tokens_wasted"] == 4
        assert counts["used"] == int(record["preemptive"]["reply"])
        assert counts["started"] == counts["dropped"] + counts["used"]
        assert counts["synthesis_ms_wasted"] >= SYNTH_S * 1000 - 1
        assert counts["call"]["dropped"] == 1
        # the history has nothing of it: the next request carries the committed turn only
        caller.say(speech(300))
        send_silence(caller, 600)
        play_out(served, caller, 2)
        history = fake.requests[-1].json["messages"]
        said = [m["content"] for m in history if m["role"] != "system"]
        assert said[:2] == [f"{stt.calls[1]} samples.", "Sure."]
        assert f"{stt.calls[0]} samples." not in said and not any("held back" in text for text in said)
        caller.hang_up()
        caller.ws.close()
    assert agent_threads() == []


def test_the_endpoint_releases_exactly_the_held_audio_first_and_the_reply_goes_on() -> None:
    stt, tts = CountingSTT(), ToneTTS(SYNTH_S)
    with FakeServer([stalled(RELEASE_STALL_S)], slots=IDLE) as fake, \
            serving(settings(fake.url, preemptive=True, endpoint_ms=ENDPOINT_MS), engines(stt, tts)) as served:
        caller = paused_caller(served)
        call = live_call(served)
        turn = holding(call)
        held = np.concatenate([item[3] for item in turn.held if item[0] == "audio"])
        assert nothing_received(caller)
        assert fake.requests[0].json["messages"][-1]["content"] == f"{stt.calls[0]} samples."
        send_silence(caller, 400)  # the rest of the pause: the endpoint confirms the turn
        play_out(served, caller, 1)
        record = served.agent.records[0]
        events = record["events"]
        # the reply was asked for before the endpoint; nothing of it left before the endpoint
        assert events["request_sent"] < events["endpoint"] <= events["first_audio_sent"]
        assert record["preemptive"]["reply"] is True and record["transcript"] == f"{stt.calls[0]} samples."
        assert {k: record["preemptive"][k] for k in ("started", "used", "dropped", "tokens_wasted")} == \
            {"started": 1, "used": 1, "dropped": 0, "tokens_wasted": 0}
        assert len(stt.calls) == 1  # the endpoint committed the speculative transcript
        # the line's first frames are exactly the held audio (mu-law, 20 ms frames, the last one padded), then the
        # rest of the reply (LATER, streamed after the stall)
        frames = -(-len(held) // 160)
        padded = np.zeros(frames * 160, np.int16)
        padded[:len(held)] = held
        got = media_payloads(caller)
        line = wire.twilio_line()
        assert b"".join(got[:frames]) == b"".join(wire.encode(line, padded[i:i + 160]) for i in range(0, len(padded), 160))
        assert len(got) > frames and record["reply"] == HELD + LATER
        assert record["heard"] == HELD + LATER
        assert sum(record["breakdown"].values()) == pytest.approx(record["reported_ms"], abs=1.0)
        caller.hang_up()
        caller.ws.close()
    assert agent_threads() == []


def test_with_no_preemptive_no_reply_starts_before_the_endpoint() -> None:
    stt, tts = CountingSTT(), ToneTTS()
    with FakeServer([quick("Sure.")]) as fake, \
            serving(settings(fake.url, speculative_stt=True, preemptive=False, endpoint_ms=ENDPOINT_MS),
                    engines(stt, tts)) as served:
        assert served.ready["engines"]["llm"]["preemptive"] is False
        caller = paused_caller(served)
        wait_for(lambda: stt.calls)  # the speculative decode is done; no reply is asked for before the endpoint
        time.sleep(0.2)
        assert fake.requests == []
        send_silence(caller, 400)
        play_out(served, caller, 1)
        record = served.agent.records[0]
        assert record["events"]["request_sent"] > record["events"]["endpoint"]
        assert record["preemptive"]["on"] is False and record["preemptive_attributes"] == {}
        caller.hang_up()
        caller.ws.close()
    assert agent_threads() == []


def test_a_reply_made_in_full_before_the_caller_goes_on_is_dropped_and_counted_too() -> None:
    """The whole preemptive reply streamed and synthesized (its thread over, its end held with its audio) before the
    speech resumes: dropped all the same, and its end still counted (its tokens and synthesis wasted)."""
    stt, tts = CountingSTT(), ToneTTS(SYNTH_S)
    whole = "This whole reply was made in time."
    with FakeServer([quick(whole), quick("Sure.")], slots=IDLE) as fake, \
            serving(settings(fake.url, preemptive=True, endpoint_ms=ENDPOINT_MS), engines(stt, tts)) as served:
        caller = paused_caller(served)
        call = live_call(served)
        turn = call.turns[0] if call.turns else holding(call)
        wait_for(lambda: any(item[0] == "end" for item in turn.held), 10)
        assert nothing_received(caller)
        caller.say(speech(400))
        send_silence(caller, 600)
        play_out(served, caller, 1)
        assert turn.state == "dropped" and turn.thread_ended and turn.sent == []
        counts = served.agent.records[0]["preemptive"]
        assert counts["dropped"] == 1 and counts["tokens_wasted"] == 1  # llama_events: one content chunk
        assert counts["synthesis_ms_wasted"] >= SYNTH_S * 1000 - 1
        assert caller.audio_ms() == pytest.approx(len("Sure.") * 20, abs=20)
        caller.hang_up()
        caller.ws.close()
    assert agent_threads() == []


def end_call(served: Any, caller: TwilioCaller, turns: int = 1) -> dict[str, Any]:
    """The call's replies played out (``turns``), then the hang-up; the first turn's record."""
    play_out(served, caller, turns)
    record = served.agent.records[0]
    caller.hang_up()
    caller.ws.close()
    return record


def gated_call(fake: FakeServer, stt: CountingSTT, gate: str) -> dict[str, Any]:
    """A caller's pause whose transcript is ready before the endpoint but gated (``gate``): no chat request goes
    out before the endpoint, the endpoint's turn answers as a plain one; the turn's record."""
    with serving(settings(fake.url, preemptive=True, endpoint_ms=ENDPOINT_MS), engines(stt, ToneTTS())) as served:
        caller = paused_caller(served)
        call = live_call(served)
        wait_for(lambda: call.preempted[f"gated_{gate}"] == 1)  # the pause's decode was gated; no endpoint yet
        assert fake.requests == [] and call.turns == []
        send_silence(caller, 400)
        record = end_call(served, caller)
    assert agent_threads() == []
    return record


@pytest.mark.parametrize("slots", [[False], [True, False], None],
                         ids=["one idle slot of one", "one idle slot of two", "no slots list"])
def test_no_preemptive_reply_starts_without_a_spare_slot_for_the_endpoint(slots: list[bool] | None,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """One idle slot is the endpoint's: a guess there, dropped, would hold it until llama-server lets go of it. A
    server that lists no slots (a 404) is not guessed about, and the log says so once, not at every pause."""
    listed = SLOTS_NOT_LISTED if slots is None else [{"id": i, "is_processing": busy} for i, busy in enumerate(slots)]
    with FakeServer([quick("Sure.")], slots=listed) as fake:
        record = gated_call(fake, CountingSTT(), "slot")
        assert [p.path for p in fake.probes].count("/slots") == 1  # asked once, for the one pause
    assert record["preemptive"]["reply"] is False and record["preemptive"]["started"] == 0
    assert record["events"]["request_sent"] > record["events"]["endpoint"]
    assert record["reply"] == "Sure."
    err = capsys.readouterr().err
    assert err.count("lists no slots") == (slots is None)
    assert err.count("no preemptive reply from this pause") == (slots is not None)


def test_a_transcript_that_does_not_end_a_sentence_starts_no_preemptive_reply() -> None:
    """The pause line's first half ("... to."): a reply started there would be let out at the endpoint inside the
    caller's pause. The gate is on the text alone: the server is not asked."""
    with FakeServer([quick("Sure.")], slots=IDLE) as fake:
        record = gated_call(fake, CountingSTT("I need to move my appointment to."), "transcript")
        assert fake.probes == []
    assert record["preemptive"]["reply"] is False and record["preemptive"]["started"] == 0
    assert record["transcript"] == "I need to move my appointment to."


def test_two_idle_slots_let_the_preemptive_reply_start() -> None:
    stt = CountingSTT()
    with FakeServer([quick("Sure.")], slots=IDLE) as fake:
        with serving(settings(fake.url, preemptive=True, endpoint_ms=ENDPOINT_MS), engines(stt, ToneTTS())) as served:
            caller = paused_caller(served)
            call = live_call(served)
            wait_for(lambda: fake.requests)  # the reply was asked for in the pause, before any endpoint
            assert call.preempted["started"] == 1 and call.preempted["gated_slot"] == 0
            send_silence(caller, 400)
            play_out(served, caller, 1)
            record = served.agent.records[0]
            caller.hang_up()
            caller.ws.close()
        assert [p.path for p in fake.probes] == ["/slots"]
    assert record["preemptive"]["reply"] is True
    assert record["events"]["request_sent"] < record["events"]["endpoint"]
    assert agent_threads() == []


# -- --prefill-ahead: the turn's prompt computed before the endpoint when no preemptive reply may start -----------

ONE_IDLE_OF_ONE = [{"id": 0, "is_processing": False}]  # the lab's 1-slot server, idle: no preemptive reply


def prefilled_call(fake: FakeServer, stt: CountingSTT, asked: int, **changes: Any) -> tuple[dict[str, Any], list[Any]]:
    """A caller's pause whose transcript is ready before the endpoint, then the endpoint; the turn's record and what
    the fake server was asked before the endpoint (a prefill ahead's request, or nothing). The endpointer counts
    frames: no endpoint comes while the test waits for the ``asked`` requests (then a little more, for any other)."""
    with serving(settings(fake.url, endpoint_ms=ENDPOINT_MS, **changes), engines(stt, ToneTTS())) as served:
        assert served.ready["engines"]["llm"]["prefill_ahead"] is changes["prefill_ahead"]  # the ready line says it
        caller = paused_caller(served)
        call = live_call(served)
        wait_for(lambda: "/slots" in [p.path for p in fake.probes])  # the gate asked: the decode is done
        wait_for(lambda: len(fake.requests) >= asked)
        time.sleep(0.2)
        before = list(fake.requests)
        assert all(turn.state == "held" for turn in call.turns)  # the endpoint has not come: at most a held reply
        send_silence(caller, 400)
        record = end_call(served, caller)
        heard_ms = caller.audio_ms()
    assert agent_threads() == []
    assert heard_ms == pytest.approx(len(record["reply"]) * 20, abs=20)  # the tone of the endpoint's reply only
    return record, before


@pytest.mark.parametrize("preemptive", [True, False], ids=["slot-gated preemptive", "no preemptive"])
def test_a_pause_with_no_preemptive_reply_prefills_the_turn_the_endpoint_then_asks_for(
        preemptive: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """One idle slot of one (the lab's server): no preemptive reply may start, so the conversation with the
    speculative transcript goes out for one token before the endpoint, and the endpoint's own request carries the
    same messages (llama-server's slot then holds their prefix). Nothing of the prefill's answer is heard or kept."""
    stt = CountingSTT()
    with FakeServer([quick("Ahead."), quick("Sure.")], slots=ONE_IDLE_OF_ONE) as fake:
        record, before = prefilled_call(fake, stt, 1, preemptive=preemptive, prefill_ahead=True)
        ahead, reply = fake.requests
    assert before == [ahead]
    assert ahead.json["max_tokens"] == 1 and ahead.json["messages"][-1] == {"role": "user",
                                                                           "content": f"{stt.calls[0]} samples."}
    assert reply.json["messages"] == ahead.json["messages"] and reply.json["max_tokens"] > 1
    assert not ahead.client_closed  # never closed early: llama-server would hold its slot
    assert record["reply"] == "Sure." and record["preemptive"]["reply"] is False
    assert record["events"]["request_sent"] > record["events"]["endpoint"]
    counts = record["preemptive"]
    assert counts["prefilled_ahead"] == 1 and counts["prefill_ahead_tokens"] == TIMINGS["prompt_n"]
    assert counts["started"] == 0 and counts["gated_slot"] == int(preemptive)
    assert record["preemptive_attributes"]["voice_llm.preemptive.prefilled_ahead"] == 1
    turn_lines = [line for line in capsys.readouterr().err.splitlines() if "turn 1:" in line]
    assert len(turn_lines) == 1 and f"prefilled ahead 1x ({TIMINGS['prompt_n']} prompt tokens)" in turn_lines[0]


@pytest.mark.parametrize("slots", [[True], SLOTS_NOT_LISTED], ids=["no idle slot", "no slots list"])
def test_no_prefill_ahead_without_an_idle_slot_or_a_slots_list(slots: Any) -> None:
    """A prefill ahead must not queue behind other calls' requests (no idle slot), and a server that lists no slots is
    not guessed about: the endpoint's request is the only one."""
    listed = slots if slots == SLOTS_NOT_LISTED else [{"id": 0, "is_processing": busy} for busy in slots]
    with FakeServer([quick("Sure.")], slots=listed) as fake:
        record, before = prefilled_call(fake, CountingSTT(), 0, prefill_ahead=True)
        assert len(fake.requests) == 1
    assert before == [] and record["preemptive"]["prefilled_ahead"] == 0 and record["reply"] == "Sure."


def test_a_started_preemptive_reply_is_its_own_prefill() -> None:
    """Two idle slots: the preemptive reply starts, and it prefills the turn itself; no prefill ahead is sent."""
    with FakeServer([quick("Sure.")], slots=IDLE) as fake:
        record, before = prefilled_call(fake, CountingSTT(), 1, preemptive=True, prefill_ahead=True)
        assert len(fake.requests) == 1
    assert len(before) == 1 and before[0].json["max_tokens"] > 1
    assert record["preemptive"]["reply"] is True and record["preemptive"]["prefilled_ahead"] == 0


def test_a_caller_who_goes_on_after_a_prefill_ahead_gets_the_whole_utterance_answered() -> None:
    """The prefill ahead of the first half is not closed (it ends on its own); the endpoint after the caller went on
    asks with the whole utterance's transcript, and the history keeps nothing of the first half's. Whether the second
    pause's decode is ready before its endpoint depends on the machine, so every answer is the same."""
    stt = CountingSTT()
    with FakeServer([quick("Sure.")] * 3, slots=ONE_IDLE_OF_ONE) as fake, \
            serving(settings(fake.url, endpoint_ms=ENDPOINT_MS, prefill_ahead=True), engines(stt, ToneTTS())) as served:
        caller = paused_caller(served)
        wait_for(lambda: fake.requests)
        caller.say(speech(400))  # the caller goes on before the endpoint
        send_silence(caller, 600)
        record = end_call(served, caller)
    assert agent_threads() == []
    asked = [r.json["messages"][-1]["content"] for r in fake.requests]
    whole = f"{stt.calls[-1]} samples."
    assert asked[0] == f"{stt.calls[0]} samples." and asked[-1] == whole and record["transcript"] == whole
    assert not fake.requests[0].client_closed
    assert [m["content"] for m in fake.requests[-1].json["messages"] if m["role"] != "system"] == [whole]
    assert record["reply"] == "Sure." and record["preemptive"]["call"]["prefilled_ahead"] == len(asked) - 1


def test_a_prefill_ahead_the_server_fails_is_one_log_line_and_the_turn_is_answered(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The server answers the prefill ahead with an error: the agent says so in one line, counts nothing it did not
    get, and the endpoint's request answers the turn as it would have."""
    stt = CountingSTT()
    with FakeServer([Reply.json(500, {"error": {"message": "boom"}}), quick("Sure.")], slots=ONE_IDLE_OF_ONE) as fake:
        record, before = prefilled_call(fake, stt, 1, prefill_ahead=True)
    assert len(before) == 1 and record["reply"] == "Sure."
    assert record["preemptive"]["prefilled_ahead"] == 1 and record["preemptive"]["prefill_ahead_tokens"] == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "prefill ahead failed" in line] and "Traceback" not in err

