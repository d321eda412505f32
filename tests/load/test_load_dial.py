"""Dialing callers (load --dial): a call's files into samples, refusals, and the heard-gap goodput and verdict, on
hand-made dial.json files and samples (no agent, no Locust)."""

from __future__ import annotations

import dataclasses

import json
import re
from pathlib import Path

import pytest

from voice_llm.capabilities.dial import DialOptions
from voice_llm.capabilities.dial.doc import DialDoc, Files, Floor, Heard, Line, Playout, Settings, Turn, TurnCaller
from voice_llm.capabilities.load import CAPABILITY as LOAD_CAPABILITY
from voice_llm.capabilities.load import checks, dialing, stats
from voice_llm.capabilities.load.document import load_document, sweep_document
from voice_llm.capabilities.load.plan import CallerConfig, SweepPlan
from voice_llm.capabilities.load.run import dial_caller
from voice_llm.capabilities.load.samples import read_samples, write_samples
from voice_llm.capabilities.load.settings import LoadSettings
from voice_llm.core.run import flags

SLO = 1500.0
T0 = 1_000.0  # the call's sample 0, epoch seconds
CALL = dialing.CallId("w1", "w1/1", 1, T0 - 0.5)
REFUSAL = ("the agent refused the call before turn 1 (close code 1013 'voice-llm agent: at its limit of 2 call(s) "
           "(--max-calls)'): try again later (the call so far is in /tmp/x/dial-partial.json and /tmp/x/dial/p.wav)")


def _turn(index: int, end_ms: float, gap_ms: float | None) -> Turn:
    return Turn(index=index, script=f"line {index}", caller_wav=f"dial/caller-{index:02d}.wav",
                caller=TurnCaller(offset_ms=end_ms - 2000, speech_start_ms=end_ms - 1500, speech_end_ms=end_ms),
                heard=Heard(first_sound_ms=None if gap_ms is None else end_ms + gap_ms, gap_ms=gap_ms))


def _dial_doc(turns: list[Turn], late: int = 0, frames: int = 1500, error: str | None = None) -> dict:
    """A call's dial.json built as the dialer builds it (voice_llm.capabilities.dial.doc.DialDoc), with what load reads."""
    return DialDoc(schema_version=1, t0_epoch_ns=int(T0 * 1e9), turns=tuple(turns), error=error,
                   line=Line(protocol="twilio", codec="mulaw", rate=8000, frame_ms=20.0, jitter_ms=40.0),
                   floor=Floor(caller=100, heard=100), settings=Settings(turns=max(1, len(turns))),
                   playout=Playout(frames=frames, late_frames=late),
                   files=Files(caller_wavs=tuple(t.caller_wav for t in turns if t.caller_wav))).as_dict()


def _clock(*phases: tuple[float, int, str]) -> dialing.PhaseClock:
    clock = dialing.PhaseClock()
    for at, step, phase in phases:
        clock.add(dialing.Phase(at, step, phase, step + 1))
    return clock


def _write(folder: Path, name: str, doc: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(doc))
    return folder


def test_a_call_that_went_through_gives_one_sample_per_turn_tagged_at_its_start(tmp_path: Path) -> None:
    out = _write(tmp_path / "call", "dial.json", _dial_doc([_turn(1, 4000.0, 900.0), _turn(2, 12000.0, 2100.0)],
                                                           late=3))
    # the measured window begins between the two turns' speech ends (T0 + 4 s and T0 + 12 s)
    clock = _clock((T0 - 10, 0, "warmup"), (T0 + 8, 0, "measure"))
    rows = dialing.call_samples(out, 0, "", CALL, clock)
    assert [(r["turn"], r["phase"], r["heard_gap_ms"], r["error"]) for r in rows] == \
        [(1, "warmup", 900.0, None), (2, "measure", 2100.0, None)]
    assert rows[1]["start"] == pytest.approx(T0 + 12.0)
    assert rows[1]["first_sound_ms"] - rows[1]["speech_end_ms"] == rows[1]["heard_gap_ms"]
    assert {(r["call_frames"], r["late_frames"], r["refused"]) for r in rows} == {(1500, 3, False)}
    assert set(rows[0]) == set(stats.SAMPLE_FIELDS) - {"slots"}


def test_a_turn_heard_near_a_late_tick_of_the_dialer_is_unjudged_not_an_error(tmp_path: Path) -> None:
    """dial's late-tick rule: the reply was heard but the dialer's own tick ran late there, so its gap is not timed.
    The instrument missed the turn, not the agent: it is neither judged nor an error, so it neither passes a step
    nor stops one (one such turn had stopped a 2-caller step at 4.8 % errors whose judged turns passed)."""
    late = _turn(2, 12000.0, None)
    late = dataclasses.replace(late, heard=dataclasses.replace(late.heard, first_sound_ms=12900.0, late_tick=True))
    out = _write(tmp_path / "call", "dial.json", _dial_doc([_turn(1, 4000.0, 900.0), late, _turn(3, 20000.0, 800.0)],
                                                           late=2))
    rows = dialing.call_samples(out, 0, "", CALL, _clock((T0 - 10, 0, "measure")))
    assert [(r["turn"], r["heard_gap_ms"], r["error"], r["unjudged"]) for r in rows] == \
        [(1, 900.0, None, None), (2, None, None, dialing.LATE_TICK), (3, 800.0, None, None)]
    rows += [_sample(0, 1000.0, call=c) for c in range(2, 20)]
    step = stats.summarize_step(rows, SLO, 60.0, stats.DIAL_METRIC)
    assert (step["turns"], step["judged"], step["good"], step["errors"], step["unjudged"]) == (21, 20, 20, 0, 1)
    assert step["goodput"] == 1.0 and stats.stop_reason({"callers": 2, **step}, SLO, stats.DIAL_METRIC) is None
    assert not stats.judged(rows[1], stats.DIAL_METRIC)


def test_a_refused_call_is_one_error_with_its_reason_never_a_timed_turn(tmp_path: Path) -> None:
    out = _write(tmp_path / "call", "dial-partial.json", _dial_doc([], error=REFUSAL))
    (row,) = dialing.call_samples(out, 1, f"voice-llm: {REFUSAL}\n", CALL, _clock((T0 - 60, 2, "measure")))
    assert row["refused"] and row["heard_gap_ms"] is None and (row["step"], row["phase"]) == (2, "measure")
    assert row["error"] == "refused: close code 1013 (voice-llm agent: at its limit of 2 call(s) (--max-calls))"
    # the same refusal said only on stderr (nothing written): the same error text, so a step counts them together
    (again,) = dialing.call_samples(tmp_path / "nothing", 1, f"voice-llm: {REFUSAL}\n", CALL, dialing.PhaseClock())
    assert again["error"] == row["error"] and again["refused"] and again["phase"] == "idle"
    assert dialing.refusal("close code 1000") is None and dialing.refusal("no reply within 60 s in turn 2") is None


def test_a_call_that_failed_keeps_its_measured_turns_and_counts_the_failed_one(tmp_path: Path) -> None:
    error = "no reply within 60 s in turn 2 (the call so far is in /tmp/a/dial-partial.json and /tmp/a/dial/x.wav)"
    out = _write(tmp_path / "call", "dial-partial.json",
                 _dial_doc([_turn(1, 4000.0, 800.0), _turn(2, 12000.0, None)], error=error))
    rows = dialing.call_samples(out, 1, "", CALL, _clock((T0 - 1, 0, "measure")))
    assert [(r["turn"], r["heard_gap_ms"], r["error"], r["refused"]) for r in rows] == \
        [(1, 800.0, None, False), (2, None, "no reply within 60 s in turn 2", False)]
    (crashed,) = dialing.call_samples(tmp_path / "empty", -9, "Traceback...\nKeyError: x\n", CALL, dialing.PhaseClock())
    assert crashed["error"] == "dial exited with status -9: KeyError: x" and not crashed["refused"]


def test_the_phase_clock_and_the_calls_in_flight() -> None:
    clock = _clock((10.0, 0, "warmup"), (20.0, 0, "measure"), (80.0, 0, "drain"), (81.0, 1, "warmup"),
                   (90.0, 1, "measure"))
    assert clock.at(5.0).phase == "idle" and clock.at(20.0).step == 0 and clock.at(85.0).phase == "warmup"
    assert clock.measured_steps(15.0) == {0, 1}  # a call placed in step 0's warm-up still running in step 1
    assert clock.measured_steps(85.0, 89.0) == set()
    assert clock.measured_steps(50.0, 95.0) == {0, 1}


def _call_settings(command: list[str]) -> DialOptions:
    """What a call's `dial --settings FILE` was handed, read as dial reads its file."""
    return flags.build(DialOptions, flags.read_settings(DialOptions, Path(command[command.index("--settings") + 1])))


def test_the_dial_command_and_the_lines_kept_for_later_calls(tmp_path: Path) -> None:
    _, config, _ = dial_caller(LoadSettings(dial="ws://127.0.0.1:1/", dial_turns=2))
    first = _call_settings(dialing.dial_command(config, tmp_path / "a", None))
    assert first.url == "ws://127.0.0.1:1/"
    assert (first.turns, first.barge_in_turns, first.turns_given, first.barge_in_given) == (2, (), True, True)
    assert first.stt == "none" and first.caller_audio is None
    # the load defaults: the short lines, no fixed think pause, a tenth of the heard reply (issue 30 item 4)
    assert first.caller_lines == "load" and (first.think_ms, first.think_share) == (0.0, 0.1)
    call = tmp_path / "call"
    (call / "dial").mkdir(parents=True)
    for n in (1, 2):
        (call / f"dial/caller-0{n}.wav").write_bytes(b"RIFF" + bytes([n]))
    lines = tmp_path / "lines"
    assert not dialing.keep_lines(call, lines)  # no dial.json: nothing kept
    _write(call, "dial.json", _dial_doc([_turn(1, 4000.0, 900.0), _turn(2, 9000.0, 800.0)]))
    assert dialing.keep_lines(call, lines)
    assert sorted(p.name for p in lines.iterdir()) == ["caller-01.wav", "caller-02.wav", "script.txt"]
    assert (lines / "script.txt").read_text() == "line 1\nline 2\n"
    assert not dialing.keep_lines(call, lines)  # made once
    _, planned, _ = dial_caller(LoadSettings(dial="ws://h:1/", dial_barge_in_turns=(1,)))
    later = _call_settings(dialing.dial_command(planned, tmp_path / "b", lines))
    assert later.caller_audio == lines and not later.turns_given  # every WAV the folder holds
    assert later.barge_in_turns == (1,) and later.barge_in_given
    assert later.caller_lines == DialOptions.caller_lines and later.think_share == 0.1  # every call thinks so


def _sample(step: int, gap: float | None, *, call: int = 1, turn: int = 1, error: str | None = None,
            refused: bool = False, late: int = 0, frames: int = 1000, barge: float | None | bool = False,
            start: float = 105.0, phase: str = "measure", worker: str = "w1") -> dict:
    row = {name: None for name in stats.SAMPLE_FIELDS}
    row.update({"step": step, "callers": step + 1, "phase": phase, "worker": worker, "caller": f"{worker}/1",
                "call": call, "turn": turn, "start": start + 100 * step, "error": error, "cancelled": False,
                "tokens": 0, "refused": refused, "barge_in": barge is not False,
                "barge_in_heard_after_onset_ms": barge if barge is not False else None,
                "call_frames": None if error and refused else frames, "late_frames": None if refused else late})
    if gap is not None:
        row.update({"heard_gap_ms": gap, "speech_end_ms": 4000.0, "first_sound_ms": 4000.0 + gap})
    row.pop("slots")
    return row


def test_goodput_on_the_heard_gap_counts_refusals_as_misses() -> None:
    rows = [_sample(0, 1000.0, call=c) for c in range(18)] + [_sample(0, 1500.0, call=18), _sample(0, 2400.0, call=19)]
    rows += [_sample(0, None, call=20, error="refused: close code 1013 (limit)", refused=True),
             _sample(0, None, call=21, error="refused: close code 1013 (limit)", refused=True)]
    step = stats.summarize_step(rows, SLO, 60.0, stats.DIAL_METRIC)
    # 22 judged (20 heard + 2 refused), 19 within 1500 ms (the SLO itself is within it)
    assert (step["turns"], step["judged"], step["good"], step["errors"], step["refused"]) == (22, 22, 19, 2, 2)
    assert step["goodput"] == 19 / 22
    # nearest rank over the 20 heard gaps (refusals have none): p90 is the 18th, p99 the slowest
    assert (step["heard_gap_ms"]["p50"], step["heard_gap_ms"]["p90"], step["heard_gap_ms"]["p99"]) == (1000.0, 1000.0, 2400.0)
    assert step["error_reasons"] == {"refused: close code 1013 (limit)": 2}
    assert step["first_sentence_ms"]["p50"] is None  # the text metric is not what a dialing step is judged on
    assert "errors" in stats.stop_reason({"callers": 1, **step}, SLO, stats.DIAL_METRIC)
    assert stats.stop_reason({"callers": 1, **stats.summarize_step(rows[:19], SLO, 60.0, stats.DIAL_METRIC)}, SLO,
                             stats.DIAL_METRIC) is None


def test_late_frames_make_the_step_generator_bound_and_barge_ins_are_counted() -> None:
    # two turns of one call (its frames count once), one call 2 % late: that caller could not keep real time
    rows = [_sample(0, 900.0, call=1, turn=1, late=5), _sample(0, 950.0, call=1, turn=2, late=5, barge=300.0),
            _sample(0, 800.0, call=2, late=20, barge=None)]
    step = stats.summarize_step(rows, SLO, 60.0, stats.DIAL_METRIC)
    assert (step["calls"], step["late_frames"], step["call_frames"], step["calls_behind"]) == (2, 25, 2000, 1)
    assert step["barge_ins"]["n"] == 2 and step["barge_ins"]["honoured"] == 1
    assert step["barge_ins"]["heard_after_onset_ms"]["p50"] == 300.0
    assert stats.generator_bound({}, step) and not stats.generator_bound({}, {**step, "calls_behind": 0})


def _steps(*gaps_per_step: list[float | None]) -> list[dict]:
    steps = []
    for index, gaps in enumerate(gaps_per_step):
        rows = [_sample(index, g, call=n, error=None if g is not None else "refused: close code 1013",
                        refused=g is None) for n, g in enumerate(gaps)]
        summary = stats.summarize_step(rows, SLO, 60.0, stats.DIAL_METRIC)
        steps.append({"callers": index + 1, "generator_bound": stats.generator_bound({}, summary), **summary})
    return steps


def test_the_verdict_is_the_most_callers_at_goodput_on_enough_heard_turns() -> None:
    steps = _steps([900.0] * 20, [900.0] * 19 + [3000.0], [900.0] * 15 + [None] * 5)
    verdict = stats.verdict(steps, None)
    assert verdict["max_callers"] == 2 and verdict["judged_turns"] == 20
    assert verdict["limited_by"] == "the agent's call limit (calls refused, close code 1013)"
    assert stats.verdict(_steps([900.0] * 19), None)["max_callers"] is None  # 19 judged turns: no verdict
    assert stats.verdict(_steps([3000.0] * 20), None)["max_callers"] == 0
    assert stats.verdict(_steps([900.0] * 20, [3000.0] * 20), None)["limited_by"] == "agent"


def test_a_step_that_missed_more_than_the_target_allows_fails_early() -> None:
    # 1 miss in 20 is allowed (95 %): 2 misses in the first 19 turns fail the step whatever the 20th does
    assert stats.ALLOWED_MISSES == 1
    one_miss, two_misses = _steps([900.0] * 5 + [3000.0]), _steps([3000.0, None])
    assert not stats.failed_early(one_miss[0]) and stats.failed_early(two_misses[0])
    early = stats.verdict(two_misses, None, early=True)
    assert (early["max_callers"], early["failed_early"], early["judged_turns"]) == (0, [1], 2)
    assert stats.verdict(two_misses, None)["max_callers"] is None  # text callers: the 20-turn rule only
    assert stats.verdict(one_miss, None, early=True)["max_callers"] is None
    # a passing step still needs its 20 judged turns; the failing step after it is judged early
    steps = _steps([900.0] * 20, [900.0] * 3 + [None] * 2)
    verdict = stats.verdict(steps, None, early=True)
    assert (verdict["max_callers"], verdict["failed_early"]) == (1, [2])
    assert verdict["limited_by"] == "the agent's call limit (calls refused, close code 1013)"


def _fake_dial_run(tmp_path: Path) -> Path:
    """load.json + CSV as `load --dial` writes them, from a made-up master result."""
    caller, dial, _ = dial_caller(LoadSettings(dial="ws://127.0.0.1:9/"))
    plan = SweepPlan(caller=caller, callers=(1, 2), step_s=10.0, dial=dial)
    rows = [_sample(0, 700.0, phase="warmup", start=95.0), _sample(0, 800.0, call=2), _sample(0, 1900.0, call=3),
            _sample(1, 1200.0, call=4, worker="w2"), _sample(1, None, call=5, error="refused: close code 1013",
                                                             refused=True)]
    result = {"started": 0.0, "ended": 300.0, "workers": ["w1", "w2"], "stopped": None, "samples": rows,
              "steps": [{"step": i, "callers": i + 1, "window": {"start": 100.0 + 100 * i, "end": 110.0 + 100 * i,
                         "drain_s": 0.5}, "cpu": {}, "generator_bound": False,
                         "host": {"cpu_busy": 0.5, "loadavg_1m": 1.0, "master_cpu_s": 0.1}} for i in range(2)]}
    sweep, samples = sweep_document(plan, result, None, caller.url)
    settings = LoadSettings(dial=caller.url, step_s=10.0, warmup_s=5.0, callers=(1, 2), stop_on_budget=False)
    (tmp_path / "load.json").write_text(json.dumps(load_document(settings, {"mode": "dial"}, [sweep])))
    write_samples(tmp_path / "load_samples.csv", samples)
    return tmp_path


def test_a_dial_run_passes_its_checks_and_a_tampered_one_fails(tmp_path: Path) -> None:
    out = _fake_dial_run(tmp_path)
    doc = json.loads((out / "load.json").read_text())
    assert (doc["mode"], doc["metric"], doc["slo_heard_ms"], doc["load_schema_version"]) == ("dial", "heard_gap_ms", SLO, 5)
    first, second = doc["sweeps"][0]["steps"]
    assert (first["judged"], first["good"], second["refused"], second["goodput"]) == (2, 1, 1, 0.5)
    samples = read_samples(out / "load_samples.csv")
    # the CSV keeps every column
    assert [s["refused"] for s in samples if s["error"]] == [True] and samples[0]["heard_gap_ms"] == 700.0
    for entry in LOAD_CAPABILITY.checks:
        assert entry.run(out), entry.name
    second["heard_gap_ms"]["p50"] = 1.0
    (out / "load.json").write_text(json.dumps(doc))
    with pytest.raises(checks.CheckFailed, match="heard_gap_ms"):
        checks.check_load_matches_samples(out)
    rows = read_samples(out / "load_samples.csv")
    next(r for r in rows if r["refused"])["heard_gap_ms"] = 9000.0  # a refusal counted as a (slow) timed turn
    write_samples(out / "load_samples.csv", rows)
    with pytest.raises(checks.CheckFailed, match="refused|error"):
        checks.check_load_turn_order(out)


def test_settings_take_the_modes_defaults_and_the_plan_travels_as_json() -> None:
    text, dial = LoadSettings(), LoadSettings(dial="ws://h:1/")
    assert text.callers == (1, 2, 4, 8) and text.step_s == 120.0
    assert dial.callers[:3] == (1, 2, 3) and dial.slo_heard_ms == 1500.0 and dial.dial_turns == 4
    assert dial.dial_lines == "load" and text.dial_lines == "load"  # only a dialing caller speaks them
    assert LoadSettings(dial="ws://h:1/", step_s=30.0).step_s == 30.0
    plan = SweepPlan(caller=CallerConfig(url="", system="", turns=()),
                     dial=dial_caller(LoadSettings(dial="ws://h:1/", dial_barge_in_turns=(1,)))[1])
    again = SweepPlan.from_json(plan.to_json())
    assert again == plan and again.metric == stats.DIAL_METRIC and again.slo_ms == 1500.0


def test_the_report_draws_the_heard_gap_against_its_budget(tmp_path: Path) -> None:
    from voice_llm.capabilities.load import report

    doc = json.loads((_fake_dial_run(tmp_path) / "load.json").read_text())
    fig, caption, extra = report.load_chart(doc)
    assert "the agent: no verdict" in caption and "dials the agent at ws://127.0.0.1:9/" in caption
    assert fig.axes[0].get_ylabel() == "heard gap (ms)"
    assert extra.count("<tr>") == 1 + 2 and "1 refused: close code 1013" in extra


@pytest.mark.parametrize("given, needle", [
    ({"dial": "http://127.0.0.1:9/"}, "ws:// or wss://"),
    ({"dial": "ws://127.0.0.1:9/", "dial_barge_in_turns": (4,)}, "must be 1..3"),
    ({"dial": "ws://127.0.0.1:9/", "dial_lines": "poems"}, "--dial-lines must be one of load, clinic"),
    ({"dial": "ws://127.0.0.1:9/", "url": "http://127.0.0.1:9"}, "drop --url"),
    ({"otlp_listen": "127.0.0.1:0"}, "goes with --dial URL"),
    ({"dial": "ws://127.0.0.1:9/", "otlp_listen": "nowhere"}, "--otlp-listen takes HOST:PORT"),
])
def test_bad_dial_settings_are_refused_before_anything_is_written(tmp_path: Path, given: dict, needle: str) -> None:
    from voice_llm.core.errors import ConfigError
    from voice_llm.capabilities.load.run import run_load

    with pytest.raises(ConfigError, match=re.escape(needle)):
        run_load(LoadSettings(out=tmp_path / "out", **given))
    assert not (tmp_path / "out").exists()


def test_the_verdict_line_says_a_step_failed_early() -> None:
    from voice_llm.capabilities.load import cli

    steps = _steps([3000.0, None])
    sweep = {"url": "ws://127.0.0.1:9/", "slots": None, "steps": steps, "verdict": stats.verdict(steps, None, early=True)}
    line = cli.verdict_line({"mode": "dial", "slo_heard_ms": SLO, "step_s": 300.0}, sweep)
    assert "max callers = 0 (heard gap <= 1500 ms" in line
    assert "at 1 caller 2 of 2 judged turns missed, more than the 1 in 20 the target allows" in line


def test_a_call_not_yet_recording_has_no_turn_in_a_window_that_ended(tmp_path: Path) -> None:
    """The drain's rule for a running call: no live WAV yet, no turn before now; a growing one, none before its
    length ago plus dial's lead (so a call placed just before a window ended is not waited for)."""
    out = tmp_path / "call"
    out.mkdir()
    assert dialing.turns_since(100.0, out, 130.0) == 130.0  # not even its dial folder: the call clock has not started
    (out / "dial").mkdir()
    assert dialing.turns_since(100.0, out, 130.0) == 130.0
    # 10 s of the line recorded (stereo int16 at 8 kHz): the clock started 10 s ago, a turn 0.5 s after that at least
    (out / "dial" / ".call-live-1.wav").write_bytes(bytes(44 + 10 * dialing.LINE_BYTES_PER_S))
    assert dialing.turns_since(100.0, out, 130.0) == pytest.approx(130.0 - 10.0 - dialing.TURN_MARGIN_S)
    assert dialing.turns_since(125.0, out, 130.0) == 125.0  # never before it was placed
    clock = _clock((0.0, 0, "measure"), (129.0, 0, "drain"))
    assert clock.measured_steps(dialing.turns_since(100.0, out, 130.0)) == {0}  # recording since 119.5: waited for
    (out / "dial" / ".call-live-1.wav").unlink()
    assert clock.measured_steps(dialing.turns_since(100.0, out, 130.0)) == set()  # placed in it, but not yet calling


@pytest.mark.parametrize("connected", [True, False])
def test_a_failure_line_loses_where_dial_kept_the_call_in_either_form(connected: bool) -> None:
    """load counts a call's errors by their text: dial's `kept_where` words (a temporary path, different every call)
    come off whichever form they take, read from kept_where itself so the two cannot drift apart."""
    from voice_llm.capabilities.dial import without_kept_where
    from voice_llm.capabilities.dial.step import kept_where

    where = kept_where(connected, Path("/tmp/a/dial-partial.json"), Path("/tmp/a/dial/partial-call.wav"))
    assert without_kept_where(f"nothing answers at ws://h:1/ ({where})") == "nothing answers at ws://h:1/"
