"""The agent's settings as data (issue 42 item 3): each declared once (agent.settings.AgentSettings), its flags
derived from the declaration, the converse step's agent started with them whole, as JSON (``agent --settings
FILE``), never argv built by hand; pipecat's pipeline reads the same settings, no parallel copy of them.

The proof that a default has one place: the source tree copied, one constant changed in it, and the help, the
settings and what the converse step's agent process reads all follow (before, the endpoint's 300 was written in
four places and the converse help spelled the agent's defaults again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sourcecopy import SRC, changed_copy, run_script

from voice_llm.capabilities.agent import command, pipecat_agent
from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.cli.main import main
from voice_llm.core.run.flags import as_json

# In the copied tree: every place a setting reaches, printed as JSON. The agent's command runs for real on the file
# the converse step writes, up to the settings it would serve with (server.serve is where it would start serving).
REACHES = r"""
import json, sys, tempfile
from pathlib import Path
from voice_llm.capabilities.agent import command, server
from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.capabilities.dial import converse
from voice_llm.capabilities.dial.step import DialOptions
from voice_llm.cli import main as cli
from voice_llm.core.client.api import ServerClient
from voice_llm.core.run.context import LabContext, StepOptions
from voice_llm.core.run.flags import as_json

def helps(name):
    parser = cli.build_parser()
    sub = next(action for action in parser._actions if action.dest == "command").choices[name]
    return {action.dest: action.help for action in sub._actions}

parser = cli.build_parser()
args = parser.parse_args(["converse"])
cli._refuse_bad_options(parser, args)
options = args.plugin_options["dial"]
folder = Path(tempfile.mkdtemp())
ctx = LabContext(out=folder, client=ServerClient("http://127.0.0.1:1"), kb_dir=None, options=StepOptions())
file = folder / "settings.json"
file.write_text(json.dumps(as_json(converse.agent_settings(ctx, options, folder / "ready.json", None))))
served = []
server.serve = lambda settings: served.append(settings) or 0
assert cli.main(["agent", "--settings", str(file)]) == 0
handed = json.loads(file.read_text())
print(json.dumps({
    "agent_help": helps("agent"), "converse_help": helps("converse"), "dial_help": helps("dial"),
    "settings": as_json(AgentSettings()), "handed": handed, "served": as_json(served[0]),
    "jitter": {"options": DialOptions().jitter_ms, "call": DialOptions().call_settings("ws://x:1/").jitter_ms},
}))
"""


def test_a_default_changed_in_one_place_reaches_the_help_the_settings_and_the_agent_process(tmp_path: Path) -> None:
    # the endpoint (the four places), the reply's tokens, the phone's jitter delay: one line each
    found = run_script(changed_copy(
        tmp_path, ("engines/speech_in/vad.py", r"^DEFAULT_ENDPOINT_MS = 300\.0\b", "DEFAULT_ENDPOINT_MS = 275.0"),
        ("capabilities/agent/settings.py", r"^DEFAULT_MAX_TOKENS = 48\b", "DEFAULT_MAX_TOKENS = 37"),
        ("engines/line/playout.py", r"^DEFAULT_JITTER_MS = 40\b", "DEFAULT_JITTER_MS = 60")), REACHES)
    for help_of in (found["agent_help"], found["converse_help"]):
        assert "(default 275)" in help_of["endpoint_ms"], help_of["endpoint_ms"]
    assert "(default 37)" in found["agent_help"]["max_tokens"]
    assert "(default 37)" in found["converse_help"]["reply_max_tokens"]
    for where in ("settings", "handed", "served"):  # AgentSettings(), the file handed over, what the agent read
        assert (found[where]["endpoint_ms"], found[where]["max_tokens"]) == (275.0, 37), where
    assert "(default 60)" in found["dial_help"]["jitter_ms"] and "(default 60)" in found["converse_help"]["jitter_ms"]
    assert found["jitter"] == {"options": 60, "call": 60}


def test_the_unchanged_tree_says_its_own_defaults() -> None:
    """The same script on the tree as it is (so the copy's numbers above are the edit's, not the script's)."""
    found = run_script(SRC, REACHES)
    assert "(default 300)" in found["agent_help"]["endpoint_ms"] and found["served"]["endpoint_ms"] == 300.0
    assert found["handed"] == {**found["served"]}  # what the agent read is what it was handed, whole


def _served(monkeypatch: pytest.MonkeyPatch, *argv: str) -> AgentSettings:
    seen: list[AgentSettings] = []
    monkeypatch.setattr(command.server, "serve", lambda settings: seen.append(settings) or 0)
    monkeypatch.delenv("VOICE_LLM_API_KEY", raising=False)
    assert main(["agent", *argv]) == 0
    return seen[0]


def test_the_flags_given_beside_a_settings_file_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "settings.json"
    file.write_text(json.dumps({**as_json(AgentSettings(max_tokens=24, strategy="sentences")),
                                "speech": {"clause_words": 6}}))
    served = _served(monkeypatch, "--settings", str(file), "--max-tokens", "30", "--listen", "127.0.0.1:0",
                     "--voice", "v.onnx")
    assert (served.max_tokens, served.strategy, served.port) == (30, "sentences", 0)
    assert (served.speech.clause_words, served.speech.voice) == (6, "v.onnx")  # field by field, nested too
    monkeypatch.setenv("VOICE_LLM_API_KEY", "from-the-environment")
    assert command.settings_from({"settings": file}).api_key == "from-the-environment"


@pytest.mark.parametrize("content, says", [
    ({"max_tokens": 5000}, "--max-tokens must be 1-4096, not 5000"),  # the flag's own rule
    ({"endpoint": 250}, "no such setting 'endpoint'"),
    ({"api_key": "k"}, "api_key is not read from a file"),
    ({"port": 70000}, "--listen: a port is 0..65535, not 70000"),
    ("{", "is not valid JSON"),
])
def test_a_bad_settings_file_is_one_usage_line(content: object, says: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "settings.json"
    file.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(SystemExit) as exited:
        main(["agent", "--settings", str(file)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    (error,) = [line for line in err.splitlines() if line.startswith("voice-llm agent: error:")]
    assert says in error and "Traceback" not in err


def test_pipecats_pipeline_reads_the_agents_settings() -> None:
    """No parallel PipecatSettings with an alias for the URL: pipecat's identity line is made of the agent's own."""
    settings = AgentSettings(engine="pipecat", url="http://127.0.0.1:9/v1", endpoint_ms=450.0, port=0)
    said = pipecat_agent.identity(settings)
    assert said["engine"] == "pipecat" and "http://127.0.0.1:9/v1" in said["engines"]["llm"]
    assert "speech timeout 0.25 s" in said["engines"]["turn"]
