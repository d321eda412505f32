"""The ear's measurement truths (issue 41 items 1-3): a turn the agent talks over has no gap and stays out of the
headline; a barged-in reply's heard silence is its last sound before the next reply (a reply that resumes is not
silent); the heard floor is taken over the frames that carried received audio, and a sound lasts at least a frame.
Real calls on a real WebSocket against the fake agent (tests/dial/fakeagent.py), each a few seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dialhelpers import a_log, context, measured, tone_line, tones
from fakeagent import FakeAgent, Reply
from truth import dialled

from voice_llm.core.analysis.keynumbers import Headline, headline
from voice_llm.capabilities.dial import checks
from voice_llm.capabilities.dial.caller_lines import on_line
from voice_llm.capabilities.dial.measure import heard_channel
from voice_llm.capabilities.dial.step import DialOptions, dial_step
from voice_llm.engines.line import wire
from voice_llm.engines.speech_in import caller_audio as speech_caller
from voice_llm.core.util.artifacts import read_json


def options(**extra: object) -> DialOptions:
    values = dict(stt="none", lead_ms=100.0, think_ms=60.0, reply_end_ms=200.0, barge_in_turns=(),
                  barge_in_after_ms=300.0, deadline_s=10.0)
    values.update(extra)
    return DialOptions(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def talked_over(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PCM line (no clear): the caller cuts into reply 1 (1.5 s, sent at once) with a 200 ms line 2, so reply 1
    is still playing when line 2 ends: turn 2 is talked over."""
    def attempt(_: int) -> Path:
        out = tmp_path_factory.mktemp("talked")
        with FakeAgent([Reply(100, 1500), Reply(100, 300)], protocol="pcm", rate=16000) as agent:
            dial_step(context(out), options(protocol="pcm", barge_in_turns=(1,)), agent.url,
                      caller=tones(2, rate=16000))
        return out

    # turn 1's gap is measured, unless a loaded machine's late tick nulled it: then the call is dialled again
    return dialled(attempt, lambda out: read_json(out / "dial.json"))


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



# --- item 3: the floor over the audio carried, a sound a frame long at least (both channels) --------------------

RATE8 = wire.TWILIO_RATE
FRAME = wire.twilio_line().frame_samples  # 160


def _square(n: int, amplitude: int = 6000) -> np.ndarray:
    return np.where((np.arange(n) // 10) % 2 == 0, amplitude, -amplitude).astype(np.int16)


def _played(log, *stretches: tuple[int, int | None]) -> None:
    """The playout buffer's events: it played received audio from frame a through frame b (None: to the end)."""
    for a, b in stretches:
        log.events.append({"t_ms": a * 20.0 + 0.2, "event": "playout_start", "frame": a})
        if b is not None:
            log.events.append({"t_ms": b * 20.0 + 0.2, "event": "playout_idle", "frame": b})


def test_comfort_noise_the_agent_sends_is_not_its_reply():
    """The agent sends comfort noise (+-150, -47 dBFS) from frame 20 on, its reply 800 ms after the caller's end.
    The digital zero before any audio arrived held the floor at 100: the noise counted as the reply (a 0 ms gap).
    The floor over the frames that carried received audio sits above the noise."""
    line = tone_line(1, 400, RATE8)
    right = np.zeros(RATE8 * 4, np.int16)
    noise = np.random.default_rng(7).integers(-150, 151, len(right) - 20 * FRAME).astype(np.int16)
    right[20 * FRAME:] = noise
    end = 5 * FRAME + line.end
    reply = end + 6400  # 800 ms later
    right[reply:reply + 4000] = _square(4000)
    log = a_log([line], [5], right)
    _played(log, (20, None))
    rows, unknown = measured(log)
    assert rows[0]["heard"]["first_sound_ms"] == reply / 8 and rows[0]["heard"]["gap_ms"] == 800.0
    assert rows[0]["heard"]["talked_over"] is False
    assert heard_channel(right, RATE8, log.events, FRAME, 20.0).floor > 150


def test_one_click_does_not_start_the_reply():
    """A single loud sample 100 ms after the caller's end, the reply 500 ms after it: the reply's gap is 500 ms."""
    line = tone_line(1, 400, RATE8)
    right = np.zeros(RATE8 * 4, np.int16)
    end = 5 * FRAME + line.end
    right[end + 800] = 3000  # a click, 1 sample
    reply = end + 4000
    right[reply:reply + 4000] = _square(4000)
    log = a_log([line], [5], right)
    _played(log, ((end + 800) // FRAME, (end + 800) // FRAME), (reply // FRAME, (reply + 4000) // FRAME))
    rows, _ = measured(log)
    assert rows[0]["heard"]["gap_ms"] == 500.0


def test_the_caller_channel_takes_the_same_rule():
    """A caller's own recording with background noise (+-200) and a click before its speech: the floor is over its
    audio (not the lead-in's digital zero), so the speech is the tone's, not the noise's or the click's."""
    rng = np.random.default_rng(3)
    noise = lambda n: rng.integers(-200, 201, n).astype(np.int16)  # noqa: E731
    tone = np.where((np.arange(4800) // 32) % 2 == 0, 8000, -8000).astype(np.int16)  # 300 ms at 16 kHz
    before = noise(8000)
    before[2000] = 12000  # a click 125 ms in
    speech = np.concatenate([before, tone, noise(8000)])
    utterance = speech_caller.utterance(1, None, speech, "a noisy recording", None, "test")
    line = on_line(utterance, wire.twilio_line())
    lead = speech_caller.lead_samples(RATE8)
    assert line.floor > 200
    assert abs(line.start - (lead + 4000)) <= 8 and abs(line.end - (lead + 4000 + 2400)) <= 8


def test_the_dial_report_says_how_many_turns_were_talked_over(talked_over):
    from voice_llm.capabilities.dial.doc import DialDoc
    from voice_llm.capabilities.dial.report import summary_sentence

    assert "1 turn talked over, left out" in summary_sentence(DialDoc.parse(read_json(talked_over / "dial.json")))


def test_a_dialing_load_caller_counts_the_talked_over_turn_apart_and_goes_on(talked_over):
    """load --dial: a talked-over turn is no timed turn (no heard gap) and the call's later turns still count."""
    from voice_llm.capabilities.load.dialing import CallId, PhaseClock, _turn_samples

    doc = read_json(talked_over / "dial.json")
    doc["turns"].append({**doc["turns"][0], "index": 3})  # a third turn after it, heard as turn 1 was
    from voice_llm.capabilities.dial.doc import DialDoc

    samples = _turn_samples(DialDoc.parse(doc), CallId("w1", "c1", 1, 0.0), PhaseClock(), None)
    assert [s["heard_gap_ms"] for s in samples] == [doc["turns"][0]["heard"]["gap_ms"], None,
                                                     doc["turns"][0]["heard"]["gap_ms"]]
    assert samples[1]["error"].startswith("talked over")


def test_the_barge_in_schedule_is_judged_as_the_caller_judged_it_live(tmp_path):
    """While calling, the caller counts to its barge-in from the first frame above FLOOR_MIN (the heard floor over
    the audio received is known only after the call): the measured first sound may come later (a click, comfort
    noise or a quiet onset under the final floor before it). Here dial.json's first sound of the barged-in reply
    is 60 ms after the first loud frame on the recording: the line still started on the caller's live count, no
    broken schedule. 30 ms from either is one."""
    from dialfolder import Plan, build, load, save

    out = build(tmp_path / "run", Plan())
    doc = load(out)
    doc["turns"][2]["heard"]["first_sound_ms"] += 60.0
    save(out, doc)
    assert checks.check_schedule(out)
    doc["turns"][3]["caller"]["speech_start_ms"] += 30.0  # 30 ms from either count: broken
    save(out, doc)
    with pytest.raises(checks.CheckFailed, match="barge-in line's speech starts"):
        checks.check_schedule(out)
