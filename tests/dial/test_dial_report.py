"""dial's report sections on calls built from the contract (tests/dial/dialfolder.py): "the call as heard" (heard
gap per turn with the agent's breakdown and the line's share under it, barge-ins) and the stereo waveform of the
recording; a call with nothing heard is "no data", a malformed or outside file "not available", never a crash."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from dialfolder import Plan, build, load, save

from voice_llm.capabilities.dial import report as dial_report
from voice_llm.core.errors import ArtifactError
from voice_llm.core.report import page, style
from voice_llm.core.run.folder import RunFolder

FIXTURES = Path(__file__).parents[1] / "fixtures"


def svg(chart: style.Chart) -> str:
    with style.drawing():
        return style.figure_svg(chart.figure, "t")


@pytest.fixture()
def call(tmp_path: Path) -> Path:
    return build(tmp_path / "run")


def test_the_call_as_heard(call: Path) -> None:
    doc = load(call)
    chart = dial_report.heard_chart(doc)
    assert chart.caption.startswith("The caller hears the assistant 1,020 ms after they stop talking (median; p90 "
                                    "1,080 ms over 4 turns).")
    assert "The agent's own numbers leave out 70 ms of that (median over 4 turns): the line's share." in chart.caption
    assert "still heard the assistant for 140 ms (median over 1 barge-in)" in chart.caption
    assert "endpoint wait 300 ms" in chart.caption  # the agent's parts, medians
    drawn = svg(chart)
    for text in ("turn 1 heard", "agent's own", "turn 3 barge-in", "960 ms", "+60 ms line", "the line's share"):
        assert text in drawn, text
    assert "heard mouth to ear (median)" in chart.extra_html and "1,020 ms" in chart.extra_html


def test_an_agent_without_numbers_is_said_not_reported(tmp_path: Path) -> None:
    doc = load(build(tmp_path / "run", Plan(otlp=False)))
    chart = dial_report.heard_chart(doc)
    assert "The agent's own numbers were not reported" in chart.caption
    assert "agent's own numbers not reported" in svg(chart)
    assert "not reported" in chart.extra_html


def test_a_breakdown_that_does_not_add_up_is_one_bar(call: Path) -> None:
    doc = load(call)
    doc["turns"][0]["agent_breakdown"] = {"stt": 100.0}  # a foreign agent's partial account
    chart = dial_report.heard_chart(doc)
    assert "agent reported (no breakdown adding up to it)" in svg(chart)


def test_nothing_heard_is_no_data(call: Path) -> None:
    doc = load(call)
    for turn in doc["turns"]:
        turn["heard"]["first_sound_ms"] = turn["heard"]["gap_ms"] = None
    with pytest.raises(style.NoDataError, match="no turn's reply was heard"):
        dial_report.heard_chart(doc)


@pytest.mark.parametrize("change", [lambda d: d.update(turns="x"), lambda d: d["turns"][0].update(heard=[1]),
                                    lambda d: d["summary"].update(heard_gap_ms=None),
                                    lambda d: d["turns"][2]["barge_in"].update(onset_ms="soon")])
def test_malformed_dial_json_is_one_artifact_error(call: Path, change) -> None:
    doc = load(call)
    change(doc)
    with pytest.raises(ArtifactError):
        dial_report.heard_chart(doc)


def test_the_waveform_of_the_recording(call: Path) -> None:
    chart = dial_report.waveform_section(RunFolder(call))
    assert "measured again on this file from its samples alone: 960, 1,020, 1,080, 1,000 ms" in chart.caption
    assert "<svg" in svg(chart)


def test_a_recording_outside_the_folder_is_not_available(call: Path, tmp_path: Path) -> None:
    doc = load(call)
    doc["files"]["call_wav"] = "../elsewhere.wav"
    save(call, doc)
    with pytest.raises(ArtifactError):
        dial_report.waveform_section(RunFolder(call))
    doc["files"]["call_wav"] = "dial/call.wav"
    save(call, doc)
    (call / "dial" / "call.wav").rename(tmp_path / "x.wav")
    (call / "dial" / "call.wav").symlink_to(tmp_path / "x.wav")
    with pytest.raises(ArtifactError):
        dial_report.waveform_section(RunFolder(call))


def test_report_html_draws_both_sections_after_first_audio(tmp_path: Path) -> None:
    out = Path(shutil.copytree(FIXTURES / "sample_run", tmp_path / "run"))
    build(out, Plan())
    doc = load(out)
    run = json.loads((out / "run.json").read_text())
    doc["run_id"] = run["run_id"]
    save(out, doc)
    # the dial step ran in this run, as run.json says of a step that wrote its files (sections of steps not run
    # are left out of the page and named)
    run["steps"].append({"step": "dial", "wall_ms": 1.0, "server_compute_ms": 0.0})
    run["steps_planned"].append("dial")
    (out / "run.json").write_text(json.dumps(run))
    try:
        html = page.render_report(out).read_text()
    except ArtifactError as exc:  # other steps' files absent from the fixture: incomplete is fine here
        html = Path(getattr(exc, "path")).read_text()
    names = [s.name for s in page.sections()]
    assert names.index("firstaudio") < names.index("dial") and names.index("dial-wave") == names.index("dial") + 1
    for name in ("dial", "dial-wave"):
        section = re.search(rf'<section id="section-{name}">(.*?)</section>', html, re.S)
        assert section and "<svg" in section.group(1), name
    assert "The caller hears the assistant 1,020 ms after they stop talking" in html


def test_a_folder_without_a_dial_call_gets_no_dial_section(tmp_path: Path) -> None:
    out = Path(shutil.copytree(FIXTURES / "sample_run", tmp_path / "run"))
    assert dial_report.waveform_section(RunFolder(out)) == ""
    try:
        html = page.render_report(out).read_text()
    except ArtifactError as exc:
        html = Path(getattr(exc, "path")).read_text()
    assert 'id="section-dial"' not in html and 'id="section-dial-wave"' not in html
