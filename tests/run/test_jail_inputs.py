"""Planted or corrupt input never gives a traceback or a hang (issue 20): a deeply nested or ill-typed server
record (status, down), a `--dialogue` that is not a bundled name or not a dialogue, a FIFO as a KB document, a
deeply nested audio.json read by `load` for its speech rate. Each is one clear line, through the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from voice_llm.core.server import state as server_state

from clihelpers import assert_clean_failure, cli
from conftest import free_port
from clihelpers import make_kb

NESTED = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on this
DEAD = "http://127.0.0.1:9"  # nothing listens: a command that gets past its input checks fails on the server
HANG_S = 60  # a command that hangs on a FIFO would run into this; a working one ends in seconds


# --- the server's state record -------------------------------------------------------------------------------


def ill_typed() -> str:
    return json.dumps({"pid": 0, "start_ticks": 1, "host": "127.0.0.1", "port": 1, "url": "u", "binary": "b",
                       "model": "m", "ctx": 1, "slots": 1, "started_at": 0.0, "api_key_set": False})


@pytest.mark.parametrize("record", [NESTED, ill_typed()])
@pytest.mark.parametrize("command", ["status --port {port}", "status --port {port} --json", "down --port {port}",
                                     "status"])
def test_a_corrupt_server_record_is_no_record(record: str, command: str, state_dir: Path, env: dict[str, str]) -> None:
    port = free_port()
    server_state.port_dir(port).mkdir(parents=True)
    server_state.record_path(port).write_text(record)
    assert server_state.read_record(port) is None  # never trusted: pid 0 would signal a whole process group
    result = cli(*command.format(port=port).split(), env=env, timeout=HANG_S)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert "RecursionError" not in result.stdout + result.stderr
    if command.startswith("down"):
        assert result.stdout.strip() == f"no managed server on port {port}", result.stdout
    elif "--json" in command:
        assert json.loads(result.stdout)["running"] is False and json.loads(result.stdout)["pid"] is None
    else:
        assert "not running" in result.stdout, result.stdout


# --- --dialogue -------------------------------------------------------------------------------------------------


def test_a_dialogue_name_is_a_bundled_name_or_a_file_the_user_gave(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    escaping = cli("load", "--url", DEAD, "--dialogue", "../../x", "--out", str(out), env=env, timeout=HANG_S)
    assert_clean_failure(escaping, "cannot read the dialogue file ../../x")
    unknown = cli("load", "--url", DEAD, "--dialogue", "nope", "--out", str(out), env=env, timeout=HANG_S)
    assert_clean_failure(unknown, "no dialogue named 'nope'; bundled: clinic, lab-ttft")


@pytest.mark.parametrize(("content", "reason"), [
    ("[1, 2]", "a JSON list, not an object"),
    ('{"name": "x", "system": "s"}', "'turns' is missing or not a list of texts"),
    ('{"name": "x", "system": "s", "turns": [1]}', "'turns' is missing or not a list of texts"),
    ('{"name": "x", "turns": ["hi"]}', "'system' is missing or not a text"),
    ('{"name": "x", "system": "s", "turns": ["hi"], "max_tokens": "64"}', "'max_tokens' is '64'"),
    ("{not json", "is not valid JSON"),
    (NESTED, "nested too deeply"),
])
def test_a_dialogue_file_of_another_shape_is_one_line(content: str, reason: str, tmp_path: Path,
                                                      env: dict[str, str]) -> None:
    dialogue = tmp_path / "mine.json"
    dialogue.write_text(content)
    result = cli("load", "--url", DEAD, "--dialogue", str(dialogue), "--out", str(tmp_path / "out"), env=env,
                 timeout=HANG_S)
    assert_clean_failure(result, f"the dialogue file {dialogue}", reason)


def test_a_dialogue_file_of_the_right_shape_is_used(tmp_path: Path, env: dict[str, str]) -> None:
    from voice_llm.core.scenario.dialogue import load_dialogue

    dialogue = tmp_path / "mine.json"
    dialogue.write_text(json.dumps({"name": "mine", "system": "Be brief.", "turns": ["Hello?", "Bye."]}))
    assert load_dialogue(str(dialogue)).turns == ("Hello?", "Bye.")
    result = cli("load", "--url", DEAD, "--dialogue", str(dialogue), "--out", str(tmp_path / "out"), env=env,
                 timeout=HANG_S)
    assert_clean_failure(result, "no server at http://127.0.0.1:9")  # past the dialogue, on to the server


def test_a_fifo_as_the_dialogue_file_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    result = cli("load", "--url", DEAD, "--dialogue", str(tmp_path / "fifo.json"), "--out", str(tmp_path / "out"),
                 env=env, timeout=HANG_S)
    assert_clean_failure(result, "not a regular file")


# --- a FIFO as a KB document ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["prefill", "lab"])
def test_a_fifo_as_a_kb_document_is_refused_before_any_request(command: str, tmp_path: Path,
                                                               env: dict[str, str]) -> None:
    kb = make_kb(tmp_path / "kb")
    (kb / "05-doc.md").unlink()
    os.mkfifo(kb / "05-doc.md")
    result = cli(command, "--url", DEAD, "--kb", str(kb), "--out", str(tmp_path / "out"), "-q", env=env,
                 timeout=HANG_S)
    err = assert_clean_failure(result, f"KB document {kb / '05-doc.md'} is not a regular file")
    assert "connection refused" not in err


# --- load reads audio.json for the speech rate ---------------------------------------------------------------------


def test_a_deeply_nested_audio_json_gives_load_the_default_speech_rate(tmp_path: Path, env: dict[str, str]) -> None:
    from voice_llm.capabilities.load.plan import SPEECH_WORDS_PER_S
    from voice_llm.capabilities.load.speech import answer_speech_rate

    out = tmp_path / "out"
    out.mkdir()
    (out / "audio.json").write_text(NESTED)
    assert answer_speech_rate(out) == (SPEECH_WORDS_PER_S,
                                       f"default {SPEECH_WORDS_PER_S:g} words/s (no readable audio.json)")
    result = cli("load", "--url", DEAD, "--out", str(out), env=env, timeout=HANG_S)
    assert_clean_failure(result, "no server at http://127.0.0.1:9")
    assert (out / "audio.json").read_text() == NESTED
