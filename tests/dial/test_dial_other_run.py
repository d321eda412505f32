"""Issue 41 item 8: `voice-llm dial` into a folder holding a run whose call was made to another agent silently
replaced that call (the lab's headline went 3655 -> 355 ms from another agent, check exited 3). A lone dial asks no
LLM server, so the lab steps' identity rule never refused it: it now refuses a call to another agent or URL before
anything is written, a re-dial of the same agent re-measures it, and dial's default --out is not the lab's folder."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from dialhelpers import write_tone_wavs
from fakeagent import FakeAgent, Reply

from voice_llm.cli.main import EXIT_FAILURE, build_parser, main
from voice_llm.core.server.config import default_out_dir


def _dial(url: str, out: Path, wavs: Path) -> int:
    return main(["dial", url, "--out", str(out), "--caller-audio", str(wavs), "--turns", "1",
                 "--barge-in-turns", "none", "--stt", "none", "--deadline", "10", "--quiet"])


def _files(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_dial_to_another_agent_is_refused_and_the_run_is_untouched(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, wavs = tmp_path / "out", write_tone_wavs(tmp_path / "w", 1)
    with FakeAgent([Reply(100, 200, "m1")]) as first:
        assert _dial(first.url, out, wavs) == 0, capsys.readouterr().err
        first_url = first.url
    before = _files(out)
    capsys.readouterr()
    with FakeAgent([Reply(100, 200, "m1")]) as other:
        assert other.url != first_url
        assert _dial(other.url, out, wavs) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"its call was made to {first_url}" in err and "--out" in err, err
    assert _files(out) == before  # nothing written, not even run.json


def test_a_dial_to_the_same_agent_remeasures_its_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, wavs = tmp_path / "out", write_tone_wavs(tmp_path / "w", 1)
    with FakeAgent([Reply(100, 200, "m1"), Reply(100, 200, "m1")]) as agent:
        assert _dial(agent.url, out, wavs) == 0, capsys.readouterr().err
        run_id = json.loads((out / "run.json").read_text())["run_id"]
        assert _dial(agent.url + "/", out, wavs) == 0, capsys.readouterr().err  # the same URL, written otherwise
    assert json.loads((out / "dial.json").read_text())["run_id"] == run_id


def test_dials_default_folder_is_not_the_labs() -> None:
    parser = build_parser()
    assert parser.parse_args(["dial", "ws://127.0.0.1:1/"]).out == default_out_dir("dial") != default_out_dir()
    assert parser.parse_args(["lab"]).out == default_out_dir()
