"""Cut-offs (issue 29 item 5, issue 28's "no cut-off on the pause line"): the agent heard inside the caller's own
speech span, a planned mid-sentence pause included. measure_turns on recordings built here (numpy arrays: the tick
grid is ours, so times are asserted to the sample), check_cut_offs on the contract's folder (tests/dial/dialfolder.py)
and on tampered copies, and a real call against the fake agent on a real WebSocket that answers into the caller's
pause after a known delay (what is asserted is measured inside that call: its arrivals and its frames)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dataclasses import replace

from dialfolder import FS, build, doc_of, read_stereo, sample, save_doc, stereo_wav, tone, with_turn
from dialhelpers import a_log, context, measured, tone_line
from fakeagent import FakeAgent, Reply

from voice_llm.core.checks import core
from voice_llm.core.checks.base import FAIL, FINDING, PASS, CheckResult
from voice_llm.capabilities.dial import CAPABILITY as DIAL_CAPABILITY
from voice_llm.capabilities.dial.caller_lines import CallerLine, join_parts, on_line, quiet_run
from voice_llm.capabilities.dial.doc import CutOff, DialDoc
from voice_llm.capabilities.dial.measure import CUT_OFF_RULE, caller_sound
from voice_llm.capabilities.dial.step import Caller, DialOptions, _Unknown, dial_step, options_value
from voice_llm.core.errors import ConfigError
from voice_llm.engines.line import wire
from voice_llm.core.run.folder import RunFolder
from voice_llm.engines.speech_in.caller_audio import SAMPLE_RATE, Utterance
from voice_llm.core.util.artifacts import read_json

DIAL_CHECKS = tuple(c for c in DIAL_CAPABILITY.checks if c.step == "dial")
RATE = wire.TWILIO_RATE
FRAME = 160  # samples in a 20 ms frame at 8 kHz


def results(out: Path) -> dict[str, CheckResult]:
    folder = RunFolder(out)
    return {c.function.rsplit(":", 1)[1]: core._result(c, folder) for c in DIAL_CHECKS}


def failed(out: Path) -> dict[str, str]:
    return {name: r.detail for name, r in results(out).items() if r.status == FAIL}


def paused_line(index: int, before_ms: float, pause_ms: float, after_ms: float) -> CallerLine:
    """A tone line with a pause of digital silence inside it (40 ms lead), as a pause line goes on the line."""
    square = lambda n: np.where((np.arange(n) // 16) % 2 == 0, 8000, -8000).astype(np.int16)  # noqa: E731
    samples = np.concatenate([np.zeros(320, np.int16), square(int(before_ms * 8)), np.zeros(int(pause_ms * 8), np.int16),
                              square(int(after_ms * 8))])
    samples = wire.decode(wire.twilio_line(), wire.encode(wire.twilio_line(), samples))
    floor, (start, end) = caller_sound(samples, RATE, FRAME)  # the dialer's rule
    pause = (320 + int(before_ms * 8), 320 + int((before_ms + pause_ms) * 8))
    return CallerLine(index, f"paused {index}", samples, RATE, "test tone", None, floor, start, end, (pause,))


# --- measure_turns on built recordings --------------------------------------------------------------------------


def test_a_reply_heard_in_the_callers_pause_is_a_cut_off() -> None:
    line = paused_line(1, 800, 600, 900)
    right = np.zeros(RATE * 5, np.int16)
    start = 25 * FRAME + line.pauses[0][0] + 2400  # 300 ms into the pause
    right[start:start + 800] = tone(100, 6000, 500)
    rows, unknown = measured(a_log([line], [25], right))
    row = rows[0]
    assert row["cut_off"] is True and "turns[0].cut_off" not in unknown
    end_ms = row["caller"]["speech_end_ms"]
    assert row["cut_off_at"] == {"t_ms": start / 8, "caller_speech_left_ms": end_ms - start / 8}
    assert row["caller"]["pauses_ms"] == [[(25 * FRAME + a) / 8, (25 * FRAME + b) / 8] for a, b in line.pauses]
    assert row["heard"]["first_sound_ms"] is None  # nothing after the line's end: the cut-off is not its reply


def test_nothing_inside_the_line_is_no_cut_off_and_a_reply_after_it_is_not_one() -> None:
    line = paused_line(1, 800, 600, 900)
    right = np.zeros(RATE * 5, np.int16)
    after = 25 * FRAME + line.end  # the first sample after the speech end: the reply, not a cut-off
    right[after:after + 800] = tone(100, 6000, 500)
    rows, unknown = measured(a_log([line], [25], right))
    assert rows[0]["cut_off"] is False and rows[0]["cut_off_at"] is None and not any("cut_off" in k for k in unknown)
    assert rows[0]["heard"]["gap_ms"] == 0.0


def test_the_reply_a_planned_barge_in_cuts_into_is_not_a_cut_off() -> None:
    """Turn 1 barged in on: line 2 starts while reply 1 plays; reply 1 heard under line 2 until its heard silence
    is the barge-in, not a cut-off. A new sound inside line 2 after that silence is one."""
    one, two = tone_line(1, 400, RATE), tone_line(2, 1500, RATE)
    right = np.zeros(RATE * 6, np.int16)
    reply = 30 * FRAME  # reply 1 from 600 ms, on for 1.5 s: line 2 starts at 1000 ms (its speech at 1040 ms)
    right[reply:reply + 12000] = tone(1500, 6000, 500)
    rows, unknown = measured(a_log([one, two], [5, 50], right, barged=(1,)))
    silent = rows[0]["barge_in"]["heard_silent_ms"]
    assert silent == (reply + 12000) / 8 and rows[0]["barge_in"]["onset_ms"] < silent
    assert rows[1]["cut_off"] is False and rows[1]["cut_off_at"] is None and "turns[1].cut_off" not in unknown
    # the same, with a new sound in line 2 after the barged-in reply was cleared (audio after a clear is new)
    again = reply + 12000 + 3200  # 400 ms after it went silent, line 2 still speaking (till 2540 ms)
    right[again:again + 400] = tone(50, 6000, 700)
    log = a_log([one, two], [5, 50], right, barged=(1,))
    log.events = [{"t_ms": (reply + 12000) / 8 - 5.0, "dir": "down", "event": "clear", "dropped_ms": 0.0}]
    rows, _ = measured(log)
    assert rows[1]["cut_off_at"]["t_ms"] == again / 8 and rows[1]["cut_off"] is True
    assert rows[0]["barge_in"]["resumed_ms"] == []
    # without a clear the sound after the pause, before line 2's end, is the same reply resumed
    # (BARGE_SILENCE_RULE): its heard silence is after it, and it is no cut-off of line 2
    right[again + 200:again + 400] = 0  # 25 ms of it, ending before line 2 does
    rows, _ = measured(a_log([one, two], [5, 50], right, barged=(1,)))
    assert rows[0]["barge_in"]["resumed_ms"] == [[(reply + 12000) / 8, again / 8]]
    assert rows[0]["barge_in"]["heard_silent_ms"] == (again + 200) / 8
    assert rows[1]["cut_off"] is False


def test_a_barged_in_reply_that_never_goes_silent_cannot_show_a_cut_off() -> None:
    one, two = tone_line(1, 400, RATE), tone_line(2, 600, RATE)
    right = np.zeros(RATE * 3, np.int16)
    right[30 * FRAME:] = tone(3000, 6000, 500)[:len(right) - 30 * FRAME]  # plays to the end of the recording
    rows, unknown = measured(a_log([one, two], [5, 50], right, barged=(1,)))
    assert rows[1]["cut_off"] is None and rows[1]["cut_off_at"] is None
    assert "never went silent" in unknown["turns[1].cut_off"]


def test_the_summary_counts_known_turns_and_says_which_cannot_show_it() -> None:
    from voice_llm.capabilities.dial.step import cut_offs

    unknown = _Unknown()
    assert cut_offs([{"index": 1, "cut_off": True}, {"index": 2, "cut_off": None}], unknown) == 1
    assert "turn(s) 2 cannot show a cut-off" in unknown.reasons["summary.cut_offs"]
    assert cut_offs([{"index": 1, "cut_off": None}], _Unknown()) is None  # never a zero for nothing measured
    assert cut_offs([{"index": 1, "cut_off": False}], _Unknown()) == 0


# --- the pause line's making --------------------------------------------------------------------------------------


def test_parts_are_joined_by_exactly_the_pause_with_their_quiet_edges_trimmed() -> None:
    a = np.concatenate([np.zeros(800, np.int16), np.full(1600, 3000, np.int16), np.zeros(1200, np.int16)])
    b = np.concatenate([np.zeros(640, np.int16), np.full(800, -3000, np.int16), np.zeros(300, np.int16)])
    joined, pauses = join_parts([a, b], 600.0)
    assert pauses == [(2400, 2400 + 9600)]  # the first part's lead kept, its tail and the second's lead trimmed
    assert np.all(joined[2400:12000] == 0) and joined[2399] == 3000 and joined[12000] == -3000
    assert len(joined) == 2400 + 9600 + 800 + 300
    # on the line (8 kHz mu-law), the pause is the silent run it became
    utter = Utterance(1, "a b", np.concatenate([np.zeros(4800, np.int16), joined]), "synthesized", None, 100, 4800,
                      4800 + len(joined) - 300)
    line = on_line(utter, wire.twilio_line(), [(4800 + a_, 4800 + b_) for a_, b_ in pauses])
    (start, end), = line.pauses
    assert abs(start - (4800 + 2400) // 2) <= 8 and abs(end - (4800 + 12000) // 2) <= 8
    assert np.all(np.abs(line.samples[start:end].astype(np.int32)) <= line.floor)
    assert quiet_run(line.samples, line.floor, 0) == (0, line.start)


def test_the_pause_lines_flag() -> None:
    assert options_value({"command": "dial", "url": "ws://x/", "caller_lines": "pause"}).caller_lines == "pause"
    assert options_value({"command": "dial", "url": "ws://x/"}).caller_lines == "clinic"
    with pytest.raises(ConfigError, match="one or the other"):
        DialOptions(caller_lines="pause", caller_audio=Path("/tmp"))
    with pytest.raises(ConfigError, match="--caller-lines must be"):
        DialOptions(caller_lines="nope")


# --- check_cut_offs on the contract's folder ------------------------------------------------------------------------


@pytest.fixture()
def call(tmp_path: Path) -> Path:
    return build(tmp_path / "run")


def test_no_cut_off_passes_and_the_barge_in_line_is_not_one(call: Path) -> None:
    """dialfolder's turn 4 barges in on reply 3: reply 3 plays under line 4 until the clear, no cut-off."""
    found = results(call)["check_cut_offs"]
    assert found.status == PASS and "no cut-off" in found.detail and "4 turn(s)" in found.detail


def _sound_in_turn_2(call: Path) -> float:
    """A 100 ms burst on the heard channel 300 ms into turn 2's speech: the agent talking over the caller."""
    at = sample(doc_of(call).turns[1].caller.speech_start_ms + 300.0)
    left, right = read_stereo(call / "dial" / "call.wav")
    right[at:at + 800] = tone(100, 6000, 650.0)
    (call / "dial" / "call.wav").write_bytes(stereo_wav(left, right))
    return at / 8.0


def _cut_off(doc: DialDoc, position: int, t: float | None, counted: int | None = 1) -> DialDoc:
    """``doc`` stating a cut-off at ``t`` ms in the turn at ``position`` (None: cut_off true without where), the
    summary counting ``counted``."""
    turn = doc.turns[position]
    at = None if t is None else CutOff(t_ms=t, caller_speech_left_ms=turn.caller.speech_end_ms - t)
    assert doc.summary is not None
    return with_turn(replace(doc, summary=replace(doc.summary, cut_offs=counted)), position,
                     replace(turn, cut_off=True, cut_off_at=at))


def test_a_cut_off_on_the_files_and_in_dial_json_is_a_finding(call: Path) -> None:
    t = _sound_in_turn_2(call)
    doc = doc_of(call)
    end = doc.turns[1].caller.speech_end_ms
    save_doc(call, _cut_off(doc, 1, t))
    found = results(call)
    assert found["check_cut_offs"].status == FINDING, found["check_cut_offs"].detail
    assert f"turn 2: the agent heard at {t:.0f} ms, {end - t:.0f} ms before the caller's speech end" in \
        found["check_cut_offs"].detail
    assert "check_cut_offs" not in failed(call)


def test_a_cut_off_dial_json_leaves_out_fails(call: Path) -> None:
    _sound_in_turn_2(call)
    assert "no cut-off in dial.json, call.wav's heard channel sounds at" in failed(call)["check_cut_offs"]


def _summary_cut_offs(doc: DialDoc, counted: int) -> DialDoc:
    assert doc.summary is not None
    return replace(doc, summary=replace(doc.summary, cut_offs=counted))


@pytest.mark.parametrize("tamper, said", [
    (lambda d: _cut_off(d, 0, d.turns[0].caller.speech_start_ms + 100.0, counted=0),
     "heard channel is silent within a frame of it"),
    (lambda d: _cut_off(d, 0, None, counted=0), "cut_off True but cut_off_at None"),
    (lambda d: _summary_cut_offs(d, 2), "summary.cut_offs 2, the turns count 0"),
    (lambda d: with_turn(d, 3, replace(d.turns[3], cut_off=None)),
     "cut_off is null, but call.wav shows the caller's span"),
])
def test_a_tampered_cut_off_fails(call: Path, tamper, said: str) -> None:
    save_doc(call, tamper(doc_of(call)))
    assert said in failed(call)["check_cut_offs"]


def test_the_barge_in_reply_stated_as_a_cut_off_fails(call: Path) -> None:
    """Turn 4's line starts under reply 3: calling that reply a cut-off is what the rule excludes."""
    doc = doc_of(call)
    save_doc(call, _cut_off(doc, 3, doc.turns[3].caller.speech_start_ms))
    assert "outside the caller's span" in failed(call)["check_cut_offs"]


def test_an_older_dial_json_without_cut_offs_is_not_checkable(call: Path) -> None:
    doc = doc_of(call)  # the keys absent from the file, as in a dial.json from before cut-offs were counted
    older = tuple(replace(t, cut_off=None, cut_off_at=None, absent=t.absent | {"cut_off", "cut_off_at"})
                  for t in doc.turns)
    save_doc(call, replace(doc, turns=older))
    assert results(call)["check_cut_offs"].label == "N/C"


# --- a real call: the fake agent answers into the caller's pause --------------------------------------------------


def test_the_fake_agent_answering_into_the_pause_is_a_cut_off(tmp_path: Path) -> None:
    """Line 1 is 600 ms of tone, a 600 ms pause, 500 ms of tone; line 2 a plain tone. The agent's endpoint is
    150 ms of silence: it answers line 1's first half 250 ms after the last loud frame it received, into the pause
    (a 150 ms burst that has played before the caller resumes), then each line after its end. What the caller heard
    in the pause is the cut-off, at the burst's arrival + the phone's 40 ms jitter delay (rounded up to the tick);
    line 2, answered after it ended, is none."""
    lines = (paused_line(1, 600, 600, 500), tone_line(2, 400, RATE))
    caller = Caller(lines, None, "test tones", "clinic")
    options = DialOptions(stt="none", lead_ms=100.0, think_ms=60.0, reply_end_ms=300.0, barge_in_turns=(),
                          deadline_s=10.0)
    with FakeAgent([Reply(250, 150, "m1"), Reply(200, 300, "m2"), Reply(200, 300, "m3")], endpoint_ms=150) as agent:
        dial_step(context(tmp_path), options, agent.url, caller=caller)
    doc = read_json(tmp_path / "dial.json")
    assert [s.turn for s in agent.sent][:1] == [1] and not agent.clears
    one, two = doc["turns"]
    assert one["cut_off"] is True and two["cut_off"] is False and doc["summary"]["cut_offs"] == 1
    pause = one["caller"]["pauses_ms"][0]
    t = one["cut_off_at"]["t_ms"]
    assert pause[0] < t < pause[1]
    assert one["cut_off_at"]["caller_speech_left_ms"] == pytest.approx(one["caller"]["speech_end_ms"] - t, abs=1e-3)
    # heard where the dialer's own clock says it arrived: its first media + the 40 ms jitter delay, within a frame
    # (playout starts at the first tick whose pop comes at or after that moment; the recording places a tick's
    # frame at its nominal start, which a late tick popped later: its lateness, measured in the call, is slack)
    arrived = next(e["t_ms"] for e in map(__import__("json").loads, (tmp_path / "dial" / "events.jsonl").read_text()
                                          .splitlines()) if e.get("dir") == "down" and e.get("event") == "media")
    assert abs(t - (arrived + 40.0)) <= 20.0 + 3.0 + doc["playout"]["max_late_ms"], (t, arrived)
    # ... and where the agent's own delay puts it: the last loud frame's tick + the delay + the jitter
    last_loud_tick = (lines[0].pauses[0][0] - 1) // FRAME * 20.0 + one["caller"]["offset_ms"]
    assert t >= last_loud_tick + agent.sent[0].delay_ms + 40.0 - 20.0
    assert doc["settings"]["cut_off_rule"] == CUT_OFF_RULE
    found = results(tmp_path)
    assert found["check_cut_offs"].status == FINDING and "inside its planned pause" in found["check_cut_offs"].detail
    assert not failed(tmp_path), failed(tmp_path)


# --- the pause lines, spoken by Piper ---------------------------------------------------------------------------


@pytest.mark.slow
def test_the_pause_lines_are_one_sentence_with_a_planned_pause() -> None:
    """--caller-lines pause with the real Piper voice: line 1 is the whole sentence as one turn, silent for the
    planned pause (on the line: the run under the floor, at least PAUSE_MS, a few ms more where the voice's edges
    fade under the floor) inside its speech span; line 2 has none; no barge-in planned."""
    from voice_llm.capabilities.dial.caller_lines import PAUSE_LINES, PAUSE_MS
    from voice_llm.capabilities.dial.step import caller_lines

    caller = caller_lines(DialOptions(caller_lines="pause"))
    one, two = caller.lines
    assert one.script == " ".join(PAUSE_LINES[0]) and two.script == PAUSE_LINES[1][0]
    (start, end), = one.pauses
    assert one.start < start < end < one.end and not two.pauses
    assert PAUSE_MS - 1 <= (end - start) * 1000 / one.rate <= PAUSE_MS + 60
    assert caller.barge_in_turns == () and caller.as_dict()["pause_ms"] == PAUSE_MS
    assert caller.as_dict()["pauses_ms"] == [[[start / 8, end / 8]], []]
