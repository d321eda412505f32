"""Faults of what the user hands in: the KB folder, the output folder, a run interrupted half-way, and a folder
left incomplete by such a run. Each test asserts the message and that nothing already saved was lost."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from voice_llm.core.util import artifacts
from voice_llm.core.util.artifacts import write_bytes_atomic, write_json
from voice_llm.core.errors import KnowledgeBaseError
from voice_llm.core.scenario.kb import load_kb

from conftest import RunningServer, free_port
from clihelpers import WITHOUT_THE_CALL, assert_clean_failure, cli, make_kb

WAIT_S = 240.0





@pytest.fixture
def dead_url() -> str:
    """Nothing listens here: a step that got past its input checks would fail with 'connection refused'."""
    return f"http://127.0.0.1:{free_port()}"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------------------------
# 6a. The KB folder: missing, empty, too few documents, a document that is not UTF-8 or not readable
# ---------------------------------------------------------------------------------------------------------------


def _bad_kb(kind: str, tmp_path: Path) -> tuple[Path, list[str]]:
    kb = tmp_path / "kb"
    if kind == "missing":
        return kb, ["KB folder not found", str(kb)]
    if kind == "empty":
        kb.mkdir()
        (kb / "notes.txt").write_text("not markdown\n")
        return kb, [f"KB folder {kb} has no *.md documents"]
    if kind == "too-few":
        make_kb(kb, 11)
        return kb, [f"KB folder {kb} has 11 *.md documents; the lab needs 12"]
    if kind == "latin-1":
        make_kb(kb)
        bad = kb / "07-doc.md"
        bad.write_bytes(b"\xe9t\xe9 \xe0 la clinique\n")
        return kb, [f"KB document {bad} is not UTF-8 text (byte 0)"]
    if kind == "unreadable":
        make_kb(kb)
        (kb / "05-doc.md").unlink()
        (kb / "05-doc.md").symlink_to(tmp_path / "gone.md")  # a dangling link
        return kb, [f"cannot read KB document {kb / '05-doc.md'}", "No such file"]
    if kind == "a-file":
        kb.write_text("# one document\n")
        return kb, ["KB folder not found", str(kb)]
    raise AssertionError(kind)


KB_FAULTS = ["missing", "empty", "too-few", "latin-1", "unreadable", "a-file"]


@pytest.mark.parametrize("kind", KB_FAULTS)
def test_bad_kb_folder_in_the_library(kind: str, tmp_path: Path) -> None:
    kb, needles = _bad_kb(kind, tmp_path)
    with pytest.raises(KnowledgeBaseError) as caught:
        load_kb(kb)
    for needle in needles:
        assert needle in str(caught.value)


@pytest.mark.parametrize("kind", KB_FAULTS)
@pytest.mark.parametrize("command", ["prefill", "cache", "lab"])
def test_bad_kb_folder_on_the_command_line(command: str, kind: str, tmp_path: Path, env: dict[str, str],
                                           dead_url: str) -> None:
    kb, needles = _bad_kb(kind, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "prefill.json").write_text('[{"docs": 0}]\n')
    before = _snapshot(out)
    # The KB is checked before any request: the dead URL is never reached, so the message is about the KB
    # (for `lab` too, before it would spend minutes on the first steps).
    result = cli(command, "--url", dead_url, "--kb", str(kb), "--out", str(out), "-q", env=env)
    err = assert_clean_failure(result, *needles)
    assert "connection refused" not in err
    assert _snapshot(out) == before


# ---------------------------------------------------------------------------------------------------------------
# 6b. OUT not writable
# ---------------------------------------------------------------------------------------------------------------


def _bad_out(kind: str, tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """OUT that cannot be a folder, and what the one line must say of it (a file in the way is named)."""
    if kind == "under-a-file":
        (tmp_path / "afile").write_text("x\n")
        out = tmp_path / "afile" / "sub"
        return out, (f"cannot use {out} as the output folder", f"{tmp_path / 'afile'}, above OUT, is a file")
    if kind == "is-a-file":
        (tmp_path / "out").write_text("x\n")
        out = tmp_path / "out"
        return out, (f"cannot use {out} as the output folder", "OUT is a file, not a folder")
    if kind == "under-proc":
        out = Path("/proc/voice-llm-test/out")
        return out, (f"cannot write to the output folder {out}", "No such file or directory")
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["under-a-file", "is-a-file", "under-proc"])
@pytest.mark.parametrize("command", ["health", "sse", "prefill", "report", "lab"])
def test_output_folder_not_writable(command: str, kind: str, tmp_path: Path, env: dict[str, str],
                                    dead_url: str) -> None:
    out, said = _bad_out(kind, tmp_path)
    if command == "report":  # it reads OUT: no folder there is nothing to report, as `check` says it
        said = (f"no artifact folder at {out}", said[1] if kind != "under-proc" else "nothing to check")
    kb = make_kb(tmp_path / "kb")
    # report reads the files alone: it takes no --url
    args = [command, *(["--url", dead_url] if command != "report" else []), "--out", str(out), "-q"]
    if command in ("prefill", "lab"):
        args += ["--kb", str(kb)]
    result = cli(*args, env=env)
    assert_clean_failure(result, *said)


def test_check_on_a_folder_that_is_not_there(tmp_path: Path, env: dict[str, str]) -> None:
    result = cli("check", str(tmp_path / "nothing"), env=env)
    assert_clean_failure(result, "no artifact folder at", str(tmp_path / "nothing"))


# ---------------------------------------------------------------------------------------------------------------
# 6c. Atomic writes: an interruption at any point leaves the old complete file or the new one, never half
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_an_interrupted_write_keeps_the_earlier_complete_file(where: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "cache.json"
    write_json(target, {"first": {"prompt_n": 2281}})
    before = target.read_bytes()

    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    if where == "write":  # half the bytes reach the temp file, then Ctrl-C
        real_fdopen = os.fdopen

        class HalfWriter:
            def __init__(self, fh) -> None:
                self.fh = fh

            def __enter__(self) -> HalfWriter:
                return self

            def __exit__(self, *exc: object) -> None:
                self.fh.close()

            def write(self, data: bytes) -> None:
                self.fh.write(data[: len(data) // 2])
                self.fh.flush()
                raise KeyboardInterrupt

        monkeypatch.setattr(artifacts.os, "fdopen", lambda fd, mode: HalfWriter(real_fdopen(fd, mode)))
    else:
        monkeypatch.setattr(artifacts.os, where, interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_json(target, {"first": {"prompt_n": 1}, "second": {"prompt_n": 1}})
    monkeypatch.undo()
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["cache.json"]  # no temp file left behind


def test_write_is_atomic_for_every_artifact_writer(tmp_path: Path) -> None:
    # The three writers share one path through write_bytes_atomic and leave no temp file.
    artifacts.write_jsonl(tmp_path / "chunks.jsonl", [{"t_ms": 1.0, "text": "Hi"}])
    write_json(tmp_path / "ttft.json", {"ttft_p50": 1.0})
    write_bytes_atomic(tmp_path / "sse_raw.txt", b"data: [DONE]\n\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunks.jsonl", "sse_raw.txt", "ttft.json"]


# ---------------------------------------------------------------------------------------------------------------
# 6d. Ctrl-C during `lab` on the real server, then `check` on what it left
# ---------------------------------------------------------------------------------------------------------------

SENTINELS = {
    # A previous complete run's later artifacts, with known bytes (ttft.json is the one being redone when the
    # interrupt comes).
    "ttft.json": {"runs": [{"ttft_ms": 40.0 + i, "total_ms": 400.0 + i, "tokens": 12} for i in range(5)],
                  "ttft_p50": 42.0, "total_p50": 402.0},
    "cache.json": {"first": {"prompt_n": 2281, "cache_n": 0, "ttft_ms": 6500.0, "total_ms": 7000.0},
                   "second": {"prompt_n": 1, "cache_n": 2280, "ttft_ms": 21.0, "total_ms": 500.0}},
    "sentence.json": {"ttft_ms": 50.0, "first_sentence_ms": 300.0, "total_ms": 900.0, "first_sentence": "Eat nothing.",
                      "text": "Eat nothing. Drink water. Come early."},
    "cancel.json": {"max_tokens": 256, "received_tokens": 10, "closed_at_ms": 500.0, "slot_idle_after_ms": 9.0},
    "report.json": {"ttft_p50_ms": 1.0},
}


@pytest.mark.server
def test_ctrl_c_during_lab_keeps_complete_files_and_check_names_what_is_missing(
    module_server: RunningServer, tmp_path: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name, value in SENTINELS.items():
        (out / name).write_text(json.dumps(value, indent=1) + "\n")
    sentinels = {name: (out / name).read_bytes() for name in SENTINELS}

    # Without the call: what is tested is an interrupt between steps (the call's own Ctrl-C is dial's test), and a
    # lab with the call first gets its speech engines ready (~40 s of the test on a shared machine).
    env = {**env, **WITHOUT_THE_CALL}
    proc = subprocess.Popen(
        [sys.executable, "-m", "voice_llm", "lab", "--url", module_server.url, "--out", str(out), "-q"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        # Health and sse are done and recorded once the ttft step has opened its first raw stream (chunks.jsonl
        # alone is written a moment before the sse step is recorded in run.json).
        while not list(out.glob("raw/ttft-*")) and proc.poll() is None:
            assert time.monotonic() < deadline, "the lab did not get through its first steps in time"
            time.sleep(0.01)
        assert proc.poll() is None, f"the lab ended before it was interrupted: {proc.communicate()}"
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)

    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert stderr.strip() == "voice-llm lab: interrupted; files already written are complete and kept"
    # The steps that finished wrote complete files; the later sentinels were not touched; nothing half-written.
    for name in ("health.json", "props.json", "sse_raw.txt", "chunks.jsonl", "sse.py"):
        assert (out / name).is_file(), name
    for name, data in sentinels.items():
        assert (out / name).read_bytes() == data, f"{name} was changed by the interrupted run"
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.tmp"))
    for path in out.glob("*.json"):
        json.loads(path.read_text(encoding="utf-8"))
    for line in (out / "chunks.jsonl").read_text(encoding="utf-8").splitlines():
        json.loads(line)
    assert (out / "sse_raw.txt").read_bytes().endswith(b"data: [DONE]\n\n")
    run = json.loads((out / "run.json").read_text())  # the summary says the run did not finish, and where
    assert run["failed_step"] not in (None, "health", "sse")
    assert [step["step"] for step in run["steps"]][:2] == ["health", "sse"]

    # `check` works from the files alone: it fails, and names where the run stopped, the files an earlier run
    # left, and the steps never reached (their relations are not checked: they have no evidence of this run).
    check = cli("check", str(out), env=env)
    assert check.returncode == 3, check.stdout + check.stderr
    assert "Traceback" not in check.stderr
    lines = check.stdout.splitlines()
    # Interrupted is the user's choice, not inconsistent evidence: not checkable, naming the step (issue 31 item 19).
    assert any(line.startswith(f"N/C   the run finished every step: interrupted during step {run['failed_step']}")
               for line in lines), lines
    assert any(line.startswith("FAIL  one run: every file as the run wrote it") and "report.json" in line
               for line in lines), lines
    assert any(line.startswith("N/C   planned steps not run in this folder: ") and "report" in line
               for line in lines), lines
    assert not any(line.startswith("FAIL  report equals its sources") for line in lines), lines
    assert any(line.startswith("PASS  sse_raw") for line in lines), lines
    # The earlier run's ttft.json is not this run's: its relation is not checked on it, neither PASS nor FAIL.
    assert not any(line.startswith(("PASS  ttft < total", "FAIL  ttft < total")) for line in lines), lines
    # check only reads: the run's files are still as they were.
    for name, data in sentinels.items():
        assert (out / name).read_bytes() == data


def copy_sample_out(out: Path) -> Path:
    """A complete, consistent OUT folder (tests/fixtures/sample_out) to damage."""
    out.mkdir()
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "sample_out", out, dirs_exist_ok=True)
    return out


def test_check_names_a_half_written_file_left_by_an_older_tool(tmp_path: Path, env: dict[str, str]) -> None:
    out = copy_sample_out(tmp_path / "out")
    full = (out / "prefill.json").read_bytes()
    (out / "prefill.json").write_bytes(full[: len(full) // 2])  # cut in the middle, as a non-atomic copy would
    (out / "chunks.jsonl").write_bytes(b'{"t_ms": 1.0, "text": "Hi"}\n{"t_ms": 2.0, "te')
    check = cli("check", str(out), env=env)
    assert check.returncode == 3 and "Traceback" not in check.stderr + check.stdout
    assert "prefill.json is not valid JSON" in check.stdout
    # A later step that needs it says which file and what to do, in one line.
    report = cli("report", "--out", str(out), "-q", env=env)
    assert_clean_failure(report, "prefill.json is not valid JSON")


def test_report_step_on_a_folder_missing_earlier_steps(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "ttft.json").write_text(json.dumps({"runs": [], "ttft_p50": 1.0, "total_p50": 2.0}))
    result = cli("report", "--out", str(out), "-q", env=env)
    # A report draws what the folder has (issue 31 item 18): the steps not run are null with the reason, never a
    # refusal of the whole page, never a traceback.
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["ttft_p50_ms"] is None or isinstance(report["ttft_p50_ms"], (int, float))
    assert "prefill.json" in report["unknown"]["ttft_12docs_ms"], report["unknown"]


def test_an_artifact_that_is_a_folder(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    (out / "ttft.json").mkdir(parents=True)
    report = cli("report", "--out", str(out), "-q", env=env)
    assert_clean_failure(report, f"cannot read {out / 'ttft.json'}", "Is a directory")
    check = cli("check", str(out), env=env)
    assert check.returncode == 3 and "Traceback" not in check.stderr + check.stdout
    assert "FAIL  files present and well-formed: missing: health.json" in check.stdout


def test_raw_evidence_folder_blocked_by_a_file(tmp_path: Path, env: dict[str, str]) -> None:
    from fakeshapes import VLLM, ShapedServer

    out = tmp_path / "out"
    out.mkdir()
    (out / "raw").write_text("a file where the raw/ folder goes\n")
    # A server that answers: with nothing at --url, that is the error, before anything is written to OUT.
    with ShapedServer(VLLM) as server:
        result = cli("ttft", "--url", server.url, "--out", str(out), "-q", env=env)
    assert_clean_failure(result, f"cannot create the folder for raw streams {out / 'raw'}: File exists")


def test_any_os_error_becomes_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The last net under every command: a refusal from the machine (disk full, ...) is one line, exit 1."""
    from voice_llm.cli import main as cli_module

    def disk_full(args: object, progress: object) -> int:
        raise OSError(28, "No space left on device", str(tmp_path / "out" / ".ttft.json.x.tmp"))

    monkeypatch.setitem(cli_module.COMMANDS, "check", disk_full)
    assert cli_module.main(["check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"voice-llm check: No space left on device: {tmp_path / 'out' / '.ttft.json.x.tmp'}\n"


NESTED = "[" * 50_000 + "]" * 50_000  # json.loads raises RecursionError on this


def test_read_json_turns_deep_nesting_into_an_artifact_error(tmp_path: Path) -> None:
    from voice_llm.core.errors import ArtifactError

    (tmp_path / "props.json").write_text(NESTED)
    with pytest.raises(ArtifactError, match="props.json is not valid JSON: nested too deeply"):
        artifacts.read_json(tmp_path / "props.json")
    (tmp_path / "chunks.jsonl").write_text('{"t_ms": 1.0, "text": "Hi"}\n' + NESTED + "\n")
    with pytest.raises(ArtifactError, match="chunks.jsonl line 2 is not valid JSON: nested too deeply"):
        artifacts.read_jsonl(tmp_path / "chunks.jsonl")
    with pytest.raises(ArtifactError, match="an event is not valid JSON: nested too deeply"):
        artifacts.loads_json(NESTED, "an event")


def test_check_and_report_on_deeply_nested_artifacts(tmp_path: Path, env: dict[str, str]) -> None:
    out = copy_sample_out(tmp_path / "out")
    (out / "prefill.json").write_text(NESTED)
    (out / "sse_raw.txt").write_text(f"data: {NESTED}\n\n")
    check = cli("check", str(out), env=env)
    assert check.returncode == 3 and "Traceback" not in check.stderr + check.stdout, check.stderr
    assert "RecursionError" not in check.stdout + check.stderr
    assert "prefill.json is not valid JSON: nested too deeply" in check.stdout
    assert "an event in sse_raw.txt is not valid JSON: nested too deeply" in check.stdout
    report = cli("report", "--out", str(out), "-q", env=env)
    assert_clean_failure(report, "prefill.json is not valid JSON: nested too deeply")
