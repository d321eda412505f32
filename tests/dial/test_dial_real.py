"""Real engines (slow): the clinic lines spoken by Piper and the heard replies transcribed by faster-whisper (the
session lab's call, read); and the lab's converse step against voice-llm's own agent on a real llama-server (both
protocols: Twilio is the session lab's own call, read; PCM is a call of its own, whose agent process is also watched
from outside: its ready file gone once stopped, its ready line on stdout, the call's threads gone after it). No
wall-clock time is asserted: only relations measured inside one call."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from clihelpers import SHORT_KB
from truth import measured_turns

from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.core.client.api import ServerClient
from voice_llm.capabilities.dial import converse
from voice_llm.capabilities.dial.step import DialOptions
from voice_llm.core.run.context import LabContext, StepOptions
from voice_llm.core.util.artifacts import read_json

FRAME_MS = 20.0
JITTER_MS = 40.0
# The PCM call's agent answers in at most this many tokens (the lab's: 48): a few seconds of speech, still playing
# when the barge-in comes 500 ms after its first sound. The caller listens to every reply in real time, and what is
# asserted (each gap heard, the agent's number beside it, the barge-in's silence) does not depend on the reply's length.
REPLY_TOKENS = 16


@pytest.mark.slow
def test_synthesized_caller_and_transcribed_replies(lab_run):
    """The session lab's call (dial against voice-llm's agent, 4 turns, turn 3 barged in on) is dial's own: its
    caller lines spoken by Piper, the agent's replies as heard transcribed by faster-whisper (real speech, where a
    call of its own against a fake agent had square waves), the words heard before the barge-in's silence counted."""
    out, _ = lab_run
    doc = read_json(out / "dial.json")
    assert doc["caller"]["source"] == "synthesized" and doc["caller"]["voice"]["engine"] == "piper"
    assert doc["settings"]["stt_engine"]["model"] == "tiny.en"
    for turn in doc["turns"]:
        caller = turn["caller"]
        assert caller["offset_ms"] < caller["speech_start_ms"] < caller["speech_end_ms"]
        assert isinstance(turn["heard"]["transcript"], str)
    assert any(turn["heard"]["transcript"].strip() for turn in doc["turns"])  # Whisper heard words in the replies
    barged = doc["settings"]["barge_in_turns"]
    assert barged == [3], barged
    barge = doc["turns"][2]["barge_in"]
    assert barge is not None and barge["words_heard_count"] is not None
    # the line after the barge-in was answered (its gap timed, unless a late tick nulled it or the reply it cut
    # into talked it over, with their reasons: tests/truth.py)
    assert doc["turns"][3]["heard"]["first_sound_ms"] is not None and measured_turns(doc, after_barge_in=True)


def _assert_the_call_through_voice_llms_agent(doc: dict, protocol: str, barged: int) -> None:
    assert doc["agent"]["identity"]["engine"] == "builtin" and doc["line"]["protocol"] == protocol
    assert doc["settings"]["barge_in_turns"] == [barged], doc["settings"]
    measured = measured_turns(doc, after_barge_in=True)  # heard and timed, but where a late tick nulled it
    for index, turn in enumerate(doc["turns"]):
        heard = turn["heard"]
        assert heard["first_sound_ms"] is not None, turn
        reported = turn["agent_reported"]
        assert reported is not None, doc["unknown"]
        if index not in measured:
            continue
        assert heard["gap_ms"] > 0, turn
        # the agent's own number starts at its VAD's speech end and stops at its first audio sent: the caller's
        # gap holds it plus the line (the jitter delay, within a frame of quantization and the agent's lead-in)
        assert turn["heard_minus_reported_ms"] >= JITTER_MS - FRAME_MS - doc["playout"]["max_late_ms"], turn
    barge = doc["turns"][barged - 1]["barge_in"]
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
    _assert_the_call_through_voice_llms_agent(doc, "twilio", 3)


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


class WatchedAgent(converse.Agent):
    """The converse step's agent process (converse.run starts it as it always does; replies of REPLY_TOKENS), watched
    from outside: its ready file as written and its thread count once ready, its thread count once the call is over
    (the step stops it right after the call), and whether its ready file is left once it has stopped."""

    seen: dict[str, Any] = {}

    def __init__(self, command: list[str], ready_file: Path, log_path: Path, **kwargs: Any) -> None:
        super().__init__([*command, "--max-tokens", str(REPLY_TOKENS)], ready_file, log_path, **kwargs)

    def wait_ready(self, timeout_s: float = converse.READY_TIMEOUT_S) -> dict[str, Any]:
        ready = super().wait_ready(timeout_s)
        assert self.process is not None
        self.seen.update(ready_text=self.ready_file.read_text(), idle_threads=_threads(self.process.pid))
        return ready

    def stop(self) -> int | None:
        process = self.process
        if process is not None and process.poll() is None and "idle_threads" in self.seen \
                and "threads_after" not in self.seen:
            # the hang-up joins the call's turn threads; the agent's own pool keeps at most 2 idle workers
            idle, deadline = self.seen["idle_threads"], time.monotonic() + 60
            while (after := _threads(process.pid)) > idle + 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            self.seen["threads_after"] = after
        status = super().stop()
        self.seen["ready_file_left"] = self.ready_file.exists()
        return status


@pytest.mark.slow
@pytest.mark.server
def test_converse_through_voice_llms_agent_over_pcm(module_server, tmp_path, monkeypatch):
    # Two turns, the first barged in on by line 2: each turn proves what each of the lab's four does (answered, the
    # agent's number beside the heard one), and the barge-in is there, over PCM.
    # --stt whisper (issue 39: the agent's default is Moonshine, whisper must still work): this call's agent runs
    # faster-whisper tiny.en, the session lab's call (Twilio) Moonshine
    options = DialOptions(protocol="pcm", turns=2, barge_in_turns=(1,),
                          agent=AgentSettings(stt="whisper", stt_threads=1))
    ctx = LabContext(out=tmp_path, client=ServerClient(module_server.url), kb_dir=SHORT_KB,
                     options=StepOptions(plugins={"dial": options}))
    monkeypatch.setattr(converse, "Agent", WatchedAgent)
    monkeypatch.setattr(WatchedAgent, "seen", {})
    written = converse.run(ctx)
    assert Path(tmp_path / "dial" / "agent.log") in written
    doc = read_json(tmp_path / "dial.json")
    _assert_the_call_through_voice_llms_agent(doc, "pcm", 1)
    assert doc["agent"]["identity"]["engines"]["llm"]["max_tokens"] == REPLY_TOKENS
    assert doc["agent"]["identity"]["engines"]["stt"]["model"] == "tiny.en"  # whisper, recorded as faster-whisper
    assert doc["agent"]["identity"]["engines"]["stt"]["package"] == "faster-whisper"
    # The agent's process: SIGTERM (to its group) stops it with exit 0 and no traceback, the ready line it printed on
    # stdout is its ready file's, which it removes on the way out (a stopped agent claims to serve nothing), and the
    # turn and synthesis threads of the call are gone after it.
    seen = WatchedAgent.seen
    log = (tmp_path / "dial" / "agent.log").read_text()
    assert log.rstrip().endswith("[exit status 0]") and "Traceback" not in log, log[-3000:]
    assert seen["ready_text"].strip() in log.splitlines()
    assert seen["ready_file_left"] is False
    assert seen["threads_after"] <= seen["idle_threads"] + 2, seen
