"""Real engines (slow): the clinic lines spoken by Piper and the heard replies transcribed by faster-whisper
against the fake agent; and the lab's converse step against voice-llm's own agent on a real llama-server (both
protocols). No wall-clock time is asserted: only relations measured inside one call."""

from __future__ import annotations

from pathlib import Path

import pytest
from clihelpers import SHORT_KB
from dialhelpers import context
from fakeagent import FakeAgent, Reply

from voice_llm.client.api import ServerClient
from voice_llm.dial import converse
from voice_llm.dial.step import DialOptions, dial_step
from voice_llm.lab.context import LabContext, StepOptions
from voice_llm.util.artifacts import read_json

FRAME_MS = 20.0
JITTER_MS = 40.0


@pytest.mark.slow
def test_synthesized_caller_and_transcribed_replies(tmp_path):
    options = DialOptions(turns=2, barge_in_turns=(1,), barge_in_after_ms=300.0, stt_threads=1)
    with FakeAgent([Reply(400, 1500, "m1"), Reply(300, 500, "m2")], endpoint_ms=300.0) as agent:
        dial_step(context(tmp_path), options, agent.url)
    doc = read_json(tmp_path / "dial.json")
    assert doc["caller"]["source"] == "synthesized" and doc["caller"]["voice"]["engine"] == "piper"
    assert doc["settings"]["stt_engine"]["model"] == "tiny.en"
    for turn in doc["turns"]:
        caller = turn["caller"]
        assert caller["offset_ms"] < caller["speech_start_ms"] < caller["speech_end_ms"]
        assert isinstance(turn["heard"]["transcript"], str)  # a square wave transcribed: whatever Whisper says
    barge = doc["turns"][0]["barge_in"]
    assert barge is not None and barge["words_heard_count"] is not None
    assert doc["turns"][1]["heard"]["gap_ms"] is not None


def _assert_the_call_through_voice_llms_agent(doc: dict, protocol: str) -> None:
    assert doc["agent"]["identity"]["engine"] == "builtin" and doc["line"]["protocol"] == protocol
    for turn in doc["turns"]:
        heard = turn["heard"]
        assert heard["gap_ms"] is not None and heard["gap_ms"] > 0, turn
        reported = turn["agent_reported"]
        assert reported is not None, doc["unknown"]
        # the agent's own number starts at its VAD's speech end and stops at its first audio sent: the caller's
        # gap holds it plus the line (the jitter delay, within a frame of quantization and the agent's lead-in)
        assert turn["heard_minus_reported_ms"] >= JITTER_MS - FRAME_MS - doc["playout"]["max_late_ms"], turn
    barge = doc["turns"][2]["barge_in"]
    assert barge is not None and barge["heard_silent_ms"] is not None
    if protocol == "twilio":
        assert barge["cleared_ms"] is not None  # the agent clears on a barge-in; PCM has no clear


@pytest.mark.slow
def test_the_session_labs_call_through_voice_llms_agent_over_twilio(lab_run):
    """The lab's converse step is this call over Twilio Media Streams (the default line): read its files."""
    out, _ = lab_run
    doc = read_json(out / "dial.json")
    assert (out / "dial" / "agent.log").is_file() and (out / "dial" / "call.wav").is_file()
    assert len(doc["turns"]) == 4  # the lab's default: turn 3 barged in on by line 4
    _assert_the_call_through_voice_llms_agent(doc, "twilio")


@pytest.mark.slow
@pytest.mark.server
def test_converse_through_voice_llms_agent_over_pcm(module_server, tmp_path):
    options = DialOptions(protocol="pcm", turns=4, stt_threads=1)  # turn 3 barged in on by line 4, as the lab's
    ctx = LabContext(out=tmp_path, client=ServerClient(module_server.url), kb_dir=SHORT_KB,
                     options=StepOptions(plugins={"dial": options}))
    written = converse.run(ctx)
    assert Path(tmp_path / "dial" / "agent.log") in written
    _assert_the_call_through_voice_llms_agent(read_json(tmp_path / "dial.json"), "pcm")
