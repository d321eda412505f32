"""The agent's own stage times for dialing callers (``load --dial URL --otlp-listen HOST:PORT``).

Why one receiver for the run: the agent exports every call's spans to its single ``--otlp`` endpoint, so the
concurrent dial calls cannot each bind it (``dial --otlp`` is one call's receiver). The load command starts ONE
OTLP/HTTP receiver (dial's, through dial's public face) for the whole run, the user points the agent at it
(``voice-llm agent --otlp http://HOST:PORT``), and after each sweep every turn sample gets the agent's breakdown of
its turn. The agent's spans carry the call's Twilio streamSid (``voice_llm.call.stream_sid``, from the ``start``
the dialer sent) and each sample carries its call's streamSid (dial.json ``line.stream_sid``): spans go to their
call by it, then to the call's turns by dial's own rule (dial.otlp.match: the turn whose caller speech ended last
at or before the span's end) on the call's clock (its ``t0_epoch_ns``). A span without a streamSid, or of a call
no sample names, is counted and left out: never guessed onto a call.

The receiver stamps each body's arrival in epoch ms; per call it is shifted onto that call's clock, so dial's
clock rule (a span that ends after its body arrived shows an offset) holds per call as in `dial --otlp`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from voice_llm.capabilities.dial import OTLP_RUN_LIMITS, OTLPReceiver, otlp_clock_for, otlp_match, parse_otlp_listen
from voice_llm.core.errors import ConfigError
from voice_llm.capabilities.load.stats import AGENT_STAGES, stage_column

STREAM_SID = "voice_llm.call.stream_sid"  # what voice-llm's agent puts on its call and turn spans (agent/otel.py)
RULE = ("spans to calls by voice_llm.call.stream_sid = the call's streamSid (dial.json line.stream_sid; a turn span "
        "without it: by its trace's call span); to turns by dial's rule: the turn whose caller speech ended last at "
        "or before the span's end, on the call's clock (t0_epoch_ns)")


def epoch_ms() -> float:
    return time.time_ns() / 1e6


def start_receiver(listen: str) -> Any:
    """The run's OTLP receiver on ``listen`` (HOST:PORT), listening; ConfigError in one line when it cannot."""
    try:
        host, port = parse_otlp_listen(listen)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("--otlp", "--otlp-listen")) from None
    try:
        return OTLPReceiver(host, port, epoch_ms, OTLP_RUN_LIMITS).start()  # binds in the constructor
    except OSError as exc:
        raise ConfigError(f"--otlp-listen {listen}: cannot listen there ({exc.strerror or exc})") from None


def by_call(spans: Sequence[Any]) -> tuple[dict[str, list[Any]], int]:
    """The spans of each streamSid (a span without one joins its trace's call span's), and how many had none."""
    trace_sid = {s.trace_id: s.attributes[STREAM_SID] for s in spans if isinstance(s.attributes.get(STREAM_SID), str)}
    calls: dict[str, list[Any]] = {}
    orphans = 0
    for span in spans:
        sid = span.attributes.get(STREAM_SID)
        sid = sid if isinstance(sid, str) else trace_sid.get(span.trace_id)
        if sid is None:
            orphans += 1
            continue
        calls.setdefault(sid, []).append(span)
    return calls, orphans


@dataclass(frozen=True)
class Attached:
    """What attaching the spans did, for load.json's ``agent_spans`` block."""

    calls: int  # calls (streamSids) of the samples that had spans
    turns: int  # turn samples that got stage times
    spans: int
    without_sid: int  # spans that named no call: left out


def attach(samples: Sequence[MutableMapping[str, Any]], spans: Sequence[Any]) -> Attached:
    """Give each turn sample the agent's stage times (and its reported latency) from its call's spans; a sample
    that has them already (its call received the spans itself) or whose call sent none is left as it is."""
    calls, orphans = by_call(spans)
    rows: dict[str, list[MutableMapping[str, Any]]] = {}
    for sample in samples:
        if isinstance(sample.get("stream_sid"), str) and sample.get("speech_end_ms") is not None:
            rows.setdefault(sample["stream_sid"], []).append(sample)
    matched_calls = matched_turns = 0
    for sid, turns in rows.items():
        call_spans, t0 = calls.get(sid), turns[0].get("t0_epoch_ns")
        if not call_spans or not isinstance(t0, int):
            continue
        matched_calls += 1
        # the arrivals (epoch ms) on this call's clock, as dial's own receiver stamps them
        shifted = [replace(span, arrival_ms=span.arrival_ms - t0 / 1e6) for span in call_spans]
        turns = sorted(turns, key=lambda s: s["speech_end_ms"])
        ends = [s["speech_end_ms"] for s in turns]
        found = otlp_match(ends, shifted, otlp_clock_for(shifted, t0, ends))  # the offset from the matched spans
        for sample, reported in zip(turns, found):
            if reported is None or any(sample.get(stage_column(st)) is not None for st in AGENT_STAGES):
                continue
            breakdown = reported.breakdown or {}
            sample.update({stage_column(st): _number(breakdown.get(st)) for st in AGENT_STAGES})
            if sample.get("agent_reported_ms") is None:
                sample["agent_reported_ms"] = float(reported.latency_ms)
            matched_turns += 1
    return Attached(matched_calls, matched_turns, len(spans), orphans)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def block(listen: str | None, receiver: Any, attached: Sequence[Attached]) -> dict[str, Any] | None:
    """load.json's ``agent_spans``: where the spans were received and what matched (None: no --otlp-listen)."""
    if listen is None:
        return None
    bodies = receiver.bodies() if receiver is not None else []
    # the bodies kept, and those refused (the receiver's limits: voice_llm.capabilities.dial.otlp.RUN_LIMITS) counted, the first
    # lines kept
    return {"listen": listen, "bodies": len(bodies), "refused": receiver.refused() if receiver is not None else [],
            "refused_bodies": receiver.refused_count() if receiver is not None else 0,
            "spans": sum(a.spans for a in attached[-1:]), "without_stream_sid": sum(a.without_sid for a in attached[-1:]),
            "calls_matched": sum(a.calls for a in attached), "turns_matched": sum(a.turns for a in attached),
            "rule": RULE, "stages": list(AGENT_STAGES)}


__all__ = ["Attached", "RULE", "STREAM_SID", "attach", "block", "by_call", "start_receiver"]
