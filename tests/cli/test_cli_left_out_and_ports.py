"""Round 4's CLI findings (issue 31.11, 31.21), each with the exact input that showed it: what a left-out or
misspelt capability says, `call` not called a lab step, the port `up` should be run with, OUT that is a file, and
`up`'s ready line said once. In-process (cli.main) except `up`, which starts a stand-in llama-server."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from voice_llm.core import registry
from voice_llm.cli import main as cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICE_LLM_STATE", str(tmp_path / "state"))
    monkeypatch.delenv(registry.WITHOUT_ENV, raising=False)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# --- 31.11: VOICE_LLM_WITHOUT --------------------------------------------------------------------------------


@pytest.mark.parametrize("value, named, hint", [("garbage", "'garbage'", ""), ("TTS", "'TTS'", "did you mean 'tts'?"),
                                                ("tts,garbage", "'garbage'", "")])
def test_an_unknown_capability_is_named_in_one_line(value: str, named: str, hint: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(registry.WITHOUT_ENV, value)
    code, out, err = _run(["check", "--help"], capsys)
    assert code == cli.EXIT_USAGE and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"voice-llm: VOICE_LLM_WITHOUT names no capability: {named} (the capabilities: tts, ")
    assert hint in line


def test_a_command_whose_capability_needs_one_left_out_says_so(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(registry.WITHOUT_ENV, "tts")
    code, out, err = _run(["converse", "--port", "18601"], capsys)
    assert code == cli.EXIT_USAGE and out == ""
    # the converse command is dial's step (dial against voice-llm's agent), and dial requires tts and the agent
    # (which requires tts): the message names the capability that owns the command and the ones it needs
    assert err == "voice-llm converse: not available: dial needs tts, agent, which are left out (VOICE_LLM_WITHOUT=tts)\n"
    code, _, err = _run(["speak"], capsys)
    assert err == "voice-llm speak: not available: the tts capability is left out (VOICE_LLM_WITHOUT=tts)\n"
    assert code == cli.EXIT_USAGE
    # a command that is nobody's is still argparse's business
    with pytest.raises(SystemExit) as stop:
        cli.main(["conversee"])
    assert stop.value.code == cli.EXIT_USAGE and "invalid choice: 'conversee'" in capsys.readouterr().err


def test_left_out_follows_requires_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.WITHOUT_ENV, "tts")
    out = registry.left_out()
    assert out["tts"] == "the tts capability is left out"
    assert {"agent", "dial"} <= set(out) and "converse" not in out
    # load requires dial (its --dial callers and the OTLP receiver of the agent's spans) and the agent (a local
    # agent's settings): it goes with them
    assert out["load"] == "load needs dial, agent, which are left out"
    assert {c.name for c in registry.capabilities()}.isdisjoint(out)


# --- 31.21: help and messages --------------------------------------------------------------------------------


def test_help_calls_only_the_labs_steps_lab_steps() -> None:
    text = cli.build_parser().format_help()
    call = next(line for line in text.splitlines() if line.strip().startswith("call "))
    assert "lab step" not in call and "not in the lab" in call
    assert next(line for line in text.splitlines() if line.strip().startswith("ttft ")).strip().startswith("ttft      lab step")


def test_a_step_on_a_port_with_no_server_suggests_up_on_that_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    code, _, err = _run(["ttft", "--port", str(port), "--out", str(tmp_path / "out"), "-q"], capsys)
    assert code == cli.EXIT_FAILURE
    assert f"start one with `voice-llm up --port {port}` or pass --url" in err, err


@pytest.mark.parametrize("under", [False, True])
def test_out_that_is_a_file_is_named(under: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    out = afile / "sub" if under else afile
    code, _, err = _run(["report", "--out", str(out), "-q"], capsys)
    assert code == cli.EXIT_FAILURE
    (line,) = err.splitlines()
    said = f"{afile}, above OUT, is a file" if under else "OUT is a file, not a folder"
    assert said in line and "File exists" not in line and "Not a directory" not in line, line
    assert afile.read_text() == "x\n"


# --- `up` says it is ready once ------------------------------------------------------------------------------

STAND_IN = textwrap.dedent("""\
    # A llama-server stand-in for `up`: answers /health with 200 on --port until it is stopped.
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "ok"}).encode()
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Health).serve_forever()
    """)


def test_up_prints_its_ready_line_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\n{STAND_IN}")
    binary.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    port = _free_port()
    try:
        code, out, err = _run(["up", "--port", str(port), "--server-bin", str(binary), "--model", str(model)], capsys)
        assert code == 0, err
        ready = [line for line in (out + err).splitlines() if "ready" in line]
        assert len(ready) == 1 and ready[0].startswith(f"llama-server ready on http://127.0.0.1:{port}"), out + err
        assert ready[0] in out  # the result, on stdout
    finally:
        cli.main(["down", "--port", str(port)])
        capsys.readouterr()
    assert not os.path.exists(tmp_path / "state" / f"port-{port}" / "server.json")
