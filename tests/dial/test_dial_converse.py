"""The lab's converse step around a stand-in agent process: started in its own group, its ready line read, dialed,
stopped (SIGTERM, then SIGKILL after the grace), its log kept; an agent that dies before it is ready is one line."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from dialhelpers import context

from voice_llm.capabilities.dial import converse
from voice_llm.capabilities.dial.call import DialError
from voice_llm.capabilities.dial.step import DialOptions, Prepared, options_value
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

    def command(ctx, options, ready_file, otlp_endpoint):
        assert otlp_endpoint.startswith("http://127.0.0.1:")
        return [sys.executable, str(SCRIPT), str(ready_file), "normal"]

    monkeypatch.setattr(converse, "agent_command", command)
    options = DialOptions(stt="none", lead_ms=100.0, think_ms=60.0, reply_end_ms=200.0, barge_in_turns=())
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


def test_agent_command_follows_the_contract(tmp_path):
    ctx = context(tmp_path)
    options = DialOptions(protocol="pcm", rate=16000, endpoint_ms=250.0, strategy="clauses", stt="none",
                          reply_max_tokens=24)
    command = converse.agent_command(ctx, options, tmp_path / "r.json", "http://127.0.0.1:4318")
    joined = " ".join(command)
    assert command[1:4] == ["-m", "voice_llm", "agent"]
    for part in ("--listen 127.0.0.1:0", "--url http://127.0.0.1:1", "--protocol pcm", "--rate 16000",
                 "--max-calls 1", "--endpoint-ms 250", "--strategy clauses", "--stt none", "--max-tokens 24",
                 "--otlp http://127.0.0.1:4318", f"--ready-file {tmp_path / 'r.json'}"):
        assert part in joined, part
    # the lab's --reply-max-tokens reaches the agent; without it the agent keeps its own default
    assert options_value({"command": "lab", "reply_max_tokens": 24}).reply_max_tokens == 24
    default = converse.agent_command(ctx, options_value({"command": "lab"}), tmp_path / "r.json", None)
    assert "--max-tokens" not in default


def test_the_converse_flags_state_the_agents_own_defaults() -> None:
    """The lab's converse flags leave the agent's settings to the agent (default None) and say in their help what
    the agent then uses; dial may not import the agent (tests/layout), so the help spells the values and this holds
    them to the agent's constants."""
    import argparse

    from voice_llm.capabilities.agent.settings import DEFAULT_ENDPOINT_MS, DEFAULT_MAX_TOKENS, DEFAULT_STRATEGY
    from voice_llm.capabilities.dial.step import add_converse_flags

    parser = argparse.ArgumentParser()
    add_converse_flags(parser, "lab")
    helps = {action.dest: action.help for action in parser._actions}
    for dest, value in (("endpoint_ms", f"{DEFAULT_ENDPOINT_MS:g}"), ("reply_max_tokens", str(DEFAULT_MAX_TOKENS)),
                        ("strategy", DEFAULT_STRATEGY)):
        assert parser.get_default(dest) is None, dest
        assert f"(default: the agent's, {value})" in helps[dest], (dest, helps[dest])
