"""Issue 31 item 14: the lab checks what each planned step needs before its first request (the steps' ``prepare``
hook, voice_llm.core.lab.steps), as the context preflight does: without faster-whisper it fails at once, naming the
step that needs it, instead of running every step before failing at converse. faster-whisper is hidden from the
import system (a None in sys.modules is "not installed" to importlib); the speak step's own need (its Piper voice,
a real engine) is stood in for, so this stays a fast test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fakeshapes import VLLM, ShapedServer

from voice_llm.cli import main as cli
from voice_llm.core.errors import TTSError
from voice_llm.core.lab import LabSettings, run_lab
from voice_llm.engines.speech_in.stt import STTUnavailableError
from voice_llm.capabilities.speak import step as speak

NO_STT = "the STT is not installed: pip install 'faster-whisper==1.2.1' (or use --stt none)"


@pytest.fixture
def no_whisper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "faster_whisper", None)
    monkeypatch.setattr(speak, "prepare", lambda options: None)  # the voice loads (not what is tested here)


def test_the_lab_without_faster_whisper_fails_before_its_first_request(no_whisper, tmp_path: Path) -> None:
    out = tmp_path / "new"
    with ShapedServer(VLLM) as server:
        with pytest.raises(STTUnavailableError) as failure:
            run_lab(LabSettings(out=out, url=server.url))
        assert server.requests == []  # not even /props: nothing was asked
    assert str(failure.value) == NO_STT
    assert failure.value.__notes__ == ["needed by the converse step; nothing was asked or written"]
    assert not out.exists()


def test_the_cli_says_it_in_one_line_and_keeps_an_earlier_folder(no_whisper, tmp_path: Path, state_dir: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "old"
    out.mkdir()
    (out / "ttft.json").write_text('{"earlier": true}\n')
    with ShapedServer(VLLM) as server:
        code = cli.main(["lab", "--url", server.url, "--out", str(out), "-q"])
        assert server.requests == []
    err = capsys.readouterr().err
    assert code == 1
    assert err == f"voice-llm lab: {NO_STT} (needed by the converse step; nothing was asked or written)\n"
    assert [p.name for p in out.iterdir()] == ["ttft.json"] and (out / "ttft.json").read_text() == '{"earlier": true}\n'


def test_what_several_steps_lack_is_named_at_once(no_whisper, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def bad_voice(options: object) -> None:
        raise TTSError("the voice nope.onnx does not exist")

    monkeypatch.setattr(speak, "prepare", bad_voice)
    with pytest.raises(Exception) as failure:
        run_lab(LabSettings(out=tmp_path / "new", url="http://127.0.0.1:9"))
    assert str(failure.value) == (f"the planned steps need what is not here: speak: the voice nope.onnx does not "
                                  f"exist; converse: {NO_STT}; nothing was asked or written")


def test_stt_none_needs_no_faster_whisper(no_whisper) -> None:
    from voice_llm.engines.speech_in.stt import check_installed

    check_installed("none")  # the script's own line: nothing to install
    with pytest.raises(STTUnavailableError, match="faster-whisper"):
        check_installed("faster-whisper")
