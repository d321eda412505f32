"""`voice-llm dial --settings FILE` (issue 42 item 3): the call's settings, DialOptions, read whole from one JSON file
as `agent --settings` reads AgentSettings (the declared defaults, then the file, then the flags given beside it,
which win); a file that cannot be the settings is one usage line (exit 2) before anything is written; no secret is
written to one or read from one. load --dial hands each of its calls its settings so
(tests/load/test_load_dial_settings.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voice_llm.capabilities.agent import AgentSettings
from voice_llm.capabilities.dial import DialOptions
from voice_llm.cli import main as cli
from voice_llm.core.run import flags


def read_by_dial(argv: list[str]) -> DialOptions:
    """The call's settings as `voice-llm dial` makes them of ``argv`` (its arguments after the program)."""
    parser = cli.build_parser()
    args = parser.parse_args(argv)
    cli._refuse_bad_options(parser, args)
    options: DialOptions = args.plugin_options["dial"]
    return options


def _file(tmp_path: Path, content: object, name: str = "call.json") -> Path:
    file = tmp_path / name
    file.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return file


def test_a_settings_file_reads_back_the_very_settings_written(tmp_path: Path) -> None:
    """Every field, as JSON and back through dial's own reading: the same value (paths, lists, the plan flags)."""
    written = DialOptions(url="ws://127.0.0.1:9/", protocol="pcm", rate=16000, turns=2, turns_given=True,
                          barge_in_turns=(1,), barge_in_given=True, jitter_ms=80.0, stt="none", think_share=0.1,
                          caller_audio=tmp_path / "lines")
    file = tmp_path / "call.json"
    flags.write_settings(written, file)
    assert read_by_dial(["dial", "--settings", str(file)]) == written


def test_the_flags_given_beside_the_file_win(tmp_path: Path) -> None:
    file = _file(tmp_path, {"url": "ws://127.0.0.1:9/", "turns": 3, "jitter_ms": 80, "stt": "none"})
    read = read_by_dial(["dial", "ws://127.0.0.1:10/", "--settings", str(file), "--turns", "2", "--seed", "5"])
    assert (read.url, read.turns, read.seed) == ("ws://127.0.0.1:10/", 2, 5)  # the flags
    assert (read.jitter_ms, read.stt) == (80.0, "none")  # the file
    assert read.reply_end_ms == DialOptions().reply_end_ms  # neither: dial's declared default


def test_turns_named_in_a_file_decide_over_the_callers_folder_as_their_flags_do(tmp_path: Path) -> None:
    """With --caller-audio the folder decides the turns and the barge-in plan unless they are asked for: a
    hand-written file asks by naming them; a file written from DialOptions says so itself (turns_given)."""
    lines = str(tmp_path / "lines")
    bare = read_by_dial(["dial", "--settings", str(_file(tmp_path, {"url": "ws://h:9/", "caller_audio": lines}))])
    assert (bare.turns_given, bare.barge_in_given) == (False, False)
    named = _file(tmp_path, {"url": "ws://h:9/", "caller_audio": lines, "turns": 2, "barge_in_turns": []}, "b.json")
    asked = read_by_dial(["dial", "--settings", str(named)])
    assert (asked.turns_given, asked.barge_in_given) == (True, True)
    said = _file(tmp_path, flags.as_json(DialOptions(url="ws://h:9/", caller_audio=Path(lines))), "c.json")
    assert read_by_dial(["dial", "--settings", str(said)]).turns_given is False  # every field there, turns too
    assert read_by_dial(["dial", "--settings", str(said), "--turns", "2"]).turns_given is True


def test_no_secret_is_written_to_a_settings_file(tmp_path: Path) -> None:
    """The agent a converse call would start carries its API key: never into a file (the environment carries it)."""
    file = tmp_path / "call.json"
    flags.write_settings(DialOptions(url="ws://127.0.0.1:9/", agent=AgentSettings(api_key="k-secret-123")), file)
    assert "k-secret-123" not in file.read_text() and "api_key" not in file.read_text()
    agent = read_by_dial(["dial", "--settings", str(file)]).agent
    assert agent is not None and agent.api_key is None


@pytest.mark.parametrize("content, says", [
    ("{", "is not valid JSON"),
    ([1, 2], "must hold a JSON object of settings, not list"),
    ({"url": "ws://127.0.0.1:9/", "jitter": 40}, "no such setting 'jitter'"),
    ({"url": "ws://127.0.0.1:9/", "turns": "four"}, "turns must be a whole number, not 'four'"),
    ({"url": "ws://127.0.0.1:9/", "jitter_ms": 5000}, "--jitter-ms must be 0-1000 ms, not 5000"),  # the flag's rule
    ({"url": "http://127.0.0.1:9/"}, "the agent's URL must be ws:// or wss://"),
    ({"url": "ws://127.0.0.1:9/", "agent": {"api_key": "k"}}, "api_key is not read from a file"),
    ({"turns": 2}, "dial needs the agent's URL"),  # no URL given, none in the file
    (None, "cannot read the settings file"),
])
def test_a_bad_settings_file_is_one_usage_line(content: object, says: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    file = _file(tmp_path, content) if content is not None else tmp_path / "missing.json"
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        cli.main(["dial", "--settings", str(file), "--out", str(out)])
    assert exited.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith("voice-llm dial: error: ") and says in errors[0], err
    assert "Traceback" not in err and not out.exists()
