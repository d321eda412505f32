"""A dial run folder built in code from docs/line.md's contract, its dial.json built as the dialer builds it
(voice_llm.capabilities.dial.doc.DialDoc, the one type dial/step.py writes and the checks read): dial.json, dial/events.jsonl,
dial/call.wav (stereo, 8 kHz, left = the caller's tones as sent, right = the "assistant" tones as the playout buffer
let them out) and dial/caller-NN.wav, every number consistent with every other. No speech engine, no socket: a small simulation of
the phone's ear on the tick grid (one 20 ms frame per tick) places each reply where a playout buffer with a 40 ms
jitter delay would have played it, so the checks' re-measurements of the recording must agree with it.

The simulated call (defaults): four turns; the agent's own reported latency per turn (from its VAD's end of speech,
10 ms after the true end, to its first audio sent, which reaches the caller 1 ms later); each reply sent at once as
a burst with a mark after each of its two segments; turn 3 barged in on: the caller starts line 4 so that its true
onset is 500 ms after the reply's first heard sound, the agent sends `clear` 125 ms after the onset, and the buffer
is emptied as the clear arrives (the next frame is silent).
"""

from __future__ import annotations

import io
import json
import math
import wave
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from voice_llm.capabilities.dial.doc import (DIAL_SCHEMA_VERSION, Agent, AgentReported, BargeIn, DialDoc, DialerCost, Files, Floor,
                                Heard, Line, Otlp, Playout, Settings, Spread, Summary, Turn, TurnCaller, Wer)
from voice_llm.capabilities.dial.measure import heard_channel
from voice_llm.engines.speech_in.caller_audio import audible_span
from voice_llm.engines.speech_in.wer import wer
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import dumps_json

RATE = 8000
FRAME_MS = 20.0
FS = int(RATE * FRAME_MS / 1000)  # 160 samples per frame
JITTER_MS = 40.0
FLOOR = 100
LEAD_MS = 300.0  # the caller WAV's silence before its speech
TAIL_MS = 100.0  # ... and after it
SCRIPTS = ("Hi, I'd like to book an appointment.", "Tuesday morning would be great.",
           "Do you take Medicare?", "Actually, make it Wednesday please.")
HEARD = ("Sure, which day suits you?", "Tuesday at nine works.", "Yes, we accept Medicare and most plans.",
         "Wednesday at ten is free.")
AGENT_HEARD = ("Hi, I'd like to book an appointment.", "Tuesday morning would be grand.",
               "Do you take Medicare?", "Actually, make it Wednesday please.")


MEDIAN_ONLY = frozenset({"p90", "talked_over", "late_tick"})  # a summary block of a median and a count


def ms(sample: int) -> float:
    return sample * 1000.0 / RATE


def sample(t_ms: float) -> int:
    return round(t_ms * RATE / 1000.0)


def next_tick(t_ms: float) -> float:
    """The start of the first tick at or after ``t_ms`` (the frame grid of sample 0)."""
    return math.ceil(t_ms / FRAME_MS - 1e-9) * FRAME_MS


def tone(length_ms: float, amplitude: float, hz: float) -> np.ndarray:
    """A cosine (its first sample at full amplitude: the sound starts at sample 0) of ``length_ms``."""
    n = sample(length_ms)
    t = np.arange(n) / RATE
    return np.round(amplitude * np.cos(2 * np.pi * hz * t)).astype(np.int16)


def square(length_ms: float, amplitude: float, hz: float) -> np.ndarray:
    """A square wave of ``length_ms``: every sample at +-``amplitude``, so a reply sounds from its first sample to
    its last whatever the heard floor (FLOOR_RULE raises it over the audio received: FLOOR_MAX here)."""
    return np.where(tone(length_ms, 1.0, hz) >= 0, amplitude, -amplitude).astype(np.int16) if length_ms else \
        np.zeros(0, np.int16)


def mono_wav(samples: np.ndarray, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()


def stereo_wav(left: np.ndarray, right: np.ndarray, rate: int = RATE) -> bytes:
    both = np.empty(2 * len(left), dtype="<i2")
    both[0::2], both[1::2] = left, right
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(both.tobytes())
    return buf.getvalue()


def read_stereo(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with wave.open(str(path), "rb") as wav:
        data = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    return data[0::2].copy(), data[1::2].copy()


@dataclass
class Plan:
    speech_ms: tuple[float, ...] = (1600.0, 1200.0, 1000.0, 1400.0)
    reported_ms: tuple[float, ...] = (900.0, 960.0, 1010.0, 930.0)
    reply_ms: tuple[float, ...] = (1500.0, 1300.0, 3000.0, 1200.0)
    barge_in_turns: tuple[int, ...] = (3,)
    barge_in_after_ms: float = 500.0
    clear_after_onset_ms: float = 125.0
    # audio the agent sends after its clear (the tail of a synthesis it had in flight, as pipecat does): a burst of
    # this length 1 ms after the clear, played from the emptied buffer after the jitter delay; 0: none
    sent_after_clear_ms: float = 0.0
    vad_lag_ms: float = 10.0
    transport_ms: float = 1.0
    otlp: bool = True  # the agent reported its own numbers (spans received)
    late_frames: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # more top-level keys of dial.json (DialDoc.extra)


def _breakdown(latency: float) -> dict[str, float]:
    parts = {"endpoint_wait": 300.0, "stt": 0.25 * (latency - 300.0), "request_to_first_token": 0.35 * (latency - 300.0),
             "first_token_to_first_segment": 0.2 * (latency - 300.0), "segment_to_first_audio": 0.15 * (latency - 300.0)}
    parts["audio_to_sent"] = latency - sum(parts.values())
    return parts


def build(out: Path, plan: Plan | None = None) -> Path:
    """The consistent dial folder in ``out`` (created): returns ``out``."""
    plan = plan or Plan()
    out.mkdir(parents=True, exist_ok=True)
    (out / "dial").mkdir(exist_ok=True)
    n_turns = len(plan.speech_ms)
    events: list[tuple[float, int, dict[str, Any]]] = []  # (t_ms, tie-break, event)
    order = iter(range(10 ** 9))

    def event(t: float, **fields: Any) -> None:
        events.append((t, next(order), {"t_ms": t, **fields}))

    left_parts: list[tuple[int, np.ndarray]] = []
    right_parts: list[tuple[int, np.ndarray]] = []
    turns: list[Turn] = []
    offset = 500.0
    mark_no = 0
    pending_offset: float | None = None
    for i in range(n_turns):
        index = i + 1
        if pending_offset is not None:
            offset = pending_offset
        speech = tone(plan.speech_ms[i], 4000 + 300 * i, 300.0 + 40 * i)
        wav = np.concatenate([np.zeros(sample(LEAD_MS), np.int16), speech, np.zeros(sample(TAIL_MS), np.int16)])
        name = f"dial/caller-{index:02d}.wav"
        (out / name).write_bytes(mono_wav(wav))
        at = sample(offset)
        left_parts.append((at, wav))
        event(offset + 0.25, event="caller_line", turn=index, frame=round(offset / FRAME_MS))
        span = audible_span(wav, FLOOR)
        assert span is not None
        start, end = ms(at + span[0]), ms(at + span[1])
        latency = plan.reported_ms[i]
        arrival = end + plan.vad_lag_ms + latency + plan.transport_ms
        heard_start = next_tick(arrival + JITTER_MS)
        length = plan.reply_ms[i]
        reply = square(length, 6000, 500.0 + 50 * i)
        barge = index in plan.barge_in_turns and index < n_turns
        heard_end = heard_start + length
        cleared = None
        if barge:
            onset = heard_start + plan.barge_in_after_ms
            pending_offset = onset - LEAD_MS
            cleared = onset + plan.clear_after_onset_ms
            silent = next_tick(cleared)  # the buffer emptied as the clear arrived: the next frame is silent
            assert silent < heard_end
            reply = reply[: sample(silent - heard_start)]
            heard_end = silent
        right_parts.append((sample(heard_start), reply))
        # The burst: every 20 ms frame of the whole reply arrives at once (0.001 ms apart), a mark per segment.
        frames = math.ceil(sample(length) / FS)
        first_segment = frames // 2
        marks = []
        for k in range(frames):
            got = min(FS, sample(length) - k * FS)
            event(arrival + 0.001 * k, dir="down", event="media", bytes=got, samples=got)
            if k in (first_segment - 1, frames - 1):
                mark_no += 1
                queued = arrival + 0.001 * k + 0.0005
                ahead = ms((k + 1) * FS if k < frames - 1 else sample(length))
                event(queued, dir="down", event="mark", name=f"m{mark_no}")
                marks.append((f"m{mark_no}", queued, ahead))
        event(heard_start + 0.2, event="playout_start")
        if cleared is not None:
            dropped = heard_start + length - silent
            event(cleared, dir="down", event="clear", dropped_ms=dropped)
            for name_, queued, ahead in marks:  # pending marks are echoed at the clear (as Twilio does)
                if heard_start + ahead > silent:
                    event(cleared + 0.01, dir="up", event="mark", name=name_, queued_ms=queued,
                          audio_before_ms=ahead)
            event(silent + 0.2, event="playout_idle")
            if plan.sent_after_clear_ms:
                late_arrival = cleared + 1.0
                late_start = next_tick(late_arrival + JITTER_MS)
                tail = square(plan.sent_after_clear_ms, 6000, 450.0)
                right_parts.append((sample(late_start), tail))
                for k in range(math.ceil(len(tail) / FS)):
                    got = min(FS, len(tail) - k * FS)
                    event(late_arrival + 0.001 * k, dir="down", event="media", bytes=got, samples=got)
                event(late_start + 0.2, event="playout_start")
                heard_end = late_start + plan.sent_after_clear_ms
                event(heard_end + 0.2, event="playout_idle")
        else:
            for name_, queued, ahead in marks:
                event(heard_start + ahead + 0.3, dir="up", event="mark", name=name_, queued_ms=queued,
                      audio_before_ms=ahead)
            event(heard_end + 0.2, event="playout_idle")
        gap = heard_start - end
        reported = latency if plan.otlp else None
        script = SCRIPTS[i % len(SCRIPTS)]
        scored = wer(script, AGENT_HEARD[i % len(AGENT_HEARD)])
        turns.append(Turn(
            index=index, script=script, caller_wav=name,
            caller=TurnCaller(offset_ms=offset, speech_start_ms=start, speech_end_ms=end, floor=FLOOR,
                              source="test tone", converted_from=None),
            heard=Heard(first_sound_ms=heard_start, gap_ms=gap, last_sound_ms=heard_end,
                        transcript=HEARD[i % len(HEARD)], absent=frozenset({"talked_over", "late_tick"})),
            barge_in=BargeIn(onset_ms=None, heard_silent_ms=heard_end, heard_after_onset_ms=None, cleared_ms=cleared,
                             words_heard="Yes, we accept", words_heard_count=3, absent=frozenset({"resumed_ms"}))
            if barge else None,
            agent_reported=AgentReported(latency_ms=reported,
                                         source="voice-llm agent: vad_speech_end -> first_audio_sent")
            if reported is not None else None,
            heard_minus_reported_ms=None if reported is None else gap - reported,
            agent_breakdown=_breakdown(latency) if reported is not None else None,
            agent_transcript=AGENT_HEARD[i % len(AGENT_HEARD)] if plan.otlp else None,
            wer=Wer(errors=scored.errors, words=scored.words) if plan.otlp else None,
            false_barge_in=False, false_barge_in_at=None, cut_off=False, cut_off_at=None))
        if not barge:
            pending_offset = next_tick(heard_end + 700.0 + 300.0)
    for i, turn in enumerate(turns):  # a barge-in's onset is the next line's true start
        if turn.barge_in is not None and turn.barge_in.heard_silent_ms is not None:
            onset = turns[i + 1].caller.speech_start_ms
            turns[i] = replace(turn, barge_in=replace(turn.barge_in, onset_ms=onset,
                                                      heard_after_onset_ms=turn.barge_in.heard_silent_ms - onset))
    last_heard = turns[-1].heard.last_sound_ms if turns[-1].heard is not None else None
    end_ms = next_tick(max(last_heard or 0.0, ms(left_parts[-1][0] + len(left_parts[-1][1])))
                       + 1000.0)
    total = sample(end_ms)
    left = np.zeros(total, np.int16)
    right = np.zeros(total, np.int16)
    for at, part in left_parts:
        left[at:at + len(part)] = part
    for at, part in right_parts:
        right[at:at + len(part)] = part
    (out / "dial" / "call.wav").write_bytes(stereo_wav(left, right))
    n_frames = total // FS
    # Uplink: connected and start before the first frame, frame k sent at tick k + 1 (its audio captured: the
    # last at the hang-up), stop after the last.
    event(0.0, dir="up", event="connected")
    event(0.0, dir="up", event="start")
    # A stall at tick 100 (late_frames > 0): the loop resumes 10 ms into the frame after the last late one and
    # sends the overdue frames at once, so exactly ``late_frames`` ticks ran more than a frame late.
    resume = 100 * FRAME_MS + FRAME_MS * plan.late_frames + 10.0 if plan.late_frames else -1.0
    for k in range(n_frames):
        t = (k + 1) * FRAME_MS + 0.3
        if plan.late_frames and 100 <= k + 1 and t < resume:
            t = resume + 0.01 * (k + 1 - 100)
            if t - (k + 1) * FRAME_MS > FRAME_MS:  # the dialer logs a late tick as it starts (LATE_TICK_RULE)
                event(t - 0.001, event="late_tick", frame=k + 1, late_ms=round(t - 0.001 - (k + 1) * FRAME_MS, 3))
        event(t, dir="up", event="media", chunk=k + 1, timestamp=int(k * FRAME_MS))
    event(max(end_ms, n_frames * FRAME_MS + 0.3) + 0.5, dir="up", event="stop")
    rows = [e for _, _, e in sorted(events, key=lambda x: (x[0], x[1]))]
    seq = 0
    for row in rows:  # Twilio numbers every message the caller side sends after `connected`
        if row.get("dir") == "up" and row["event"] != "connected":
            seq += 1
            row["seq"] = seq
    (out / "dial" / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the heard floor by the dialer's rule: over the frames the playout buffer played received audio in
    heard_floor = heard_channel(right, RATE, rows, FS, FRAME_MS).floor
    otlp_files = []
    if plan.otlp:
        (out / "dial" / "otlp").mkdir(exist_ok=True)
        (out / "dial" / "otlp" / "0001.bin").write_bytes(b"\x0a\x00")
        otlp_files = ["dial/otlp/0001.bin"]
    gaps = [g for t in turns if (g := t.gap_ms) is not None]
    barges = [b.heard_after_onset_ms for t in turns
              if (b := t.barge_in) is not None and b.heard_after_onset_ms is not None]
    minus = [d for t in turns if (d := t.heard_minus_reported_ms) is not None]
    doc = DialDoc(
        schema_version=1, dial_schema_version=DIAL_SCHEMA_VERSION,
        agent=Agent(url="ws://127.0.0.1:18301/", protocol="twilio", headers={"server": "test"},
                    identity={"engine": "builtin", "engines": {}, "versions": {}}),
        line=Line(protocol="twilio", codec="mulaw", rate=RATE, frame_ms=FRAME_MS, jitter_ms=JITTER_MS, loss_pct=0,
                  echo_db=None, seed=1, absent=frozenset({"echo_delay_ms", "lost_up_frames", "lost_down_frames",
                                                          "conditions", "cap_s", "stream_sid", "call_sid"})),
        clock="ms since the call started: 0 is sample 0 of dial/call.wav (both channels)",
        t0_epoch_ns=1733000000000000000,
        floor=Floor(rule="a frame is sound when its peak |sample| > floor", caller=FLOOR, heard=heard_floor),
        caller={"source": "synthesized", "voice": {}, "script": "clinic"},
        settings=Settings(turns=n_turns, barge_in_turns=plan.barge_in_turns, barge_in_after_ms=plan.barge_in_after_ms,
                          think_ms=300, reply_wait_s=60, reply_end_ms=700.0, silent_after_ms=200.0, lead_ms=LEAD_MS),
        turns=tuple(turns),
        playout=Playout(frames=n_frames, late_frames=plan.late_frames, underruns=n_turns, max_buffered_ms=3000.0,
                        dropped_ms=0.0, marks_returned=sum(1 for r in rows if r.get("dir") == "up"
                                                           and r["event"] == "mark"),
                        clears=sum(1 for r in rows if r["event"] == "clear")),
        dialer_cost_ms=DialerCost(median=0.4, p90=0.7, frames=n_frames),
        summary=Summary(heard_gap_ms=Spread(median=stats.median(gaps), p90=stats.percentile(gaps, 90), n=len(gaps),
                                            talked_over=0, late_tick=0),
                        barge_in_heard_after_onset_ms=Spread(median=stats.median(barges) if barges else None,
                                                             n=len(barges), absent=MEDIAN_ONLY),
                        heard_minus_reported_ms=Spread(median=stats.median(minus) if minus else None, n=len(minus),
                                                       absent=MEDIAN_ONLY),
                        false_barge_ins=0, cut_offs=0),
        files=Files(call_wav="dial/call.wav", events="dial/events.jsonl",
                    caller_wavs=tuple(t.caller_wav for t in turns if t.caller_wav is not None), otlp=tuple(otlp_files)),
        otlp=Otlp(bodies=len(otlp_files), extra={"listen": "127.0.0.1:4318", "spans": 4 * n_turns, "refused": [],
                                                  "clock": "common"}) if plan.otlp else None,
        unknown={} if plan.otlp else {"agent_reported": "the agent sent no traces (no --otlp, or none received)"},
        extra={"run_id": "run-dial-test", **plan.extra},
    )
    save_doc(out, doc)
    return out


def doc_of(out: Path) -> DialDoc:
    """The folder's dial.json as its type (an edit is then ``dataclasses.replace``, type-checked)."""
    return DialDoc.parse(load(out))


def save_doc(out: Path, doc: DialDoc) -> None:
    """Write ``doc`` as dial.json, as the dialer writes it (voice_llm.core.util.artifacts.dumps_json)."""
    (out / "dial.json").write_text(dumps_json(doc.as_dict()))


def with_turn(doc: DialDoc, position: int, turn: Turn) -> DialDoc:
    """``doc`` with its turn at ``position`` replaced by ``turn``."""
    turns = list(doc.turns)
    turns[position] = turn
    return replace(doc, turns=tuple(turns))


def load(out: Path) -> dict[str, Any]:
    """dial.json as the file holds it: a hand edit of the file (a shape the type refuses too) is made on this."""
    loaded: dict[str, Any] = json.loads((out / "dial.json").read_text())
    return loaded


def save(out: Path, doc: dict[str, Any]) -> None:
    (out / "dial.json").write_text(json.dumps(doc, indent=1))


def events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "dial" / "events.jsonl").read_text().splitlines() if line.strip()]


def save_events(out: Path, rows: list[dict[str, Any]]) -> None:
    (out / "dial" / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def renumber(rows: list[dict[str, Any]]) -> None:
    """Give the uplink messages consecutive sequence numbers again, in file order (after moving one)."""
    seq = 0
    for row in rows:
        if row.get("dir") == "up" and row["event"] != "connected":
            seq += 1
            row["seq"] = seq


def heard(turn: Turn) -> Heard:
    assert turn.heard is not None, turn.where
    return turn.heard


def barge_in(turn: Turn) -> BargeIn:
    assert turn.barge_in is not None, turn.where
    return turn.barge_in


def summarized(doc: DialDoc) -> DialDoc:
    """``doc`` with its summary's medians made its turns' again: an edit consistent on paper."""
    assert doc.summary is not None and doc.summary.heard_gap_ms is not None
    gaps = doc.heard_gaps()
    barges = [b.heard_after_onset_ms for _, _, b in doc.barge_ins() if b.heard_after_onset_ms is not None]
    minus = [d for t in doc.turns if (d := t.heard_minus_reported_ms) is not None]
    return replace(doc, summary=replace(
        doc.summary,
        heard_gap_ms=replace(doc.summary.heard_gap_ms, median=stats.median(gaps), p90=stats.percentile(gaps, 90),
                             n=len(gaps)),
        barge_in_heard_after_onset_ms=Spread(median=stats.median(barges) if barges else None, n=len(barges),
                                             absent=MEDIAN_ONLY),
        heard_minus_reported_ms=Spread(median=stats.median(minus) if minus else None, n=len(minus),
                                       absent=MEDIAN_ONLY)))
