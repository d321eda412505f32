"""The lab's converse step around a stand-in agent process: started in its own group, its ready line read, dialed,
stopped (SIGTERM, then SIGKILL after the grace), its log kept; an agent that dies before it is ready is one line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from dialhelpers import context

from voice_llm.capabilities.agent import command as agent_command
from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.capabilities.dial import converse
from voice_llm.capabilities.dial.call import DialError
from voice_llm.capabilities.dial.step import DialOptions, Prepared
from voice_llm.cli.main import _refuse_bad_options, build_parser, main as cli_main
from voice_llm.core.run.flags import as_json
from voice_llm.core.run.context import StepOptions
from voice_llm.core.util.artifacts import read_json

SCRIPT = Path(__file__).with_name("fake_agent_process.py")


def agent(tmp_path: Path, mode: str, grace_s: float = 5.0) -> converse.Agent:
    ready = tmp_path / "ready.json"
    return converse.Agent([sys.executable, str(SCRIPT), str(ready), mode], ready, tmp_path / "agent.log", grace_s)


def test_ready_then_stopped_by_sigterm(tmp_path):
    with agent(tmp_path, "normal") as running:
        ready = running.wait_ready(30)
        assert ready["listen"].startswith("ws://127.0.0.1:") and ready["engine"] == "fake"
        status = running.stop()
    assert status == 0 and "stopped" in (tmp_path / "agent.log").read_text()


def test_an_agent_that_ignores_sigterm_is_killed(tmp_path):
    with agent(tmp_path, "ignore-term", grace_s=0.5) as running:
        running.wait_ready(30)
        t0 = time.monotonic()
        status = running.stop()
    assert status == -9 and time.monotonic() - t0 < 5


def test_an_agent_that_dies_before_it_is_ready(tmp_path):
    with agent(tmp_path, "die") as running:
        with pytest.raises(DialError, match="exited with status 3 before it was ready: cannot load the engines"):
            running.wait_ready(30)


def test_the_step_dials_the_agent_and_keeps_its_identity_and_log(tmp_path, monkeypatch):
    from dialhelpers import tones
    from truth import measured_turns

    handed: list[dict] = []

    def command(settings_file):
        """The stand-in agent, started on the settings the step handed the real one: their ready file."""
        handed.append(json.loads(settings_file.read_text()))
        return [sys.executable, str(SCRIPT), handed[-1]["ready_file"], "normal"]

    monkeypatch.setattr(converse, "agent_command", command)
    options = DialOptions(stt="none", lead_ms=100.0, think_ms=60.0, reply_end_ms=200.0, barge_in_turns=(),
                          agent=AgentSettings(endpoint_ms=250.0, stt="none"))
    monkeypatch.setattr(converse, "prepare_call", lambda ctx, opts: Prepared(tones(1), None, None))
    ctx = context(tmp_path)
    ctx = type(ctx)(**{**ctx.__dict__, "options": StepOptions(plugins={"dial": options})})
    written = converse.run(ctx)
    doc = read_json(tmp_path / "dial.json")
    assert doc["agent"]["identity"]["engine"] == "fake" and doc["agent"]["identity"]["versions"] == {"fake": "1"}
    assert doc["agent"]["url"] == doc["agent"]["identity"]["listen"]
    assert doc["turns"][0]["heard"]["first_sound_ms"] is not None  # answered; its gap measured unless a late tick
    measured_turns(doc, at_least=0)  # nulled it (LATE_TICK_RULE, with its reason: tests/truth.py)
    log = (tmp_path / "dial" / "agent.log").read_text()
    assert "loading the engines" in log and "[exit status 0]" in log
    assert tmp_path / "dial" / "agent.log" in written
    # the agent was handed its settings whole: the lab's flags for it, and this call's own
    (settings,) = handed
    assert settings["endpoint_ms"] == 250.0 and settings["stt"] == "none" and settings["port"] == 0
    assert settings["otlp"].startswith("http://127.0.0.1:") and settings["max_calls"] == 1
    assert settings["url"] == "http://127.0.0.1:1" and "api_key" not in settings  # the key stays in the environment


def _converse(*argv: str) -> DialOptions:
    """The converse command's dial options, as the CLI makes them of these flags."""
    parser = build_parser()
    args = parser.parse_args(["converse", *argv])
    _refuse_bad_options(parser, args)
    return args.plugin_options["dial"]


def test_the_agent_gets_the_converse_flags_whole_as_json(tmp_path, monkeypatch):
    """converse's flags for the agent, and the call's own settings, reach the agent process as one JSON file that
    `voice-llm agent --settings FILE` reads back into the very same settings (its API key aside: the environment's);
    its command line is that file and nothing else."""
    options = _converse("--protocol", "pcm", "--rate", "16000", "--endpoint-ms", "250", "--strategy", "sentences",
                        "--stt", "none", "--reply-max-tokens", "24", "--stt-threads", "2")
    assert options.protocol == "pcm" and options.rate == 16000 and options.stt == "none"  # the caller's side
    settings = converse.agent_settings(context(tmp_path), options, tmp_path / "r.json", "http://127.0.0.1:4318")
    assert (settings.protocol, settings.rate, settings.endpoint_ms, settings.strategy, settings.stt,
            settings.max_tokens, settings.stt_threads) == ("pcm", 16000, 250.0, "sentences", "none", 24, 2)
    assert (settings.port, settings.max_calls, settings.ready_file, settings.otlp) == \
        (0, 1, tmp_path / "r.json", "http://127.0.0.1:4318")
    file = tmp_path / "settings.json"
    file.write_text(json.dumps(as_json(settings)))
    assert converse.agent_command(file) == [sys.executable, "-m", "voice_llm", "agent", "--settings", str(file)]
    served: list[AgentSettings] = []
    monkeypatch.setattr(agent_command.server, "serve", lambda given: served.append(given) or 0)
    monkeypatch.delenv("VOICE_LLM_API_KEY", raising=False)
    assert cli_main(["agent", "--settings", str(file)]) == 0
    assert served == [settings]


def test_the_lab_leaves_the_agent_its_own_defaults() -> None:
    """No converse flag given: the agent the lab starts has the agent's own settings, whatever they are (declared
    once: agent.settings), and the lab's flags for it are the agent's own, help and all."""
    options = _converse()
    assert options.agent == AgentSettings()
    agent_help = {action.dest: action.help for action in build_parser()._subparsers._group_actions[0]
                  .choices["agent"]._actions}
    converse_help = {action.dest: action.help for action in build_parser()._subparsers._group_actions[0]
                     .choices["converse"]._actions}
    for agent_dest, converse_dest in (("endpoint_ms", "endpoint_ms"), ("stt", "stt"), ("strategy", "strategy"),
                                      ("max_tokens", "reply_max_tokens"), ("protocol", "protocol")):
        assert converse_help[converse_dest] == agent_help[agent_dest], agent_dest
    assert f"(default {AgentSettings().max_tokens})" in converse_help["reply_max_tokens"]
