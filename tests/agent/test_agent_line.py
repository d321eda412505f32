"""The agent on the line, with fake engines (a loud-frame VAD, a tone TTS, --stt none) and a fake LLM server: the
protocol (media frames, marks after each segment, clear on a barge-in, the history keeping what was heard), PCM,
--max-calls, bad input, OTLP spans, shutdown. Real speech is in test_agent_real.py."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from agentkit import (MS_PER_CHAR, Collector, ToneTTS, TwilioCaller, agent_threads, collector, dial, fake_engines, serving,
                      settings, silence, speech, wait_for)
from fakeserver import FakeServer, Reply, at, free_port, llama_events
from voice_llm.capabilities.agent import server
from voice_llm.capabilities.agent.server import PCM_LEAD_S, AgentError
from voice_llm.engines.line import wire

REPLY = ["Sure, I can ", "help you with that. ", "Anything ", "else today?"]
SPOKEN = "".join(REPLY)


def answer(texts: list[str], delay_s: float = 0.0) -> Reply:
    """llama-server's events of an answer of ``texts``, each ``delay_s`` after the one before."""
    return Reply.stream(at(delay_s, llama_events(texts)))


def test_a_turn_is_answered_in_20ms_frames_with_a_mark_after_each_segment() -> None:
    # the plain path (no speculative decode, no preemptive reply): every stage after the endpoint, in order
    plain = {"speculative_stt": False, "preemptive": False}
    with FakeServer(answer(REPLY)) as fake, serving(settings(fake.url, **plain)) as served:
        assert served.ready["protocol"] == "twilio" and served.ready["rate"] == 8000
        assert served.ready["engine"] == "builtin" and served.ready["engines"]["llm"]["model"] == "fake"
        with dial(served.url) as ws:
            caller = TwilioCaller(ws)
            caller.begin()
            caller.say(speech(400))
            caller.say(silence(500))
            first = caller.until("mark")
            second = caller.until("mark")
            media = [m for m in caller.received if m["event"] == "media"]
            # every frame is 20 ms of mu-law (160 bytes) for our stream
            assert {len(base64.b64decode(m["media"]["payload"])) for m in media} == {160}
            assert {m["streamSid"] for m in caller.received} == {"MZtest"}
            # one mark per spoken segment, each after that segment's audio: the tone is 20 ms per character
            assert [first["mark"]["name"], second["mark"]["name"]] == ["t1-s1", "t1-s2"]
            before_first = caller.received.index(first)
            first_ms = sum(1 for m in caller.received[:before_first] if m["event"] == "media") * 20
            assert abs(first_ms - len("Sure, I can help you with that.") * 20) <= 20
            assert abs(caller.audio_ms() - (len(SPOKEN.strip()) - 1) * 20) <= 40  # the space between them unsaid
            caller.echo("t1-s1")
            caller.echo("t1-s2")
            wait_for(lambda: served.agent.records)
            caller.hang_up()
        record = served.agent.records[0]
        assert record["end_reason"] == "completed" and record["heard"] == SPOKEN
        events = record["events"]
        order = ["vad_speech_end", "endpoint", "stt_start", "stt_end", "request_sent", "first_token",
                 "first_segment_text", "first_audio_ready", "first_audio_sent"]
        assert [events[name] for name in order] == sorted(events[name] for name in order)
        assert record["reported_ms"] == pytest.approx((events["first_audio_sent"] - events["vad_speech_end"]) * 1000, abs=0.2)
        assert sum(record["breakdown"].values()) == pytest.approx(record["reported_ms"], abs=1.0)
    assert agent_threads() == []


def test_a_barge_in_clears_stops_the_stream_and_keeps_only_what_was_heard() -> None:
    slow = answer(["Sure, I can help ", "you with that. "] + ["More words here. "] * 20, 0.05)
    tts = ToneTTS()
    with FakeServer([slow, answer(["Okay."])]) as fake, \
            serving(settings(fake.url), fake_engines(tts)) as served:
        with dial(served.url) as ws:
            caller = TwilioCaller(ws)
            caller.begin()
            caller.say(speech(400))
            caller.say(silence(500))
            caller.until("mark")  # the first segment is out; the caller heard none of it yet (no echo)
            caller.say(speech(400))  # ...and talks over it
            caller.until("clear")
            caller.say(silence(500))
            wait_for(lambda: len(fake.requests) >= 2)
            wait_for(lambda: len(served.agent.records) >= 1)
        first = fake.wait_finished(0)
        assert first.client_closed  # the stream was closed, not read to its end
        record = served.agent.records[0]
        assert record["end_reason"] == "interrupted"
        history = fake.requests[1].json["messages"]
        said = [m["content"] for m in history if m["role"] == "assistant"]
        # what the caller heard: a prefix of the reply, shorter than what was generated
        assert len(said) <= 1
        heard = said[0] if said else ""
        assert SPOKEN.startswith(heard.strip()[:10]) and len(heard) < len(record["reply"])
        assert record["heard"] is not None and record["reply"].startswith(record["heard"])
        assert len(tts.texts) < 5  # synthesis stopped: not every sentence generated was spoken


def test_marks_echoed_after_a_clear_do_not_count_as_heard() -> None:
    slow = answer(["One two three four, ", "five six. "] + ["Seven eight. "] * 20, 0.05)
    with FakeServer(slow) as fake, serving(settings(fake.url)) as served:
        with dial(served.url) as ws:
            caller = TwilioCaller(ws)
            caller.begin()
            caller.say(speech(400))
            caller.say(silence(500))
            mark = caller.until("mark")
            caller.say(speech(300))
            caller.until("clear")
            caller.echo(mark["mark"]["name"])  # Twilio returns the pending marks on a clear
            caller.say(silence(100))
            wait_for(lambda: served.agent.records)
        assert served.agent.records[0]["end_reason"] == "interrupted"
        assert served.agent.records[0]["heard"] != "One two three four, five six."


def test_pcm_line_sends_binary_frames_at_its_rate() -> None:
    short = ["Okay, sure. "]
    with FakeServer(answer(short)) as fake, serving(settings(fake.url, protocol="pcm", rate=16000)) as served:
        assert served.ready["protocol"] == "pcm" and served.ready["rate"] == 16000
        with dial(served.url) as ws:
            for frame in wire.frames(np.concatenate([speech(400, 16000), silence(500, 16000)]), 320):
                ws.send(frame.astype("<i2").tobytes())
            got = []
            while len(got) < len("Okay, sure.") * MS_PER_CHAR // 20:
                message = ws.recv(timeout=5)
                assert isinstance(message, bytes)
                got.append(message)
            assert {len(b) for b in got} == {640}  # 20 ms of 16-bit samples at 16 kHz
            wait_for(lambda: served.agent.records)  # the estimated end of its playout passed: completed
        assert served.agent.records[0]["end_reason"] == "completed"


def test_pcm_barge_in_stops_the_audio_within_the_lead() -> None:
    """A PCM line has no clear: the audio goes at most PCM_LEAD_S ahead of real time, so what is still on its way
    after a barge-in is that much (plus what was in flight), not the rest of the reply."""
    long = answer(["One two three four, five six seven. "] * 6)
    with FakeServer(long) as fake, serving(settings(fake.url, protocol="pcm", rate=16000)) as served:
        with dial(served.url) as ws:
            for frame in wire.frames(np.concatenate([speech(400, 16000), silence(500, 16000)]), 320):
                ws.send(frame.astype("<i2").tobytes())
            for _ in range(10):
                assert isinstance(ws.recv(timeout=5), bytes)
            for frame in wire.frames(speech(300, 16000), 320):  # the caller talks over it
                ws.send(frame.astype("<i2").tobytes())
            wait_for(lambda: served.agent.records)
            after = 0
            try:
                while True:
                    ws.recv(timeout=0.3)
                    after += 1
            except TimeoutError:
                pass
        assert served.agent.records[0]["end_reason"] == "interrupted"
        lead_frames = int(PCM_LEAD_S * 1000 / 20)
        assert after <= lead_frames + 15  # the lead, and the frames sent while the 300 ms of speech arrived
        assert 10 + after < 6 * len("One two three four, five six seven.") * MS_PER_CHAR // 20 // 3  # not the rest


def test_a_call_beyond_max_calls_is_refused_with_1013() -> None:
    with FakeServer(answer(REPLY)) as fake, serving(settings(fake.url, max_calls=1)) as served:
        with dial(served.url) as first:
            TwilioCaller(first).begin()
            wait_for(lambda: served.agent.calls)
            with dial(served.url) as second:
                with pytest.raises(ConnectionClosed) as closed:
                    second.recv(timeout=5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            assert "--max-calls" in closed.value.rcvd.reason
        assert served.agent.refused == 1


@pytest.mark.parametrize("garbage, why", [
    ("this is not json", "not a JSON message"),
    (json.dumps({"event": "media", "media": {"payload": "AAAA"}}), "before start"),
    ("[" * 5000 + "]" * 5000, "not a JSON message"),
])
def test_garbage_from_the_caller_is_one_log_line_and_the_call_closed(garbage: str, why: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(answer(REPLY)) as fake, serving(settings(fake.url)) as served:
        with dial(served.url) as ws:
            ws.send(garbage)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
        wait_for(lambda: not served.agent.calls)
        with dial(served.url) as ws:  # the agent goes on serving
            caller = TwilioCaller(ws)
            caller.begin()
            caller.say(speech(400))
            caller.say(silence(500))
            assert caller.until("media")["event"] == "media"
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if why in line]
    assert len(lines) == 1 and "call 1" in lines[0] and "Traceback" not in err


def test_a_wrong_codec_in_start_closes_the_call() -> None:
    with FakeServer(answer(REPLY)) as fake, serving(settings(fake.url)) as served:
        with dial(served.url) as ws:
            start = json.loads(wire.start(1, "MZ", "CA", "AC"))
            start["start"]["mediaFormat"] = {"encoding": "audio/l16", "sampleRate": 16000, "channels": 1}
            ws.send(json.dumps(start))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd.code == 1007 and "wrong codec" in closed.value.rcvd.reason


@pytest.mark.parametrize("field, value, said", [
    ("sampleRate", "8000", "start's mediaFormat.sampleRate is a string (\"8000\"), where Twilio sends a number (8000)"),
    ("encoding", 7, "start's mediaFormat.encoding is a number (7), where Twilio sends a string (\"audio/x-mulaw\")"),
])
def test_a_start_field_of_the_wrong_type_is_named_as_such(field: str, value: object, said: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A Twilio start whose sampleRate is "8000" (a string) is refused naming the type, not with "announces 8000
    Hz; this agent takes 8000 Hz", which contradicts itself."""
    with FakeServer(answer(REPLY)) as fake, serving(settings(fake.url)) as served:
        with dial(served.url) as ws:
            start = json.loads(wire.start(1, "MZ", "CA", "AC"))
            start["start"]["mediaFormat"][field] = value
            ws.send(json.dumps(start))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd.code == 1007 and closed.value.rcvd.reason.startswith(said)
        wait_for(lambda: not served.agent.calls)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if said in line]
    assert len(lines) == 1 and "Traceback" not in err, err


def test_spans_per_turn_reach_an_otlp_collector() -> None:
    with collector() as found, FakeServer(answer(REPLY)) as fake, \
            serving(settings(fake.url, otlp=None)) as _:
        pass  # no --otlp: nothing is sent
    assert found.bodies == []
    found: Collector
    with collector() as found:
        with FakeServer(answer(REPLY)) as fake, \
                serving(settings(fake.url, otlp=found.url)) as served:
            with dial(served.url) as ws:
                caller = TwilioCaller(ws)
                caller.begin()
                caller.say(speech(400))
                caller.say(silence(500))
                caller.until("mark")
                caller.until("mark")
                caller.echo("t1-s1")
                caller.echo("t1-s2")
                wait_for(lambda: served.agent.records)
                caller.hang_up()
        spans = found.spans()  # the agent stopped: every span flushed
    by_name = {s["name"]: s for s in spans}
    assert {"voice_llm.call", "invoke_agent", "speech_to_text", "chat", "text_to_speech"} <= set(by_name)
    turn = by_name["invoke_agent"]
    assert len({s["trace_id"] for s in spans}) == 1  # one trace per call
    assert turn["parent"] == by_name["voice_llm.call"]["span_id"]
    assert all(by_name[n]["parent"] == turn["span_id"] for n in ("speech_to_text", "chat", "text_to_speech"))
    a = turn["attributes"]
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.invocation.end_reason"] == "completed"
    assert a["voice_llm.turn.number"] == 1
    record = served.agent.records[0]
    assert a["voice_llm.latency.reported_ms"] == pytest.approx(record["reported_ms"])
    assert a["voice_llm.breakdown.stt_ms"] == pytest.approx(record["breakdown"]["stt"])
    events = turn["events"]
    # the reported number is rounded to 0.1 ms; the events are the exact bounds
    assert events["first_audio_sent"] - events["vad_speech_end"] == pytest.approx(record["reported_ms"] * 1e6, abs=1e5)
    assert turn["start"] == events["vad_speech_end"] and turn["end"] >= events["first_audio_sent"]


def test_shutdown_mid_reply_leaves_no_thread_and_ends_the_turn_as_session_closed() -> None:
    slow = answer(["Sure, I can help ", "you with that. "] + ["More. "] * 40, 0.05)
    with FakeServer(slow) as fake, serving(settings(fake.url)) as served:
        ws = dial(served.url).__enter__()
        caller = TwilioCaller(ws)
        caller.begin()
        caller.say(speech(400))
        caller.say(silence(500))
        caller.until("media")
    # the block's exit stopped the agent as SIGTERM does: the call closed, the turn thread joined
    assert served.agent.records and served.agent.records[0]["end_reason"] == "session_closed"
    assert agent_threads() == []
    with pytest.raises(ConnectionClosed):
        for _ in range(1000):
            ws.recv(timeout=5)
    ws.close()


def test_a_taken_port_and_a_dead_llm_server_are_one_clear_error() -> None:
    with FakeServer(answer(REPLY)) as fake, serving(settings(fake.url)) as served:
        port = int(served.url.rsplit(":", 1)[1].strip("/"))
        with pytest.raises(AgentError, match=f"cannot listen on 127.0.0.1:{port}"):
            with serving(settings(fake.url, port=port)):
                pass
    with pytest.raises(AgentError, match="does not answer"):
        with serving(settings(f"http://127.0.0.1:{free_port()}", prime=True)):
            pass
    assert agent_threads() == []


def test_two_calls_at_once_each_keep_their_own_turns_and_history() -> None:
    replies = [answer(["Alpha reply. "]), answer(["Beta reply. "]), answer(["Second turn. "])]
    with FakeServer(replies) as fake, serving(settings(fake.url, max_calls=2)) as served:
        with dial(served.url) as one, dial(served.url) as two:
            a, b = TwilioCaller(one), TwilioCaller(two)
            a.begin()
            b.begin()
            a.say(speech(400))
            b.say(speech(400))
            a.say(silence(500))
            a.until("mark")
            b.say(silence(500))
            b.until("mark")
            a.echo("t1-s1")
            b.echo("t1-s1")
            wait_for(lambda: len(served.agent.records) == 2)
            a.say(speech(400))  # call one's second turn
            a.say(silence(500))
            a.until("mark")
            wait_for(lambda: len(fake.requests) == 3)
        first_reply = next(r["reply"] for r in served.agent.records if r["call"] == 1 and r["number"] == 1)
        history = fake.requests[2].json["messages"]
        assistant = [m["content"] for m in history if m["role"] == "assistant"]
        assert assistant == [first_reply.strip()]  # call one's own reply only, not call two's
        assert {r["call"] for r in served.agent.records} == {1, 2}
        assert served.agent.refused == 0


def test_a_caller_that_echoes_no_marks_is_not_barged_in_long_after_the_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "MARK_SLACK_S", 0.05)  # the rule, not its second of slack
    with FakeServer([answer(["Okay."]), answer(["Again."])]) as fake, serving(settings(fake.url)) as served:
        with dial(served.url) as ws:
            caller = TwilioCaller(ws)
            caller.begin()
            caller.say(speech(400))
            caller.say(silence(500))
            caller.until("mark")  # never echoed
            time.sleep(len("Okay.") * MS_PER_CHAR / 1000 + server.MARK_SLACK_S + 0.1)
            caller.say(speech(400))
            caller.say(silence(500))
            caller.until("mark")
        assert [r["end_reason"] for r in served.agent.records][:1] == ["completed"]
        assert not any(m["event"] == "clear" for m in caller.received)


def test_the_first_piece_of_a_reply_loses_its_lead_in_silence_but_not_the_pauses_later() -> None:
    tts = ToneTTS(lead_ms=60)
    with FakeServer(answer(REPLY)) as fake, serving(settings(fake.url), fake_engines(tts)) as served:
        with dial(served.url) as ws:
            caller = TwilioCaller(ws)
            caller.begin()
            caller.say(speech(400))
            caller.say(silence(500))
            caller.until("mark")
            caller.until("mark")
    frames = [wire.mulaw_decode(base64.b64decode(m["media"]["payload"])) for m in caller.received
              if m["event"] == "media"]
    audio = np.concatenate(frames).astype(np.int32)
    loud = np.flatnonzero(np.abs(audio) > 100)
    assert loud[0] <= 10 * 8 + 8  # 10 ms kept (80 samples at 8 kHz), give or take the resampler's filter
    first = len("Sure, I can help you with that.") * MS_PER_CHAR * 8
    quiet = np.flatnonzero(np.diff(loud) > 5 * 8)  # a silence over 5 ms: between the two sentences
    assert len(quiet) == 1
    pause_ms = (loud[quiet[0] + 1] - loud[quiet[0]]) / 8
    assert abs(loud[quiet[0]] - loud[0] - first) <= 16  # the first sentence whole
    assert 60 <= pause_ms <= 60 + 20 + 2  # the second keeps its 60 ms lead-in (and the first's last frame's padding)


def test_an_empty_reply_is_said_as_the_servers_not_the_engines(capsys: pytest.CaptureFixture[str]) -> None:
    """The server streams no text: the turn makes no sound, nobody hears it, and the agent's log says why in the speak
    step's words (moved from converse's reply: an empty server answer is not the TTS failing)."""
    with FakeServer([answer([]), answer(["Okay."])]) as fake, serving(settings(fake.url)) as served:
        with dial(served.url) as ws:
            caller = TwilioCaller(ws)
            caller.begin()
            caller.say(speech(400))
            caller.say(silence(500))
            err: list[str] = []
            wait_for(lambda: err.append(capsys.readouterr().err) or "empty reply" in "".join(err))
            assert not [m for m in caller.received if m["event"] == "media"]  # nothing was sent for it
            caller.say(speech(400))  # the call goes on: the next line is answered
            caller.say(silence(500))
            assert caller.until("mark")["event"] == "mark"
            caller.hang_up()
    err.append(capsys.readouterr().err)
    said = [line for line in "".join(err).splitlines() if "empty reply" in line]
    assert said == ["voice-llm agent: call 1: turn attempt 1 failed: the server sent an empty reply: the reply has "
                    "no text to speak"], said
    assert "Traceback" not in "".join(err)
    assert agent_threads() == []


def test_a_caller_reconnecting_as_a_call_hangs_up_is_served_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 item 16: a caller connecting within ~50 ms of an agent-side 1007 close was refused 1013 "at its
    limit", the closed call still counted while it hung up. The hang-up is held 1.5 s here (a busy machine joining a
    turn thread; within the agent's HANG_UP_WAIT_S): the new caller waits for that slot and is served."""
    slow = server.Call._hang_up

    async def slow_hang_up(self: server.Call) -> None:
        await asyncio.sleep(1.5)
        await slow(self)

    monkeypatch.setattr(server.Call, "_hang_up", slow_hang_up)
    with FakeServer(answer(REPLY)) as fake, serving(settings(fake.url, max_calls=1)) as served:
        with dial(served.url) as ws:
            ws.send("this is not json")
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
        assert served.agent.calls  # still hanging up
        with dial(served.url) as ws:
            caller = TwilioCaller(ws)
            caller.begin()
            caller.say(speech(400))
            caller.say(silence(500))
            assert caller.until("media")["event"] == "media"
        assert served.agent.refused == 0


@pytest.mark.parametrize(("total_slots", "max_calls", "primed"), [(3, 8, [0, 1, 2]), (4, 2, [0, 1]), (None, 4, [None])])
def test_the_system_prompt_is_primed_in_every_slot_a_call_may_take(total_slots: int | None, max_calls: int,
                                                                   primed: list[int | None]) -> None:
    """Before the first call, the system prompt in each of the server's slots (llama-server's /props total_slots,
    each by id_slot), no more than the calls served at once; a server that says no slots gets one request with no
    id_slot. A cold slot cost a call's first turn 5.5 s under load --dial (Agent._prime says why)."""
    props = Reply.json(200, {"total_slots": total_slots} if total_slots else {"default_generation_settings": {}})
    with FakeServer([props, answer(["Hi."])], script_props=True) as fake:
        agent = server.Agent(settings(fake.url, prime=True, max_calls=max_calls, docs=1), fake_engines())
        agent.prepare()
        chats = [r for r in fake.requests if r.path.endswith("/chat/completions")]
    assert sorted((r.json.get("id_slot") for r in chats), key=lambda s: -1 if s is None else s) == primed
    assert all(r.json["messages"][0]["role"] == "system" and r.json["max_tokens"] == 1 for r in chats)
    assert agent.primed_slots == len(primed) and agent.ready()["engines"]["llm"]["primed_slots"] == len(primed)
