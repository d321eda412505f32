"""The dial checks on a call built from docs/line.md's contract (tests/dial/dialfolder.py: stereo 8 kHz call.wav with
the caller's tones on the left and the assistant's on the right at known times, events.jsonl, dial.json built
through voice_llm.capabilities.dial.doc.DialDoc as the dialer builds it), and on tampered copies: each tamper must FAIL the check
that guards it. A tamper that keeps the file's shape is made on the type (``dataclasses.replace``: type-checked, so a
renamed field fails here, tests/dial/test_dial_doc.py); one that breaks the shape on the file itself. No time is
asserted: the numbers are built."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dataclasses import replace

from dialfolder import (FS, Plan, barge_in, build, doc_of, events, heard, load, read_stereo, renumber, sample, save,
                        save_doc, save_events, stereo_wav, summarized, tone, with_turn)

from voice_llm.core.checks import core
from voice_llm.core.checks.base import FAIL, FINDING, NOT_CHECKABLE, PASS, CheckResult
from voice_llm.capabilities.dial import CAPABILITY as DIAL_CAPABILITY
from voice_llm.capabilities.dial import checks
from voice_llm.capabilities.dial.doc import DialDoc, FalseBargeIn
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util.artifacts import dumps_json

DIAL_CHECKS = tuple(c for c in DIAL_CAPABILITY.checks if c.step == "dial")  # listed once, in the capability


def results(out: Path) -> dict[str, CheckResult]:
    folder = RunFolder(out)  # each file read once, as `voice-llm check` does
    return {str(c.function).rsplit(":", 1)[1]: core._result(c, folder) for c in DIAL_CHECKS}


def failed(out: Path) -> dict[str, str]:
    return {name: r.detail for name, r in results(out).items() if r.status == FAIL}


@pytest.fixture()
def call(tmp_path: Path) -> Path:
    return build(tmp_path / "run")


def test_a_consistent_call_passes_every_check(call: Path) -> None:
    found = results(call)
    assert {n: r.detail for n, r in found.items() if r.status != PASS} == {}
    assert "caller channel = the 4 caller WAVs" in found["check_recording"].detail
    assert "turn 3: heard 140 ms after the onset" in found["check_barge_in"].detail


def test_the_recording_measures_the_built_numbers(call: Path) -> None:
    """The re-measurement finds exactly the built times (cosines start and end on a sample)."""
    folder = RunFolder(call)
    doc = folder.artifact(DialDoc)
    found = checks.measure(checks.recording(folder), doc, [len(w) for w in checks.caller_wavs(folder, doc)])
    for turn, seen in zip(doc.turns, found):
        assert seen.speech_end is not None and seen.first_sound is not None and seen.last_sound is not None
        assert seen.speech_end / 8 == turn.caller.speech_end_ms
        assert seen.first_sound / 8 == heard(turn).first_sound_ms
        assert seen.last_sound / 8 == heard(turn).last_sound_ms


# --- tampered copies ------------------------------------------------------------------------------------------


def test_a_changed_gap_fails(call: Path) -> None:
    save_doc(call, _shift_heard(doc_of(call), 1, 100.0))  # consistent on paper: only the recording disagrees
    found = failed(call)
    assert set(found) == {"check_heard_gaps"}, found
    assert "turn 2: first heard sound 8380.0 ms on call.wav, 8480.0 ms in dial.json" in found["check_heard_gaps"] and "more than one sample" in found["check_heard_gaps"]


def _shift_heard(doc: DialDoc, position: int, by: float) -> DialDoc:
    """Move a turn's first heard sound (and its gap) by ``by`` ms in dial.json, the summary kept consistent."""
    turn = doc.turns[position]
    was = heard(turn)
    assert was.first_sound_ms is not None and was.gap_ms is not None and turn.heard_minus_reported_ms is not None
    moved = replace(turn, heard=replace(was, first_sound_ms=was.first_sound_ms + by, gap_ms=was.gap_ms + by),
                    heard_minus_reported_ms=turn.heard_minus_reported_ms + by)
    return summarized(with_turn(doc, position, moved))


def test_a_heard_gap_edited_by_less_than_a_frame_fails(call: Path) -> None:
    """Issue 41 item 6: the re-measure is exact (the same samples), so a 19 ms edit (under the 20 ms frame) is one."""
    save_doc(call, _shift_heard(doc_of(call), 1, 19.0))
    found = failed(call)
    assert "check_heard_gaps" in found, found
    assert "first heard sound 8380.0 ms on call.wav, 8399.0 ms in dial.json" in found["check_heard_gaps"]
    assert "more than one sample (0.125 ms at 8000 Hz) apart" in found["check_heard_gaps"]


def test_a_heard_gap_within_a_sample_passes(call: Path) -> None:
    """A sample's worth (what a stated time may lie between two samples) is no edit."""
    save_doc(call, _shift_heard(doc_of(call), 1, 0.1))
    assert "check_heard_gaps" not in failed(call)


def test_a_barge_in_heard_silence_edited_by_less_than_a_frame_fails(call: Path) -> None:
    save_doc(call, _shift_silence(doc_of(call), 2, 19.0))
    found = failed(call)
    assert "check_barge_in" in found, found
    assert "more than one sample (0.125 ms at 8000 Hz)" in found["check_barge_in"]


def _shift_silence(doc: DialDoc, position: int, by: float, last_sound: bool = False) -> DialDoc:
    """Move a barge-in's heard silence (and its heard-after-onset; ``last_sound``: the reply's last heard sound) by
    ``by`` ms, the summary kept consistent."""
    turn = doc.turns[position]
    was = barge_in(turn)
    assert was.heard_silent_ms is not None and was.heard_after_onset_ms is not None
    moved = replace(turn, barge_in=replace(was, heard_silent_ms=was.heard_silent_ms + by,
                                           heard_after_onset_ms=was.heard_after_onset_ms + by))
    if last_sound:
        last = heard(turn).last_sound_ms
        assert last is not None
        moved = replace(moved, heard=replace(heard(turn), last_sound_ms=last + by))
    return summarized(with_turn(doc, position, moved))


def test_the_re_measure_checks_name_one_sample() -> None:
    names = [c.name for c in DIAL_CHECKS if "re-measured" in c.name]
    assert len(names) == 2 and all(n.endswith("(one sample)") for n in names), names


def test_a_gap_that_is_not_first_sound_minus_speech_end_fails(call: Path) -> None:
    doc = doc_of(call)
    turn = doc.turns[0]
    gap = heard(turn).gap_ms
    assert gap is not None
    save_doc(call, with_turn(doc, 0, replace(turn, heard=replace(heard(turn), gap_ms=gap - 30.0))))
    found = failed(call)
    assert "gap_ms" in found["check_values"] and "check_heard_gaps" in found  # the median (upper middle) is another turn's


def test_a_clear_not_honoured_fails(call: Path) -> None:
    """Audio heard after clear + 1 frame (and before new audio arrived): the buffer was not emptied."""
    cleared = barge_in(doc_of(call).turns[2]).cleared_ms
    assert cleared is not None
    left, right = read_stereo(call / "dial" / "call.wav")
    at = sample(cleared + 20.0) + 8  # one frame and one ms after the clear
    right[at:at + sample(30)] = tone(30, 5000, 400.0)
    (call / "dial" / "call.wav").write_bytes(stereo_wav(left, right))
    found = failed(call)
    assert "check_clears" in found and "still sounds" in found["check_clears"], found
    assert "check_barge_in" in found  # the heard silence moved as well


def test_audio_within_the_frame_after_a_clear_passes(call: Path) -> None:
    """What a real buffer may do: the frame being played when the clear arrived ends (within one frame)."""
    doc = doc_of(call)
    stated = barge_in(doc.turns[2]).heard_silent_ms
    assert stated is not None
    left, right = read_stereo(call / "dial" / "call.wav")
    silent = sample(stated)
    right[silent:silent + sample(5)] = tone(5, 5000, 400.0)  # 5 ms more, ending before clear + 20 ms
    (call / "dial" / "call.wav").write_bytes(stereo_wav(left, right))
    save_doc(call, _shift_silence(doc, 2, 5.0, last_sound=True))
    assert failed(call) == {}


def test_a_mark_echoed_before_its_audio_played_fails(call: Path) -> None:
    rows = events(call)
    i = next(i for i, r in enumerate(rows) if r.get("dir") == "up" and r["event"] == "mark")
    mark = rows.pop(i)
    mark["t_ms"] = mark["queued_ms"] + 1.0  # echoed at once: 700 ms of audio ahead of it had not played
    j = next(j for j, r in enumerate(rows) if r["t_ms"] > mark["t_ms"])
    rows.insert(j, mark)
    renumber(rows)  # the log is in order and numbered: only the echo's time is wrong
    save_events(call, rows)
    found = failed(call)
    assert set(found) == {"check_marks"}, found
    assert "before its audio played out" in found["check_marks"]


def test_a_mark_name_the_agent_reuses_is_matched_per_sending(call: Path) -> None:
    """Twilio marks are matched per sending, first in first out per name (an agent may name every mark "dup"):
    each echo is judged against the sending it answers; an echo more than the sendings of its name still FAILs."""
    rows = events(call)
    for row in rows:
        if row.get("event") == "mark":
            row["name"] = "dup"
    save_events(call, rows)
    assert failed(call) == {}
    assert "8 marks echoed" in results(call)["check_marks"].detail
    downs = [row for row in rows if row.get("event") == "mark" and row["dir"] == "down"]
    downs[1]["name"] = "m2"  # one "dup" fewer sent than echoed (and "m2" never echoed)
    save_events(call, rows)
    assert "mark 'dup' echoed, the agent never sent it" in failed(call)["check_marks"]


def test_a_skipped_sequence_number_fails(call: Path) -> None:
    rows = events(call)
    for row in rows[40:]:
        if "seq" in row:
            row["seq"] += 1
    save_events(call, rows)
    found = failed(call)
    assert set(found) == {"check_uplink"}, found
    assert "sequence number" in found["check_uplink"]


def test_a_skipped_chunk_or_timestamp_fails(call: Path) -> None:
    rows = events(call)
    media = [r for r in rows if r.get("dir") == "up" and r["event"] == "media"]
    media[50]["timestamp"] += 20
    save_events(call, rows)
    assert "timestamp" in failed(call)["check_uplink"]


def test_an_uplink_frame_sent_before_its_audio_ended_fails(call: Path) -> None:
    """Issue 41 item 4: frame k leaves at tick k + 1, when its audio has been spoken; one sent at tick k's start
    (the dialer's old timing: a frame early) fails."""
    rows = events(call)
    media = [r for r in rows if r.get("dir") == "up" and r["event"] == "media"]
    media[50]["t_ms"] = media[50]["timestamp"] + 0.3  # tick 50's start, before the frame's audio of [50, 51)
    save_events(call, rows)
    assert "before its audio ended" in failed(call)["check_uplink"]


def test_events_out_of_order_fail(call: Path) -> None:
    rows = events(call)
    rows[100]["t_ms"] = rows[101]["t_ms"] + 5.0
    save_events(call, rows)
    assert "not in the order they happened" in failed(call)["check_event_order"]


def test_a_shifted_caller_channel_fails(call: Path) -> None:
    left, right = read_stereo(call / "dial" / "call.wav")
    shifted = np.concatenate([np.zeros(80, np.int16), left[:-80]])  # 10 ms later
    (call / "dial" / "call.wav").write_bytes(stereo_wav(shifted, right))
    found = failed(call)
    assert "check_recording" in found and "differs from" in found["check_recording"], found


def test_a_changed_summary_median_fails(call: Path) -> None:
    doc = doc_of(call)
    assert doc.summary is not None and doc.summary.heard_gap_ms is not None
    save_doc(call, replace(doc, summary=replace(doc.summary, heard_gap_ms=replace(doc.summary.heard_gap_ms,
                                                                                  median=9432.0))))
    found = failed(call)
    assert set(found) == {"check_summary"}, found
    assert "summary.heard_gap_ms.median 9432.0" in found["check_summary"]


def test_a_changed_wer_fails(call: Path) -> None:
    doc = doc_of(call)
    turn = doc.turns[1]
    assert turn.wer is not None
    save_doc(call, with_turn(doc, 1, replace(turn, wer=replace(turn.wer, errors=0))))
    found = failed(call)
    assert set(found) == {"check_wer"}, found
    assert "wer 0/5 stated, 1/5" in found["check_wer"]


@pytest.mark.parametrize(("path", "value", "said"), [
    (("line", "jitter_ms"), -40.0, "line.jitter_ms -40.0 is impossible"),
    (("line", "frame_ms"), 0, "line.frame_ms 0"),
    (("line", "rate"), 16000, "line.rate 16000 on a twilio line"),
    (("line", "loss_pct"), 140, "line.loss_pct 140"),
    (("floor", "heard"), 5, "floor.heard 5 is outside"),
    (("settings", "turns"), 0, "settings.turns 0 is impossible"),
    (("playout", "late_frames"), -1, "playout.late_frames -1 is impossible"),
    (("dialer_cost_ms", "median"), 9.0, "dialer_cost_ms median 9.0, p90 0.7"),
    (("t0_epoch_ns",), 0, "t0_epoch_ns 0 is impossible"),
])
def test_impossible_values_fail(call: Path, path: tuple[str, ...], value: object, said: str) -> None:
    doc = load(call)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    save(call, doc)
    found = failed(call)
    assert "check_values" in found and said in found["check_values"], found


@pytest.mark.parametrize(("path", "value", "said"), [
    (("t0_epoch_ns",), True, "dial.json: t0_epoch_ns is True, not a whole number"),
    (("line", "rate"), "8000", "dial.json: line.rate is '8000', not a whole number"),
    (("turns", 1, "heard", "gap_ms"), "x", "dial.json: turns[1].heard.gap_ms is 'x', not a finite number"),
    (("turns", 0, "caller"), None, "dial.json: turns[0].caller is null"),
    (("unknown", "agent_reported"), 3, "dial.json: unknown.agent_reported is 3, not a string"),
])
def test_a_field_of_the_wrong_type_fails_every_check_in_one_line(call: Path, path: tuple[str | int, ...],
                                                                 value: object, said: str) -> None:
    """The file's shape is DialDoc's, read by its one parse: a field of the wrong type is one line naming the file
    and the field, the FAIL of every check (none can read the call), never a check's guess."""
    doc = load(call)
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    save(call, doc)
    found = results(call)
    assert {r.status for r in found.values()} == {FAIL}
    assert {r.detail for r in found.values()} == {f"cannot check: {said}"}


def test_a_negative_breakdown_part_fails(call: Path) -> None:
    doc = doc_of(call)
    turn = doc.turns[0]
    save_doc(call, with_turn(doc, 0, replace(turn, agent_breakdown={**(turn.agent_breakdown or {}), "stt": -5.0})))
    assert "agent_breakdown.stt -5.0 ms is negative" in failed(call)["check_values"]


def test_a_leftover_caller_wav_of_a_longer_call_fails(call: Path) -> None:
    (call / "dial" / "caller-05.wav").write_bytes((call / "dial" / "caller-04.wav").read_bytes())
    found = failed(call)
    assert set(found) == {"check_files"}, found
    assert "dial/caller-05.wav in dial/ but no artifact names it" in found["check_files"]


def test_a_link_or_fifo_in_dial_fails(call: Path, tmp_path: Path) -> None:
    os.mkfifo(call / "dial" / "partial-call.wav")
    assert "dial/partial-call.wav" in failed(call)["check_files"]
    os.unlink(call / "dial" / "partial-call.wav")
    (call / "dial" / "caller-01.wav").rename(tmp_path / "elsewhere.wav")
    (call / "dial" / "caller-01.wav").symlink_to(tmp_path / "elsewhere.wav")
    assert "caller-01.wav" in failed(call)["check_files"]


def test_a_named_file_outside_dial_fails(call: Path) -> None:
    doc = doc_of(call)
    save_doc(call, replace(doc, files=replace(doc.files, events="../events.jsonl")))
    assert "check_files" in failed(call)


def test_a_dropped_calls_partial_files_are_named_by_dial_partial(call: Path) -> None:
    (call / "dial" / "partial-call.wav").write_bytes((call / "dial" / "call.wav").read_bytes())
    assert "check_files" in failed(call)
    doc = doc_of(call)
    partial = replace(doc, files=replace(doc.files, call_wav="dial/partial-call.wav", caller_wavs=(), otlp=(),
                                         absent=frozenset({"caller_wavs"})), error="the agent hung up")
    (call / "dial-partial.json").write_text(dumps_json(partial.as_dict()))
    assert "check_files" not in failed(call)


def test_heard_audio_before_it_arrived_fails(call: Path) -> None:
    left, right = read_stereo(call / "dial" / "call.wav")
    right[FS:FS + 400] = tone(50, 3000, 440.0)  # at 20 ms: nothing had arrived yet
    (call / "dial" / "call.wav").write_bytes(stereo_wav(left, right))
    assert "before any audio arrived" in failed(call)["check_clears"]


def test_heard_audio_before_it_arrived_by_no_more_than_the_ticks_lateness_holds(call: Path) -> None:
    """A tick that ran late popped its frame after audio that arrived meanwhile; the frame sits at the tick's time.
    The slack is the lateness the dialer measured, and a sound earlier than that still fails."""
    rows = events(call)
    first = next(r for r in rows if r.get("dir") == "down" and r.get("event") == "media")["t_ms"]
    left, right = read_stereo(call / "dial" / "call.wav")
    at = sample(first - 10.0)
    right[at:at + 400] = tone(50, 3000, 440.0)  # 10 ms before the first arrival
    (call / "dial" / "call.wav").write_bytes(stereo_wav(left, right))
    doc = doc_of(call)
    save_doc(call, replace(doc, playout=replace(doc.playout, max_late_ms=5.0)))
    assert "before any audio arrived" in failed(call)["check_clears"]
    save_doc(call, replace(doc, playout=replace(doc.playout, max_late_ms=12.0)))
    assert "before any audio arrived" not in failed(call).get("check_clears", "")


def test_a_clear_count_that_is_not_the_logs_fails(call: Path) -> None:
    doc = doc_of(call)
    save_doc(call, replace(doc, playout=replace(doc.playout, clears=0)))
    assert "playout.clears 0, the event log has 1" in failed(call)["check_clears"]


def test_a_changed_line_share_fails(call: Path) -> None:
    doc = doc_of(call)
    save_doc(call, with_turn(doc, 0, replace(doc.turns[0], heard_minus_reported_ms=10.0)))
    found = failed(call)
    assert set(found) == {"check_agent_reported"} and "heard gap 960.0 - reported 900.0" in found["check_agent_reported"]


def test_a_moved_barge_in_onset_fails(call: Path) -> None:
    doc = doc_of(call)
    turn = doc.turns[2]
    was = barge_in(turn)
    assert was.onset_ms is not None and was.heard_after_onset_ms is not None
    moved = replace(turn, barge_in=replace(was, onset_ms=was.onset_ms - 100.0,
                                           heard_after_onset_ms=was.heard_after_onset_ms + 100.0))
    save_doc(call, summarized(with_turn(doc, 2, moved)))
    assert "the next line's speech starts" in failed(call)["check_barge_in"]


# --- findings and what the files cannot show ---------------------------------------------------------------


def test_a_line_share_above_jitter_plus_two_frames_is_a_finding(tmp_path: Path) -> None:
    out = build(tmp_path / "run", Plan(vad_lag_ms=60.0))  # the agent's VAD ends 60 ms after the true end
    found = results(out)
    assert found["check_agent_reported"].status == FINDING
    assert "above the line's jitter 40 ms + 2 frames (80 ms)" in found["check_agent_reported"].detail
    assert not [n for n, r in found.items() if r.status == FAIL]


def test_late_frames_are_a_finding(tmp_path: Path) -> None:
    out = build(tmp_path / "run", Plan(late_frames=3))
    found = results(out)
    assert found["check_real_time"].status == FINDING and "3 late frames" in found["check_real_time"].detail
    assert found["check_uplink"].status == PASS


def test_late_frames_not_counted_fail(tmp_path: Path) -> None:
    out = build(tmp_path / "run", Plan(late_frames=3))
    doc = doc_of(out)
    save_doc(out, replace(doc, playout=replace(doc.playout, late_frames=0)))
    assert "more than two frames after their tick, playout.late_frames 0" in failed(out)["check_uplink"]


def test_a_median_above_the_target_is_a_finding(tmp_path: Path) -> None:
    out = build(tmp_path / "run", Plan(reported_ms=(1400.0, 1500.0, 1450.0, 1300.0)))
    found = results(out)
    assert found["check_target"].status == FINDING and "above the 1200 ms target" in found["check_target"].detail
    assert not [n for n, r in found.items() if r.status == FAIL]


def test_an_agent_that_reports_nothing_is_not_checkable(tmp_path: Path) -> None:
    out = build(tmp_path / "run", Plan(otlp=False))
    found = results(out)
    assert found["check_agent_reported"].status == NOT_CHECKABLE
    assert found["check_agent_reported"].detail == "agent's own numbers not reported"
    assert found["check_wer"].status == NOT_CHECKABLE
    assert not [n for n, r in found.items() if r.status == FAIL], {n: r.detail for n, r in found.items()}


def test_a_null_agent_number_without_a_reason_fails(tmp_path: Path) -> None:
    out = build(tmp_path / "run", Plan(otlp=False))
    save_doc(out, replace(doc_of(out), unknown={}))
    assert "unknown.agent_reported gives no reason" in failed(out)["check_values"]


def test_no_barge_in_is_not_checkable(tmp_path: Path) -> None:
    out = build(tmp_path / "run", Plan(barge_in_turns=()))
    found = results(out)
    assert found["check_barge_in"].status == NOT_CHECKABLE
    assert found["check_clears"].status == NOT_CHECKABLE
    assert not [n for n, r in found.items() if r.status == FAIL], {n: r.detail for n, r in found.items()}


@pytest.mark.parametrize("content", ["", "{", "[]", '{"turns": []}', '{"turns": [1]}', '{"schema_version": 99}'])
def test_malformed_dial_json_fails_in_one_line(call: Path, content: str) -> None:
    (call / "dial.json").write_text(content)
    for result in results(call).values():
        assert result.status in (FAIL, NOT_CHECKABLE) and "\n" not in result.detail


def test_a_linked_recording_fails_without_reading_it(call: Path, tmp_path: Path) -> None:
    (call / "dial" / "call.wav").rename(tmp_path / "call.wav")
    (call / "dial" / "call.wav").symlink_to(tmp_path / "call.wav")
    found = failed(call)
    for name in ("check_recording", "check_heard_gaps", "check_files"):
        assert name in found and "\n" not in found[name]


def test_check_runs_the_registered_dial_checks(call: Path) -> None:
    """`voice-llm check` on a folder of a dial call alone (no run.json): every dial check runs, by the names the
    capability registers, and the built call passes them."""
    from voice_llm.core import registry

    capability = next(c for c in registry.capabilities() if c.name == "dial")
    entries = capability.checks
    steps = [s.name for s in capability.steps if "dial.json" in s.artifacts]
    assert "dial" in steps
    assert {e.step for e in entries} == set(steps)  # every step writing dial.json, and only those
    for step in steps:  # the same checks for `voice-llm dial` and (later) the lab's converse step
        assert [(e.name, e.function) for e in entries if e.step == step] == \
            [(c.name, c.function) for c in DIAL_CHECKS]
    found = {r.name: r for r in core.run_checks(call)}
    for check in DIAL_CHECKS:
        assert found[check.name].status == PASS, (check.name, found[check.name].detail)


def test_a_file_named_under_files_belongs(call: Path) -> None:
    """The lab's converse step keeps the agent's log as dial/agent.log: named in files, it is the step's."""
    (call / "dial" / "agent.log").write_text("ready\n")
    assert "dial/agent.log in dial/ but no artifact names it" in failed(call)["check_files"]
    doc = doc_of(call)
    save_doc(call, replace(doc, files=replace(doc.files, extra={**doc.files.extra, "agent_log": "dial/agent.log"})))
    assert "check_files" not in failed(call)


def test_a_barge_in_off_schedule_or_unplanned_fails(call: Path) -> None:
    doc = doc_of(call)
    # the line cut in 500 ms after the first heard sound
    save_doc(call, replace(doc, settings=replace(doc.settings, barge_in_after_ms=300.0)))
    assert "barge_in_after_ms 300" in failed(call)["check_schedule"]
    save_doc(call, replace(doc, settings=replace(doc.settings, barge_in_turns=(2,))))
    assert "a barge-in on a turn settings.barge_in_turns does not name" in failed(call)["check_schedule"]


def _last_sound(doc: DialDoc, position: int, last_ms: float) -> DialDoc:
    turn = doc.turns[position]
    return with_turn(doc, position, replace(turn, heard=replace(heard(turn), last_sound_ms=last_ms)))


def test_a_line_that_talks_over_the_reply_fails(call: Path) -> None:
    doc = doc_of(call)
    last = heard(doc.turns[0]).last_sound_ms
    assert last is not None
    save_doc(call, _last_sound(doc, 0, last + 500.0))  # the reply (on paper) still playing when line 2 began
    found = failed(call)
    assert "before turn 1's reply ended" in found["check_schedule"] and "check_heard_gaps" in found


def _resume_turn_1_into_line_2(call: Path, at_ms: float, length_ms: float = 100.0) -> float:
    """The agent speaks again at ``at_ms`` (a 100 ms tone on the heard channel): turn 1's last heard sound is then
    its end, as the dialer measures it (up to line 2's speech start)."""
    left, right = read_stereo(call / "dial" / "call.wav")
    right = right.copy()
    right[sample(at_ms):sample(at_ms + length_ms)] = tone(length_ms, 8000, 440)
    (call / "dial" / "call.wav").write_bytes(stereo_wav(left, right))
    return at_ms + length_ms


def test_a_reply_that_resumes_after_the_callers_wait_is_no_broken_schedule(call: Path) -> None:
    """A busy agent silent longer than reply_end_ms + think_ms mid-reply, then speaking on: the caller heard the
    reply end and spoke as its rule says; the later sound lies after its line began. PASS, and said."""
    doc = doc_of(call)
    offset = doc.turns[1].caller.offset_ms
    assert doc.turns[1].caller.speech_start_ms > offset + 200  # the line's lead silence holds the tone
    save_doc(call, _last_sound(doc, 0, _resume_turn_1_into_line_2(call, offset + 60.0)))
    found = results(call)
    assert found["check_schedule"].status == PASS, found["check_schedule"].detail
    assert "turn 1's reply resumed" in found["check_schedule"].detail and "into turn 2's line" in found["check_schedule"].detail
    assert "check_heard_gaps" not in failed(call)  # the recording agrees with the stated last sound


def test_a_line_started_while_the_agent_was_still_heard_fails(call: Path) -> None:
    doc = doc_of(call)
    offset = doc.turns[1].caller.offset_ms
    assert doc.settings.reply_end_ms is not None and doc.settings.think_ms is not None
    wait = doc.settings.reply_end_ms + doc.settings.think_ms
    _resume_turn_1_into_line_2(call, offset - wait / 2)  # sound inside the quiet the caller had to wait for
    save_doc(call, _last_sound(doc, 0, _resume_turn_1_into_line_2(call, offset + 60.0)))
    detail = failed(call)["check_schedule"]
    assert "before turn 1's reply ended" in detail and "into that wait" in detail


def test_a_false_barge_in_not_on_the_files_fails(call: Path) -> None:
    """A false barge-in stated for turn 1 by a clear the event log does not have; a count that is not the turns'."""
    doc = doc_of(call)
    assert doc.summary is not None
    counted = replace(doc, summary=replace(doc.summary, false_barge_ins=1))
    cut = FalseBargeIn(kind="clear", t_ms=3000.0, dropped_ms=500.0, absent=frozenset({"silent_ms", "resumed_ms"}))
    save_doc(call, with_turn(counted, 0, replace(doc.turns[0], false_barge_in=True, false_barge_in_at=cut)))
    assert "no clear then cut the reply" in failed(call)["check_false_barge_ins"]
    save_doc(call, counted)
    assert "summary.false_barge_ins 1, the turns count 0" in failed(call)["check_false_barge_ins"]


def test_audio_the_agent_sent_after_its_clear_is_heard_after_it(tmp_path: Path) -> None:
    """pipecat sends the tail of a synthesis it had in flight after its clear (its Vonage serializer, in CI): the
    buffer was emptied, the new audio plays on from it, and the reply goes silent after that audio, not one frame
    after the clear. Every check passes; the barge-in's line says what came after the clear."""
    out = build(tmp_path / "run", Plan(sent_after_clear_ms=80.0))
    found = results(out)
    assert {n: r.detail for n, r in found.items() if r.status != PASS} == {}
    assert "came after the clear" in found["check_barge_in"].detail
    barge = barge_in(doc_of(out).turns[2])
    assert barge.cleared_ms is not None and barge.heard_silent_ms is not None
    assert barge.heard_silent_ms > barge.cleared_ms + 20.0 + 80.0


def test_a_silence_after_the_clear_with_no_audio_sent_after_it_fails(tmp_path: Path) -> None:
    """The same recording with the late audio's arrival taken out of the event log: the silence comes long after
    the clear and nothing explains it. (check_clears finds the buffer not emptied too.)"""
    out = build(tmp_path / "run", Plan(sent_after_clear_ms=80.0))
    cleared = barge_in(doc_of(out).turns[2]).cleared_ms
    rows = [r for r in events(out) if not (r.get("dir") == "down" and r["event"] == "media" and cleared is not None
                                           and cleared < r["t_ms"] < cleared + 2.0)]
    renumber(rows)
    save_events(out, rows)
    found = failed(out)
    assert "no audio sent after the clear: not in that order" in found.get("check_barge_in", ""), found
