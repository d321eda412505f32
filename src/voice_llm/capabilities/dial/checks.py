"""check relations for a dial run (dial.json, dial/events.jsonl, dial/call.wav, dial/caller-NN.wav) from the saved
files alone, through the run folder's jail (voice_llm.core.run.folder.RunFolder: no link, no FIFO, no file outside OUT).
dial.json is read as its type (voice_llm.capabilities.dial.doc.DialDoc, parsed once per folder, the type dial/step.py writes it
from): a field of the wrong type is that one line, the FAIL of every check; the checks read its fields and hold
them to each other and to the recording.

The recording is a recording now (the dialer appended each 20 ms frame as it was sent and as it left the playout
buffer: docs/line.md "Clocks"), so measuring it again is an independent measurement, not a number compared with itself:
the heard gaps, the last heard sound of each reply and a barge-in's heard silence are re-measured on call.wav's
samples with the artifact's own floor rule; the caller channel is compared sample by sample with the caller WAVs;
the event log is replayed for the line's own rules (sequence numbers, clears, marks); the summary, the WER and the
line's share (heard minus the agent's own number) are recomputed.

Laws (FAIL: they hold on every honest run on any machine, or the evidence is impossible) and findings (machine- or
agent-dependent expectations: the line's share above jitter + 2 frames, late frames, the 1.2 s target) are written
next to each check. The agent's own numbers are the agent's claim: when it reported none, the checks that compare
with them are not checkable ("agent's own numbers not reported"), never a pass.
"""

from __future__ import annotations

import math
import os
import stat
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, TypeVar

import numpy as np

from voice_llm.engines.audio.wav import decode_wav
from voice_llm.core.checks.base import CheckFailed, Finding, NotCheckable, expect, unless_missed
from voice_llm.core.checks.base import finite_number as _num
from voice_llm.core.checks.base import require as _require
from voice_llm.capabilities.dial.doc import DialDoc, DialPartialDoc, Heard as HeardDoc, Turn
from voice_llm.capabilities.dial.measure import (Heard, at_sample, caller_sound, heard_channel, late_tick_frames, near_late_tick,
                                    reply_silent_from)
from voice_llm.engines.line.playout import jitter_frames
from voice_llm.core.errors import ArtifactError
from voice_llm.engines.line import wire
from voice_llm.core.run.folder import RunFolder
from voice_llm.engines.speech_in.caller_audio import FLOOR_MAX, FLOOR_MIN, audible_span
from voice_llm.engines.speech_in.wer import wer as word_errors
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import DIAL, DIAL_DIR, DIAL_PARTIAL

STEP = "dial"  # `voice-llm dial URL`; the registry gives the same checks to every step that writes dial.json
ARTIFACT = DIAL
TOLERANCE_MS = 2e-3  # numbers recomputed from numbers the artifact rounds to 0.001 ms (two roundings apart)
SAMPLE_ROUNDING_MS = 1e-3  # a sample's time as an artifact may round it
STAMP_MS = 1.0  # two readings of the clock for one arrival (the event and the mark's queued_ms)
SILENT_RUN_MS = 200.0  # docs/line.md: a barge-in's heard silence is the first moment it stays silent this long
MOUTH_TO_EAR_TARGET_MS = 1200.0  # issue 27: target median at a 300 ms endpoint
DIALER_COST_MS = 2.0  # issue 27: the dialer's own cost per frame, median
LINE_SHARE_FRAMES = 2  # the line's share may exceed the jitter delay by this many frames before it is a finding
# protocol -> (its codecs, the only rate, if fixed): Twilio Media Streams are 8 kHz mu-law only; a pcm line carries
# 16-bit PCM or mu-law bytes (--codec) at its --rate
PROTOCOLS = {"twilio": (("mulaw",), 8000), "pcm": (("pcm16", "mulaw"), None),
             # the phone bridges' one format each (voice_llm.engines.line.wire.FIXED_FORMATS)
             "telnyx": (("mulaw",), 8000), "plivo": (("mulaw",), 8000), "exotel": (("pcm16",), 8000),
             "vonage": (("pcm16",), 16000),
             # WebRTC: the frames decoded from the RTP received (Opus as negotiated: line.webrtc.codec), 48 kHz
             "webrtc": (("pcm16",), 48000)}
# lost: a frame numbered, lost in transit; cleared: a bridge's answer to a clear (Plivo's clearedAudio, Vonage's
# websocket:cleared)
UP_EVENTS = {"connected", "start", "media", "lost", "mark", "stop", "cleared"}
DOWN_EVENTS = {"media", "lost", "mark", "clear", "bad"}  # lost: received audio removed before the playout buffer
PLAYOUT_EVENTS = {"playout_start", "playout_idle", "caller_line", "late_tick"}  # caller_line: a line starts (its
# frame); late_tick: a tick that started more than a frame late (measure.LATE_TICK_RULE)
NOT_REPORTED = "agent's own numbers not reported"


# --- reading --------------------------------------------------------------------------------------------------


def _doc(out: RunFolder | Any) -> DialDoc:
    """dial.json as its type (voice_llm.capabilities.dial.doc.DialDoc), parsed once per folder: a field of the wrong type is
    one ArtifactError line naming it (the check's FAIL); a call with no turns measured nothing."""
    doc = RunFolder.of(out).artifact(DialDoc)
    _require(bool(doc.turns), f"{ARTIFACT} has no turns: nothing was measured")
    return doc


T = TypeVar("T")


def _must(value: T | None, what: str) -> T:
    """A field the relation needs, which an older (or edited) dial.json may leave null or out."""
    _require(value is not None, f"{what} is missing")
    return value  # type: ignore[return-value]


def _int(value: int, what: str, low: int = 0) -> int:
    _require(value >= low, f"{what} {value} is impossible (below {low})")
    return value


def _one_sample(doc: DialDoc) -> tuple[float, str]:
    """The re-measure checks' allowance, and its words: one sample at the line's rate (plus the artifact's 0.001 ms
    rounding). The dialer measured the same samples call.wav holds, so the numbers agree exactly; a sample is what
    a time stated between two samples may be off by, and a frame (20 ms) would pass an edited number."""
    rate = _rate(doc)
    return 1000.0 / rate + TOLERANCE_MS, f"one sample ({1000.0 / rate:g} ms at {rate} Hz)"


def _frame_ms(doc: DialDoc) -> float:
    frame = doc.line.frame_ms
    _require(frame > 0, f"line.frame_ms {frame} is impossible: a frame has a length")
    return frame


def _rate(doc: DialDoc) -> int:
    return _int(doc.line.rate, "line.rate", 1)


def line_floor(doc: DialDoc, turn: Turn) -> int:
    """The floor a caller line was measured with: its own (``caller.floor``, the dialer's per-line rule) or the
    caller channel's."""
    floor = turn.caller.floor
    if floor is None:
        return doc.floor.caller
    _require(FLOOR_MIN <= floor <= FLOOR_MAX, f"{turn.where}: caller.floor {floor} is outside the floor rule's "
                                              f"{FLOOR_MIN}..{FLOOR_MAX}")
    return floor


def _silent_run(doc: DialDoc) -> float:
    """How long the heard channel must stay silent to count as a barge-in's heard silence (settings.silent_after_ms,
    docs/line.md's 200 ms when not stated)."""
    value = doc.settings.silent_after_ms
    return SILENT_RUN_MS if value is None else value


def _events(folder: RunFolder, doc: DialDoc) -> list[Mapping[str, Any]]:
    name = _must(doc.files.events, "files.events")
    rows = folder.jsonl(name)
    for number, row in enumerate(rows, 1):
        _require(isinstance(row, dict), f"{name} line {number} is not an object")
    return rows


def _t(row: Mapping[str, Any], number: int) -> float:
    return _num(row.get("t_ms"), f"events line {number} t_ms")


def _event_int(value: Any, what: str) -> int:
    """A whole number of the event log (a frame, a count of samples), not negative."""
    _require(isinstance(value, int) and not isinstance(value, bool), f"{what} is not an integer: {value!r}")
    return _int(value, what)


def _samples(row: Mapping[str, Any], what: str) -> int:
    return _event_int(row.get("samples"), what)


@dataclass(frozen=True)
class Recording:
    """call.wav decoded: left (what the caller sent) and right (what the caller heard), on the call clock."""

    left: np.ndarray
    right: np.ndarray
    rate: int

    @property
    def frames(self) -> int:
        return len(self.left)

    def ms(self, index: float) -> float:
        return index * 1000.0 / self.rate

    def at(self, t_ms: float) -> int:
        """The first sample at or after ``t_ms`` (clamped to the recording)."""
        return min(max(0, math.ceil(t_ms * self.rate / 1000.0 - 1e-6)), self.frames)


def decode_stereo(data: bytes, name: str) -> Recording:
    """A stereo 16-bit WAV's two channels (voice_llm.engines.audio's one reader); an ArtifactError naming ``name`` for
    anything else."""
    info, pcm = decode_wav(data, name)
    shape = (info.channels, info.sample_width, info.sample_rate)
    if shape[:2] != (2, 2):
        raise ArtifactError(f"{name}: {shape[0]} channel(s), {8 * shape[1]}-bit; expected stereo 16-bit")
    both = np.frombuffer(pcm[: len(pcm) // 4 * 4], dtype="<i2")
    return Recording(both[0::2].copy(), both[1::2].copy(), shape[2])


def decode_mono(data: bytes, name: str, rate: int) -> np.ndarray:
    info, pcm = decode_wav(data, name)
    shape = (info.channels, info.sample_width, info.sample_rate)
    _require(shape == (1, 2, rate), f"{name}: {shape[0]} ch, {8 * shape[1]}-bit, {shape[2]} Hz; expected mono "
                                    f"16-bit {rate} Hz (the line's rate)")
    return np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2")


def recording(out: RunFolder | Any, doc: DialDoc | None = None) -> Recording:
    """dial/call.wav as dial.json names it, read through the jail, at the line's rate."""
    folder = RunFolder.of(out)
    doc = _doc(folder) if doc is None else doc
    name = _must(doc.files.call_wav, "files.call_wav")
    call = decode_stereo(folder.bytes(name), name)
    _require(call.rate == _rate(doc), f"{name} is {call.rate} Hz, line.rate is {_rate(doc)}")
    return call


# --- measuring the recording (the rules of docs/line.md "What the dialer measures, only at the ear") -----------------


def ear(call: Recording, doc: DialDoc) -> Heard:
    """call.wav's heard channel with the artifact's floor.heard, measured by the dialer's own sound rule
    (voice_llm.capabilities.dial.measure.Heard: the one copy of it, so the re-measure is the same rule on the saved samples)."""
    return Heard(call.right, call.rate, doc.floor.heard, _frame_samples(doc))


def _frame_samples(doc: DialDoc) -> int:
    return round(_frame_ms(doc) * _rate(doc) / 1000)


@dataclass(frozen=True)
class Measured:
    """One turn as call.wav shows it (sample indices; None where the channel had no sound)."""

    speech_start: int | None
    speech_end: int | None
    first_sound: int | None
    last_sound: int | None
    talked_over: bool = False


def clear_samples(folder: RunFolder, doc: DialDoc, rate: int) -> list[int]:
    """The samples the event log's clears arrived at (a barged-in reply's silence rule: audio after a clear is new)."""
    return [at_sample(_t(r, n), rate) for n, r in enumerate(_events(folder, doc), 1)
            if r.get("dir") == "down" and r.get("event") == "clear"]


def barge_silence(heard: Heard, doc: DialDoc, onset: int, line_end: int,
                  clears: Sequence[int]) -> tuple[int | None, tuple[tuple[int, int], ...]]:
    """A barged-in reply's heard silence on call.wav by the dialer's own rule (measure.BARGE_SILENCE_RULE)."""
    return reply_silent_from(heard, onset, line_end, round(_silent_run(doc) * heard.rate / 1000), clears,
                             round(_frame_ms(doc) * heard.rate / 1000))


def measure(call: Recording, doc: DialDoc, lengths: Sequence[int],
            wavs: Sequence[np.ndarray] | None = None, clears: Sequence[int] = ()) -> list[Measured]:
    """Each turn on the recording: the caller's speech inside its WAV's span (offset .. offset + length) on the
    left (with an echo on the line the left channel also holds the heard audio: the speech is then the caller
    WAV's own, ``wavs``, which check_recording proves lies under the echo at its offset), above the line's floor; on the right the first sound at or after that speech's end, up to the next line's
    speech start (what sounds later answers, or is cut by, the next line), and the reply's last sound: before the
    next line's start, or, on a barge-in, before the heard silence after the onset (the reply plays on under the
    caller until the buffer runs dry or is cleared)."""
    heard = ear(call, doc)
    frame = round(_frame_ms(doc) * call.rate / 1000)
    spans: list[tuple[int, int] | None] = []
    for turn, length in zip(doc.turns, lengths):
        at = call.at(turn.caller.offset_ms)
        said = wavs[len(spans)] if wavs is not None and doc.line.echo_db is not None else \
            call.left[at:at + length]
        span = audible_span(said, line_floor(doc, turn), frame)
        spans.append(None if span is None else (at + span[0], at + span[1]))
    found = []
    for i, (turn, span) in enumerate(zip(doc.turns, spans)):
        if span is None:
            found.append(Measured(None, None, None, None))
            continue
        following = next((s for s in spans[i + 1:] if s is not None), None)
        limit = following[0] if following is not None else call.frames
        first = heard.first_sound(span[1], limit)
        last = None
        if first is not None:
            until = limit
            if turn.barge_in is not None and following is not None and limit < call.frames:
                until = barge_silence(heard, doc, limit, following[1], clears)[0] or call.frames
            last = heard.last_sound(first, until)
        found.append(Measured(span[0], span[1], first, last,
                              first is not None and heard.talked_over(span[1], frame)))
    return found


def caller_wavs(folder: RunFolder, doc: DialDoc) -> list[np.ndarray]:
    rate = _rate(doc)
    wavs = []
    for turn in doc.turns:
        name = _must(turn.caller_wav, f"{turn.where}: caller_wav")
        wavs.append(decode_mono(folder.bytes(name), name, rate))
    return wavs


# --- the checks ------------------------------------------------------------------------------------------------


def check_values(out: RunFolder | Any) -> str:
    """Law: every value dial.json states is a possible one. A frame has a length and a whole number of samples, a
    jitter delay, a loss share, a floor, a count, a cost cannot be negative; Twilio Media Streams carry 8 kHz
    mu-law only; a floor follows speech.caller's rule (FLOOR_MIN..FLOOR_MAX); the settings plan at least the turns
    there are, barge-ins on planned turns; times of one turn in the order they can happen (the caller's line is
    fed from its offset, speech starts before it ends, a reply is first heard after the speech ended and ends after
    it began); every null agent number has its reason in ``unknown`` (docs/line.md: never 0, never silent). Impossible
    evidence is a FAIL, not a finding (issue 31 item 13)."""
    doc = _doc(out)
    line = doc.line
    protocol = line.protocol
    _require(protocol in PROTOCOLS, f"line.protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    codecs, fixed_rate = PROTOCOLS[protocol]
    _require(line.codec in codecs, f"line.codec {line.codec!r} on a {protocol} line (it carries "
                                   f"{' or '.join(codecs)})")
    rate, frame = _rate(doc), _frame_ms(doc)
    _require(fixed_rate is None or rate == fixed_rate, f"line.rate {rate} on a {protocol} line (it carries {fixed_rate} Hz)")
    samples = line.frame_samples
    _require(abs(samples - round(samples)) < 1e-9, f"line.frame_ms {frame} at {rate} Hz is {samples} samples: not whole")
    jitter = line.jitter_ms
    _require(jitter >= 0, f"line.jitter_ms {jitter} is impossible: a delay cannot be negative")
    loss = line.loss
    _require(0 <= loss <= 100, f"line.loss_pct {loss} is not a share of frames (0..100)")
    if line.echo_db is not None:
        _require(line.echo_db <= 0, f"line.echo_db {line.echo_db} is a gain, not an echo's attenuation")
        delay = _must(line.echo_delay_ms, "line.echo_delay_ms")
        _require(delay >= frame, f"line.echo_delay_ms {delay}: an echo earlier than a frame is heard before it played")
    for key, counted in (("lost_up_frames", line.lost_up_frames), ("lost_down_frames", line.lost_down_frames)):
        if counted is not None:
            lost = _int(counted, f"line.{key}")
            _require(loss > 0 or lost == 0, f"line.{key} {lost} on a line without loss (loss_pct 0)")
    for channel, floor in (("caller", doc.floor.caller), ("heard", doc.floor.heard)):
        _require(FLOOR_MIN <= floor <= FLOOR_MAX, f"floor.{channel} {floor} is outside the floor rule's "
                                                  f"{FLOOR_MIN}..{FLOOR_MAX} (speech.caller.noise_floor)")
    _int(doc.t0_epoch_ns, "t0_epoch_ns", 1)
    settings = doc.settings
    planned = _int(settings.turns, "settings.turns", 1)
    _require(len(doc.turns) <= planned, f"{len(doc.turns)} turns, settings.turns {planned}")
    for turn_no in settings.barge_in_turns:
        _require(_int(turn_no, "settings.barge_in_turns[]", 1) <= planned,
                 f"settings.barge_in_turns names turn {turn_no} of {planned}")
    for key, value in (("barge_in_after_ms", settings.barge_in_after_ms), ("think_ms", settings.think_ms)):
        _require(_must(value, f"settings.{key}") >= 0, f"settings.{key} {value} is negative")
    _require(_must(settings.reply_wait_s, "settings.reply_wait_s") > 0, "settings.reply_wait_s is not positive")
    for key, value in (("silent_after_ms", settings.silent_after_ms), ("reply_end_ms", settings.reply_end_ms),
                       ("deadline_s", settings.deadline_s)):  # the dialer's own, where it states them
        _require(value is None or value > 0, f"settings.{key} {value} is impossible")
    _require(settings.lead_ms is None or settings.lead_ms >= 0, f"settings.lead_ms {settings.lead_ms} is negative")
    playout = doc.playout
    frames = _int(playout.frames, "playout.frames")
    _require(_int(playout.late_frames, "playout.late_frames") <= frames,
             f"playout.late_frames {playout.late_frames} of {frames} frames")
    for key, count in (("underruns", playout.underruns), ("marks_returned", playout.marks_returned),
                       ("clears", playout.clears)):
        _int(_must(count, f"playout.{key}"), f"playout.{key}")
    for key, ms in (("max_buffered_ms", playout.max_buffered_ms), ("dropped_ms", playout.dropped_ms)):
        _require(_must(ms, f"playout.{key}") >= 0, f"playout.{key} {ms} is negative")
    cost = _must(doc.dialer_cost_ms, "dialer_cost_ms")
    median, p90 = _must(cost.median, "dialer_cost_ms.median"), _must(cost.p90, "dialer_cost_ms.p90")
    _require(0 <= median <= p90, f"dialer_cost_ms median {median}, p90 {p90}: impossible")
    for position, turn in enumerate(doc.turns, 1):
        where = turn.where
        _require(turn.index == position, f"turn {position} has index {turn.index!r}")
        offset, start, end = turn.caller.offset_ms, turn.caller.speech_start_ms, turn.caller.speech_end_ms
        _require(0 <= offset <= start < end, f"{where}: caller offset {offset}, speech {start}..{end} ms: impossible")
        heard = turn.heard or HeardDoc()
        first, gap, last = heard.first_sound_ms, heard.gap_ms, heard.last_sound_ms
        over, late = bool(heard.talked_over), bool(heard.late_tick)
        _require((first is None) == (gap is None) or ((over or late) and first is not None),
                 f"{where}: heard first_sound_ms and gap_ms not both stated")
        for flag, what in ((over, "talked over"), (late, "near a late tick")):
            _require(not flag or (gap is None and doc.reason(f"turns[{position - 1}].heard.gap_ms") is not None),
                     f"{where}: {what}, but its gap_ms is {gap!r} or has no reason in unknown")
        if first is not None:
            _require(first >= end, f"{where}: first heard sound at {first} ms, before the caller's speech end {end}")
            _require(gap is None or abs(gap - (first - end)) <= TOLERANCE_MS,
                     f"{where}: heard gap_ms {gap}, first_sound - speech_end = {first - end}")
            _require(last is None or last > first, f"{where}: last heard sound {last} ms, not after the first {first}")
        reported = turn.reported_ms
        if reported is None:
            _require(bool(doc.reason("agent_reported")),
                     f"{where}: agent_reported is null but unknown.agent_reported gives no reason")
        else:
            _require(reported >= 0, f"{where}: the agent reports a negative latency {reported}")
        for key, value in (turn.agent_breakdown or {}).items():
            _require(value is None or value >= 0, f"{where}: agent_breakdown.{key} {value} ms is negative: impossible")
    return (f"{protocol} line, {line.codec} at {rate} Hz, {frame:g} ms frames, jitter {jitter:g} ms; "
            f"{len(doc.turns)} turns of {planned} planned; every value possible")


def _named(doc: DialDoc, source: str) -> set[str]:
    """Every path the artifact lists (call_wav, events, caller_wavs, otlp, agent_log) and its turns' caller WAVs."""
    names: set[Any] = set(doc.files.named())
    names.update(turn.caller_wav for turn in doc.turns)
    names.discard(None)
    _require(all(isinstance(n, str) for n in names), f"{source} names a file by something other than a path")
    return names


def _walk(folder: RunFolder, rel: str) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below ``rel`` (links and FIFOs too, never followed), as 'dial/...' paths."""
    with os.scandir(folder.path / rel) as entries:
        for entry in entries:
            name = f"{rel}/{entry.name}"
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                yield from _walk(folder, name)
            else:
                yield name, info


def check_files(out: RunFolder | Any) -> str:
    """Law: the dial step's files are exactly those its artifact names (issue 31 item 8): every file dial.json
    names under ``files`` and per turn (the recording, the event log, the caller WAVs, the agent's OTLP bodies, the
    agent's log) is a regular file inside
    dial/, and dial/ holds nothing else, so a caller-05.wav left by an earlier, longer call is not certified
    beside a four-turn call (a dropped call's dial-partial.json may name its own files beside them). The OTLP
    bodies counted are the files listed."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    named = _named(doc, ARTIFACT)
    if folder.is_file(DIAL_PARTIAL):
        try:
            named |= _named(folder.artifact(DialPartialDoc), DIAL_PARTIAL)
        except (ArtifactError, CheckFailed):
            pass  # a partial that does not parse names nothing: its files are then unnamed
    for name in sorted(named):
        _require(PurePosixPath(name).parts[:1] == (DIAL_DIR,), f"{ARTIFACT} names {name!r}, not a file of {DIAL_DIR}/")
        folder.bytes(name)  # inside OUT, no link, no FIFO, a regular file: else its one-line refusal
    listed = doc.files.otlp
    if doc.otlp is not None:
        _require(doc.otlp.bodies == len(listed), f"otlp.bodies {doc.otlp.bodies} but files.otlp lists {len(listed)}")
    _require(folder.path.joinpath(DIAL_DIR).is_dir() and not folder.path.joinpath(DIAL_DIR).is_symlink(),
             f"{DIAL_DIR}/ is not a folder of OUT")
    found = dict(_walk(folder, DIAL_DIR))
    unnamed = sorted(set(found) - named)
    _require(not unnamed, f"{', '.join(unnamed[:5])}{' ...' if len(unnamed) > 5 else ''} in {DIAL_DIR}/ but no "
                          f"artifact names it (a leftover of an earlier call?): the step's files are what it names")
    return f"{len(named)} files in {DIAL_DIR}/, each named by {ARTIFACT}, nothing else"


def check_recording(out: RunFolder | Any) -> str:
    """Law: call.wav is stereo 16-bit at the line's rate and holds whole frames, one per tick of the call
    (playout.frames: the loop never skips a frame of the recording); its caller channel is the caller WAVs, each at
    its offset, sample for sample, and digital silence between them (the dialer sends caller audio or silence); the
    floors are the stated rule's (dial.measure.FLOOR_RULE, the dialer's own functions) on the samples they were
    taken from (each line's own after its lead-in; the heard channel's frames the event log says carried received
    audio); each turn's speech_start / speech_end are its first and last sample above its floor
    (the true start and end, docs/line.md)."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    call = recording(folder, doc)
    samples = round(_rate(doc) * _frame_ms(doc) / 1000.0)
    _require(call.frames % samples == 0, f"call.wav holds {call.frames} samples, not whole {samples}-sample frames")
    frames = _int(doc.playout.frames, "playout.frames")
    _require(call.frames // samples == frames, f"call.wav holds {call.frames // samples} frames, playout.frames {frames}")
    heard_floor = doc.floor.heard
    ruled = heard_channel(call.right, call.rate, _events(folder, doc), samples, _frame_ms(doc)).floor
    _require(heard_floor == ruled, f"floor.heard {heard_floor}, but the floor rule on call.wav's heard channel (over "
                                   f"the frames the event log says carried received audio) gives {ruled}")
    expected = np.zeros(call.frames, np.int16)
    covered = np.zeros(call.frames, bool)
    for turn, wav in zip(doc.turns, caller_wavs(folder, doc)):
        where, caller = turn.where, turn.caller
        at = call.at(caller.offset_ms)
        _require(abs(call.ms(at) - caller.offset_ms) <= SAMPLE_ROUNDING_MS,
                 f"{where}: caller offset {caller.offset_ms} ms is not on a sample")
        _require(at + len(wav) <= call.frames, f"{where}: {turn.caller_wav} at {caller.offset_ms} ms runs past the "
                                               "recording's end")
        _require(not covered[at:at + len(wav)].any(), f"{where}: {turn.caller_wav} overlaps the previous line")
        expected[at:at + len(wav)] = wav
        covered[at:at + len(wav)] = True
        caller_floor = line_floor(doc, turn)
        if caller.floor is not None:  # the line's own floor: the rule on its samples as sent
            ruled = caller_sound(wav, call.rate, samples)[0]
            _require(caller_floor == ruled, f"{where}: caller.floor {caller_floor}, the floor rule on "
                                            f"{turn.caller_wav} gives {ruled}")
        span = audible_span(wav, caller_floor, samples)
        _require(span is not None, f"{where}: {turn.caller_wav} holds no sample above its floor {caller_floor}")
        assert span is not None
        for key, stated, index in (("speech_start_ms", caller.speech_start_ms, span[0]),
                                   ("speech_end_ms", caller.speech_end_ms, span[1])):
            _require(abs(stated - call.ms(at + index)) <= SAMPLE_ROUNDING_MS,
                     f"{where}: caller.{key} {stated} ms, but {turn.caller_wav}'s "
                     f"{'first' if key == 'speech_start_ms' else 'last'} sample above the floor is at "
                     f"{call.ms(at + index):.3f} ms")
    echo = None
    if doc.line.echo_db is not None:
        expected, echo = _with_echo(expected, call, doc)
    differ = np.flatnonzero(call.left != expected)
    if differ.size:
        first = int(differ[0])
        which = "a caller WAV" if covered[first] else "the silence between the caller's lines"
        if echo is not None:
            which += f" plus the heard channel {echo}"
        raise CheckFailed(f"the caller channel of call.wav differs from {which} at {call.ms(first):.3f} ms "
                          f"({differ.size} samples differ)")
    said = (f"the {len(doc.turns)} caller WAVs at their offsets" if echo is None else
            f"the {len(doc.turns)} caller WAVs at their offsets plus the heard channel {echo}")
    return (f"{frames} frames of {samples} samples at {call.rate} Hz ({call.ms(call.frames) / 1000:.1f} s); caller "
            f"channel = {said}, sample for sample")


def _with_echo(said: np.ndarray, call: Recording, doc: DialDoc) -> tuple[np.ndarray, str]:
    """What a speakerphone with no echo canceller sends (voice_llm.engines.line.conditions, stated in dial.json's
    line.conditions): the caller's samples plus the heard channel ``echo_delay_ms`` earlier times 10^(echo_db/20),
    each echo sample rounded half to even, clipped to 16 bits, then through the line's codec once (mu-law: encoded
    and decoded, the samples the agent gets)."""
    line = doc.line
    db = _must(line.echo_db, "line.echo_db")
    delay_ms = _must(line.echo_delay_ms, "line.echo_delay_ms")
    delay = round(delay_ms * call.rate / 1000)
    _require(delay > 0, f"line.echo_delay_ms {delay_ms}: no delay")
    heard = np.zeros(call.frames, np.float64)
    heard[delay:] = call.right[:max(0, call.frames - delay)]
    echo = np.rint(heard * (10.0 ** (db / 20.0))).astype(np.int32)
    mixed = np.clip(said.astype(np.int32) + echo, -32768, 32767).astype(np.int16)
    if line.codec == wire.MULAW:
        mixed = wire.mulaw_decode(wire.mulaw_encode(mixed))
    return mixed, f"{delay_ms:g} ms earlier at {db:g} dB (the echo)"


def check_heard_gaps(out: RunFolder | Any) -> str:
    """Law: each turn's heard gap measured again on call.wav (left: the caller's last sample above the floor;
    right: the first sample above the floor at or after it) equals dial.json's within one sample at the line's rate,
    and so do its ends and the reply's last heard sound: the recording was appended frame by frame as it happened
    and the dialer derived its numbers from those same samples, so the re-measure is exact (a sample is what a
    stated time between two samples may be off by; a frame would let a 19 ms edit pass). A turn
    whose reply was never heard is null in dial.json and silent on the recording."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    call = recording(folder, doc)
    allowed, allowance = _one_sample(doc)
    wavs = caller_wavs(folder, doc)
    measured = measure(call, doc, [len(w) for w in wavs], wavs, clear_samples(folder, doc, call.rate))
    late_ticks = late_tick_frames(_events(folder, doc))
    frame = _frame_samples(doc)
    jitter = jitter_frames(doc.line.jitter_ms, _frame_ms(doc))
    worst = 0.0
    gaps: list[float] = []
    talked: list[str] = []
    late_near: list[str] = []
    for turn, seen in zip(doc.turns, measured):
        where = turn.where
        heard = turn.heard or HeardDoc()
        _require(seen.speech_end is not None, f"{where}: no caller sound on call.wav's left channel in its line's span")
        assert seen.speech_end is not None
        first = heard.first_sound_ms
        if first is None:
            _require(seen.first_sound is None, f"{where}: dial.json heard nothing, call.wav's heard channel sounds at "
                                               f"{call.ms(seen.first_sound or 0):.1f} ms after the caller's end")
            continue
        _require(seen.first_sound is not None, f"{where}: dial.json hears the reply at {first:.1f} ms, call.wav's heard "
                                               "channel is silent after the caller's end")
        assert seen.first_sound is not None
        over = bool(heard.talked_over)
        _require(over == seen.talked_over, f"{where}: talked_over {over} in {ARTIFACT}, call.wav's heard channel "
                                           f"{'sounds' if seen.talked_over else 'does not sound'} across the caller's "
                                           "speech end (settings.talked_over_rule)")
        # measure.LATE_TICK_RULE on the event log's late ticks: near one the recording is not when things happened
        late = not seen.talked_over and near_late_tick(late_ticks, seen.speech_end, seen.first_sound, frame, jitter)
        _require(bool(heard.late_tick) == late,
                 f"{where}: late_tick {bool(heard.late_tick)} in {ARTIFACT}, the event log's late ticks "
                 f"{'are' if late else 'are not'} near its speech end or first heard sound (settings.late_tick_rule)")
        pairs = [("caller speech end", call.ms(seen.speech_end), turn.caller.speech_end_ms),
                 ("first heard sound", call.ms(seen.first_sound), first)]
        if not over and not late:  # a talked-over turn, or one near a late tick, has no gap (null, with why)
            pairs.append(("heard gap", call.ms(seen.first_sound - seen.speech_end),
                          _must(heard.gap_ms, f"{where} heard.gap_ms")))
        last = heard.last_sound_ms
        if last is not None and seen.last_sound is not None:
            pairs.append(("last heard sound", call.ms(seen.last_sound), last))
        for what, on_file, stated in pairs:
            _require(abs(on_file - stated) <= allowed, f"{where}: {what} {on_file:.1f} ms on call.wav, {stated:.1f} ms "
                                                       f"in {ARTIFACT} (more than {allowance} apart)")
            worst = max(worst, abs(on_file - stated))
        if over or late:
            (talked if over else late_near).append(where)
            continue
        gaps.append(call.ms(seen.first_sound - seen.speech_end))
    left_out = f"; talked over (no gap): {', '.join(talked)}" if talked else ""
    left_out += f"; near a late tick (no gap): {', '.join(late_near)}" if late_near else ""
    if not gaps:
        raise NotCheckable(f"no turn's reply was heard: no gap to measure{left_out}")
    return (f"heard gaps on call.wav {', '.join(f'{g:.0f}' for g in gaps)} ms, each within {worst:.1f} ms of "
            f"{ARTIFACT}'s{left_out}")


def check_barge_in(out: RunFolder | Any) -> str:
    """Law: a barge-in's onset is the caller's next line's true start (the samples sent) and comes while this
    turn's reply was heard; its heard silence re-measured on call.wav (the first moment after the onset from which
    the heard channel stays silent for 200 ms and the reply does not resume: measure.BARGE_SILENCE_RULE, the
    dialer's own function, with the event log's clears; the pauses passed over are barge_in.resumed_ms) equals
    dial.json's within one sample at the line's rate (the same
    samples the dialer measured: the re-measure is exact); heard_after_onset is their
    difference; a clear stated is a clear in the event log, between the onset and the silence it caused (+ a
    frame); the words heard are counted as stated."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    found = doc.barge_ins()
    if not found:
        raise NotCheckable("no turn was barged in on")
    call = recording(folder, doc)
    frame = _frame_ms(doc)  # the clear's causal window (a tick), not the re-measure's allowance
    allowed, allowance = _one_sample(doc)
    heard_ear = ear(call, doc)
    rows = _events(folder, doc)
    clears = [_t(r, n) for n, r in enumerate(rows, 1) if r.get("dir") == "down" and r.get("event") == "clear"]
    arrivals = [_t(r, n) for n, r in enumerate(rows, 1) if r.get("dir") == "down" and r.get("event") == "media"]
    turns = doc.turns
    lines = []
    for position, turn, barge in found:
        where = turn.where
        _require(position + 1 < len(turns), f"{where}: a barge-in on the last turn: no line cut in")
        onset = _must(barge.onset_ms, f"{where} barge_in.onset_ms")
        following = turns[position + 1].caller
        _require(abs(onset - following.speech_start_ms) <= TOLERANCE_MS,
                 f"{where}: barge-in onset {onset} ms, the next line's speech starts at {following.speech_start_ms} ms")
        first = _must(turn.heard, f"{where} heard").first_sound_ms
        _require(first is not None and first <= onset, f"{where}: barge-in at {onset} ms, before the reply was heard ({first})")
        stated = _must(barge.heard_silent_ms, f"{where} barge_in.heard_silent_ms")
        after = _must(barge.heard_after_onset_ms, f"{where} barge_in.heard_after_onset_ms")
        _require(abs(after - (stated - onset)) <= TOLERANCE_MS, f"{where}: heard_after_onset_ms {after}, heard_silent - "
                                                                f"onset = {stated - onset}")
        line_end = call.at(following.speech_end_ms)
        silent, resumed = barge_silence(heard_ear, doc, call.at(onset), line_end,
                                        [at_sample(t, call.rate) for t in clears])
        stated_resumed = barge.resumed_ms or ()
        _require(len(stated_resumed) == len(resumed) and all(
            all(abs(x - call.ms(y)) <= allowed for x, y in zip(p, pair)) for p, pair in zip(stated_resumed, resumed)),
            f"{where}: barge_in.resumed_ms {[list(p) for p in stated_resumed]!r}, call.wav's heard channel resumes "
            "after "
            f"{[[round(call.ms(a), 3), round(call.ms(b), 3)] for a, b in resumed]} (settings.barge_silence_rule)")
        _require(silent is not None, f"{where}: call.wav's heard channel never stays silent for {_silent_run(doc):g} ms "
                                     f"after the barge-in at {onset:.0f} ms")
        assert silent is not None
        _require(abs(call.ms(silent) - stated) <= allowed, f"{where}: heard silent at {call.ms(silent):.1f} ms on "
                                                           f"call.wav, {stated:.1f} ms in {ARTIFACT} (more than {allowance})")
        cleared = barge.cleared_ms
        lines_after = ""
        window = [t for t in clears if onset - frame <= t <= stated + frame]
        if cleared is None:
            _require(not window, f"{where}: cleared_ms is null, the event log has a clear at {window[:1]} ms")
        else:
            _require(any(abs(t - cleared) <= TOLERANCE_MS for t in clears),
                     f"{where}: cleared_ms {cleared} ms, no clear in the event log then")
            # Causal: the agent can clear only after the frame holding the onset was sent (its tick, at most one frame
            # before the onset); the heard silence comes at the latest one frame after the clear (honoured), unless
            # the agent sent audio after its clear: that audio is new, played on from the empty buffer (check_clears
            # holds each clear honoured), so the silence comes after it. pipecat sends the tail of a synthesis it
            # had in flight after its clear (seen on its Vonage serializer: heard silent 100 ms after the clear).
            sent_after = [t for t in arrivals if cleared < t <= stated]
            _require(onset - frame <= cleared and (bool(sent_after) or stated <= cleared + frame),
                     f"{where}: clear at {cleared:.1f} ms, onset {onset:.1f}, heard silent {stated:.1f} with no audio "
                     "sent after the clear: not in that order")
            if sent_after:
                lines_after = (f"; {len(sent_after)} audio message(s) came after the clear, up to "
                               f"+{sent_after[-1] - cleared:.0f} ms")
            following_heard = turns[position + 1].heard
            following_first = following_heard.first_sound_ms if following_heard is not None else None
            _require(following_first is None or cleared <= following_first,
                     f"{where}: cleared_ms {cleared:.1f} is after the next reply was heard ({following_first:.1f} ms): "
                     "another reply's clear")
        words, count = barge.words_heard, barge.words_heard_count
        _require(words is None or count == len(words.split()),
                 f"{where}: words_heard {words!r} counted as {count!r}")
        lines.append(f"{where}: heard {call.ms(silent) - onset:.0f} ms after the onset"
                     f"{'' if cleared is None else f', clear at +{cleared - onset:.0f} ms'}{lines_after}")
    return "; ".join(lines)


def check_schedule(out: RunFolder | Any) -> str:
    """Law: the caller spoke as its script says, so the agent was never talked over by accident: a line starts only
    after the previous reply was heard to end (the heard channel silent reply_end_ms after its last sound) and the
    think pause, within a frame (lines start on ticks); a barge-in line's speech starts barge_in_after_ms after the
    reply's first heard sound, within a frame, and only on the turns settings.barge_in_turns names.
    What the caller could hear is all it could go by: an agent that falls silent for longer than reply_end_ms +
    think_ms mid-reply (its next clause late, as on a busy machine) and then speaks on is heard to have ended, so its
    later sound lies after the next line's start. That is no broken schedule when call.wav's heard channel was silent
    for those reply_end_ms + think_ms right before the line (within a frame): the check passes and counts the
    reply that resumed into the caller's line; if the channel was not silent then, the caller did not follow its
    rule and it fails. A barge-in's timing is also the caller's live judgement where the two differ: while calling it
    took a frame above FLOOR_MIN as the reply heard (the heard floor, over the audio received, is known only after
    the call), so a click or comfort noise under the final floor may start its count."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    settings, frame = doc.settings, _frame_ms(doc)
    think = _must(settings.think_ms, "settings.think_ms")
    reply_end = settings.reply_end_ms
    planned = set(settings.barge_in_turns)
    after = _must(settings.barge_in_after_ms, "settings.barge_in_after_ms")
    turns = doc.turns
    lines = 0
    resumed: list[str] = []
    call: Recording | None = None  # read only when a reply resumed after the caller's line started
    heard_ear: Heard | None = None
    for position, turn in enumerate(turns):
        where, barge = turn.where, turn.barge_in
        _require(barge is None or turn.index in planned,
                 f"{where}: a barge-in on a turn settings.barge_in_turns does not name ({sorted(planned)})")
        if position + 1 >= len(turns):
            continue
        following = turns[position + 1].caller
        heard = turn.heard or HeardDoc()
        first, last = heard.first_sound_ms, heard.last_sound_ms
        if barge is not None:
            start = following.speech_start_ms
            on_time = first is not None and abs(start - (first + after)) <= frame
            if not on_time:
                # the caller went by what it could judge live: the first frame after its line whose peak is above
                # FLOOR_MIN (the heard floor, over the audio received, is known only after the call), so a click or
                # noise under the final floor may have started its count
                call = call or recording(folder, doc)
                live = _live_first_sound(call, doc, turn, len(caller_wavs(folder, doc)[position]))
                on_time = live is not None and abs(start - (call.ms(live) + after)) <= frame
            _require(on_time, f"{where}: the barge-in line's speech starts at {start:.1f} ms, the reply was first "
                              f"heard at {first} ms + barge_in_after_ms {after:g}")
        elif last is not None and reply_end is not None:
            offset = following.offset_ms
            wait = reply_end + think
            earliest = last + wait
            if offset < earliest - frame:
                call = call or recording(folder, doc)
                heard_ear = heard_ear or ear(call, doc)
                # the quiet the caller waited for, right before its line (a frame's slack at the far edge: the
                # dialer counts quiet in whole ticks)
                sound = heard_ear.last_sound(call.at(offset - wait + frame), call.at(offset))
                spoke_on = heard_ear.last_sound(call.at(offset), call.at(last + frame))
                _require(sound is None and spoke_on is not None,
                         f"turn {position + 2}'s line starts at {offset:.1f} ms, before {where}'s reply ended "
                         f"({last:.1f} ms) + reply_end_ms + think_ms = {earliest:.1f}, and "
                         + (f"the caller heard sound {call.ms(sound):.1f} ms into that wait" if sound is not None
                            else "call.wav's heard channel has no sound after the line's start up to that end"))
                resumed.append(f"{where}'s reply resumed at or before {last:.0f} ms, after {wait:g} ms of silence, "
                               f"into turn {position + 2}'s line (started at {offset:.0f} ms)")
        lines += 1
    return (f"{lines} lines started as scheduled (after the heard reply ended + think, or a barge-in on time)"
            + (f"; the agent paused past the caller's reply end and spoke on: {'; '.join(resumed)}" if resumed else ""))


def _live_first_sound(call: Recording, doc: DialDoc, turn: Turn, length: int) -> int | None:
    """Where the caller judged a reply first heard while calling (dial.call's schedule): the first 20 ms frame
    after the line's last frame sent whose peak is above FLOOR_MIN; its first sample, or None."""
    fs = _frame_samples(doc)
    at = call.at(turn.caller.offset_ms)
    k = (at + length + fs - 1) // fs
    peaks = np.abs(call.right[k * fs:call.frames // fs * fs].astype(np.int32)).reshape(-1, fs).max(axis=1)
    loud = np.flatnonzero(peaks > FLOOR_MIN)
    return int(k + loud[0]) * fs if loud.size else None


def check_event_order(out: RunFolder | Any) -> str:
    """Law: the event log is in the order things happened on one clock: each line has a finite t_ms, no line is
    earlier than the one before it; the caller's side begins with `connected` then `start` and ends with `stop`
    (Twilio), nothing sent after the stop; every event is one the contract knows, in its direction; a line starts
    (`caller_line`) at the frame its caller.offset_ms states."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    rows = _events(folder, doc)
    _require(bool(rows), "the event log is empty")
    previous = -math.inf
    up: list[str] = []
    for number, row in enumerate(rows, 1):
        t = _t(row, number)
        _require(t >= previous, f"events line {number} ({row.get('dir')} {row.get('event')}) at {t} ms, before line "
                                f"{number - 1} at {previous} ms: not in the order they happened")
        previous = t
        kind, direction = row.get("event"), row.get("dir")
        known = UP_EVENTS if direction == "up" else DOWN_EVENTS if direction == "down" else PLAYOUT_EVENTS
        _require(kind in known, f"events line {number}: {direction!r} {kind!r} is not an event of the contract")
        if direction == "up":
            _require(not up or up[-1] != "stop", f"events line {number}: {kind} sent after the stop")
            up.append(str(kind))
    if doc.line.protocol == "twilio":
        _require(up[:2] == ["connected", "start"], f"the caller's side begins with {up[:2]}, not connected, start")
        _require(up[-1] == "stop", f"the caller's side ends with {up[-1]!r}, not stop")
    frame = _frame_ms(doc)
    offsets = {turn.index: (turn.caller.offset_ms, turn.where) for turn in doc.turns}
    for number, row in enumerate(rows, 1):
        if row.get("event") != "caller_line" or row.get("turn") not in offsets:
            continue
        offset, where = offsets[row["turn"]]
        tick = _event_int(row.get("frame"), f"events line {number} frame") * frame
        _require(offset == tick, f"events line {number}: {where}'s line started at frame {row['frame']} ({tick:g} ms), "
                                 f"its caller.offset_ms is {offset}")
    return f"{len(rows)} events in order over {previous / 1000:.1f} s"


def check_uplink(out: RunFolder | Any) -> str:
    """Law: the caller's messages are numbered as Twilio numbers them: sequenceNumber +1 on every message after
    `connected`, media chunk +1 from 1 and timestamp + one frame from 0 (pcm: frame +1 from 0); one media per
    frame of call.wav (but the last, when the call failed: it leaves at the hang-up); frame k is sent no earlier than
    its audio's end, tick k + 1 (t0 + (k + 1) frames: a phone packetizes a frame once it was spoken, absolute
    deadlines, never early); a frame sent more than two frames after that tick was a late tick, so late_frames
    counts at least those.
    A frame lost on the line (--loss) was numbered by the sender and never reached the agent: the numbers skip
    exactly there, and the event log records it (an up `lost` in the frame's place, with its numbers); any other
    gap is a FAIL, and a lost frame on a line without loss, or a count that is not line.lost_up_frames, too."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    rows = _events(folder, doc)
    frame = _frame_ms(doc)
    line = doc.line
    twilio = line.protocol == "twilio"
    loss = line.loss
    seq, media, overdue, lost = 0, 0, 0, 0
    for number, row in enumerate(rows, 1):
        if row.get("dir") != "up" or row.get("event") == "connected":
            continue
        if twilio:
            seq += 1
            _require(row.get("seq") == seq, f"events line {number} ({row.get('event')}): sequence number "
                                            f"{row.get('seq')!r}, expected {seq}")
        if row.get("event") == "lost":
            _require(loss > 0, f"events line {number}: an uplink frame lost on a line without loss (loss_pct 0)")
            lost += 1
        elif row.get("event") != "media":
            continue
        if twilio:
            _require(row.get("chunk") == media + 1, f"events line {number}: chunk {row.get('chunk')!r}, expected {media + 1}")
            _require(row.get("timestamp") == round(media * frame),
                     f"events line {number}: timestamp {row.get('timestamp')!r}, expected {round(media * frame)}")
        else:
            _require(row.get("frame") == media, f"events line {number}: frame {row.get('frame')!r}, expected {media}")
        t = _t(row, number)
        due = (media + 1) * frame  # the tick after the frame's audio: its audio has been captured by then
        _require(t >= due - 1.0, f"events line {number}: frame {media} sent at {t} ms, before its audio ended at "
                                 f"{due:g} ms (sent at tick {media + 1})")
        overdue += t > due + 2 * frame
        media += 1
    frames = _int(doc.playout.frames, "playout.frames")
    # a call that failed never hung up, so its last captured frame was never sent
    unsent = 1 if doc.error is not None and media == frames - 1 else 0
    _require(media + unsent == frames, f"{media} media frames sent or lost, playout.frames {frames} (one per tick"
                                       f"{'' if doc.error is None else ', the last one unsent when the call failed'})")
    stated_lost = line.lost_up_frames
    _require(stated_lost is None or stated_lost == lost, f"line.lost_up_frames {stated_lost}, the event log loses {lost}")
    late = _int(doc.playout.late_frames, "playout.late_frames")
    _require(overdue <= late, f"{overdue} frames sent more than two frames after their tick, playout.late_frames {late}")
    logged = sum(1 for row in rows if row.get("event") == "late_tick")
    # every late tick is logged as it happens (measure.LATE_TICK_RULE), since dial_schema_version 3
    _require(logged == late or (not logged and doc.version < 3),
             f"{logged} late ticks in the event log, playout.late_frames {late}")
    gaps = f" but for the {lost} frames the log records lost" if lost else ""
    return f"{media} frames, sequence numbers{', chunks and timestamps' if twilio else ''} continuous{gaps}"


def _down(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, Mapping[str, Any]]]:
    return [(_t(r, n), r) for n, r in enumerate(rows, 1) if r.get("dir") == "down"]


def check_clears(out: RunFolder | Any) -> str:
    """Law: the heard channel is what arrived, played no sooner than it came: nothing sounds before the first
    audio arrived, the heard channel carries no more sound than the samples received, and every `clear` is
    honoured within one frame: from clear + 1 frame until the next audio arrived the heard channel is silent (the
    audio buffered before the clear was dropped, as Twilio does). playout.clears counts the clears received."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    rows = _events(folder, doc)
    call = recording(folder, doc)
    frame = _frame_ms(doc)
    heard_ear = ear(call, doc)
    down = _down(rows)
    media = [(t, r) for t, r in down if r.get("event") == "media"]
    lost = [r for _, r in down if r.get("event") == "lost"]
    _require(doc.line.loss > 0 or not lost, "the event log removes received audio (down 'lost') on a line without loss")
    removed = sum(_samples(r, "down lost samples") for r in lost)
    stated_lost = doc.playout.lost_ms
    _require(stated_lost is None or abs(stated_lost - removed * 1000.0 / _rate(doc)) <= TOLERANCE_MS,
             f"playout.lost_ms {stated_lost}, the event log removes {removed * 1000.0 / _rate(doc):.3f} ms")
    # the playout buffer received what arrived minus what the line lost
    received = sum(_samples(r, "down media samples") for _, r in media) - removed
    loud = heard_ear.mask
    heard = int(loud.sum())
    _require(heard <= received, f"the heard channel sounds for {heard} samples, only {received} samples arrived")
    first_loud = np.flatnonzero(loud)
    if first_loud.size:
        # A frame sits in call.wav at its tick's time, but a tick that ran late popped it late, after audio that
        # arrived in between (seen: heard 4 ms before the first arrival, the ticks up to a frame late): the slack is
        # the lateness the dialer measured (playout.max_late_ms), never more.
        late_ms = doc.playout.max_late_ms
        slack = max(0.0, late_ms) if late_ms is not None else 0.0
        _require(bool(media) and call.ms(int(first_loud[0])) >= media[0][0] - slack,
                 f"the heard channel sounds at {call.ms(int(first_loud[0])):.1f} ms, before any audio arrived "
                 f"({media[0][0] if media else 'none'}; ticks at most {slack:.1f} ms late)")
    clears = [t for t, r in down if r.get("event") == "clear"]
    stated_clears = _int(_must(doc.playout.clears, "playout.clears"), "playout.clears")
    _require(stated_clears == len(clears), f"playout.clears {stated_clears}, the event log has {len(clears)} clears")
    if not clears:
        raise NotCheckable(f"no clear was received ({len(media)} frames of audio arrived; nothing heard before its arrival)")
    for t in clears:
        resumed = next((m for m, _ in media if m > t), call.ms(call.frames))
        start, end = call.at(t + frame), call.at(resumed)
        late = heard_ear.first_sound(start, end)
        _require(late is None, f"a clear arrived at {t:.1f} ms, the heard channel still sounds at {call.ms(late or 0):.1f} ms "
                               f"(more than a {frame:g} ms frame later, before new audio arrived at {resumed:.1f} ms)")
    return f"{len(clears)} clear{'s' if len(clears) != 1 else ''}, each honoured within one frame; {heard} of {received} " \
           "samples received heard, none before it arrived"


def check_marks(out: RunFolder | Any) -> str:
    """Law: a mark is echoed only after the audio before it played (echo time >= queued + audio before it - 1
    frame) or at a clear (within one frame of one), once, after the agent sent it (its down `mark` at queued_ms);
    the audio ahead of it cannot exceed what had arrived by then; playout.marks_returned counts the echoes. Marks
    are matched per sending, first in first out per name, as the dialer echoes them: an agent may reuse a name."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    rows = _events(folder, doc)
    frame = _frame_ms(doc)
    rate = _rate(doc)
    sent: dict[str, deque[float]] = {}  # per name, the arrivals of its sendings not yet echoed, in order
    clears: list[float] = []
    arrived_ms = 0.0
    arrivals: list[tuple[float, float]] = []  # (t, audio received by then, ms)
    echoed = 0
    for number, row in enumerate(rows, 1):
        t, kind, direction = _t(row, number), row.get("event"), row.get("dir")
        if direction == "down" and kind == "media":
            arrived_ms += _samples(row, f"events line {number} samples") * 1000.0 / rate
            arrivals.append((t, arrived_ms))
        elif direction == "down" and kind == "mark":
            name: Any = row.get("name")
            _require(isinstance(name, str), f"events line {number}: a mark without a name")
            sent.setdefault(name, deque()).append(t)
        elif direction == "down" and kind == "clear":
            clears.append(t)
        elif direction == "up" and kind == "mark":
            name = row.get("name")
            _require(bool(sent.get(name)), f"events line {number}: mark {name!r} echoed, the agent never sent it"
                     + (" (each of its sendings was echoed already)" if name in sent else ""))
            queued = _num(row.get("queued_ms"), f"events line {number} queued_ms")
            ahead = _num(row.get("audio_before_ms"), f"events line {number} audio_before_ms")
            arrived = sent[name].popleft()
            _require(abs(queued - arrived) <= STAMP_MS, f"events line {number}: mark {name!r} queued at {queued} ms, "
                                                        f"it arrived at {arrived} ms")
            got = max((a for at, a in arrivals if at <= queued + TOLERANCE_MS), default=0.0)
            _require(0 <= ahead <= got + TOLERANCE_MS, f"events line {number}: {ahead} ms of audio ahead of mark {name!r}, "
                                                       f"{got:.0f} ms had arrived by then")
            on_clear = any(t - frame <= c <= t + TOLERANCE_MS for c in clears)
            _require(on_clear or t >= queued + ahead - frame,
                     f"events line {number}: mark {name!r} echoed at {t:.1f} ms, before its audio played out "
                     f"(queued {queued:.1f} ms + {ahead:.0f} ms ahead) and not at a clear")
            echoed += 1
    stated = _int(_must(doc.playout.marks_returned, "playout.marks_returned"), "playout.marks_returned")
    _require(stated == echoed, f"playout.marks_returned {stated}, the event log echoes {echoed}")
    if not echoed:
        raise NotCheckable("the agent sent no mark" + (" (a pcm line has none)" if doc.line.protocol == "pcm" else ""))
    left = sum(len(arrivals) for arrivals in sent.values())
    pending = f"; {left} never echoed (the call ended first)" if left else ""
    return f"{echoed} marks echoed after their audio played or at a clear{pending}"


def _median_block(values: Sequence[float], p90: bool = True) -> dict[str, Any]:
    block: dict[str, Any] = {"median": stats.median(values) if values else None}
    if p90:
        block["p90"] = stats.percentile(values, 90)
    block["n"] = len(values)
    return block


def heard_gaps(doc: DialDoc) -> list[float]:
    """Every heard turn's gap, in turn order (what the summary and compare's samples are made of)."""
    return doc.heard_gaps()


def barge_in_after_onset(doc: DialDoc) -> list[float]:
    return [_must(b.heard_after_onset_ms, f"{turn.where} barge_in.heard_after_onset_ms")
            for _, turn, b in doc.barge_ins()]


def heard_minus_reported(doc: DialDoc) -> list[float]:
    return [turn.heard_minus_reported_ms for turn in doc.turns if turn.heard_minus_reported_ms is not None]


def summary_of(doc: DialDoc) -> dict[str, Any]:
    """dial.json's summary as its turns give it (the one median rule, nearest-rank p90)."""
    gaps = _median_block(heard_gaps(doc))
    gaps["talked_over"] = sum(1 for turn in doc.turns if turn.heard is not None and turn.heard.talked_over is True)
    gaps["late_tick"] = sum(1 for turn in doc.turns if turn.heard is not None and turn.heard.late_tick is True)
    return {"heard_gap_ms": gaps,
            "barge_in_heard_after_onset_ms": _median_block(barge_in_after_onset(doc), p90=False),
            "heard_minus_reported_ms": _median_block(heard_minus_reported(doc), p90=False)}


def check_summary(out: RunFolder | Any) -> str:
    """Law: the summary is its turns': the heard gap's median (voice_llm.core.util.stats.median, always a measured
    value, so equal exactly), p90 and count, the barge-ins' heard-after-onset median and the line's share's median,
    over the turns that have them (a summary of none: {"median": null, "n": 0}; heard_minus_reported_ms may be null,
    as docs/line.md allows)."""
    doc = _doc(out)
    summary = _must(doc.summary, "summary")
    again = summary_of(doc)
    stated_blocks = {"heard_gap_ms": summary.heard_gap_ms,
                     "barge_in_heard_after_onset_ms": summary.barge_in_heard_after_onset_ms,
                     "heard_minus_reported_ms": summary.heard_minus_reported_ms}
    for key, block in again.items():
        stated = stated_blocks[key]
        if stated is None and key == "heard_minus_reported_ms" and not block["n"]:
            continue  # docs/line.md: null when no turn's agent number was reported
        _require(stated is not None, f"summary.{key} is None, the turns give {block}")
        assert stated is not None
        said = stated.numbers()
        for field, value in block.items():
            if field in ("talked_over", "late_tick") and field in stated.absent and not value:
                continue  # a dial.json from before such turns were told apart (dial_schema_version 1, 2)
            _require(said[field] == value, f"summary.{key}.{field} {said[field]}, the turns give {value}")
    gap = again["heard_gap_ms"]
    if not gap["n"]:
        return "no turn's reply was heard; the summary says so"
    return f"heard gap median {gap['median']:.0f} ms, p90 {gap['p90']:.0f} ms over {gap['n']} turns, recomputed"


def check_wer(out: RunFolder | Any) -> str:
    """Law: each turn's word errors are what the agent's transcript of the caller's line gives against the line's
    script by the run's rule (voice_llm.engines.speech_in.wer), so a WER cannot be edited apart from what it scores. The
    caller's own business is the heard transcript; this scores the agent's recognition when it reported it."""
    doc = _doc(out)
    scored = []
    for turn in doc.turns:
        where, stated, transcript, script = turn.where, turn.wer, turn.agent_transcript, turn.script
        if stated is None:
            _require(transcript is None, f"{where}: the agent's transcript is there, its word errors are not")
            continue
        _require(script is not None and transcript is not None,
                 f"{where}: wer stated without the script and the transcript it scores")
        assert script is not None and transcript is not None
        again = word_errors(script, transcript)
        _require((stated.errors, stated.words) == (again.errors, again.words),
                 f"{where}: wer {stated.errors}/{stated.words} stated, {again.errors}/{again.words} from "
                 f"{transcript[:60]!r} against {script[:60]!r}")
        scored.append(again)
    if not scored:
        raise NotCheckable(f"{NOT_REPORTED}: no transcript of the caller's lines to score")
    return f"{sum(w.errors for w in scored)} word errors in {sum(w.words for w in scored)} words over {len(scored)} " \
           "turns, recomputed"


def check_agent_reported(out: RunFolder | Any) -> str:
    """Law: heard_minus_reported_ms is the heard gap minus the agent's own reported latency, per turn (null when
    either is). Finding: the line's share (transport, the jitter delay, the tick, the VAD's lag behind the true end)
    above the line's jitter + 2 frames, or below zero (the agent claims more silence than the caller heard: its
    clock starts before the caller's true end): the agent's number does not predict what its caller hears."""
    doc = _doc(out)
    jitter, frame = doc.line.jitter_ms, _frame_ms(doc)
    limit = jitter + LINE_SHARE_FRAMES * frame
    shares: list[float] = []
    missed: list[str] = []
    for turn in doc.turns:
        where, reported, gap, stated = turn.where, turn.reported_ms, turn.gap_ms, turn.heard_minus_reported_ms
        if reported is None or gap is None:
            _require(stated is None, f"{where}: heard_minus_reported_ms {stated} without a heard gap and a reported latency")
            continue
        share = _must(stated, f"{where} heard_minus_reported_ms")
        _require(abs(share - (gap - reported)) <= TOLERANCE_MS, f"{where}: heard_minus_reported_ms {share}, heard gap "
                                                                f"{gap} - reported {reported} = {gap - reported}")
        shares.append(share)
        expect(share <= limit, f"{where}: the caller heard {share:.0f} ms more than the agent reports, above the "
                               f"line's jitter {jitter:g} ms + {LINE_SHARE_FRAMES} frames ({limit:g} ms)", missed)
        expect(share >= 0, f"{where}: the agent reports {-share:.0f} ms more than the caller heard", missed)
    if not shares:
        raise NotCheckable(NOT_REPORTED)
    return unless_missed(f"heard minus reported {', '.join(f'{s:.0f}' for s in shares)} ms (median "
                         f"{stats.median(shares):.0f} ms; limit {limit:g} ms)", missed)


def check_real_time(out: RunFolder | Any) -> str:
    """Expectation, a finding when it does not hold: the dialer kept up with real time (no tick more than a frame
    late, issue 27 at one caller), its own cost per frame at most 2 ms median, no audio dropped at the playout
    cap. Lateness and cost are facts about this machine's load."""
    doc = _doc(out)
    playout, cost = doc.playout, _must(doc.dialer_cost_ms, "dialer_cost_ms")
    late, frames = _int(playout.late_frames, "playout.late_frames"), _int(playout.frames, "playout.frames")
    median = _must(cost.median, "dialer_cost_ms.median")
    dropped = _must(playout.dropped_ms, "playout.dropped_ms")
    missed: list[str] = []
    expect(late == 0, f"{late} late frames of {frames}", missed)
    expect(median <= DIALER_COST_MS, f"the dialer's cost {median:.2f} ms per frame (median), above {DIALER_COST_MS:g} ms",
           missed)
    expect(dropped == 0, f"{dropped:.0f} ms of the agent's audio dropped at the playout buffer's cap", missed)
    return unless_missed(f"{late} late frames of {frames}; dialer cost {median:.2f} ms per frame (median)", missed)


def check_target(out: RunFolder | Any) -> str:
    """Expectation, a finding when it does not hold: issue 27's target, the median heard mouth-to-ear at most
    1.2 s (with the built-in agent at a 300 ms endpoint; a fact about the agent, the model and the machine)."""
    gaps = heard_gaps(_doc(out))
    if not gaps:
        raise NotCheckable("no turn's reply was heard: no mouth-to-ear time")
    median, p90 = stats.median(gaps), stats.percentile(gaps, 90)
    missed: list[str] = []
    expect(median <= MOUTH_TO_EAR_TARGET_MS, f"median heard mouth-to-ear {median:.0f} ms, above the "
                                             f"{MOUTH_TO_EAR_TARGET_MS:.0f} ms target", missed)
    return unless_missed(f"median {median:.0f} ms, p90 {p90:.0f} ms over {len(gaps)} turns (target "
                         f"{MOUTH_TO_EAR_TARGET_MS:.0f} ms)", missed)


def check_false_barge_ins(out: RunFolder | Any) -> str:
    """Law: the false barge-ins dial.json counts (the agent cut its own reply with no caller speech: a clear that
    dropped audio, or the agent's audio stopping (the playout buffer ran dry, a `playout_idle`) with the heard reply
    silent for 200 ms and sounding again, inside a turn's reply before the next line's speech start; settings.false_barge_in_rule) are on the files, and none is missing: each `clear` stated
    is a clear in the event log at that time, after the reply's first audio arrived and before the next line's
    speech start; each stop stated is re-measured on call.wav (silent from then for at least 200 ms, sounding again
    at the resumption, within a frame); every clear in the log that dropped audio inside a turn's reply with no
    caller line sounding is one stated (an agent that cuts itself cannot hide it); summary.false_barge_ins counts
    the turns. The caller's speech is its lines' true spans (caller.speech_start_ms .. speech_end_ms)."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    turns = doc.turns
    if all("false_barge_in" in t.absent for t in turns):
        raise NotCheckable("dial.json counts no false barge-ins (written before line conditions)")
    rows = _events(folder, doc)
    frame = _frame_ms(doc)
    arrivals = [_t(r, n) for n, r in enumerate(rows, 1) if r.get("dir") == "down" and r.get("event") == "media"]
    clears = [(_t(r, n), _num(r.get("dropped_ms", 0), f"events line {n} dropped_ms"))
              for n, r in enumerate(rows, 1) if r.get("dir") == "down" and r.get("event") == "clear"]
    spans = [(t.caller.speech_start_ms, t.caller.speech_end_ms) for t in turns]
    call = None
    counted, lines = 0, []
    for position, turn in enumerate(turns):
        where, flag, at = turn.where, turn.false_barge_in, turn.false_barge_in_at
        _require(flag is not None and flag == (at is not None),
                 f"{where}: false_barge_in {flag!r} but false_barge_in_at {at!r}")
        end = spans[position][1]
        limit = spans[position + 1][0] if position + 1 < len(spans) else math.inf
        reply = next((t for t in arrivals if t >= end), None)
        silent = [(reply, t) for t, dropped in clears if reply is not None and reply <= t < limit and dropped > 0
                  and not any(s < t and e > reply for s, e in spans)]
        if at is None:
            _require(not silent, f"{where}: a clear at {silent[0][1] if silent else 0:.1f} ms dropped the reply's "
                                 "audio with no caller speech, and dial.json counts no false barge-in")
            continue
        counted += 1
        assert at is not None
        kind = at.kind
        if kind == "clear":
            t = _must(at.t_ms, f"{where} false_barge_in_at.t_ms")
            _require(any(abs(t - c) <= TOLERANCE_MS for _, c in silent),
                     f"{where}: a false barge-in by a clear at {t} ms, no clear then cut the reply with the caller silent")
        elif kind == "stopped":
            call = call or recording(folder, doc)
            stop = _must(at.silent_ms, f"{where} false_barge_in_at.silent_ms")
            resumed = _must(at.resumed_ms, f"{where} false_barge_in_at.resumed_ms")
            _require(resumed - stop >= _silent_run(doc) - frame and resumed < limit,
                     f"{where}: heard silent {stop}..{resumed} ms: not a {_silent_run(doc):g} ms stop inside the reply")
            again = ear(call, doc).first_sound(call.at(stop), call.frames)
            _require(again is not None and abs(call.ms(again) - resumed) <= frame,
                     f"{where}: the reply resumes at {resumed} ms in {ARTIFACT}, call.wav's heard channel at "
                     f"{call.ms(again) if again is not None else 'never'}")
            idles = [_event_int(r["frame"], f"events line {n} frame") * frame if "frame" in r else _t(r, n)
                     for n, r in enumerate(rows, 1) if r.get("event") == "playout_idle"]
            _require(any(stop - frame - TOLERANCE_MS <= t <= resumed for t in idles),
                     f"{where}: a stop at {stop} ms, but the playout buffer did not run dry then (a pause inside the "
                     "agent's audio is no stop)")
            _require(not any(s < resumed and e > stop for s, e in spans),
                     f"{where}: a stop at {stop} ms while the caller spoke: no false barge-in")
        else:
            raise CheckFailed(f"{where}: false_barge_in_at.kind {kind!r} is neither 'clear' nor 'stopped'")
        lines.append(f"{where}: {kind} at {at.t_ms if at.t_ms is not None else at.silent_ms} ms")
    stated = _must(doc.summary, "summary").false_barge_ins
    _require(stated == counted, f"summary.false_barge_ins {stated!r}, the turns count {counted}")
    if not counted:
        return f"no false barge-in: {len(clears)} clear{'s' if len(clears) != 1 else ''}, none cut a reply with the caller silent"
    return f"{counted} false barge-in{'s' if counted != 1 else ''}: {'; '.join(lines)}"


def _pause_of(turn: Turn, t_ms: float) -> str:
    """", inside its planned pause A..B ms" when ``t_ms`` falls in one of the turn's pauses (turns[].caller)."""
    for start, end in turn.caller.pauses_ms:
        if start <= t_ms < end:
            return f", inside its planned pause {start:.0f}..{end:.0f} ms"
    return ""


def check_cut_offs(out: RunFolder | Any) -> str:
    """Law: the cut-offs dial.json states (the agent heard inside the caller's own speech span, a pause in the line
    included; settings.cut_off_rule) are the recording's, and none is missing. Re-derived from call.wav alone: each
    line's speech span from the caller channel (the caller WAV's own samples under an echo, as check_heard_gaps
    does), the reply a barge-in line cut into excluded up to its heard silence re-measured on the heard channel
    (the first 200 ms of silence from the line's onset), then the first heard sample above floor.heard inside the
    span. It holds because the recording is the samples the caller sent and heard, appended frame by frame, and the
    dialer measured the same samples with the same floor: the first heard sound stated is the file's within a frame
    (the window edges are one frame wide for the same reason), nothing sounds in the window before it, a turn
    stated without one has no sound inside its window, and a turn stated unknown is one the files cannot show
    either (the reply cut into never went silent inside the line, or the recording ended first) with its reason in
    ``unknown``; summary.cut_offs counts the turns that can show it. That the agent talked into the caller's line is
    the agent's behaviour (its endpoint shorter than the caller's pause), never a failure: a FINDING."""
    folder = RunFolder.of(out)
    doc = _doc(folder)
    turns = doc.turns
    if all("cut_off" in t.absent for t in turns):
        raise NotCheckable("dial.json counts no cut-offs (written before they were measured)")
    call = recording(folder, doc)
    frame_ms = _frame_ms(doc)
    f = round(frame_ms * call.rate / 1000)
    wavs = caller_wavs(folder, doc)
    measured = measure(call, doc, [len(w) for w in wavs], wavs, clear_samples(folder, doc, call.rate))
    heard_ear = ear(call, doc)
    clears = clear_samples(folder, doc, call.rate)
    counted, known, cut = 0, 0, []
    for position, (turn, seen) in enumerate(zip(turns, measured)):
        where, flag, at = turn.where, turn.cut_off, turn.cut_off_at
        _require((flag is True) == (at is not None),
                 f"{where}: cut_off {flag!r} but cut_off_at {at!r}")
        _require(seen.speech_start is not None and seen.speech_end is not None,
                 f"{where}: no caller sound on call.wav in its line's span")
        assert seen.speech_start is not None and seen.speech_end is not None
        start, end = seen.speech_start, seen.speech_end
        looked_from, why = start, None
        previous = turns[position - 1] if position else None
        if previous is not None and previous.barge_in is not None:
            silent = barge_silence(heard_ear, doc, start, end, clears)[0]
            if silent is None:
                why = "the reply cut into never goes silent on call.wav"
            elif silent >= end:
                why = f"the reply cut into plays to the line's end on call.wav (silent at {call.ms(silent):.1f} ms)"
            else:
                looked_from = silent
        if why is None and end > call.frames and heard_ear.first_sound(looked_from, end) is None:
            why = "call.wav ends before the caller's line"
        if why is not None:
            _require(flag is None, f"{where}: cut_off {flag!r}, but {why}: the heard channel cannot show it")
            _require(doc.reason(f"turns[{position}].cut_off") is not None,
                     f"{where}: cut_off is null without its reason in unknown")
            continue
        _require(flag is not None, f"{where}: cut_off is null, but call.wav shows the caller's span "
                                   f"{call.ms(looked_from):.1f}..{call.ms(end):.1f} ms whole")
        known += 1
        if at is None:
            sound = heard_ear.first_sound(looked_from + f, end - f)
            _require(sound is None, f"{where}: no cut-off in {ARTIFACT}, call.wav's heard channel sounds at "
                                    f"{call.ms(sound or 0):.1f} ms, {call.ms(end - (sound or 0)):.0f} ms before the "
                                    "caller's speech end")
            continue
        assert at is not None
        t = _must(at.t_ms, f"{where} cut_off_at.t_ms")
        left = _must(at.caller_speech_left_ms, f"{where} cut_off_at.caller_speech_left_ms")
        stated_end = turn.caller.speech_end_ms
        _require(abs(left - (stated_end - t)) <= TOLERANCE_MS,
                 f"{where}: caller_speech_left_ms {left}, speech_end {stated_end} - t {t} = {stated_end - t}")
        sample = call.at(t)
        _require(call.ms(looked_from) - frame_ms <= t < call.ms(end) + frame_ms,
                 f"{where}: a cut-off at {t:.1f} ms, outside the caller's span {call.ms(looked_from):.1f}.."
                 f"{call.ms(end):.1f} ms on call.wav")
        _require(heard_ear.first_sound(sample - f, sample + f + 1) is not None,
                 f"{where}: a cut-off at {t:.1f} ms, call.wav's heard channel is silent within a frame of it")
        earlier = heard_ear.first_sound(looked_from + f, sample - f)
        _require(earlier is None, f"{where}: a cut-off at {t:.1f} ms, call.wav's heard channel already sounds in the "
                                  f"caller's span at {call.ms(earlier or 0):.1f} ms")
        counted += 1
        cut.append(f"{where}: the agent heard at {t:.0f} ms, {left:.0f} ms before the caller's speech end"
                   f"{_pause_of(turn, t)}")
    stated = _must(doc.summary, "summary").cut_offs
    _require(stated == (counted if known else None),
             f"summary.cut_offs {stated!r}, the turns count {counted if known else None} (of {known} that can show it)")
    if not known:
        raise NotCheckable("no turn's heard channel can show a cut-off (the reasons are in unknown)")
    detail = f"{counted} cut-off(s) in {known} turn(s), re-derived from call.wav"
    if counted:
        raise Finding(f"the agent talked into the caller's line: {'; '.join(cut)} ({detail})")
    return f"no cut-off: nothing heard inside the caller's speech in {known} turn(s), re-derived from call.wav"
