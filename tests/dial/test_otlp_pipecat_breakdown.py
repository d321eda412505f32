"""Issue 40 item 3: why a third-party agent is slow. pipecat's turn span carries only its own latency
(turn.user_bot_latency_seconds); its stt, llm and tts spans and their metrics.ttfb are mapped to the stages the
built-in agent reports (voice_llm.capabilities.dial.otlp.pipecat_breakdown), per dial turn, so dial.json, the report and
load --dial name pipecat's stages too. The spans are a real call's (tests/fixtures/pipecat_call_spans/call.json says
which); a stage the spans say nothing of is null with its reason."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from voice_llm.capabilities.dial.otlp import (CALL_LIMITS, PIPECAT_ENDPOINT_UNKNOWN, PIPECAT_SOURCE, PROTOBUF, Span, clock_for,
                                 decode_request, flatten, match)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "pipecat_call_spans"
CALL = json.loads((FIXTURE / "call.json").read_text())
STAGES = ("stt", "handoff", "request_to_first_token", "first_token_to_first_segment", "segment_to_first_audio",
          "audio_to_sent")


def _spans() -> list[Span]:
    return [span for i, name in enumerate(CALL["bodies"], 1)
            for span in flatten(decode_request((FIXTURE / Path(name).name).read_bytes(), PROTOBUF), i, 0.0)]


def _matched(spans: list[Span]):  # type: ignore[no-untyped-def]
    ends = CALL["speech_end_ms"]
    return match(ends, spans, clock_for(spans, CALL["t0_epoch_ns"], ends, None))


def test_pipecats_turns_get_the_built_in_agents_stages_adding_up_to_its_own_latency() -> None:
    reported = _matched(_spans())
    assert all(r is not None and r.source == PIPECAT_SOURCE for r in reported)
    for turn, found in zip(CALL["reported_ms"], reported):
        assert found is not None and found.latency_ms == pytest.approx(turn, abs=0.001)
        parts = found.breakdown
        assert parts is not None and set(parts) == {"endpoint_wait", *STAGES}
        assert all(parts[k] is not None and parts[k] >= 0 for k in STAGES), parts
        # the parts run from pipecat's VAD stop to its first audio sent: its own latency, as the report stacks it
        assert sum(parts[k] for k in STAGES) == pytest.approx(found.latency_ms, abs=1.0)
        assert parts["endpoint_wait"] is None and found.breakdown_unknown == {"endpoint_wait": PIPECAT_ENDPOINT_UNKNOWN}
    # the first turn's LLM first token is its own span's metrics.ttfb: the llm span the reply came from (the first
    # after the caller's speech end), not the one answering the lead-in's "Hi." before the caller's line ended
    first = reported[0]
    assert first is not None and first.breakdown is not None
    llms = sorted((s for s in _spans() if s.name == "llm"), key=lambda s: s.start_ns)
    assert first.breakdown["request_to_first_token"] == pytest.approx(llms[1].attributes["metrics.ttfb"] * 1000, abs=0.1)


def test_pipecats_transcript_of_a_line_is_every_segment_it_heard_before_the_reply() -> None:
    """pipecat ends its turn at a pause inside a line and transcribes each segment on its own: the real call's line 1
    reached its LLM as "Hi." (the comma) and then the rest, and line 2's "Okay." sits in the turn span of line 1.
    The transcript of a line is every stt segment between the previous reply's llm and this reply's, in order; one
    stt span alone (the first, as it was) gave "Hi." and "Okay.": 17 of 18 and 4 of 5 word errors of a line pipecat
    had heard whole."""
    reported = _matched(_spans())
    assert [r.transcript if r is not None else None for r in reported] == [
        "Hi. I'd like to come in for the first time. What should I bring as a new patient?",
        "Okay. Do you take Medicare?"]
    # a segment whose stt span carries no transcript is left out; a reply with none in its window has None
    spans = [replace(s, attributes={k: v for k, v in s.attributes.items() if k != "transcript"})
             if s.attributes.get("transcript") == "Okay." else s for s in _spans()]
    assert [r.transcript for r in _matched(spans) if r is not None][1] == "Do you take Medicare?"
    bare = [replace(s, attributes={k: v for k, v in s.attributes.items() if k != "transcript"}) for s in _spans()]
    assert [r.transcript for r in _matched(bare) if r is not None] == [None, None]


@pytest.mark.parametrize("name, stages", [
    ("tts", {"segment_to_first_audio", "audio_to_sent"}),
    ("llm", {"request_to_first_token", "first_token_to_first_segment"}),
    ("stt", {"stt", "audio_to_sent"}),
])
def test_a_span_without_its_ttfb_leaves_its_stages_null_with_the_reason(name: str, stages: set[str]) -> None:
    spans = [replace(s, attributes={k: v for k, v in s.attributes.items() if k != "metrics.ttfb"})
             if s.name == name else s for s in _spans()]
    for found in _matched(spans):
        assert found is not None and found.breakdown is not None
        assert {k for k in STAGES if found.breakdown[k] is None} == stages
        assert all("metrics.ttfb" in found.breakdown_unknown[k] or "not known" in found.breakdown_unknown[k]
                   for k in stages), found.breakdown_unknown


def test_spans_out_of_order_give_no_negative_stage() -> None:
    """A tts span that starts before the llm's first token (a clock or span bug of the agent): that part is null
    with what the spans said, never a negative number (dial's check_values refuses those)."""
    spans = _spans()
    llm_ttfb = {s.span_id: s.attributes["metrics.ttfb"] for s in spans if s.name == "llm"}
    spans = [replace(s, attributes={**s.attributes, "metrics.ttfb": 30.0}) if s.name == "llm" else s for s in spans]
    for found in _matched(spans):
        assert found is not None and found.breakdown is not None
        assert found.breakdown["first_token_to_first_segment"] is None
        assert "negative" in found.breakdown_unknown["first_token_to_first_segment"]
    assert llm_ttfb  # the planted value replaced real ones


def test_dial_json_states_the_null_stages_reasons(tmp_path: Path) -> None:
    """Through dial's own path (step._apply_otlp): the parts in turns[].agent_breakdown, the reasons in unknown."""
    from voice_llm.capabilities.dial import step

    class Receiver:
        def spans(self) -> list[Span]:
            return _spans()

        def bodies(self) -> list:  # type: ignore[type-arg]
            return []

        received = 1
        limits = CALL_LIMITS

        def refused(self) -> list[str]:
            return []

        def refused_count(self) -> int:
            return 0

    rows = [{"caller": {"speech_end_ms": end}, "heard": {"gap_ms": gap}, "script": None}
            for end, gap in zip(CALL["speech_end_ms"], CALL["heard_gap_ms"])]
    unknown = step._Unknown()
    step._apply_otlp(rows, Receiver(), CALL["t0_epoch_ns"], "127.0.0.1:4318", unknown)
    for position, row in enumerate(rows):
        assert row["agent_breakdown"]["endpoint_wait"] is None
        assert unknown.reasons[f"turns[{position}].agent_breakdown.endpoint_wait"] == PIPECAT_ENDPOINT_UNKNOWN
        assert row["heard_minus_reported_ms"] == pytest.approx(row["heard"]["gap_ms"] - row["agent_reported"]["latency_ms"], abs=0.01)
