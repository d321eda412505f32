"""The phone bridges (issue 40 items 1 and 5): `voice-llm dial --protocol telnyx|plivo|exotel|vonage` against a test
agent of known delays that speaks each bridge's agent side as its provider documents it (tests/dial/fakeagent.py
BRIDGE_SIDES, written by hand, not through voice_llm.engines.line's framings). What was heard at the caller's ear equals
what the agent did, within one frame, on every bridge, as on Twilio and PCM: heard gap = the agent's real delay +
the jitter delay (never less), a barge-in heard silent within a frame of the agent's clear, each mark (checkpoint,
notify) echoed after its audio played, the caller's messages numbered as the bridge numbers them, and every check
of `voice-llm check` passes on the files. Bad input per bridge: one line, the partial call kept.

Third-party proof (pipecat's own serializers for each bridge) is the slow test in
tests/agent/test_pipecat_agent_real.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dialhelpers import context, tones
from fakeagent import FakeAgent, Reply
from test_dial_call import fast_options
from test_dial_faults import failing_call, quick
from truth import (EPS_MS, FRAME_MS, JITTER_MS, assert_heard_as_it_happened, dialled, measured_turns, receiving,
                   slack)

from voice_llm.core.checks import core
from voice_llm.core.checks.base import FAIL
from voice_llm.capabilities.dial import CAPABILITY as DIAL_CAPABILITY
from voice_llm.capabilities.dial.step import dial_step
from voice_llm.engines.line import wire
from voice_llm.core.util.artifacts import read_json

REPLIES = [Reply(150, 400, "m1"), Reply(200, 1200, "m2"), Reply(120, 300, "m3")]
DIAL_CHECKS = {c.name for c in DIAL_CAPABILITY.checks if c.step == "dial"}


@pytest.fixture(scope="module", params=wire.BRIDGES)
def bridge_call(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    protocol = request.param
    line = wire.line_for(protocol)

    def attempt(_: int):
        out = tmp_path_factory.mktemp(protocol)
        with FakeAgent(REPLIES, protocol=protocol) as agent, receiving() as received:
            dial_step(context(out), fast_options(protocol=protocol), agent.url, caller=tones(3, rate=line.rate))
        return protocol, read_json(out / "dial.json"), agent, out, received.read(out)

    return dialled(attempt, lambda result: result[1])


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "dial" / "events.jsonl").read_text().splitlines()]


def test_the_line_is_the_bridges_own(bridge_call):
    protocol, doc, agent, _, _ = bridge_call
    codec, rate = wire.FIXED_FORMATS[protocol]
    assert (doc["line"]["protocol"], doc["line"]["codec"], doc["line"]["rate"]) == (protocol, codec, rate)
    # the caller's side opened as the bridge does (Vonage: one JSON text message; Plivo: the start alone)
    opening = {"telnyx": ["connected", "start"], "plivo": ["start"], "exotel": ["connected", "start"],
               "vonage": ["websocket:connected"]}[protocol]
    assert agent.received[:len(opening)] == opening


def test_heard_gaps_are_the_agents_delays_plus_the_jitter_buffer(bridge_call):
    _, doc, agent, _, received = bridge_call
    assert [s.turn for s in agent.sent] == [1, 2, 3]
    for index in measured_turns(doc, after_barge_in=True):  # as on Twilio (test_dial_call): each leg as logged
        leg = assert_heard_as_it_happened(doc, doc["turns"][index], agent.sent[index], received)
        assert leg.ahead == JITTER_MS and leg.onset == 0.0, leg


def test_a_barge_in_is_heard_silent_within_a_frame_of_the_clear(bridge_call):
    _, doc, agent, _, _ = bridge_call
    barge = doc["turns"][1]["barge_in"]
    assert len(agent.clears) == 1 and barge["cleared_ms"] is not None
    assert abs(barge["heard_silent_ms"] - barge["cleared_ms"]) <= FRAME_MS + slack(doc), barge


def test_marks_are_echoed_after_their_audio_played(bridge_call):
    _, doc, agent, out, _ = bridge_call
    rows = _events(out)
    up_marks = {row["name"]: row for row in rows if row.get("dir") == "up" and row["event"] == "mark"}
    names = {"m1", "m2", "m3"}
    # Vonage's notify carries a payload: the dialer's mark name is its JSON text
    got = {json.loads(name)["name"] if name.startswith("{") else name: row for name, row in up_marks.items()}
    assert set(got) == names and sorted(agent.marks_back) == sorted(names)
    for name, index in (("m1", 0), ("m3", 2)):
        heard = doc["turns"][index]["heard"]
        assert heard["last_sound_ms"] - EPS_MS <= got[name]["t_ms"] <= heard["last_sound_ms"] + FRAME_MS + slack(doc)


def test_the_uplink_is_numbered_and_in_real_time(bridge_call):
    protocol, doc, _, out, _ = bridge_call
    media = [row for row in _events(out) if row.get("dir") == "up" and row["event"] == "media"]
    assert [row["frame"] for row in media] == list(range(len(media))) == list(range(doc["playout"]["frames"]))
    assert all(row["t_ms"] >= (row["frame"] + 1) * FRAME_MS - 0.5 for row in media)
    if protocol != wire.VONAGE:  # the JSON bridges number every message of the caller's side
        seqs = [row["seq"] for row in _events(out) if row.get("dir") == "up" and "seq" in row]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def test_every_check_passes_on_the_files(bridge_call):
    _, _, _, out, _ = bridge_call
    found = {r.name: r for r in core.run_checks(out) if r.name in DIAL_CHECKS}
    assert found and not [(n, r.detail) for n, r in found.items() if r.status == FAIL]


@pytest.mark.parametrize("protocol", wire.BRIDGES)
def test_garbage_on_a_bridge_is_one_line_and_the_call_is_kept(tmp_path, protocol):
    with FakeAgent([Reply(100, 200, "m1")], mode="garbage", protocol=protocol) as agent:
        failing_call(tmp_path, agent.url, quick(protocol=protocol), "the agent sent what the line does not carry "
                     "in turn 1", "not a JSON message")


def test_a_bridge_takes_no_rate_or_codec_of_its_own():
    from voice_llm.core.errors import ConfigError

    for protocol in wire.BRIDGES:
        with pytest.raises(ConfigError, match="--rate and --codec are for --protocol pcm"):
            fast_options(protocol=protocol, rate=44100)
    with pytest.raises(ValueError, match="a vonage line carries pcm16 at 16000 Hz"):
        wire.LineFormat(wire.VONAGE, wire.MULAW, 8000)


def test_every_protocol_has_one_framing_module_on_the_one_interface():
    from voice_llm.engines.line import protocols
    from voice_llm.engines.line.framing import FRAMINGS, Framing

    assert set(FRAMINGS) == set(wire.PROTOCOLS)
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in protocols.MODULES) == sorted(wire.PROTOCOLS)
    for protocol, cls in FRAMINGS.items():
        assert issubclass(cls, Framing) and cls.__module__ == f"voice_llm.engines.line.{protocol}"
    # a line without marks or clear says so (docs/line.md "The bridges", "WebRTC"): raw PCM and WebRTC
    assert [p for p in wire.PROTOCOLS if not all(protocols.capabilities(p).values())] == [wire.PCM, wire.WEBRTC]
