"""A malformed capabilities.json is one clear line, never a traceback: in report.html (the `report` step) and in
the lab's terminal summary. No server: a copy of tests/fixtures/sample_run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from voice_llm.cli import main as cli
from voice_llm.core.util.artifacts import CAPABILITIES, REPORT_HTML
from voice_llm.core.report.capability_table import read_capability_rows
from voice_llm.core.errors import ArtifactError

SAMPLE_RUN = Path(__file__).parents[1] / "fixtures" / "sample_run"
MALFORMED = {
    "not JSON": "{\"found\": ",
    "a list": "[1, 2]",
    "found is a list": json.dumps({"found": [1], "inferred": {}}),
    "an endpoint is a number": json.dumps({"found": {"endpoints": {"/health": 200}}, "inferred": {}}),
    "inferred entries are strings": json.dumps({"found": {}, "inferred": {"health": "yes", "model": "m"}}),
}


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return Path(shutil.copytree(SAMPLE_RUN, tmp_path / "out"))


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_file_is_an_artifact_error_naming_it(out: Path, text: str) -> None:
    (out / CAPABILITIES).write_text(text, encoding="utf-8")
    with pytest.raises(ArtifactError, match="capabilities.json"):
        read_capability_rows(out)


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_the_report_step_shows_it_in_its_section(out: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    (out / CAPABILITIES).write_text(text, encoding="utf-8")
    assert cli.main(["report", "--out", str(out), "-q"]) == 0
    assert capsys.readouterr().err == ""
    page = (out / REPORT_HTML).read_text()
    start = page.index('<section id="section-capabilities">')
    found = page[start: page.index("</section>", start)]
    assert '<p class="missing">' in found and "capabilities.json" in found and "could not be drawn" not in found


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_the_lab_summary_says_it_in_one_line(out: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    (out / CAPABILITIES).write_text(text, encoding="utf-8")
    cli._print_findings(out)  # what `voice-llm lab` prints after its steps
    captured = capsys.readouterr()
    assert "first token" in captured.out  # the measurements are still shown
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("server capabilities not shown: capabilities.json"), captured.err


def test_a_good_file_still_gives_its_table(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (out / CAPABILITIES).write_text(json.dumps({"found": {"server_header": "llama.cpp"}, "inferred": {}}))
    cli._print_findings(out)
    captured = capsys.readouterr()
    assert "what this server exposed" in captured.out and "llama.cpp" in captured.out and captured.err == ""
