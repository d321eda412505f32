"""`voice-llm agent` for real: Silero, tiny.en, Piper and a real llama-server, one real-time call over the Twilio
line by a small caller (realcaller.py), the agent's spans received by a tiny OTLP collector. What must hold: every
turn's breakdown is in causal order on the agent's clock, its spans arrive (one trace, an invoke_agent per turn with
its children), the caller's barge-in is answered with a clear, the agent stops on SIGTERM with exit 0 and no
traceback, and the threads it runs during a call are gone after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clihelpers import wait_for_ready

from agentkit import collector
from conftest import RunningServer
from fakeserver import free_port
from realcaller import call, caller_lines

ORDER = ["vad_speech_end", "endpoint", "stt_start", "stt_end", "request_sent", "first_token", "first_segment_text",
         "first_audio_ready", "first_audio_sent"]


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


@pytest.mark.slow
@pytest.mark.server
def test_one_real_call_breakdown_in_causal_order_and_spans_received(shared_server: RunningServer,
                                                                     tmp_path: Path) -> None:
    port = free_port()
    ready_file = tmp_path / "ready.json"
    with collector() as found:
        agent = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "voice_llm", "agent", "--listen", f"127.0.0.1:{port}",
             "--url", shared_server.url, "--otlp", found.url, "--ready-file", str(ready_file)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
        try:
            ready = wait_for_ready(agent, ready_file, 180)
            assert ready["listen"] == f"ws://127.0.0.1:{port}/" and ready["engine"] == "builtin"
            assert ready["engines"]["stt"]["model"] == "tiny.en" and ready["engines"]["tts"]["engine"] == "piper"
            idle_threads = _threads(agent.pid)
            lines = caller_lines(2)
            result = call(ready["listen"], lines, barge=1)
            # the hang-up joins the call's turn threads; the agent's own pool keeps at most 2 idle workers
            deadline = time.monotonic() + 60
            while (threads_after := _threads(agent.pid)) > idle_threads + 2 and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            agent.send_signal(signal.SIGTERM)
            out, err = agent.communicate(timeout=120)
        assert agent.returncode == 0, err
        assert "Traceback" not in err
        assert not ready_file.exists()  # a stopped agent leaves no ready file claiming it serves
        assert json.loads(out.splitlines()[0]) == ready  # the ready line on stdout is the file's
        spans = found.spans()
    assert threads_after <= idle_threads + 2  # the turn and synthesis threads of the call are gone
    turns = [s for s in spans if s["name"] == "invoke_agent"]
    assert len({s["trace_id"] for s in spans}) == 1
    assert [t["attributes"]["voice_llm.turn.number"] for t in turns] == list(range(1, len(turns) + 1))
    assert len(turns) >= 2, err
    assert turns[0]["attributes"]["gen_ai.agent.invocation.end_reason"] == "interrupted"
    assert result["clears"] >= 1  # the barge-in was cleared at the caller
    for turn in turns:
        events = turn["events"]
        assert all(name in events for name in ORDER), events
        times = [events[name] for name in ORDER]
        assert times == sorted(times), dict(zip(ORDER, times))
        reported = turn["attributes"]["voice_llm.latency.reported_ms"]
        assert reported == pytest.approx((events["first_audio_sent"] - events["vad_speech_end"]) / 1e6, abs=0.1)  # 0.1 ms rounding
        children = {s["name"] for s in spans if s["parent"] == turn["span_id"]}
        assert children == {"speech_to_text", "chat", "text_to_speech"}
    # Against this caller's ear, on one machine (one clock, converted to epoch ns on both sides within a frame): the
    # agent's speech end is after the caller's true speech end, and its first audio sent is before the first heard
    # sound (the caller cannot hear what was not sent), so the heard gap is at least the reported latency.
    frame_ns = 20_000_000
    compared = 0
    for turn, heard in zip(turns, result["turns"]):
        if heard.get("first_sound_ms") is None:
            continue
        end_ns = result["t0_epoch_ns"] + heard["end_ms"] * 1e6
        sound_ns = result["t0_epoch_ns"] + heard["first_sound_ms"] * 1e6
        assert turn["events"]["vad_speech_end"] >= end_ns - frame_ns
        assert turn["events"]["first_audio_sent"] <= sound_ns + frame_ns
        assert heard["gap_ms"] >= turn["attributes"]["voice_llm.latency.reported_ms"] - 2 * 20
        compared += 1
    assert compared >= 1
