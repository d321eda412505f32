"""`voice-llm agent` for real: Silero, tiny.en, Piper and a real llama-server, one real-time call over the Twilio
line with a barge-in, the agent's spans received over OTLP. That call is the session lab's converse step
(`voice-llm dial` against `voice-llm agent --otlp <dial's receiver>`, 4 turns, turn 3 barged in on by line 4): its
dial.json, dial/otlp/*.bin (the bodies as received) and dial/agent.log (the agent's stdout and stderr, and its exit
status) are read here. What must hold: every turn's breakdown is in causal order on the agent's clock, its spans
arrive (one trace, an invoke_agent per turn with its children), the caller's barge-in is answered with a clear, and
the agent stops on SIGTERM with exit 0 and no traceback. What only a process of one's own shows (the ready file
gone after SIGTERM, the ready line on stdout, the call's threads gone after it) is asserted on the PCM call of
tests/dial/test_dial_real.py, which starts its agent itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentkit import decode_spans
from clihelpers import LAB_REPLY_TOKENS
from truth import measured_turns
from voice_llm.core.util.artifacts import read_json

ORDER = ["vad_speech_end", "endpoint", "stt_start", "stt_end", "request_sent", "first_token", "first_segment_text",
         "first_audio_ready", "first_audio_sent"]
FRAME_NS = 20_000_000  # one 20 ms frame: the agent's and the caller's events are stamped on frame ticks


@pytest.mark.slow
def test_one_real_call_breakdown_in_causal_order_and_spans_received(lab_run: tuple[Path, Any]) -> None:
    out, _ = lab_run
    doc = read_json(out / "dial.json")
    log = (out / doc["files"]["agent_log"]).read_text()
    # the agent the lab started and stopped (SIGTERM to its group): exit 0, no traceback, its ready line on stdout
    assert log.rstrip().endswith("[exit status 0]") and "Traceback" not in log, log[-3000:]
    ready = json.loads(next(line for line in log.splitlines() if line.startswith("{")))
    identity = doc["agent"]["identity"]
    assert {key: ready[key] for key in identity} == identity  # dial.json's agent block is that ready line's
    assert ready["engine"] == "builtin" and ready["listen"] == doc["agent"]["url"]
    assert ready["listen"].startswith("ws://127.0.0.1:") and not ready["listen"].startswith("ws://127.0.0.1:0/")
    # the agent's default STT (issue 39): Moonshine tiny on one onnxruntime thread
    assert ready["engines"]["stt"]["model"] == "moonshine-tiny-en" and ready["engines"]["stt"]["cpu_threads"] == 1
    assert ready["engines"]["tts"]["engine"] == "piper"
    assert ready["engines"]["llm"]["max_tokens"] == LAB_REPLY_TOKENS  # the lab's --reply-max-tokens reached it

    spans = decode_spans((out / name).read_bytes() for name in doc["files"]["otlp"])
    turns = sorted((s for s in spans if s["name"] == "invoke_agent"),
                   key=lambda s: s["attributes"]["voice_llm.turn.number"])
    assert len({s["trace_id"] for s in spans}) == 1
    assert [t["attributes"]["voice_llm.turn.number"] for t in turns] == list(range(1, len(doc["turns"]) + 1))
    barged = doc["settings"]["barge_in_turns"]
    assert barged, doc["settings"]  # the lab's call has its barge-in (turn 3)
    for number in barged:
        assert turns[number - 1]["attributes"]["gen_ai.agent.invocation.end_reason"] == "interrupted"
        assert doc["turns"][number - 1]["barge_in"]["cleared_ms"] is not None
    assert doc["playout"]["clears"] >= 1  # the barge-in was cleared at the caller
    for turn in turns:
        events = turn["events"]
        assert all(name in events for name in ORDER), events
        # Two causal chains (speculative STT and the preemptive reply are the defaults: the decode and the reply may
        # start before the endpoint, but nothing is sent before it): the reply's own stages in order from the VAD's
        # speech end, and the endpoint between that speech end and the first audio sent.
        times = [events[name] for name in ORDER if name != "endpoint"]
        assert times == sorted(times), {name: events[name] for name in ORDER}
        assert events["vad_speech_end"] <= events["endpoint"] <= events["first_audio_sent"], events
        reported = turn["attributes"]["voice_llm.latency.reported_ms"]
        assert reported == pytest.approx((events["first_audio_sent"] - events["vad_speech_end"]) / 1e6, abs=0.1)  # 0.1 ms rounding
        children = {s["name"] for s in spans if s["parent"] == turn["span_id"]}
        assert children == {"speech_to_text", "chat", "text_to_speech"}
    # Against the caller's ear, on one machine (one clock: dial's t0_epoch_ns is time.time_ns at the call's sample 0,
    # the agent's events are epoch ns): the agent's speech end is after the caller's true speech end, and its first
    # audio sent is before the first heard sound (the caller cannot hear what was not sent), so the heard gap is at
    # least the reported latency, each within a frame.
    assert doc["clock"].startswith("ms since the call started")
    compared = 0
    # timed, but where a late tick nulled a gap (LATE_TICK_RULE: near a tick of the dialer's that ran late the
    # recording is not when things happened), or the barge-in's line was talked over by the reply it cut into, with
    # their reasons (tests/truth.py): no relation to hold there
    measured = measured_turns(doc, after_barge_in=True)
    for index, (turn, row) in enumerate(zip(turns, doc["turns"])):
        heard = row["heard"]
        if heard["first_sound_ms"] is None:
            continue
        if index not in measured:
            compared += 1
            continue
        end_ns = doc["t0_epoch_ns"] + row["caller"]["speech_end_ms"] * 1e6
        sound_ns = doc["t0_epoch_ns"] + heard["first_sound_ms"] * 1e6
        # within a frame, and the dialer's own lateness (a tick up to a frame late is not nulled, but plays its
        # frame at its nominal place: the recording's times are that much early)
        late_ns = doc["playout"]["max_late_ms"] * 1e6
        assert turn["events"]["vad_speech_end"] >= end_ns - FRAME_NS, row["index"]
        assert turn["events"]["first_audio_sent"] <= sound_ns + FRAME_NS + late_ns, row["index"]
        assert heard["gap_ms"] >= turn["attributes"]["voice_llm.latency.reported_ms"] - 2 * 20 - late_ns / 1e6
        compared += 1
    assert compared == len(doc["turns"])  # every turn of the lab's call was heard
