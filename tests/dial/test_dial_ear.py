"""The ear's measurement truths (issue 41 items 1-3): a turn the agent talks over has no gap and stays out of the
headline; a barged-in reply's heard silence is its last sound before the next reply (a reply that resumes is not
silent); the heard floor is taken over the frames that carried received audio, and a sound lasts at least a frame.
Real calls on a real WebSocket against the fake agent (tests/dial/fakeagent.py), each a few seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from dialhelpers import context, tones
from fakeagent import FakeAgent, Reply

from voice_llm.analysis.keynumbers import Headline, headline
from voice_llm.dial import checks
from voice_llm.dial.step import DialOptions, dial_step
from voice_llm.util.artifacts import read_json


def options(**extra: object) -> DialOptions:
    values = dict(stt="none", lead_ms=100.0, think_ms=60.0, reply_end_ms=200.0, barge_in_turns=(),
                  barge_in_after_ms=300.0, deadline_s=10.0)
    values.update(extra)
    return DialOptions(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def talked_over(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PCM line (no clear): the caller cuts into reply 1 (1.5 s, sent at once) with a 200 ms line 2, so reply 1
    is still playing when line 2 ends: turn 2 is talked over."""
    out = tmp_path_factory.mktemp("talked")
    with FakeAgent([Reply(100, 1500), Reply(100, 300)], protocol="pcm", rate=16000) as agent:
        dial_step(context(out), options(protocol="pcm", barge_in_turns=(1,)), agent.url,
                  caller=tones(2, rate=16000))
    return out


def test_a_talked_over_turn_has_no_gap_and_says_why(talked_over):
    doc = read_json(talked_over / "dial.json")
    turn = doc["turns"][1]
    assert turn["heard"]["talked_over"] is True and turn["heard"]["gap_ms"] is None
    assert turn["heard"]["first_sound_ms"] is not None  # the audio across the end is still stated where it is
    assert "talked over" in doc["unknown"]["turns[1].heard.gap_ms"]
    assert doc["turns"][0]["heard"]["talked_over"] is False and doc["turns"][0]["heard"]["gap_ms"] > 100
    summary = doc["summary"]["heard_gap_ms"]
    assert summary["n"] == 1 and summary["talked_over"] == 1
    assert summary["median"] == doc["turns"][0]["heard"]["gap_ms"]
    assert "talked_over_rule" in doc["settings"]


def test_the_checks_remeasure_the_talked_over_turn(talked_over):
    for check in (checks.check_values, checks.check_heard_gaps, checks.check_summary):
        check(talked_over)
    doc = read_json(talked_over / "dial.json")
    doc["turns"][1]["heard"]["talked_over"] = False  # an edit the recording refutes
    (talked_over / "edited").mkdir()
    with pytest.raises(checks.CheckFailed, match="talked_over"):
        _edited(talked_over, doc, checks.check_heard_gaps)


def _edited(out: Path, doc: dict, check) -> None:
    import json
    import shutil

    copy = out / "edited" / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("edited"))
    (copy / "dial.json").write_text(json.dumps(doc))
    check(copy)


def test_the_headline_counts_the_talked_over_turns(talked_over):
    found = headline(talked_over)
    assert found.talked_over == 1 and found.turns == 1
    assert "1 turn talked over" in found.sentence()
    assert "talked over" not in Headline("dial.json", 900.0, 950.0, turns=4, talked_over=0).sentence()


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PCM line (no clear): reply 1 is 500 ms of sound, 300 ms of silence, 500 ms of sound, sent at once; the
    caller cuts into it 300 ms after it is first heard with a 1.2 s line 2, which is still speaking when the reply
    resumes and ends."""
    out = tmp_path_factory.mktemp("resumed")
    with FakeAgent([Reply(100, 1000), Reply(100, 300)], protocol="pcm", rate=16000, mode="gap_inside",
                   pause_ms=300.0) as agent:
        dial_step(context(out), options(protocol="pcm", barge_in_turns=(1,)), agent.url,
                  caller=tones(2, ms=1200.0, rate=16000))
    return out


def test_a_resumed_reply_is_silent_only_after_its_last_sound(resumed):
    doc = read_json(resumed / "dial.json")
    first = doc["turns"][0]["heard"]["first_sound_ms"]
    barge = doc["turns"][0]["barge_in"]
    # the pause inside the reply is passed over, and listed: the silence is after the resumed half
    assert barge["resumed_ms"] == [[pytest.approx(first + 500.0, abs=1.0), pytest.approx(first + 800.0, abs=1.0)]]
    assert barge["heard_silent_ms"] == pytest.approx(first + 1300.0, abs=1.0)
    assert barge["heard_after_onset_ms"] == pytest.approx(first + 1300.0 - barge["onset_ms"], abs=0.01)
    assert doc["turns"][0]["heard"]["last_sound_ms"] == pytest.approx(first + 1300.0, abs=1.0)
    # the resumed half played inside line 2 is the barged-in reply's, not a cut-off of line 2
    assert doc["turns"][1]["cut_off"] is False
    assert "barge_silence_rule" in doc["settings"]


def test_the_checks_remeasure_the_resumed_reply(resumed):
    for check in (checks.check_barge_in, checks.check_heard_gaps, checks.check_values, checks.check_summary):
        check(resumed)
    assert checks.check_cut_offs(resumed).startswith("no cut-off")
    doc = read_json(resumed / "dial.json")
    doc["turns"][0]["barge_in"]["resumed_ms"] = []
    (resumed / "edited").mkdir(exist_ok=True)
    with pytest.raises(checks.CheckFailed, match="resumed_ms"):
        _edited(resumed, doc, checks.check_barge_in)

