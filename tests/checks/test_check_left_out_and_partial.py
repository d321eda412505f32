"""Round 4 (issue 31) on `check`: the exact bad inputs found by adversarial testing, each giving its one line and
exit status, the folder left as it was.

- item 4: a step present in the folder whose capability is left out gives N/C lines, never silence (dial, tts);
- item 10: ``"schema_version": null`` is refused; only a missing key means a file from before versions;
- item 19: after Ctrl-C, a step not run is N/C (not FAIL), no line names an exception class, and a folder that
  holds only the complete streams an interrupted `sentence` kept as raw/*.sse.partial is a run folder where nothing
  finished (refused in one line, as an empty one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from checkfolders import FIXTURES, SAMPLE_AUDIO, clean_run, dial_alone, planned_by_step, read, reseal, write

from voice_llm.core import registry
from voice_llm.core.checks.base import FAIL, NOT_CHECKABLE, PASS
from voice_llm.core.checks.core import run_checks
from voice_llm.cli import main as cli
from voice_llm.capabilities.dial import CAPABILITY as DIAL
from voice_llm.core.errors import ArtifactError
from voice_llm.capabilities.speak import CAPABILITY as TTS

SAMPLE_OUT = FIXTURES / "sample_out"


def _snapshot(out: Path) -> dict[str, bytes]:
    return {path.relative_to(out).as_posix(): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}


def _check(out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    status = cli.main(["check", str(out)])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err




# --- item 4: a capability left out never checks in silence -----------------------------------------------------


def test_a_converse_step_checked_without_dial_gives_na_lines_not_silence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out = dial_alone(tmp_path / "out")
    doc = read(out, "dial.json")
    doc["turns"][0]["heard"]["gap_ms"] = -250.0  # the tampered copy: a negative gap
    write(out, "dial.json", doc)
    reseal(out, "dial.json")
    before = _snapshot(out)
    monkeypatch.setenv(registry.WITHOUT_ENV, "dial")
    status, lines, err = _check(out, capsys)
    left_out = [line for line in lines if line.startswith("N/C   dial:")]
    # the checks of the step that ran (converse), each once
    assert len(left_out) == len([e for e in DIAL.checks if e.step == "converse"]), lines
    assert all("not checkable: capability dial left out" in line for line in left_out), left_out
    assert not [line for line in lines if line.startswith("PASS  dial")]
    assert status == cli.EXIT_OK and err == ""  # nothing failed: not checkable is said, never passed
    assert _snapshot(out) == before


def test_tts_left_out_names_the_speak_checks_and_dial_with_it(tmp_path: Path) -> None:
    out = Path(shutil.copytree(SAMPLE_OUT, tmp_path / "out"))
    shutil.copy(SAMPLE_AUDIO, out / "audio.json")  # a folder without run.json: the speak step's file is there
    with registry.without("tts"):
        results = run_checks(out)
    for entry in TTS.checks:
        found = next(r for r in results if r.name == entry.name)
        assert found.status == NOT_CHECKABLE and "capability tts left out" in found.detail, found
    dial = [r for r in results if r.name.startswith("dial:")]
    # dial requires tts and the agent (whose settings its converse step hands over), which requires tts too
    assert dial and all(r.status == NOT_CHECKABLE and "left out with tts, agent, which it requires" in r.detail
                        for r in dial), dial
    # a folder without run.json: dial's checks apply by dial.json, registered for two steps (dial, converse), each
    # named once, and no step of it is said to be unchecked
    assert len(dial) == len({r.name for r in dial}) == len([e for e in DIAL.checks if e.step == "dial"])
    assert not [r for r in results if r.name.endswith(": its files")]
    with registry.without("dial"):  # with tts: the same folder's speak checks run
        assert any(r.name == TTS.checks[0].name and "left out" not in r.detail for r in run_checks(out))


def test_a_left_out_capability_whose_step_has_no_check_still_gets_a_line(tmp_path: Path) -> None:
    out = dial_alone(tmp_path / "out")
    with registry.without("dial"):
        results = run_checks(out)
    # Every dial check of the converse step is named N/C; no separate line for the step, which its checks cover.
    assert not [r for r in results if r.name == "converse: its files"]
    with registry.without("call"):  # a call that ran with its capability left out is said too
        run = read(out, "run.json")
        run["steps"].append({"step": "call", "wall_ms": 1.0, "server_compute_ms": 0.0})
        run["steps_planned"].append("call")
        run["artifacts_by_step"]["call"] = ["call.json"]
        run["expected_artifacts"].append("call.json")
        write(out, "run.json", run)
        lines = {r.name: r for r in run_checks(out) if "capability call left out" in r.detail}
    assert {name for name in lines if name.startswith("call:")} and all(
        r.status == NOT_CHECKABLE for r in lines.values())


# --- item 10: schema_version null is refused -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["run.json", "dial.json"])
def test_a_null_schema_version_is_refused_in_one_line(tmp_path: Path, name: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = dial_alone(tmp_path / "out")
    doc = read(out, name)
    doc["schema_version"] = None
    write(out, name, doc)
    before = _snapshot(out)
    status, lines, err = _check(out, capsys)
    assert status == cli.EXIT_FAILURE and lines == []
    assert err.strip() == f"voice-llm check: {name} states schema_version null, not a version voice-llm knows", err
    assert _snapshot(out) == before
    assert cli.main(["report", "--out", str(out)]) == cli.EXIT_FAILURE  # report refuses it too, writing nothing
    assert "schema_version null" in capsys.readouterr().err
    assert _snapshot(out) == before


def test_a_null_schema_version_in_one_row_of_a_list_artifact_is_refused(tmp_path: Path) -> None:
    out = clean_run(tmp_path / "out")
    rows = read(out, "prefill.json")
    rows[1]["schema_version"] = None
    write(out, "prefill.json", rows)
    with pytest.raises(ArtifactError, match="prefill.json states schema_version null"):
        run_checks(out)


def test_only_a_missing_key_is_an_old_file(tmp_path: Path) -> None:
    out = clean_run(tmp_path / "out")
    doc = read(out, "ttft.json")
    doc.pop("schema_version", None)
    write(out, "ttft.json", doc)
    reseal(out, "ttft.json")
    assert not [r for r in run_checks(out) if r.status == FAIL]


# --- item 19: after Ctrl-C ---------------------------------------------------------------------------------------


def _interrupted_lab(out: Path, failure: str = "interrupted") -> Path:
    """A lab stopped by Ctrl-C during prefill, as the run session records it (failure "interrupted"): health, sse
    and ttft finished, prefill's file was never written, the steps after it never ran."""
    clean_run(out)
    planned_by_step(out)
    run = read(out, "run.json")
    for name in ("prefill.json", "cache.json", "sentence.json", "cancel.json", "report.json"):
        (out / name).unlink()
        run["artifacts"].pop(name, None)
    run["steps"] = [s for s in run["steps"] if s["step"] in ("health", "sse", "ttft")]
    run.update(failed_step="prefill", failure=failure)
    write(out, "run.json", run)
    return out


def test_an_interrupted_lab_is_not_checkable_where_it_stopped_and_names_no_exception(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _interrupted_lab(tmp_path / "out")
    before = _snapshot(out)
    status, lines, err = _check(out, capsys)
    assert not [line for line in lines if line.startswith("FAIL")], lines
    assert not [line for line in lines if "Error:" in line], lines
    finished = next(line for line in lines if "the run finished every step" in line)
    assert finished.startswith("N/C") and "interrupted during step prefill" in finished, finished
    not_run = next(line for line in lines if "planned steps not run" in line)
    assert "prefill, cache, sentence, cancel, report" in not_run and "prefill was interrupted" in not_run
    assert status == cli.EXIT_OK and err == ""
    assert _snapshot(out) == before


def test_a_step_that_failed_for_another_reason_still_fails(tmp_path: Path) -> None:
    out = _interrupted_lab(tmp_path / "out", failure="StreamError: the server closed the stream")
    results = {r.name: r for r in run_checks(out)}
    assert results["the run finished every step"].status == FAIL
    files = results["files present and well-formed"]
    assert files.status == FAIL and "prefill.json" in files.detail
    # A check of the failed step: FAIL, said in words, never an exception's class name.
    prefill = results["prefill: first token grows 0 -> 4 -> 12 docs"]
    assert prefill.status == FAIL and prefill.detail.startswith("cannot check: prefill.json is missing")
    assert "ArtifactError" not in prefill.detail


def test_a_malformed_field_is_said_in_words(tmp_path: Path) -> None:
    out = clean_run(tmp_path / "out")
    doc = read(out, "ttft.json")
    del doc["runs"]
    write(out, "ttft.json", doc)
    reseal(out, "ttft.json")
    ttft = next(r for r in run_checks(out) if r.name == "ttft < total, medians right")
    assert ttft.status == FAIL and ttft.detail == "cannot check: ttft.json has no field 'runs'"


def test_an_interrupted_sentence_that_kept_its_streams_is_a_run_folder_where_nothing_finished(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to check there (tests/checks/test_check_nothing_to_check.py: the same line and status as an empty
    folder's), but no "not a run folder" either: the kept streams are named as evidence."""
    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    stream = (FIXTURES / "sample_run" / "sse_raw.txt").read_bytes()  # a complete answer, as the step's streams are
    for n in (1, 2, 3):
        (out / "raw" / f"sentence-{n}.sse.partial").write_bytes(stream)
    before = _snapshot(out)
    status, lines, err = _check(out, capsys)
    assert "not a run folder" not in err and lines == [], err
    assert err.startswith(f"voice-llm check: nothing to check in {out}: no step finished there"), err
    assert "3 streams a stopped request kept: raw/sentence-1.sse.partial" in err and len(err.splitlines()) == 1
    assert status == cli.EXIT_FAILURE
    assert _snapshot(out) == before


def test_a_folder_of_something_else_is_still_not_a_run_folder(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "draft.partial").write_text("x")  # a .partial of another tool, not a kept stream in raw/
    status, lines, err = _check(tmp_path, capsys)
    assert status == cli.EXIT_FAILURE and "not a run folder" in err and lines == []


def test_the_sample_lab_still_passes(tmp_path: Path) -> None:
    out = clean_run(tmp_path / "out")
    results = run_checks(out)
    assert not [r for r in results if r.status == FAIL] and sum(r.status == PASS for r in results) > 10
    assert json.loads((out / "run.json").read_text())["failed_step"] is None
