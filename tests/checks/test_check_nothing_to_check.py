"""A folder with nothing to check (newcomer walkthrough, items 1, 2 and 5): `check` and `report` refuse it in the same
one line with the same status (1, an error: there is no run to pass or fail), and `report` writes nothing; a
failed dial's folder says the call failed and where its partial evidence is, once, not a FAIL per dial check."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
from checkfolders import FIXTURES, dial_alone, read, reseal, write
from fakeserver import free_port

from voice_llm.cli import main as cli
from voice_llm.core.checks.base import FAIL, NOT_CHECKABLE
from voice_llm.core.checks.core import run_checks
from voice_llm.core.errors import EXIT_CHECKS_FAILED, EXIT_FAILURE
from voice_llm.core.run.lock import LOCK_NAME


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _folder(kind: str, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    if kind == "missing":
        return out
    out.mkdir()
    if kind == "lock only":  # what a refused run into a new OUT can leave
        (out / LOCK_NAME).write_text("")
    if kind == "kept streams":  # a Ctrl-C in `voice-llm sentence` into an empty OUT
        (out / "raw").mkdir()
        (out / "raw" / "sentence-1.sse.partial").write_bytes((FIXTURES / "sample_run" / "sse_raw.txt").read_bytes())
    return out


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = cli.main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("kind", ["missing", "empty", "lock only", "kept streams"])
def test_check_and_report_refuse_a_folder_with_nothing_to_check_alike(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _folder(kind, tmp_path)
    before = _snapshot(tmp_path)
    said = {}
    for command in ("check", "report"):
        status, stdout, err = _run(capsys, command, "--out", str(out), *(["-q"] if command == "report" else []))
        assert status == EXIT_FAILURE and stdout == "", (command, status, stdout, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"voice-llm {command}: "), err
        said[command] = lines[0].removeprefix(f"voice-llm {command}: ")
        assert _snapshot(tmp_path) == before  # nothing written: no report.json, report.html nor run.json
        assert out.exists() == (kind != "missing")
    assert said["check"] == said["report"]
    expected = (f"no artifact folder at {out}" if kind == "missing" else
                f"nothing to check in {out}: no step finished there (no run.json, no step's file)")
    assert said["check"].startswith(expected), said
    if kind == "kept streams":  # the evidence a stopped step kept is named, never read as a result
        assert "1 stream a stopped request kept: raw/sentence-1.sse.partial (" in said["check"]


def test_a_folder_of_something_else_is_still_not_a_run_folder(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "notes.txt").write_text("not a stream a step kept")
    for command in ("check", "report"):
        status, _, err = _run(capsys, command, "--out", str(tmp_path))
        assert status == EXIT_FAILURE and "holds no voice-llm artifact" in err and "not a run folder" in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["notes.txt", "raw"]


def _tone_wavs(folder: Path) -> Path:
    folder.mkdir(parents=True)
    body = np.where((np.arange(3200) // 32) % 2 == 0, 8000, -8000).astype("<i2")
    with wave.open(str(folder / "turn-01.wav"), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(body.tobytes())
    return folder


def test_a_dial_that_never_connected_says_so_and_check_says_the_call_failed_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    status, _, err = _run(capsys, "dial", f"ws://127.0.0.1:{free_port()}/", "--out", str(out), "--quiet",
                          "--caller-audio", str(_tone_wavs(tmp_path / "wavs")), "--turns", "1",
                          "--barge-in-turns", "none", "--stt", "none")
    assert status == EXIT_FAILURE and len(err.splitlines()) == 1, err
    assert "nothing answers at" in err and "it never connected: nothing was sent or heard; the bytes so far kept " \
        f"in {out / 'dial-partial.json'} and {out / 'dial' / 'partial-call.wav'}" in err, err
    assert "the call so far" not in err
    results = run_checks(out)
    failed = [r for r in results if r.status == FAIL]
    # the run's failure, said once; no check of the dial.json the failure kept from being written
    assert [r.name for r in failed] == ["the run finished every step"], results
    assert "never connected" in failed[0].detail
    dial = [r for r in results if r.name.startswith("dial")]
    assert len(dial) == 1 and dial[0].status == NOT_CHECKABLE, dial
    assert dial[0].detail.startswith("step dial failed (see \"the run finished every step\"); what it had until "
                                     "then is in dial-partial.json, dial/partial-call.wav (44 bytes), "
                                     "dial/partial-events.jsonl (0 bytes); its 17 checks need dial.json"), dial[0]
    status, stdout, _ = _run(capsys, "check", str(out))
    assert status == EXIT_CHECKS_FAILED and len(stdout.splitlines()) == 5, stdout  # 4 lines and the count


def test_a_dial_that_failed_beside_an_earlier_call_still_checks_that_call(tmp_path: Path) -> None:
    """The partial file alone does not hide checks: an earlier good call's dial.json there is checked as ever."""
    out = dial_alone(tmp_path / "out")
    run = read(out, "run.json")  # the re-run failed: converse is not among the steps that finished
    run.update(steps=[], failed_step="converse", failure="DialError: no reply within 1 s in turn 2")
    write(out, "run.json", run)
    write(out, "dial-partial.json", {"files": {}})
    reseal(out, "dial-partial.json")
    names = [r.name for r in run_checks(out)]
    assert "converse: its checks" not in names and sum(name.startswith("dial:") for name in names) == 17
    (out / "dial.json").unlink()  # without it, the one line (the counter-proof)
    names = [r.name for r in run_checks(out)]
    assert "converse: its checks" in names and not [name for name in names if name.startswith("dial:")]
