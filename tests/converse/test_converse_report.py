"""The converse sections of report.html, drawn from a hand-made call (test_converse_checks.build_call) and from
missing or malformed files, which give the section's "no data" / "not available" line, never an exception."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib
import pytest

from voice_llm.report import page as report_html
from voice_llm.report import style
from voice_llm.converse import report

sys.path.insert(0, str(Path(__file__).parent))
from test_converse_checks import build_call  # noqa: E402  (the fixture builder lives beside the checks' tests)


def _render(out: Path) -> str:
    with style.drawing():
        return report.section_html(out)


def test_sections_of_a_call(tmp_path: Path) -> None:
    out = build_call(tmp_path / "run")
    html = _render(out)
    assert html.count("<section") == 2 and html.count("<svg") == 2
    assert 'id="section-converse"' in html and 'id="section-converse-wave"' in html
    doc = json.loads((out / "converse.json").read_text())
    median = doc["summary"]["mouth_to_ear_ms"]["median"]
    row = f"the caller hears the assistant {style.ms(median)} ms after they stop talking"
    assert row in html  # the summary row
    assert "The caller hears the assistant" in html  # and the caption's sentence
    for label in ("endpoint wait", "STT", "prefill", "first segment", "synthesis", "playback", "barges in"):
        assert label in html, label
    assert "measured on this file from the samples alone" in html


def test_a_call_without_barge_in_or_with_preemptive(tmp_path: Path) -> None:
    assert "barges in" not in _render(build_call(tmp_path / "a", barge_turn=None))
    assert _render(build_call(tmp_path / "b", preemptive=True)).count("<svg") == 2


def test_same_files_same_bytes(tmp_path: Path) -> None:
    out = build_call(tmp_path / "run")
    assert _render(out) == _render(out)


def test_missing_converse_json_is_no_data(tmp_path: Path) -> None:
    html = _render(tmp_path)
    assert html.count('class="missing">no data:') == 2 and "converse.json is missing" in html


@pytest.mark.parametrize("content, reason", [
    ("{", "not valid JSON"),
    ("[]", "should be a JSON object"),
    ('{"turns": []}', "empty list"),
    ('{"turns": [{"index": 1, "events": {"speech_start": 1}}]}', "no turn reached"),
    ('{"turns": [{"index": 1, "events": {"speech_start": "x"}}]}', "should be a number"),
    ('{"turns": [{"index": 1}]}', "should be a JSON object"),
])
def test_malformed_converse_json_is_no_data(tmp_path: Path, content: str, reason: str) -> None:
    (tmp_path / "converse.json").write_text(content)
    html = _render(tmp_path)
    assert "<svg" not in html and 'class="missing">' in html
    assert reason in html, html


def test_a_summary_without_numbers_is_no_data(tmp_path: Path) -> None:
    out = build_call(tmp_path / "run")
    doc = json.loads((out / "converse.json").read_text())
    doc["summary"]["mouth_to_ear_ms"]["median"] = None
    (out / "converse.json").write_text(json.dumps(doc))
    assert "no data: converse.json summary mouth_to_ear_ms: &#x27;median&#x27; is null" in _render(out)


def test_a_missing_recording_keeps_the_waterfall(tmp_path: Path) -> None:
    out = build_call(tmp_path / "run")
    (out / "converse" / "call.wav").unlink()
    html = _render(out)
    assert html.count("<svg") == 1 and "not available: call.wav is missing" in html


def test_a_recording_outside_the_folder_is_refused(tmp_path: Path) -> None:
    out = build_call(tmp_path / "run")
    doc = json.loads((out / "converse.json").read_text())
    doc["recording"]["path"] = "../elsewhere.wav"
    (out / "converse.json").write_text(json.dumps(doc))
    html = _render(out)
    assert html.count("<svg") == 1 and "not available" in html


def test_report_html_draws_the_converse_sections(tmp_path: Path) -> None:
    """report.html of a folder holding converse.json has the two sections (converse registers its sections with
    the report)."""
    out = build_call(tmp_path / "run")
    try:
        page = report_html.render_report(out).read_text()
    except Exception as exc:  # noqa: BLE001 - the other sections' files are absent: incomplete is fine here
        path = getattr(exc, "path", None)
        if path is None:
            raise
        page = Path(path).read_text()
    assert 'id="section-converse"' in page
    assert 'id="section-converse-wave"' in page and "the caller hears the assistant" in page


def test_sections_of_the_real_call() -> None:
    data = Path(__file__).parent / "data" / "example"
    if not (data / "converse.json").is_file():
        pytest.skip("no real converse example in tests/converse/data/example")
    html = _render(data)
    assert html.count("<svg") == 2 and "the caller hears the assistant" in html and "barges in" in html
