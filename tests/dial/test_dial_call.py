"""voice-llm as the caller against a fake agent on a real WebSocket: what was heard at the caller's ear equals what
the agent did, within one frame (20 ms), on the dialer's own clock.

One call serves the relations (module fixture, about 3 s of real time): 3 tone lines; the agent answers each after
a known delay with a known burst sent all at once, a mark after it; the caller cuts into reply 2 with line 3 and
the agent clears. Each leg of a turn is measured from the side that did it (tests/truth.py): on a loaded
machine the loopback, the agent's loop and the dialer's receive path add real milliseconds the caller really
hears, and the dialer's late ticks null a gap (LATE_TICK_RULE); neither is the dialer measuring wrong.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
from dialhelpers import context, tones
from fakeagent import FakeAgent, Reply

from truth import (EPS_MS, FRAME_MS, JITTER_MS, assert_heard_as_it_happened, dialled, measured_turns, receiving,
                   slack)

from voice_llm.capabilities.dial.step import DialOptions, dial_step
from voice_llm.core.util.artifacts import read_json

REPLIES = [Reply(150, 400, "m1"), Reply(200, 1200, "m2"), Reply(120, 300, "m3")]
__all__ = ["EPS_MS", "FRAME_MS", "JITTER_MS", "fast_options", "slack"]  # what the other dial tests take from here


def fast_options(**extra: object) -> DialOptions:
    values = dict(stt="none", lead_ms=100.0, think_ms=60.0, reply_end_ms=200.0, barge_in_turns=(2,),
                  barge_in_after_ms=300.0, deadline_s=10.0)
    values.update(extra)
    return DialOptions(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def call(tmp_path_factory: pytest.TempPathFactory):  # (dial.json, the agent, the folder, the receive path's log)
    def attempt(_: int):
        out = tmp_path_factory.mktemp("dial")
        with FakeAgent(REPLIES) as agent, receiving() as received:
            dial_step(context(out), fast_options(), agent.url, caller=tones(3))
        return read_json(out / "dial.json"), agent, out, received.read(out)

    return dialled(attempt, lambda result: result[0])


def test_heard_gaps_are_the_agents_delays_plus_the_jitter_buffer(call):
    doc, agent, _, received = call
    assert [s.turn for s in agent.sent] == [1, 2, 3]
    measured = measured_turns(doc, after_barge_in=True)
    for index in measured:
        turn, sent = doc["turns"][index], agent.sent[index]
        # The agent answered `delay` after the caller's last loud frame arrived; that frame was sent when its audio
        # had been captured (at the end of the frame holding the speech end: never before it), and the phone's ear
        # adds the jitter delay rounded up to the next frame: so heard gap = delay + jitter within one frame, and
        # never less (issue 41 item 4: a frame sent at its start made gaps up to a frame short of a real phone's),
        # plus each way's transit and the agent's lateness in hearing the line's end, as both sides logged them
        leg = assert_heard_as_it_happened(doc, turn, sent, received)
        assert leg.ahead == JITTER_MS and leg.onset == 0.0, leg  # a burst at an idle buffer: the jitter delay
        assert sent.delay_ms >= REPLIES[index].delay_ms  # the agent's own lateness is in its delay, never less
    assert doc["summary"]["heard_gap_ms"]["n"] == len(measured)


def test_a_burst_sent_at_once_is_heard_over_its_real_length(call):
    doc, agent, _, _ = call
    for index in (0, 2):  # replies 1 and 3 played to their end
        heard = doc["turns"][index]["heard"]
        length = heard["last_sound_ms"] - heard["first_sound_ms"]
        assert abs(length - REPLIES[index].burst_ms) <= 1.0, (index, length)
    assert agent.sent[0].messages == 40  # 400 ms in 10 ms chunks, all sent back to back


def test_heard_silence_within_one_frame_of_the_clear(call):
    doc, agent, _, _ = call
    barge = doc["turns"][1]["barge_in"]
    assert len(agent.clears) == 1 and barge["cleared_ms"] is not None
    assert barge["onset_ms"] <= barge["cleared_ms"]
    assert abs(barge["heard_silent_ms"] - barge["cleared_ms"]) <= FRAME_MS + slack(doc), barge
    assert barge["heard_after_onset_ms"] == pytest.approx(barge["heard_silent_ms"] - barge["onset_ms"], abs=0.01)
    # the 1.2 s burst was cut: it was heard far less than its length
    heard = doc["turns"][1]["heard"]
    assert heard["last_sound_ms"] - heard["first_sound_ms"] < REPLIES[1].burst_ms - 500
    assert doc["playout"]["clears"] == 1 and doc["playout"]["cleared_ms"] > 500


def test_marks_are_echoed_after_their_audio_played(call):
    doc, agent, out, _ = call
    events = [read for read in (out / "dial" / "events.jsonl").read_text().splitlines()]
    import json

    rows = [json.loads(line) for line in events]
    up_marks = {row["name"]: row for row in rows if row.get("dir") == "up" and row["event"] == "mark"}
    assert set(up_marks) == {"m1", "m2", "m3"} and sorted(agent.marks_back) == ["m1", "m2", "m3"]
    for name, index in (("m1", 0), ("m3", 2)):
        mark, heard = up_marks[name], doc["turns"][index]["heard"]
        # echoed in the tick that played the audio's last frame: not before the audio ended, not a frame after it
        assert heard["last_sound_ms"] - EPS_MS <= mark["t_ms"] <= heard["last_sound_ms"] + FRAME_MS + slack(doc)
        assert mark["t_ms"] >= mark["queued_ms"] + mark["audio_before_ms"] - FRAME_MS
    # m2's audio was cleared: echoed at the clear, long before its audio could have played
    clear = next(row for row in rows if row.get("event") == "clear")
    assert clear["t_ms"] <= up_marks["m2"]["t_ms"] <= clear["t_ms"] + FRAME_MS + slack(doc)
    assert up_marks["m2"]["t_ms"] < doc["turns"][1]["heard"]["first_sound_ms"] + REPLIES[1].burst_ms - 500


def test_uplink_is_twilio_media_streams_in_real_time(call):
    doc, agent, out, _ = call
    import json

    rows = [json.loads(line) for line in (out / "dial" / "events.jsonl").read_text().splitlines()]
    assert agent.received[:2] == ["connected", "start"] and agent.received[-1] == "stop"
    media = [row for row in rows if row.get("dir") == "up" and row["event"] == "media"]
    seqs = [row["seq"] for row in rows if row.get("dir") == "up" and "seq" in row]
    assert seqs == list(range(1, len(seqs) + 1))  # every message after `connected` counts
    assert [row["chunk"] for row in media] == list(range(1, len(media) + 1))
    assert [row["timestamp"] for row in media] == [20 * i for i in range(len(media))]
    times = [row["t_ms"] for row in rows]
    assert times == sorted(times)
    assert doc["playout"]["frames"] == len(media)


def test_an_uplink_frame_leaves_when_its_audio_has_been_captured(call):
    """Issue 41 item 4: frame k holds the caller's audio of [k, k+1) frames; a phone sends it once that audio was
    spoken, at tick k + 1, never at tick k's start (a frame early: every gap and barge-in time came out up to 20 ms
    short). The last frame leaves at the hang-up, after its audio, before the stop."""
    doc, agent, out, _ = call
    import json

    rows = [json.loads(line) for line in (out / "dial" / "events.jsonl").read_text().splitlines()]
    media = [row for row in rows if row.get("dir") == "up" and row["event"] == "media"]
    for row in media:
        frame = row["timestamp"] / FRAME_MS
        assert row["t_ms"] >= (frame + 1) * FRAME_MS - 0.5, row
    assert len(media) == doc["playout"]["frames"]
    stop = next(row for row in rows if row.get("event") == "stop")
    assert media[-1]["t_ms"] >= doc["playout"]["frames"] * FRAME_MS - 0.5 and stop["t_ms"] >= media[-1]["t_ms"]


def test_recording_is_the_call_as_it_happened(call):
    doc, _, out, _ = call
    with wave.open(str(out / "dial" / "call.wav"), "rb") as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getsampwidth()) == (2, 8000, 2)
        frames = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").reshape(-1, 2)
    assert len(frames) == doc["playout"]["frames"] * 160
    # the caller channel is the caller WAVs at their offsets, sample for sample
    for turn in doc["turns"]:
        with wave.open(str(out / turn["caller_wav"]), "rb") as wav:
            line = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
        start = int(turn["caller"]["offset_ms"] * 8)
        assert (frames[start:start + len(line), 0] == line).all()
    # the heard channel's first sound after line 1 is where dial.json says
    first = doc["turns"][0]["heard"]["first_sound_ms"]
    right = np.abs(frames[:, 1].astype(np.int32)) > doc["floor"]["heard"]
    after = int(doc["turns"][0]["caller"]["speech_end_ms"] * 8)
    assert (np.flatnonzero(right[after:])[0] + after) / 8 == pytest.approx(first, abs=0.2)
    assert not list((out / "dial").glob(".call-live-*"))


def test_the_dialer_keeps_up_and_says_what_it_costs(call):
    doc, _, _, _ = call
    cost = doc["dialer_cost_ms"]
    assert cost["frames"] == doc["playout"]["frames"] and cost["median"] is not None
    assert cost["median"] <= cost["p90"] <= cost["max"]
    assert doc["playout"]["late_frames"] >= 0 and "late_frames" in doc["playout"]
    assert doc["agent"]["headers"].get("server", "").startswith("Python/")
    assert doc["unknown"]["agent_reported"].startswith("the agent sent no traces")


def test_the_caller_barges_in_after_the_set_time(call):
    doc, _, _, _ = call
    first = doc["turns"][1]["heard"]["first_sound_ms"]
    assert abs(doc["turns"][1]["barge_in"]["onset_ms"] - (first + 300.0)) <= FRAME_MS


def test_a_pcm_line_at_16k(tmp_path):
    """Binary 16-bit frames both ways at 16 kHz: 320 samples a frame, no marks, no clear; the same ear."""
    with FakeAgent([Reply(120, 300)], protocol="pcm", rate=16000) as agent, receiving() as received:
        dial_step(context(tmp_path), fast_options(protocol="pcm", barge_in_turns=()), agent.url,
                  caller=tones(1, rate=16000))
    doc = read_json(tmp_path / "dial.json")
    received.read(tmp_path)
    assert (doc["line"]["protocol"], doc["line"]["codec"], doc["line"]["rate"]) == (
        "pcm", "pcm16", 16000)
    turn, sent = doc["turns"][0], agent.sent[0]
    if measured_turns(doc, at_least=0):  # its one turn, unless a late tick nulled it (with its reason)
        assert_heard_as_it_happened(doc, turn, sent, received)
    assert turn["heard"]["last_sound_ms"] - turn["heard"]["first_sound_ms"] == pytest.approx(300.0, abs=1.0)
    with wave.open(str(tmp_path / "dial" / "call.wav"), "rb") as wav:
        assert wav.getframerate() == 16000 and wav.getnframes() == doc["playout"]["frames"] * 320
    import json

    rows = [json.loads(line) for line in (tmp_path / "dial" / "events.jsonl").read_text().splitlines()]
    media = [row for row in rows if row.get("dir") == "up" and row["event"] == "media"]
    assert [row["frame"] for row in media] == list(range(len(media))) and "seq" not in media[0]
    assert agent.received == []  # no JSON on a PCM line


def test_the_agents_own_spans_beside_what_was_heard(tmp_path):
    """--otlp: the agent's invoke_agent span per turn is matched to the turn; heard minus reported is the line
    (the jitter buffer within a frame: the agent reports exactly its delay)."""
    from voice_llm.capabilities.dial.step import Tracing

    def attempt(number: int):
        out = tmp_path / f"call-{number}"
        tracing = Tracing("127.0.0.1:0")
        with FakeAgent([Reply(150, 300), Reply(200, 300)], otlp=tracing.endpoint) as agent, receiving() as received:
            dial_step(context(out), fast_options(barge_in_turns=()), agent.url, caller=tones(2), tracing=tracing)
        return read_json(out / "dial.json"), agent, out, received.read(out)

    doc, agent, out, received = dialled(attempt, lambda result: result[0])
    assert doc["otlp"]["bodies"] == 2 and doc["otlp"]["clock"] == "common" and not doc["otlp"]["refused"]
    for turn, sent in zip(doc["turns"], agent.sent):
        assert turn["agent_reported"]["latency_ms"] == pytest.approx(sent.delay_ms, abs=0.01)
    measured = measured_turns(doc)  # a turn near a late tick has no heard gap, so nothing to put beside it
    for index in measured:
        turn, sent = doc["turns"][index], agent.sent[index]
        line = turn["heard_minus_reported_ms"]
        assert line == pytest.approx(turn["heard"]["gap_ms"] - turn["agent_reported"]["latency_ms"], abs=0.01)
        # the line's share is what the agent does not count: the jitter delay, and each way's transit as logged
        leg = assert_heard_as_it_happened(doc, turn, sent, received)
        assert abs(line - (leg.heard_by_agent + leg.down + JITTER_MS)) <= FRAME_MS + slack(doc), (line, leg)
    assert doc["summary"]["heard_minus_reported_ms"]["n"] == len(measured) and "agent_reported" not in doc["unknown"]
    assert sorted(doc["files"]["otlp"]) == ["dial/otlp/" + name for name in doc["otlp"]["files"]]
    assert all((out / name).is_file() for name in doc["files"]["otlp"])


def test_a_flood_of_otlp_bodies_keeps_a_bounded_number_of_files(tmp_path):
    """Issue 41 item 15: 18,630 small OTLP bodies became 18,630 files. A call keeps CALL_LIMITS.bodies (1024) bodies,
    one file each; the rest are refused and counted (dial.json's otlp.refused_bodies, 10 lines), and the checks of
    the call's files hold: files.otlp is what otlp.bodies says."""
    import http.client
    import json

    from voice_llm.core.checks import core
    from voice_llm.core.checks.base import FAIL
    from voice_llm.capabilities.dial import CAPABILITY as DIAL_CAPABILITY
    from voice_llm.capabilities.dial.otlp import CALL_LIMITS
    from voice_llm.capabilities.dial.step import Tracing
    from voice_llm.core.run.folder import RunFolder

    tracing = Tracing("127.0.0.1:0")
    host, port = tracing.receiver.address
    connection = http.client.HTTPConnection(host, port, timeout=10)
    flood = CALL_LIMITS.bodies + 100
    for n in range(flood):  # on one keep-alive connection, as an exporter sends
        body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": "%032x" % 7, "spanId": "%016x" % (n + 1), "name": "stray"}]}]}]}).encode()
        connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/json"})
        connection.getresponse().read()
    connection.close()
    with FakeAgent([Reply(150, 300)], otlp=tracing.endpoint) as agent:
        dial_step(context(tmp_path), fast_options(barge_in_turns=()), agent.url, caller=tones(1), tracing=tracing)
    doc = read_json(tmp_path / "dial.json")
    block = doc["otlp"]
    assert block["bodies"] == CALL_LIMITS.bodies == len(doc["files"]["otlp"]) == len(list((tmp_path / "dial" /
                                                                                          "otlp").iterdir()))
    assert block["received"] == flood + 1 and block["refused_bodies"] == 101 and len(block["refused"]) == 10
    assert "1024 bodies kept already" in block["refused"][0]
    assert doc["turns"][0]["agent_reported"] is None  # its body came when the receiver was full: not reported
    checks = [c for c in DIAL_CAPABILITY.checks if c.step == "dial" and c.function.rsplit(":", 1)[1] in
              ("check_values", "check_agent_reported", "check_summary", "check_files")]
    folder = RunFolder(tmp_path)
    failed = {c.function: r.detail for c in checks if (r := core._result(c, folder)).status == FAIL}
    assert len(checks) == 4 and not failed, failed


@pytest.mark.parametrize("bad", ["NaN", -5.0])
def test_a_bad_reported_number_is_refused_and_counted(tmp_path, bad, monkeypatch):
    """A foreign agent's NaN (or Inf, or negative) reported latency is refused at the receiver and counted in
    otlp.refused_values: that turn is not reported (its reason in unknown), the others are; dial.json stays strict
    JSON, and no check relation FAILs for the agent's bad number."""
    import functools
    import json

    from voice_llm.core.checks import core
    from voice_llm.core.checks.base import FAIL
    from voice_llm.capabilities.dial import CAPABILITY as DIAL_CAPABILITY
    from voice_llm.capabilities.dial import step
    from voice_llm.capabilities.dial.step import Tracing
    from voice_llm.core.run.folder import RunFolder

    # The refused turn never reports, so the dialer waits out its cap for the hang-up's export (10 s, step._settle)
    # after a call whose every body was sent during it (the fake exports at each reply, before its mark): 3 s here
    # (the test took 12.7 s, 10 of them that wait)
    monkeypatch.setattr(step, "_settle", functools.partial(step._settle, cap_s=3.0))

    tracing = Tracing("127.0.0.1:0")
    with FakeAgent([Reply(150, 300), Reply(200, 300)], otlp=tracing.endpoint, reported={1: bad}) as agent:
        dial_step(context(tmp_path), fast_options(barge_in_turns=()), agent.url, caller=tones(2), tracing=tracing)
    text = (tmp_path / "dial.json").read_text()
    doc = json.loads(text, parse_constant=lambda name: pytest.fail(f"dial.json holds {name}: not JSON"))
    json.dumps(doc, allow_nan=False)
    assert doc["otlp"]["refused_values"] == 1 and doc["otlp"]["bodies"] == 2 and not doc["otlp"]["refused"]
    first, second = doc["turns"]
    assert first["agent_reported"] is None and first["heard_minus_reported_ms"] is None
    assert second["agent_reported"]["latency_ms"] == pytest.approx(agent.sent[1].delay_ms, abs=0.01)
    assert "refused" in doc["unknown"]["agent_reported"]
    checks = [c for c in DIAL_CAPABILITY.checks if c.step == "dial" and c.function.rsplit(":", 1)[1] in
              ("check_values", "check_agent_reported", "check_summary", "check_files")]
    folder = RunFolder(tmp_path)
    failed = {c.function: r.detail for c in checks if (r := core._result(c, folder)).status == FAIL}
    assert len(checks) == 4 and not failed, failed


def test_a_mark_name_the_agent_reuses_is_echoed_per_sending(tmp_path):
    """An agent that names every mark the same: each sending is queued and echoed on its own (first in, first
    out per name), with its own queued time and audio ahead; the check re-derives the same from the files."""
    import json

    from voice_llm.core.checks import core
    from voice_llm.core.checks.base import PASS
    from voice_llm.capabilities.dial import CAPABILITY as DIAL_CAPABILITY
    from voice_llm.core.run.folder import RunFolder

    with FakeAgent([Reply(150, 400, "dup"), Reply(200, 400, "dup")], mode="mark_halves") as agent:
        dial_step(context(tmp_path), fast_options(barge_in_turns=()), agent.url, caller=tones(2))
    doc = read_json(tmp_path / "dial.json")
    rows = [json.loads(line) for line in (tmp_path / "dial" / "events.jsonl").read_text().splitlines()]
    down = [row for row in rows if row.get("dir") == "down" and row["event"] == "mark"]
    up = [row for row in rows if row.get("dir") == "up" and row["event"] == "mark"]
    assert [row["name"] for row in up] == ["dup"] * 4 and agent.marks_back == ["dup"] * 4
    for sent, echoed in zip(down, up):  # each echo answers its own sending: its queued time, its audio ahead
        assert echoed["queued_ms"] == sent["t_ms"], (sent, echoed)  # the arrival's one stamp
        assert echoed["t_ms"] >= echoed["queued_ms"] + echoed["audio_before_ms"] - FRAME_MS
    halves = [up[1]["audio_before_ms"] - up[0]["audio_before_ms"], up[3]["audio_before_ms"] - up[2]["audio_before_ms"]]
    assert all(half == pytest.approx(200.0, abs=FRAME_MS) for half in halves), up  # the second half ahead of it
    assert doc["playout"]["marks_returned"] == 4
    (marks,) = [c for c in DIAL_CAPABILITY.checks if c.step == "dial" and c.function.endswith(":check_marks")]
    result = core._result(marks, RunFolder(tmp_path))
    assert result.status == PASS, result.detail


def test_the_think_pause_scales_with_the_reply_heard(tmp_path):
    """--think-share (load --dial's callers): after the reply-end silence the caller waits think_ms plus the share of
    the reply as heard (first to last sound), so the next line starts that much later, within a frame of ticks."""
    out = tmp_path / "think"
    with FakeAgent([Reply(100, 800, "m1"), Reply(100, 200, "m2")]) as agent:
        dial_step(context(out), fast_options(barge_in_turns=(), think_ms=0.0, think_share=0.5), agent.url,
                  caller=tones(2))
    doc = read_json(out / "dial.json")
    assert doc["settings"]["think_share"] == 0.5
    first, second = doc["turns"]
    heard_ms = first["heard"]["last_sound_ms"] - first["heard"]["first_sound_ms"]
    wait = second["caller"]["offset_ms"] - first["heard"]["last_sound_ms"]
    expected = doc["settings"]["reply_end_ms"] + 0.5 * heard_ms  # 200 + ~400 ms
    # the live decision reads the floor's minimum frame by frame, the re-measure its samples: two frames apart at most
    assert abs(wait - expected) <= 3 * FRAME_MS + slack(doc), (wait, expected, heard_ms)


def test_the_think_pause_never_outlasts_the_deadline(tmp_path):
    """Every wait counts against --deadline: a think share however large (the pause scales with the heard reply)
    is held to the deadline, so the caller speaks its next line and the call ends."""
    out = tmp_path / "think"
    with FakeAgent([Reply(100, 400, "m1"), Reply(100, 200, "m2")]) as agent:
        dial_step(context(out), fast_options(barge_in_turns=(), think_ms=0.0, think_share=1e9, deadline_s=2.0),
                  agent.url, caller=tones(2))
    doc = read_json(out / "dial.json")
    first, second = doc["turns"]
    wait = second["caller"]["offset_ms"] - first["heard"]["last_sound_ms"]
    assert wait <= doc["settings"]["reply_end_ms"] + 2000.0 + 3 * FRAME_MS + slack(doc), wait


def test_the_load_lines_are_short_and_a_call_asks_for_no_more_of_them_than_there_are():
    from voice_llm.capabilities.dial.caller_lines import LOAD_LINES
    from voice_llm.capabilities.dial.step import CALLER_LINES, caller_lines
    from voice_llm.core.errors import ConfigError

    assert "load" in CALLER_LINES and len(LOAD_LINES) == 6
    assert all(len(line.split()) <= 5 for line in LOAD_LINES)  # about a second of speech each (issue 30 item 4)
    with pytest.raises(ConfigError, match="has 6 lines; --turns 7"):
        caller_lines(DialOptions(caller_lines="load", turns=7))  # refused before Piper is loaded


def test_the_collector_leaves_what_was_loaded_alone_during_the_call_only(tmp_path: Path) -> None:
    """The call runs with the heap as it was frozen (call.collector_out_of_the_way: a full collection over the
    dialer's modules is two frames on this machine, a late tick), and the freeze ends with the call."""
    import gc

    from voice_llm.capabilities.dial import call as callmod

    frozen_during: list[int] = []
    with FakeAgent(REPLIES[:1]) as agent:
        callmod.run_call(fast_options(barge_in_turns=()).call_settings(agent.url), tones(1).lines,
                         on_note=lambda note: frozen_during.append(gc.get_freeze_count()))
    assert frozen_during and min(frozen_during) > 1000, frozen_during  # every object the dialer held before it
    assert gc.get_freeze_count() == 0
