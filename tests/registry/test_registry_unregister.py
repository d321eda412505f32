"""Unregistering a capability removes it cleanly (issue 21's must-show, the check-and-report half): with tts
taken out of the registry, ``check`` on a saved run that ran the speak step runs no audio check and has no error
(each audio check is an N/C line saying the capability is left out, never silence: issue 31 item 4), and
report.html has no audio section, key number or metric. The same folder with tts registered has them all, so the
test shows the registry is what decides (the lab-run half is tests/registry/test_registry_unregister_lab.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from checkfolders import SAMPLE_AUDIO, clean_run, read, reseal, write

from voice_llm.core import registry
from voice_llm.core.analysis import keynumbers, metrics
from voice_llm.core.checks.base import FAIL, NOT_CHECKABLE
from voice_llm.core.checks.core import run_checks
from voice_llm.core.report.page import render_report, sections
from voice_llm.core.util.artifacts import AUDIO


@pytest.fixture
def spoken(tmp_path: Path) -> Path:
    """A saved lab run whose run.json planned and ran the speak step, its audio.json in the manifest."""
    out = clean_run(tmp_path / "out")
    shutil.copy(SAMPLE_AUDIO, out / AUDIO)
    run = read(out, "run.json")
    run["steps_planned"].insert(run["steps_planned"].index("report"), "speak")
    run["expected_artifacts"].append(AUDIO)
    run["steps"].append({"step": "speak", "wall_ms": 1.0, "server_compute_ms": None})
    write(out, "run.json", run)
    reseal(out, AUDIO)
    return out


def _audio_rows(out: Path) -> list[str]:
    """The audio checks that ran (one left out is an N/C line saying so, not a check that ran)."""
    return [r.name for r in run_checks(out) if r.name.startswith("audio:") and "capability tts left out" not in r.detail]


def test_check_without_tts_has_no_audio_rows_and_no_error(spoken: Path) -> None:
    assert len(_audio_rows(spoken)) == 6  # registered: the speak step's six checks run on this folder
    with registry.without("tts"):
        results = run_checks(spoken)
    audio = [r for r in results if r.name.startswith("audio:")]
    assert len(audio) == 6 and all(r.status == NOT_CHECKABLE and "capability tts left out" in r.detail for r in audio)
    assert not [r for r in results if r.status == FAIL], [r for r in results if r.status == FAIL]


def test_report_without_tts_has_no_audio_section(spoken: Path) -> None:
    with registry.without("tts"):
        assert "speak" not in [s.name for s in sections()]
        assert not [m for m in metrics.all_metrics() if m.source == AUDIO]
        assert not [k for k in keynumbers.all_key_numbers() if k.source == AUDIO]
        page = render_report(spoken, None).read_text()
    for needle in ('id="section-speak"', 'id="section-firstaudio"', "first audio"):
        assert needle not in page, needle
    assert 'id="section-sentence"' in page and 'id="section-spread"' in page  # the rest of the page is there

    registered = render_report(spoken, None).read_text()
    assert 'id="section-speak"' in registered and 'id="section-firstaudio"' in registered


def test_a_capability_left_out_by_the_environment_is_out_too(spoken: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.WITHOUT_ENV, "tts")
    assert not _audio_rows(spoken)
    assert [s.name for s in sections()].count("spread") == 1  # the repeats' section stays


def test_without_load_its_checks_and_sections_go_too(spoken: Path) -> None:
    """load's go; call's are call's own (voice_llm.capabilities.conversation registers them), so they stay."""
    with registry.without("load"):
        names = [s.name for s in sections()]
        assert "call" in names and "load" not in names and "speak" in names
        assert not [r for r in run_checks(spoken) if r.name.startswith("load:")]
    with registry.without("call"):
        names = [s.name for s in sections()]
        assert "call" not in names and "load" in names
        assert names.index("load") == names.index("cancel") + 1  # still behind the cancellation section
    names = [s.name for s in sections()]
    assert names.index("cancel") + 1 == names.index("call") == names.index("load") - 1  # the order as before
