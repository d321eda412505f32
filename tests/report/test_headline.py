"""The caller's number first (issue 26.6): report.html opens with one line, "the caller hears the assistant N ms
after they stop talking (median, p90)", above the noise warning and the tables, drawn from the key numbers a
capability marks as the headline (dial's heard mouth-to-ear: the lab's converse step, dial against voice-llm's agent,
or `voice-llm dial`). No server: folders from tests/fixtures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from voice_llm.core import registry
from voice_llm.core.analysis import keynumbers
from voice_llm.core.analysis.keynumbers import KeyNumber
from voice_llm.core.report.page import SUBTITLE, render_report
from voice_llm.core.util.artifacts import DIAL, DIAL_DIR

TESTS = Path(__file__).resolve().parents[1]
SAMPLE_RUN = TESTS / "fixtures" / "sample_run"
SAMPLE_OUT = TESTS / "fixtures" / "sample_out"  # its dial.json and dial/: a real converse call (dial + agent)


@pytest.fixture()
def lab(tmp_path: Path) -> Path:
    return Path(shutil.copytree(SAMPLE_RUN, tmp_path / "out"))


@pytest.fixture()
def called(lab: Path) -> Path:
    """The lab's folder with a converse call in it (sample_out's real call), joined to its run."""
    doc = json.loads((SAMPLE_OUT / DIAL).read_text())
    doc["run_id"] = json.loads((lab / "run.json").read_text())["run_id"]
    doc["summary"]["heard_gap_ms"] = {"median": 1432.4, "p90": 1890.6, "n": 2}
    (lab / DIAL).write_text(json.dumps(doc))
    shutil.copytree(SAMPLE_OUT / DIAL_DIR, lab / DIAL_DIR)
    return lab


def test_the_headline_is_the_marked_key_numbers(called: Path) -> None:
    found = keynumbers.headline(called)
    assert (found.source, found.median_ms, found.p90_ms) == (DIAL, 1432.4, 1890.6)
    assert found.sentence() == ("The caller hears the assistant 1432 ms after they stop talking (median; p90 1891 ms "
                                "over 2 turns).")
    marked = [(k.key, k.headline) for k in keynumbers.all_key_numbers() if k.headline]
    assert marked == [("heard_mouth_to_ear_ms", "median"), ("heard_mouth_to_ear_p90_ms", "p90")]


def test_a_run_without_the_call_says_what_measures_it(lab: Path) -> None:
    assert keynumbers.headline(lab).sentence() == \
        "The caller's number (mouth to ear) was not measured in this run (`voice-llm converse` measures it)."
    with registry.without("dial"):
        assert "measured by no registered capability" in keynumbers.headline(lab).sentence()


def test_an_impossible_value_is_not_a_headline(called: Path) -> None:
    doc = json.loads((called / DIAL).read_text())
    doc["summary"]["heard_gap_ms"]["median"] = -3
    (called / DIAL).write_text(json.dumps(doc))
    found = keynumbers.headline(called)
    assert found.median_ms is None and "cannot be read" in found.sentence() and "-3" in found.sentence()


def test_any_capability_can_mark_the_headline(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism is the flag, not dial: a number another artifact holds is taken the same way, the first
    registered one the run measured."""
    (lab / "other.json").write_text(json.dumps({"heard": {"p50": 880.0, "p90": 1200.0}}))
    numbers = (KeyNumber("heard_ms", "heard", "ms", "other.json", ("heard", "p50"), optional=True, headline="median"),
               KeyNumber("heard_p90_ms", "heard p90", "ms", "other.json", ("heard", "p90"), optional=True, headline="p90"))
    monkeypatch.setattr(keynumbers, "all_key_numbers", lambda: (*keynumbers.CORE_KEY_NUMBERS, *numbers))
    found = keynumbers.headline(lab)
    assert (found.source, found.median_ms, found.p90_ms) == ("other.json", 880.0, 1200.0)


def test_the_page_opens_with_it_above_the_noise_warning_and_the_tables(called: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from voice_llm.core.report import page as report_page

    monkeypatch.setattr(report_page, "sections", lambda: ())  # the header alone: no chart is drawn (fast)
    page = render_report(called).read_text()
    line = '<p class="headline" id="headline">The caller hears the assistant 1432 ms after they stop talking'
    assert line in page
    head = page.index(line)
    assert page.index(SUBTITLE.split(",")[0]) < head < page.index('id="section-noise"') < page.index("<table")
    assert "first whole sentence arrive" not in page
