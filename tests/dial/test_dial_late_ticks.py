"""Issue 41 item 5: a late playout tick was only a finding, and its frame was written at its nominal place, so a turn
whose speech end or first heard sound fell near it got a gap the caller never had. The dialer now logs each tick
that starts more than a frame late (events.jsonl `late_tick`), and a turn near one has no gap (null with its
reason, counted apart: measure.LATE_TICK_RULE); `voice-llm check` applies the same rule to the event log.

The late tick is made as a busy machine makes one: the dialer's own loop is held (a blocking sleep in the tick that
sends the frame holding the caller's speech end of line 1), so the next tick starts ~2.5 frames late."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from dialhelpers import context, tones
from fakeagent import FakeAgent, Reply
from truth import check_holds, dialled

from voice_llm.capabilities.dial import checks
from voice_llm.capabilities.dial.call import _Call
from voice_llm.capabilities.dial.measure import late_tick_frames, near_late_tick
from voice_llm.capabilities.dial.step import DialOptions, dial_step
from voice_llm.core.util.artifacts import read_json

FRAME = 160  # samples, 20 ms at 8 kHz
HOLD_S = 0.05  # 2.5 frames: the next tick starts more than a frame late


def test_the_rule_looks_at_both_ends_of_the_gap() -> None:
    # speech ends inside frame 9 (samples 1440..1599): frame 9 leaves at tick 10, so ticks 9..11 are near it
    end, first = 1500, 4000  # first sound in frame 25; with 2 jitter frames, ticks 22..25 are near it
    for k in (9, 10, 11, 22, 23, 24, 25):
        assert near_late_tick({k}, end, first, FRAME, 2), k
    for k in (8, 12, 21, 26):
        assert not near_late_tick({k}, end, first, FRAME, 2), k
    assert not near_late_tick(set(), end, first, FRAME, 2)
    assert late_tick_frames([{"event": "late_tick", "frame": 7, "late_ms": 31.0}, {"event": "media", "frame": 8},
                             {"event": "late_tick", "frame": True}]) == {7}


@pytest.fixture(scope="module")
def late(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the second turn's gap is measured, unless the machine's own late ticks nulled it too: then dialled again
    return dialled(lambda _: held_call(tmp_path_factory.mktemp("late")), lambda out: read_json(out / "dial.json"))


def held_call(out: Path) -> Path:
    original = _Call.send_captured

    async def held(self: _Call) -> None:
        if self.captured is not None and self.turn is not None and self.turn.index == 1:
            line = self.lines[0]
            holding_end = (self.turn.offset_tick * self.frame_samples + line.end - 1) // self.frame_samples
            if self.captured[0] == holding_end:
                time.sleep(HOLD_S)  # the loop held, as a busy machine holds it
        await original(self)

    options = DialOptions(stt="none", lead_ms=100.0, think_ms=60.0, reply_end_ms=200.0, barge_in_turns=(),
                          deadline_s=10.0)
    with pytest.MonkeyPatch.context() as patch, FakeAgent([Reply(150, 300), Reply(150, 300)]) as agent:
        patch.setattr(_Call, "send_captured", held)
        dial_step(context(out), options, agent.url, caller=tones(2))
    return out


def test_a_turn_near_a_late_tick_has_no_gap_and_says_why(late: Path) -> None:
    doc = read_json(late / "dial.json")
    rows = [json.loads(line) for line in (late / "dial" / "events.jsonl").read_text().splitlines()]
    logged = [row for row in rows if row.get("event") == "late_tick"]
    assert logged and len(logged) == doc["playout"]["late_frames"]
    assert all(row["late_ms"] > 20.0 for row in logged)
    first, second = doc["turns"]
    assert first["heard"]["late_tick"] is True and first["heard"]["gap_ms"] is None
    assert first["heard"]["first_sound_ms"] is not None  # where it sounds is still stated
    assert "late tick" in doc["unknown"]["turns[0].heard.gap_ms"]
    summary = doc["summary"]["heard_gap_ms"]
    assert summary["late_tick"] >= 1 and summary["n"] == 2 - summary["late_tick"]
    if second["heard"]["late_tick"] is False:  # the second turn (no tick held) keeps its gap
        assert second["heard"]["gap_ms"] > 150 and summary["median"] == second["heard"]["gap_ms"]
    assert "late_tick_rule" in doc["settings"]
    from voice_llm.capabilities.dial.doc import DialDoc
    from voice_llm.capabilities.dial.report import summary_sentence

    assert "near a late tick" in summary_sentence(DialDoc.parse(doc))


def test_check_applies_the_same_rule_and_refutes_an_edit(late: Path) -> None:
    for check in (checks.check_values, checks.check_heard_gaps, checks.check_summary, checks.check_uplink,
                  checks.check_event_order):
        check_holds(check, late)
    doc = read_json(late / "dial.json")
    turn = doc["turns"][0]
    turn["heard"]["late_tick"] = False  # an edit the event log refutes: the turn's gap made to count
    turn["heard"]["gap_ms"] = round(turn["heard"]["first_sound_ms"] - turn["caller"]["speech_end_ms"], 3)
    copy = late.parent / "edited"
    shutil.copytree(late, copy)
    (copy / "dial.json").write_text(json.dumps(doc))
    with pytest.raises(checks.CheckFailed, match="late_tick"):
        checks.check_heard_gaps(copy)


def test_a_late_tick_the_log_leaves_out_fails(late: Path) -> None:
    rows = [json.loads(line) for line in (late / "dial" / "events.jsonl").read_text().splitlines()]
    copy = late.parent / "unlogged"
    shutil.copytree(late, copy)
    kept = [row for row in rows if row.get("event") != "late_tick"]
    (copy / "dial" / "events.jsonl").write_text("".join(json.dumps(row) + "\n" for row in kept))
    with pytest.raises(checks.CheckFailed, match="late ticks in the event log"):
        checks.check_uplink(copy)
