"""dial's key numbers and compare metrics on folders built here (tests/fixtures/sample_run + a dial call from
tests/dial/dialfolder.py): `compare` compares heard mouth-to-ear with one sample per turn under its own rules, and a
copy whose median moved 8 s is something a listener would notice (issue 31 item 5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dialfolder import Plan, build, load, save

from voice_llm.core.analysis import compare, keynumbers, metrics
from voice_llm.capabilities.dial import numbers
from voice_llm.core.util import stats

FIXTURES = Path(__file__).parents[1] / "fixtures"
BASE = Plan().reported_ms


def a_run(dest: Path, later_ms: float = 0.0, turns: int = 4) -> Path:
    """The sample lab run with a dial call in it; every reply ``later_ms`` later (the turns move with the median)."""
    out = Path(shutil.copytree(FIXTURES / "sample_run", dest))
    plan = Plan(reported_ms=tuple(r + later_ms for r in BASE), speech_ms=Plan().speech_ms)
    if turns != 4:
        plan = Plan(speech_ms=(1200.0,) * turns, reported_ms=tuple(900.0 + later_ms + 10 * i for i in range(turns)),
                    reply_ms=(1200.0,) * turns, barge_in_turns=())
    build(out, plan)
    doc = load(out)
    doc["run_id"] = json.loads((out / "run.json").read_text())["run_id"]
    save(out, doc)
    return out


def heard(comparison: compare.Comparison) -> compare.MetricComparison:
    return next(m for m in comparison.metrics if m.key == numbers.HEARD_KEY)


def test_the_metric_is_the_summary_median_with_one_sample_per_turn(tmp_path: Path) -> None:
    out = a_run(tmp_path / "a")
    found = metrics.measure_all(out)[numbers.HEARD_KEY]
    doc = load(out)
    gaps = [t["heard"]["gap_ms"] for t in doc["turns"]]
    assert found.samples == tuple(gaps) and found.median == stats.median(gaps) == doc["summary"]["heard_gap_ms"]["median"]
    assert found.metric.audible and found.metric.source == "dial.json"
    barge = metrics.measure_all(out)[numbers.BARGE_KEY]
    assert barge.samples == (doc["turns"][2]["barge_in"]["heard_after_onset_ms"],)


def test_a_copy_heard_8_s_later_is_noticed(tmp_path: Path) -> None:
    a, b = a_run(tmp_path / "a"), a_run(tmp_path / "b", later_ms=8000.0)
    comparison = compare.compare_runs(a, b)
    row = heard(comparison)
    assert (row.a, row.b) == (1020.0, 9020.0)
    assert row.test == "ranges" and row.significant and row.noticeable  # 4 turns a side: ranges apart
    lines = compare.summary_lines(comparison)
    assert "heard mouth-to-ear 1,020 -> 9,020 ms, 784 % later, significant (ranges apart, 4 vs 4); a listener would " \
           "notice" in lines
    assert lines[-1].startswith("a listener would notice: heard mouth-to-ear"), lines[-1]


def test_the_same_call_twice_is_not_noticed(tmp_path: Path) -> None:
    a, b = a_run(tmp_path / "a"), a_run(tmp_path / "b")
    row = heard(compare.compare_runs(a, b))
    assert row.a == row.b and not row.significant and not row.noticeable


def test_six_turns_a_side_use_the_rank_test(tmp_path: Path) -> None:
    a, b = a_run(tmp_path / "a", turns=6), a_run(tmp_path / "b", later_ms=300.0, turns=6)
    row = heard(compare.compare_runs(a, b))
    assert row.test == "mann-whitney" and row.significant and row.noticeable
    assert len(row.a_samples) == len(row.b_samples) == 6


def test_a_summary_median_edited_apart_from_its_turns_is_not_compared(tmp_path: Path) -> None:
    """1020 -> 9432 in the summary alone: not taken as B's number (the turns say 1020), and never "the same"."""
    a, b = a_run(tmp_path / "a"), a_run(tmp_path / "b")
    doc = load(b)
    doc["summary"]["heard_gap_ms"]["median"] = 9432.0
    save(b, doc)
    assert numbers.HEARD_KEY not in metrics.measure_all(b)
    comparison = compare.compare_runs(a, b)
    assert numbers.HEARD_KEY in comparison.only_in_one
    assert not [m for m in comparison.metrics if m.key == numbers.HEARD_KEY]
    lines = compare.summary_lines(comparison)
    assert any(line.startswith("measured in one run only: ") and "heard mouth-to-ear" in line for line in lines)


def test_key_numbers_in_report_json(tmp_path: Path) -> None:
    out = a_run(tmp_path / "a")
    report = keynumbers.build_report(out)
    doc = load(out)
    assert report[numbers.HEARD_KEY] == doc["summary"]["heard_gap_ms"]["median"] == 1020.0
    assert report["heard_mouth_to_ear_p90_ms"] == 1080.0
    assert report[numbers.BARGE_KEY] == doc["turns"][2]["barge_in"]["heard_after_onset_ms"]
    assert report["heard_minus_reported_ms"] == doc["summary"]["heard_minus_reported_ms"]["median"]


def test_key_numbers_of_an_agent_that_reported_nothing_are_null(tmp_path: Path) -> None:
    out = Path(shutil.copytree(FIXTURES / "sample_run", tmp_path / "a"))
    build(out, Plan(otlp=False, barge_in_turns=()))
    report = keynumbers.build_report(out)
    assert report["heard_minus_reported_ms"] is None and report[numbers.BARGE_KEY] is None
    assert report[numbers.HEARD_KEY] == 1020.0


def test_turns_that_differ_are_not_the_machines_noise(tmp_path: Path) -> None:
    """Gaps of 1 s and 2.5 s in one call are two lines answered differently, not a noisy machine."""
    from voice_llm.core.analysis import noise

    out = Path(shutil.copytree(FIXTURES / "sample_run", tmp_path / "a"))
    build(out, Plan(reported_ms=(900.0, 2400.0, 1000.0, 1500.0)))
    found = metrics.measure_all(out)[numbers.HEARD_KEY]
    assert found.spread and found.spread > noise.SPREAD_LIMIT
    reasons = noise.assess(out)["reasons"]  # the sample run's load may be a reason; the turns' spread is not
    assert not any("heard mouth-to-ear" in reason for reason in reasons), reasons


def test_a_null_summary_block_is_a_null_key_number(tmp_path: Path) -> None:
    """LINE.md lets dial.json write `summary.heard_minus_reported_ms: null` when the agent reported nothing: the key
    number is then null, and report.json is still written."""
    out = Path(shutil.copytree(FIXTURES / "sample_run", tmp_path / "a"))
    build(out, Plan(otlp=False))
    doc = load(out)
    doc["summary"]["heard_minus_reported_ms"] = None
    save(out, doc)
    report = keynumbers.build_report(out)
    assert report["heard_minus_reported_ms"] is None and report[numbers.HEARD_KEY] == 1020.0
