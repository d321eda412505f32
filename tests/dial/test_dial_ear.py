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
