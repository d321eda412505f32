"""The dial checks on the dialer's own output: a real call over a WebSocket to the fake agent (tests/dial/
fakeagent.py: known delays, known bursts, a clear on the barge-in), both protocols. Every law holds on it (findings
allowed: a loaded machine runs ticks late), and a tampered copy of that real folder still fails. About 4 s of real
time per call, no engine and no server: the fast tier (it was slow-marked, 12 s of the slow tier's one process; the
fast tier's workers wait through such calls side by side)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from dialhelpers import context, tones
from fakeagent import FakeAgent, Reply
from truth import dialled, measured_turns

from voice_llm.core.checks import core
from voice_llm.core.checks.base import FAIL, NOT_CHECKABLE, PASS
from voice_llm.capabilities.dial import CAPABILITY as DIAL_CAPABILITY

DIAL_CHECKS = tuple(c for c in DIAL_CAPABILITY.checks if c.step == "dial")  # listed once, in the capability
from voice_llm.capabilities.dial.step import DialOptions, dial_step
from voice_llm.engines.line import wire
from voice_llm.core.run.folder import RunFolder

REPLIES = [Reply(150, 600, "m1"), Reply(200, 2000, "m2"), Reply(120, 400, "m3")]


@pytest.fixture(scope="module", params=[wire.TWILIO, wire.PCM])
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    protocol = request.param
    rate = wire.TWILIO_RATE if protocol == wire.TWILIO else wire.DEFAULT_PCM_RATE
    options = DialOptions(protocol=protocol, rate=None if protocol == wire.TWILIO else rate, stt="none",
                          lead_ms=200.0, think_ms=100.0, reply_end_ms=300.0, barge_in_turns=(2,),
                          barge_in_after_ms=300.0, deadline_s=10.0)

    def attempt(_: int) -> Path:
        out = tmp_path_factory.mktemp(f"dial-{protocol}")
        with FakeAgent(REPLIES, protocol=protocol, rate=rate) as agent:
            dial_step(context(out), options, agent.url, caller=tones(3, rate=rate))
        return out

    # a measured turn for the laws of the gaps: a call whose every turn a loaded machine's late ticks nulled is
    # dialled again (tests/truth.py)
    return dialled(attempt, lambda out: json.loads((out / "dial.json").read_text()))


def results(out: Path) -> dict[str, object]:
    folder = RunFolder(out)
    return {c.function.rsplit(":", 1)[1]: core._result(c, folder) for c in DIAL_CHECKS}


def test_the_dialers_own_call_holds_every_law(real: Path) -> None:
    found = results(real)
    assert not {n: r.detail for n, r in found.items() if r.status == FAIL}
    for name in ("check_values", "check_files", "check_recording", "check_heard_gaps", "check_barge_in",
                 "check_event_order", "check_uplink", "check_summary"):
        assert found[name].status == PASS, (name, found[name].detail)
    assert found["check_agent_reported"].status == NOT_CHECKABLE  # the fake agent sends no spans


def test_a_tampered_copy_of_the_real_call_fails(real: Path, tmp_path: Path) -> None:
    out = Path(shutil.copytree(real, tmp_path / "copy"))
    doc = json.loads((out / "dial.json").read_text())
    turn = doc["turns"][measured_turns(doc, after_barge_in=True)[0]]  # timed (PCM: no clear, turn 3 is talked over)
    turn["heard"]["first_sound_ms"] += 60.0
    turn["heard"]["gap_ms"] += 60.0
    (out / "dial.json").write_text(json.dumps(doc))
    (out / "dial" / "caller-04.wav").write_bytes((out / "dial" / "caller-03.wav").read_bytes())
    failed = {n for n, r in results(out).items() if r.status == FAIL}
    assert {"check_heard_gaps", "check_files"} <= failed


def test_the_agents_spans_beside_the_heard_call_hold(tmp_path: Path) -> None:
    """--otlp: the fake agent's invoke_agent spans give each turn agent_reported; the line's share is recomputed
    and judged (the agent reports exactly its delay: the share is the jitter delay within a frame, no finding)."""
    from voice_llm.capabilities.dial.step import Tracing

    options = DialOptions(stt="none", lead_ms=200.0, think_ms=100.0, reply_end_ms=300.0, barge_in_turns=(),
                          deadline_s=10.0)

    def attempt(number: int) -> Path:
        out = tmp_path / f"call-{number}"
        tracing = Tracing("127.0.0.1:0")
        with FakeAgent([Reply(150, 300), Reply(200, 300)], otlp=tracing.endpoint) as agent:
            dial_step(context(out), options, agent.url, caller=tones(2), tracing=tracing)
        return out

    out = dialled(attempt, lambda out: json.loads((out / "dial.json").read_text()))  # a timed turn to judge
    found = results(out)
    assert not {n: r.detail for n, r in found.items() if r.status == FAIL}
    assert found["check_agent_reported"].status in (PASS, "finding")
    assert "heard minus reported" in found["check_agent_reported"].detail
    assert found["check_files"].status == PASS  # the OTLP bodies are named
