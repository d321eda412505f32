"""Evidence files and the server log a step may read, without a server: whose log it is, partial files after an
interrupt, and failed writes that name the file and the step (a full disk is injected, not produced)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from voice_llm.core.checks import core as check
from voice_llm.cli import main as cli
from voice_llm.core.server import lifecycle as server
from voice_llm.core.util import artifacts
from voice_llm.core.run.session import managed_log_for

from conftest import free_port

SAMPLE_OUT = Path(__file__).parents[1] / "fixtures" / "sample_out"


# --- whose log is it ----------------------------------------------------------------------------------------


def write_record(port: int, *, pid: int, start_ticks: int, url: str) -> None:
    record = server.ServerRecord(
        pid=pid, start_ticks=start_ticks, host="127.0.0.1", port=port, url=url, binary="llama-server",
        model="m.gguf", ctx=4096, slots=1, started_at=0.0, api_key_set=False,
    )
    server.port_dir(port).mkdir(parents=True, exist_ok=True)
    artifacts.write_json(server.port_dir(port) / "server.json", asdict(record))


@pytest.fixture
def old_log(state_dir: Path) -> tuple[int, Path]:
    """A port whose state folder holds a log from an earlier server."""
    port = free_port()
    log = server.log_path(port)
    log.parent.mkdir(parents=True)
    log.write_text("srv  log from a server that has since stopped\n")
    return port, log


def test_an_old_log_with_no_record_is_not_read(old_log: tuple[int, Path]) -> None:
    port, _ = old_log
    assert managed_log_for(f"http://127.0.0.1:{port}") is None


def test_an_old_log_of_a_process_that_is_gone_is_not_read(old_log: tuple[int, Path]) -> None:
    port, _ = old_log
    ticks = server._proc_start_ticks(os.getpid())
    assert ticks is not None
    # The pid lives, but it is not the process the record describes (another start time): a reused pid.
    write_record(port, pid=os.getpid(), start_ticks=ticks + 1, url=f"http://127.0.0.1:{port}")
    assert managed_log_for(f"http://127.0.0.1:{port}") is None


def test_the_log_is_read_only_for_the_url_its_server_answers(old_log: tuple[int, Path]) -> None:
    port, log = old_log
    ticks = server._proc_start_ticks(os.getpid())
    assert ticks is not None
    write_record(port, pid=os.getpid(), start_ticks=ticks, url=f"http://127.0.0.1:{port}")
    assert managed_log_for(f"http://127.0.0.1:{port}") == log
    assert managed_log_for(f"http://127.0.0.1:{port}/") == log
    assert managed_log_for(f"http://10.1.2.3:{port}") is None  # another host on the same port number
    assert managed_log_for("http://127.0.0.1") is None
    log.unlink()
    assert managed_log_for(f"http://127.0.0.1:{port}") is None


def test_report_keeps_no_log_of_the_managed_server_running_now(state_dir: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`voice-llm report` asks no server: the managed server answering on its --port now (a record of a living
    process, its log in the state folder) measured nothing of the run in OUT, so its log is not copied there (it
    was, on a machine with `voice-llm up` on 8080: report "writing nothing" wrote server.log)."""
    out = tmp_path / "out"
    shutil.copytree(SAMPLE_OUT, out)
    ticks = server._proc_start_ticks(os.getpid())
    assert ticks is not None
    write_record(8080, pid=os.getpid(), start_ticks=ticks, url="http://127.0.0.1:8080")
    server.log_path(8080).write_text("srv  the log of a server started after this run was made\n")
    assert managed_log_for("http://127.0.0.1:8080") == server.log_path(8080)  # it is the managed server's log
    assert cli.main(["report", "--out", str(out), "-q"]) == cli.EXIT_OK, capsys.readouterr().err
    assert not (out / "server.log").exists()


# --- partial files --------------------------------------------------------------------------------------------


class ScriptedClient:
    """Stands in for ServerClient.chat: writes ``data`` to the raw file, then raises ``error``."""

    def __init__(self, data: bytes, error: BaseException) -> None:
        self.data, self.error = data, error

    def chat(self, messages: Any, max_tokens: int, cache_prompt: bool, *, raw_out: Any, **options: Any) -> Any:
        raw_out.write(self.data)  # the context hands over the .partial file it created (never through a link)
        raise self.error


def request(step_context, client: ScriptedClient) -> Path:  # type: ignore[no-untyped-def]
    ctx = step_context(client=client)
    with pytest.raises(BaseException) as caught:
        ctx.request("prefill-12docs", [{"role": "user", "content": "hi"}])
    assert caught.value is client.error or caught.value.__cause__ is client.error
    return ctx.out / "raw" / "prefill-12docs.sse.partial"


def test_an_interrupt_before_any_byte_leaves_no_empty_partial(tmp_path: Path, step_context) -> None:
    partial = request(step_context, ScriptedClient(b"", KeyboardInterrupt()))
    assert not partial.exists()
    assert list((tmp_path / "raw").iterdir()) == []


def test_an_interrupt_keeps_the_bytes_that_arrived(step_context) -> None:
    partial = request(step_context, ScriptedClient(b"data: {\"choices\"", KeyboardInterrupt()))
    assert partial.read_bytes() == b"data: {\"choices\""


def test_a_full_disk_while_saving_a_stream_names_the_file(tmp_path: Path, step_context) -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    ctx = step_context(client=ScriptedClient(b"data: x", full))
    with pytest.raises(OSError) as caught:
        ctx.request("ttft-1", [{"role": "user", "content": "hi"}])
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(tmp_path / "raw" / "ttft-1.sse.partial")


# --- failed writes name the target and the step -------------------------------------------------------------------


@pytest.fixture
def out(tmp_path: Path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(SAMPLE_OUT, copy)
    return copy


def disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every atomic artifact write fails as on a full disk: the data does not fit when it is flushed."""
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(artifacts.os, "fsync", no_space)


def test_a_full_disk_names_the_file_and_the_step(out: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    before = (out / "report.json").read_bytes()
    disk_full(monkeypatch)
    assert cli.main(["report", "--out", str(out), "-q"]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert err == f"voice-llm report: No space left on device: {out / 'report.json'} (step report)\n"
    assert (out / "report.json").read_bytes() == before  # the complete file that was there is kept
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_disk_that_fills_during_the_lab_marks_the_run_failed(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills after run.json recorded the start: the step's file and run.json's end cannot be written.
    The error names the step's file and the step; run.json still says the run never ended, and check says so."""
    from voice_llm.core.lab import LabSettings, run_lab

    full: list[str] = []

    def fills_up(fd: int) -> None:
        name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        if full or not name.startswith(".run.json."):
            full.append(name)
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(artifacts.os, "fsync", fills_up)
    settings = LabSettings(out=out, url=f"http://127.0.0.1:{free_port()}", steps=("report",), render_html=False)
    with pytest.raises(OSError) as caught:
        run_lab(settings)
    assert caught.value.filename == str(out / "report.json")
    assert "step report" in caught.value.__notes__
    assert "run.json could not be written either: No space left on device" in caught.value.__notes__
    monkeypatch.undo()
    (finished,) = [r for r in check.run_checks(out) if r.name == "the run finished every step"]
    assert finished.status == check.FAIL and "does not record the run's end" in finished.detail


def test_write_bytes_atomic_names_the_target_not_its_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk_full(monkeypatch)
    with pytest.raises(OSError) as caught:
        artifacts.write_json(tmp_path / "cancel.json", {"a": 1})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "cancel.json")
    assert list(tmp_path.iterdir()) == []


def test_report_html_that_is_a_folder_is_named(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (out / "report.html").mkdir()
    assert cli.main(["report", "--out", str(out), "-q"]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.startswith("voice-llm report: cannot replace a folder with a file") and ".tmp" not in err
    assert err.rstrip().endswith(f": {out / 'report.html'}"), err
    assert json.loads((out / "report.json").read_text())  # the step itself wrote its file
