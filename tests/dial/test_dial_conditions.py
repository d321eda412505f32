"""Line conditions on the caller's side (issue 29 item 4) against the fake agent on a real WebSocket: --codec on a
pcm line, --loss (seeded, both ways), --echo-db, and false barge-ins counted. Each call is short (one or two tone
lines, replies of a few hundred ms): a couple of seconds of real time. What is asserted is measured inside the
call (the agent's own log of what it received, the recording, the events), never a wall-clock time."""

from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
from dialhelpers import context, tone_line, tones
from fakeagent import FakeAgent, Reply
from truth import dialled

from voice_llm.core.checks import core
from voice_llm.core.checks.base import FAIL, PASS
from voice_llm.capabilities.dial import CAPABILITY as DIAL_CAPABILITY
from voice_llm.capabilities.dial.step import Caller, DialOptions, dial_step
from voice_llm.core.errors import ConfigError
from voice_llm.engines.line import conditions, wire
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util.artifacts import read_json

DIAL_CHECKS = tuple(c for c in DIAL_CAPABILITY.checks if c.step == "dial")


def fast_options(**extra: object) -> DialOptions:
    values = dict(stt="none", lead_ms=100.0, think_ms=60.0, reply_end_ms=200.0, barge_in_turns=(),
                  barge_in_after_ms=300.0, deadline_s=10.0)
    values.update(extra)
    return DialOptions(**values)  # type: ignore[arg-type]


def results(out: Path) -> dict[str, object]:
    folder = RunFolder(out)
    return {c.function.rsplit(":", 1)[1]: core._result(c, folder) for c in DIAL_CHECKS}


def failed(out: Path) -> dict[str, str]:
    return {name: r.detail for name, r in results(out).items() if r.status == FAIL}


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "dial" / "events.jsonl").read_text().splitlines()]


def channels(out: Path) -> tuple[np.ndarray, np.ndarray]:
    with wave.open(str(out / "dial" / "call.wav"), "rb") as wav:
        both = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").reshape(-1, 2)
    return both[:, 0].copy(), both[:, 1].copy()


# --- the options ----------------------------------------------------------------------------------------------


def test_the_codec_belongs_to_a_pcm_line() -> None:
    assert DialOptions(protocol="pcm", codec="mulaw").line_format() == wire.LineFormat("pcm", "mulaw", 16000)
    assert DialOptions(protocol="pcm").line_format().codec == "pcm16"
    assert DialOptions(codec="mulaw").line_format() == wire.twilio_line()
    with pytest.raises(ConfigError, match="Twilio line carries mu-law only"):
        DialOptions(codec="pcm16")
    with pytest.raises(ValueError, match="mu-law only"):
        wire.LineFormat("twilio", "pcm16", 8000)
    for bad in (dict(loss_pct=101.0), dict(loss_pct=-1.0), dict(echo_db=6.0)):
        with pytest.raises(ConfigError):
            DialOptions(**bad)  # type: ignore[arg-type]


# --- a pcm line of mu-law bytes -------------------------------------------------------------------------------


def test_a_pcm_line_of_mulaw_bytes(tmp_path: Path) -> None:
    """--protocol pcm --codec mulaw: one byte a sample in binary frames at the line's rate (160 bytes per 20 ms at
    8 kHz), heard as the agent sent it, less what the line lost (--loss 20 on a pcm line: frames numbered by their
    tick in the events, never sent)."""
    with FakeAgent([Reply(120, 600)], protocol="pcm", rate=8000, codec="mulaw") as agent:
        dial_step(context(tmp_path), fast_options(protocol="pcm", rate=8000, codec="mulaw", loss_pct=20.0, seed=2),
                  agent.url, caller=tones(1))
    doc = read_json(tmp_path / "dial.json")
    assert (doc["line"]["protocol"], doc["line"]["codec"], doc["line"]["rate"]) == ("pcm", "mulaw", 8000)
    log = rows(tmp_path)
    down = [r for r in log if r.get("dir") == "down" and r["event"] == "media"]
    assert down and all(r["bytes"] == r["samples"] == 80 for r in down)  # the fake agent's 10 ms chunks
    up = [r for r in log if r.get("dir") == "up"]
    assert [r["frame"] for r in up] == list(range(len(up))) and doc["line"]["lost_up_frames"] > 0
    assert agent.frames == sum(r["event"] == "media" for r in up) == len(up) - doc["line"]["lost_up_frames"]
    _, right = channels(tmp_path)
    heard = int((np.abs(right.astype(np.int32)) > doc["floor"]["heard"]).sum())
    assert heard / 8.0 == pytest.approx(600.0 - doc["playout"]["lost_ms"], abs=0.2)
    assert not failed(tmp_path)
    assert results(tmp_path)["check_uplink"].status == PASS


# --- loss -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[0.0, 20.0], ids=["loss0", "loss20"])
def lossy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[float, dict, FakeAgent, Path]:
    loss = request.param

    def attempt(_: int) -> tuple[float, dict, FakeAgent, Path]:
        out = tmp_path_factory.mktemp(f"loss{loss:g}")
        with FakeAgent([Reply(120, 400, "m1"), Reply(120, 400, "m2")]) as agent:
            dial_step(context(out), fast_options(loss_pct=loss, seed=7), agent.url, caller=tones(2))
        return loss, read_json(out / "dial.json"), agent, out

    # the laws are checked on a measured turn: a call whose every turn a loaded machine's late tick nulled is dialled
    # again (tests/truth.py)
    return dialled(attempt, lambda result: result[1])


def test_lost_uplink_frames_are_the_seeds_and_never_reach_the_agent(lossy) -> None:
    loss, doc, agent, out = lossy
    up = [r for r in rows(out) if r.get("dir") == "up" and r["event"] in ("media", "lost")]
    expected = conditions.Loss(loss, 7, conditions.UP)
    assert [r["event"] == "lost" for r in up] == [expected.lost(k) for k in range(len(up))]
    lost = [r for r in up if r["event"] == "lost"]
    assert doc["line"]["lost_up_frames"] == len(lost) and doc["line"]["loss_pct"] == loss and doc["line"]["seed"] == 7
    # what the agent received: every frame sent, and the numbers skip exactly at the lost ones
    sent = [(r["seq"], r["chunk"], r["timestamp"]) for r in up if r["event"] == "media"]
    assert agent.media_numbers == sent
    if loss:
        assert 0 < len(lost) < len(up) / 2
        gaps = {c for (_, c, _), (_, d, _) in zip(sent, sent[1:]) for c in range(c + 1, d)}
        assert gaps | {r["chunk"] for r in lost if r["chunk"] > sent[-1][1] or r["chunk"] < sent[0][1]} == \
            {r["chunk"] for r in lost}
    else:
        assert not lost and [c for _, c, _ in sent] == list(range(1, len(sent) + 1))


def test_lost_downlink_audio_is_not_heard(lossy) -> None:
    loss, doc, agent, out = lossy
    log = rows(out)
    down_lost = [r for r in log if r.get("dir") == "down" and r["event"] == "lost"]
    received = sum(r["samples"] for r in log if r.get("dir") == "down" and r["event"] == "media")
    removed = sum(r["samples"] for r in down_lost)
    assert doc["playout"]["lost_ms"] == pytest.approx(removed / 8.0, abs=1e-3)
    assert doc["line"]["lost_down_frames"] == len({r["frame"] for r in down_lost})
    decide = conditions.Loss(loss, 7, conditions.DOWN)
    assert all(decide.lost(r["frame"]) for r in down_lost)  # only the seed's frames, per 20 ms received
    _, right = channels(out)
    heard = int((np.abs(right.astype(np.int32)) > doc["floor"]["heard"]).sum())
    assert heard == received - removed  # every sample of the square waves is loud: heard = what the buffer got
    if loss:
        assert 0 < removed < received
    else:
        assert not down_lost


def test_a_lossy_call_holds_every_law(lossy) -> None:
    _, _, _, out = lossy
    found = results(out)
    assert not {n: r.detail for n, r in found.items() if r.status == FAIL}
    for name in ("check_values", "check_uplink", "check_recording", "check_heard_gaps", "check_event_order",
                 "check_marks"):
        assert found[name].status == PASS, (name, found[name].detail)


@pytest.mark.parametrize("lossy", [20.0], ids=["loss20"], indirect=True)
def test_an_unrecorded_uplink_gap_fails_a_recorded_one_passes(lossy, tmp_path: Path) -> None:
    loss, _, _, real = lossy
    assert loss
    out = Path(shutil.copytree(real, tmp_path / "copy"))
    log = rows(out)
    lost = next(i for i, r in enumerate(log) if r.get("dir") == "up" and r["event"] == "lost")
    assert "but for the" in results(out)["check_uplink"].detail
    # the lost frame's row removed: the gap is still on the wire, but no longer in the log
    (out / "dial" / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for i, r in enumerate(log) if i != lost))
    assert "sequence number" in failed(out)["check_uplink"]
    # a frame that was sent, called lost: the numbers are whole but the count is not the artifact's
    log[lost]["event"] = "media"
    sent = next(i for i, r in enumerate(log) if r.get("dir") == "up" and r["event"] == "media" and i > lost)
    log[sent]["event"] = "lost"
    (out / "dial" / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    assert results(out)["check_uplink"].status == PASS  # a move of the loss is not visible in the log alone...
    doc = read_json(out / "dial.json")
    doc["line"]["loss_pct"] = 0
    (out / "dial.json").write_text(json.dumps(doc))
    assert "without loss" in failed(out)["check_uplink"]  # ... but a loss on a lossless line is


# --- echo -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def echoed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("echo")
    # the agent's speech threshold above the echo (its 6000 square at -20 dB is 600): it must not take its own
    # echo for the caller here (that is the false barge-in test's business)
    with FakeAgent([Reply(120, 400, "m1"), Reply(120, 400, "m2")], loud=1500) as agent:
        dial_step(context(out), fast_options(echo_db=-20.0), agent.url, caller=tones(2))
    assert [s.turn for s in agent.sent] == [1, 2]
    return read_json(out / "dial.json"), out


def test_the_left_channel_holds_the_heard_audio_60_ms_later_attenuated(echoed) -> None:
    doc, out = echoed
    assert (doc["line"]["echo_db"], doc["line"]["echo_delay_ms"]) == (-20.0, 60.0)
    left, right = channels(out)
    first = round(doc["turns"][0]["heard"]["first_sound_ms"] * 8)
    last = round(doc["turns"][0]["heard"]["last_sound_ms"] * 8)
    # during the reply (the caller silent) the left channel is the heard one 480 samples (60 ms) later, / 10,
    # through mu-law once
    echo = left[first + 480:last + 480].astype(np.int32)
    heard = right[first:last].astype(np.int32)
    expected = wire.mulaw_decode(wire.mulaw_encode(np.rint(heard * 0.1).astype(np.int16))).astype(np.int32)
    assert np.array_equal(echo, expected)
    assert 550 <= np.abs(echo).max() <= 650  # 6000 at -20 dB
    assert not left[first:first + 480].any()  # nothing before the echo's delay
    found = results(out)
    assert found["check_recording"].status == PASS and "(the echo)" in found["check_recording"].detail
    assert not {n: r.detail for n, r in found.items() if r.status == FAIL}


def test_a_tampered_echo_fails(echoed, tmp_path: Path) -> None:
    doc, real = echoed
    out = Path(shutil.copytree(real, tmp_path / "copy"))
    left, right = channels(out)
    first = round(doc["turns"][0]["heard"]["first_sound_ms"] * 8)
    left[first + 480 + 100] += 40  # one echo sample louder than the rule gives
    both = np.column_stack((left, right)).astype("<i2")
    with wave.open(str(out / "dial" / "call.wav"), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(8000)
        wav.writeframes(both.tobytes())
    assert "plus the heard channel 60 ms earlier at -20 dB" in failed(out)["check_recording"]
    # the echo stated at another level: the untouched recording does not match it
    out2 = Path(shutil.copytree(real, tmp_path / "copy2"))
    doc2 = read_json(out2 / "dial.json")
    doc2["line"]["echo_db"] = -14.0
    (out2 / "dial.json").write_text(json.dumps(doc2))
    assert "check_recording" in failed(out2)


# --- false barge-ins ------------------------------------------------------------------------------------------


def test_an_agent_that_clears_its_own_reply_is_a_false_barge_in(tmp_path: Path) -> None:
    with FakeAgent([Reply(120, 1000, "m1"), Reply(120, 300, "m2")], mode="self_clear", self_clear_ms=200) as agent:
        dial_step(context(tmp_path), fast_options(), agent.url, caller=tones(2))
    assert len(agent.clears) == 1
    doc = read_json(tmp_path / "dial.json")
    first, second = doc["turns"]
    assert first["false_barge_in"] is True and first["false_barge_in_at"]["kind"] == "clear"
    assert first["false_barge_in_at"]["dropped_ms"] > 0
    assert first["caller"]["speech_end_ms"] < first["false_barge_in_at"]["t_ms"] < second["caller"]["speech_start_ms"]
    assert second["false_barge_in"] is False and second["false_barge_in_at"] is None
    assert doc["summary"]["false_barge_ins"] == 1
    heard = first["heard"]
    assert heard["last_sound_ms"] - heard["first_sound_ms"] < 800  # the 1 s reply was cut
    found = results(tmp_path)
    assert found["check_false_barge_ins"].status == PASS, found["check_false_barge_ins"].detail
    assert not {n: r.detail for n, r in found.items() if r.status == FAIL}
    # hidden: the clear is in the log, the count says none
    first["false_barge_in"], first["false_barge_in_at"] = False, None
    doc["summary"]["false_barge_ins"] = 0
    (tmp_path / "dial.json").write_text(json.dumps(doc))
    assert "counts no false barge-in" in failed(tmp_path)["check_false_barge_ins"]


def test_a_reply_that_stops_and_resumes_without_the_caller_is_a_false_barge_in(tmp_path: Path) -> None:
    with FakeAgent([Reply(120, 400)], mode="pause", pause_ms=350) as agent:
        dial_step(context(tmp_path), fast_options(reply_end_ms=700.0), agent.url, caller=tones(1))
    assert len(agent.sent) == 1
    doc = read_json(tmp_path / "dial.json")
    found = doc["turns"][0]["false_barge_in_at"]
    assert doc["turns"][0]["false_barge_in"] and found["kind"] == "stopped"
    assert found["resumed_ms"] - found["silent_ms"] >= 200.0
    assert doc["summary"]["false_barge_ins"] == 1
    checked = results(tmp_path)
    assert checked["check_false_barge_ins"].status == PASS, checked["check_false_barge_ins"].detail
    found["resumed_ms"] += 100.0  # a resumption the recording does not show
    (tmp_path / "dial.json").write_text(json.dumps(doc))
    assert "resumes at" in failed(tmp_path)["check_false_barge_ins"]


def test_a_pause_inside_the_agents_audio_is_no_false_barge_in(tmp_path: Path) -> None:
    """The same silence at the ear, but inside the audio the agent sent at once (the buffer never ran dry): the
    agent did not stop, so no false barge-in."""
    with FakeAgent([Reply(120, 400)], mode="gap_inside", pause_ms=350) as agent:
        dial_step(context(tmp_path), fast_options(reply_end_ms=700.0), agent.url, caller=tones(1))
    doc = read_json(tmp_path / "dial.json")
    heard = doc["turns"][0]["heard"]
    assert heard["last_sound_ms"] - heard["first_sound_ms"] == pytest.approx(750.0, abs=1.0)  # the pause was heard
    assert doc["turns"][0]["false_barge_in"] is False and doc["summary"]["false_barge_ins"] == 0
    assert results(tmp_path)["check_false_barge_ins"].status == PASS


def test_a_caller_barge_in_is_no_false_barge_in(tmp_path: Path) -> None:
    caller = Caller((tone_line(1, 200, 8000), tone_line(2, 300, 8000)), None, "test tones", "clinic")
    with FakeAgent([Reply(120, 1500, "m1"), Reply(120, 300, "m2")]) as agent:
        dial_step(context(tmp_path), fast_options(barge_in_turns=(1,)), agent.url, caller=caller)
    assert len(agent.clears) == 1  # the agent cleared: the caller talked over it
    doc = read_json(tmp_path / "dial.json")
    assert doc["turns"][0]["barge_in"]["cleared_ms"] is not None
    assert [t["false_barge_in"] for t in doc["turns"]] == [False, False] and doc["summary"]["false_barge_ins"] == 0
    assert results(tmp_path)["check_false_barge_ins"].status == PASS
