"""report.html and compare.html whatever the data: an empty, all-null or NaN step is a section that says "no data"
with the reason; a section whose drawing raises is named in one line after the page is written (exit 4), every
JSON artifact untouched. No server: folders are built from tests/fixtures."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from voice_llm.cli import main as cli
from voice_llm.core.report import page as report_html
from voice_llm.core.util.artifacts import AUDIO, CACHE, CANCEL, PREFILL, REPORT_HTML, SENTENCE, TTFT
from voice_llm.core.errors import ReportIncompleteError
from voice_llm.core.report.page import render_report

FIXTURES = Path(__file__).parents[1] / "fixtures"
SAMPLE_AUDIO = FIXTURES / "sample_audio" / "audio.json"


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A private copy of a whole run (run.json and every lab artifact), with the speak step's audio.json."""
    out = Path(shutil.copytree(FIXTURES / "sample_run", tmp_path / "out"))
    audio = json.loads(SAMPLE_AUDIO.read_text())
    audio["run_id"] = json.loads((out / "run.json").read_text())["run_id"]  # one run: require_one_run agrees
    (out / AUDIO).write_text(json.dumps(audio))
    return out


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")  # NaN is written as the bare NaN json.loads accepts


def section(page: str, name: str) -> str:
    start = page.index(f'<section id="section-{name}">')
    return page[start: page.index("</section>", start)]


def no_data(page: str, name: str) -> str:
    """The section says "no data: <reason>" and draws no chart; return the reason."""
    found = section(page, name)
    assert "<figure" not in found, found
    match = re.search(r'<p class="missing">no data: ([^<]+)</p>', found)
    assert match, found
    return match.group(1)


def test_empty_steps_render_no_data_with_the_reason(out: Path) -> None:
    edit(out / TTFT, lambda d: d.update(runs=[], ttft_p50=None, total_p50=None))
    (out / PREFILL).write_text("[]", encoding="utf-8")
    edit(out / AUDIO, lambda d: d.update(strategies={}))
    page = render_report(out, None).read_text()
    assert "ttft.json runs is an empty list" in no_data(page, "ttft")
    assert "prefill.json is an empty list" in no_data(page, "prefill")
    for name in ("speak", "firstaudio"):
        assert "audio.json has no strategy" in no_data(page, name)
    for chart in ("chart-sentence", "chart-cache", "chart-cancel"):  # the other steps still draw
        assert f'id="{chart}"' in page


def test_all_null_steps_render_no_data(out: Path) -> None:
    # What a step whose every attempt failed leaves: nulls where the numbers go.
    edit(out / CACHE, lambda d: d["first"].update(ttft_ms=None))
    edit(out / SENTENCE, lambda d: d.update(ttft_ms=None))
    edit(out / CANCEL, lambda d: d.update(closed_at_ms=None))
    edit(out / AUDIO, lambda d: [run.update(ttfa_ms=None) for e in d["strategies"].values() for run in e["runs"]])
    page = render_report(out, None).read_text()
    assert "&#x27;ttft_ms&#x27; is null" in no_data(page, "cache")
    assert "&#x27;ttft_ms&#x27; is null" in no_data(page, "sentence")
    assert "&#x27;closed_at_ms&#x27; is null" in no_data(page, "cancel")
    assert "&#x27;ttfa_ms&#x27; is null" in no_data(page, "speak")
    assert "could not be drawn" not in page


def test_nan_values_render_no_data(out: Path) -> None:
    edit(out / TTFT, lambda d: d.update(ttft_p50=math.nan))
    edit(out / AUDIO, lambda d: [e["summary"]["ttfa_ms"].update(median=math.nan) for e in d["strategies"].values()])
    edit(out / AUDIO, lambda d: [e.update(runs=[]) for name, e in d["strategies"].items() if name == "whole"])
    assert "NaN" in (out / TTFT).read_text()
    page = render_report(out, None).read_text()
    assert "&#x27;ttft_p50&#x27; is nan, not a measurement" in no_data(page, "ttft")
    assert "strategy whole has no run" in no_data(page, "firstaudio")


def test_zero_length_times_draw_without_warnings(out: Path, recwarn: pytest.WarningsRecorder) -> None:
    edit(out / SENTENCE, lambda d: d.update(ttft_ms=0, total_ms=0, first_sentence_ms=None,
                                            smart_first_sentence_ms=None, chunks=[]))
    edit(out / CANCEL, lambda d: d.update(closed_at_ms=0, slot_idle_after_ms=None, chunks=[]))
    page = render_report(out, None).read_text()
    assert 'id="chart-sentence"' in page and 'id="chart-cancel"' in page
    assert not [w for w in recwarn if "singular" in str(w.message)]  # no zero-width axis


def _raise(doc):
    raise RuntimeError("a bug in the ttft chart")


def _snapshot(out: Path) -> dict[str, bytes]:
    """Every measurement's JSON (not report.json and run.json, which the report step itself writes)."""
    return {p.name: p.read_bytes() for p in out.iterdir() if p.suffix == ".json" and p.name not in ("report.json", "run.json")}


def test_a_renderer_that_raises_names_itself_after_the_page(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_html, "CORE_SECTIONS", tuple(
        dataclasses.replace(s, builder=_raise) if s.name == "ttft" else s for s in report_html.CORE_SECTIONS))
    before = _snapshot(out)
    with pytest.raises(ReportIncompleteError) as caught:
        render_report(out, None)
    assert caught.value.failures == (("ttft", "RuntimeError: a bug in the ttft chart"),)
    page = (out / REPORT_HTML).read_text()  # the page is written, with every other chart
    assert "could not be drawn: RuntimeError: a bug in the ttft chart" in section(page, "ttft")
    assert 'id="chart-prefill"' in page and 'id="chart-speak"' in page
    assert _snapshot(out) == before


def test_the_report_command_says_it_in_one_line_and_exits_4(out: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(report_html, "CORE_SECTIONS", tuple(
        dataclasses.replace(s, builder=_raise) if s.name == "ttft" else s for s in report_html.CORE_SECTIONS))
    before = _snapshot(out)
    status = cli.main(["report", "--out", str(out), "-q"])
    err = capsys.readouterr().err
    assert status == cli.EXIT_REPORT_INCOMPLETE == 4
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"voice-llm report: {out / REPORT_HTML} was written, but 1 section(s) could not be drawn")
    assert "ttft: RuntimeError: a bug in the ttft chart" in err
    assert (out / "report.json").is_file()  # the step's own artifact is written before the page
    assert json.loads((out / "report.json").read_text())["ttft_p50_ms"] is not None
    assert json.loads((out / "run.json").read_text())["steps"][-1]["step"] == "report"  # the run recorded it
    assert _snapshot(out) == before


def test_a_raising_header_part_is_one_section_not_a_crash(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(out: Path) -> str:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(report_html, "_capabilities_html", broken)
    with pytest.raises(ReportIncompleteError, match="capabilities: ZeroDivisionError"):
        render_report(out, None)
    assert 'id="chart-ttft"' in (out / REPORT_HTML).read_text()


def _lab_that_saved_everything_but_one_chart(out: Path):
    def run_lab(settings, progress=None, notify=None):
        # What run_lab leaves when the page's ttft chart raises: every artifact saved, then the page, then this.
        assert settings.out == out
        raise ReportIncompleteError(out / REPORT_HTML, (("ttft", "RuntimeError: a bug in the ttft chart"),))
    return run_lab


@pytest.mark.parametrize("checks_pass", [True, False])
def test_the_lab_prints_its_summary_then_the_one_line(out: Path, checks_pass: bool, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "run_lab", _lab_that_saved_everything_but_one_chart(out))
    if checks_pass:
        monkeypatch.setattr(cli, "run_checks", lambda folder: [])
    status = cli.main(["lab", "--url", "http://127.0.0.1:9", "--out", str(out), "-q"])
    captured = capsys.readouterr()
    assert "first token" in captured.out and f"report: {out / REPORT_HTML}" in captured.out  # the summary
    counts = re.search(r"^(\d+) passed, .*?(\d+) failed", captured.out, re.M)
    assert counts and (counts.groups() == ("0", "0") if checks_pass else int(counts.group(2)) > 0), captured.out
    errors = [line for line in captured.err.splitlines() if line.startswith("voice-llm lab:")]
    assert errors == [captured.err.strip().splitlines()[-1]] and "ttft: RuntimeError" in errors[0]
    assert "Traceback" not in captured.err
    # A failed check is the more important news; otherwise the status says the page is incomplete.
    assert status == (cli.EXIT_REPORT_INCOMPLETE if checks_pass else cli.EXIT_CHECKS_FAILED)
