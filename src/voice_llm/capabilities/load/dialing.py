"""Dialing callers (``load --dial URL``): each Locust user makes one real call after another, each call a
``python -m voice_llm dial --settings FILE`` subprocess; this module is everything about such a call that is not
Locust.

The call's settings are dial's own (DialOptions, made once by the load command: load.run.dial_caller), handed to
each call whole as a JSON file that dial reads as it reads its flags: no dial flag is built by hand here, so a
setting or a default of dial's reaches every call with no edit of load.

Why a subprocess per call: the dialer (voice_llm.capabilities.dial) is an asyncio loop ticking every 20 ms on absolute
deadlines, with a real-time playout ear; a Locust worker is monkey-patched by gevent (sockets, threads, time), in
which that loop would share one cooperative hub with every other caller of the worker and its clock would be read
late. A subprocess is an ordinary process the OS schedules on its own; the worker waits for it cooperatively
(gevent's subprocess) and reads the call's dial.json (or dial-partial.json) afterwards. The call is measured by
the dialer itself, at its ear (dial.json turns[i].heard.gap_ms), never by the worker.

The caller's lines: the first call of a worker has dial synthesize them (Piper), and the worker keeps that call's
caller WAVs (what went on the line) with a script.txt as a caller-audio folder; every later call of the worker says
those (DialOptions.caller_audio, ``dial --caller-audio``), so a call spends its CPU on the call, not on Piper (measured here: 8.2 s of CPU
per 2-line call synthesizing, 4.2 s with the folder). The WAVs are the line's samples (8 kHz mu-law decoded):
dial reads them back at 16 kHz and puts them on the line again, the same words at the same times within a frame.

Pure: no locust, no gevent import (the worker passes its own Popen); the functions that read a call's files take
its folder.
"""

from __future__ import annotations

import bisect
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from voice_llm.capabilities.dial import DialDoc, DialOptions, DialPartialDoc, without_kept_where
from voice_llm.core.errors import ArtifactError
from voice_llm.core.run import flags
from voice_llm.capabilities.load.stats import AGENT_STAGES, SAMPLE_FIELDS, stage_column
from voice_llm.core.util.artifacts import DIAL, DIAL_PARTIAL, read_json

DIAL_JSON = DIAL  # what `voice-llm dial` writes into its OUT
DIAL_PARTIAL_JSON = DIAL_PARTIAL  # ... when the call failed (refused, no reply): the call so far
CLOSE_TRY_AGAIN = 1013  # "try again later" (RFC 6455 7.4.1, IANA close code registry): an agent at its call limit
# dial's failure line names the agent's close frame: "... (close code 1013 'voice-llm agent: at its limit ...')"
_CLOSE = re.compile(r"close code (\d+)(?: '([^']*)'| \"([^\"]*)\")?")
ERROR_CHARS = 300  # an error's text in a sample (the CSV's cell), as text-mode turns keep it


@dataclass(frozen=True)
class Phase:
    """What the master announced, and when this worker heard it (time.time())."""

    at: float
    step: int
    phase: str
    callers: int


@dataclass
class PhaseClock:
    """The sweep's phases as this worker heard them, in order, so that a turn measured after its call ended is
    tagged with the phase at the moment the turn started (a call's turns can straddle a phase change)."""

    phases: list[Phase] = field(default_factory=list)

    def add(self, phase: Phase) -> None:
        self.phases.append(phase)

    def at(self, when: float) -> Phase:
        """The phase announced last before ``when``; before the first one: idle (step -1, never counted)."""
        index = bisect.bisect_right([p.at for p in self.phases], when) - 1
        return self.phases[index] if index >= 0 else Phase(when, -1, "idle", 0)

    def measured_steps(self, since: float, until: float | None = None) -> set[int]:
        """The steps whose measured window overlapped ``since``..``until`` (None: still running)."""
        steps = {self.at(since).step} if self.at(since).phase == "measure" else set()
        steps |= {p.step for p in self.phases if p.phase == "measure" and since <= p.at and
                  (until is None or p.at <= until)}
        return steps


LINE_BYTES_PER_S = 2 * 2 * 8000  # dial's live WAV: stereo int16 at the line's rate, 8 kHz at the least (Twilio)
WAV_HEADER_BYTES = 44
TURN_MARGIN_S = 0.5  # a call's first turn starts at its first speech end: after dial's 500 ms lead silence at least


# Why a heard turn was not timed (the sample's ``unjudged``): dial's late-tick rule
LATE_TICK = "a late tick: the dialer ran late near the speech end or the reply's first sound"


def turns_since(placed: float, out: Path, now: float) -> float:
    """The earliest moment a running call's turns can have started (each starts at a caller speech end on the
    call's clock). dial opens its live WAV in ``out``/dial just before it connects and writes one frame per 20 ms
    tick: while there is none the call clock has not started, so no turn began before ``now``; once it grows, the
    clock started its length ago (read at 8 kHz, the lowest line rate: never later than it did), and no turn began
    before TURN_MARGIN_S after that. Why: at 1 caller a step's window ends at the report of a call that just ended,
    while its caller has already placed the next call; counted from its placing, the drain waited for that whole
    call, none of whose turns started in the window. Cannot tell (an OS error): when it was placed."""
    folder = out / "dial"
    try:
        sizes = [p.stat().st_size for p in folder.glob("*.wav")] if folder.is_dir() else []
    except OSError:
        return placed
    if not sizes:
        return now
    elapsed = max(0, max(sizes) - WAV_HEADER_BYTES) / LINE_BYTES_PER_S
    return max(placed, now - elapsed - TURN_MARGIN_S)


def call_options(options: DialOptions, lines: Path | None) -> DialOptions:
    """One call's settings: the plan's ``options``; once a call of this worker made the caller's lines, those lines
    instead (``lines``, a caller-audio folder kept by :func:`keep_lines`), every WAV of it (no turns asked for: the
    folder holds the plan's turns), the plan's barge-in turns kept."""
    if lines is None:
        return options
    # the synthesized set back to its default: dial refuses --caller-lines beside the caller's own audio
    return replace(options, caller_audio=lines, caller_lines=DialOptions.caller_lines, turns_given=False)


def settings_file(out: Path) -> Path:
    """Where the settings of the call into ``out`` are written: beside its folder, which holds dial's run only."""
    return out.with_name(f"{out.name}.settings.json")


def dial_command(options: DialOptions, out: Path, lines: Path | None) -> list[str]:
    """The `voice-llm dial` command line of one call into ``out`` (a folder of its own), its settings
    (:func:`call_options`) written whole to :func:`settings_file` first, for ``dial --settings FILE``; beside them
    only the run's own flags: where it writes and no progress lines."""
    file = settings_file(out)
    flags.write_settings(call_options(options, lines), file)
    return [sys.executable, "-m", "voice_llm", "dial", "--settings", str(file), "--out", str(out), "--quiet"]


def keep_lines(call_out: Path, lines: Path) -> bool:
    """After a call that went through (its dial.json in ``call_out``): its caller WAVs and their script as the
    caller-audio folder ``lines`` (made whole under a temporary name, then renamed: a concurrent call sees no
    folder or a complete one). False when ``lines`` exists already (another caller of this worker made it), or
    the call left no readable dial.json or WAVs (the next call synthesizes its lines again)."""
    if lines.exists():
        return False
    try:
        doc = DialDoc.parse(read_json(call_out / DIAL_JSON))
    except ArtifactError:
        return False
    names = [turn.caller_wav for turn in doc.turns]
    scripts = [turn.script for turn in doc.turns]
    if not names or any(n is None for n in names) or any(s is None for s in scripts):
        return False
    tmp = Path(tempfile.mkdtemp(prefix=".lines-", dir=lines.parent))
    try:
        for name in names:
            assert name is not None
            shutil.copyfile(call_out / name, tmp / Path(name).name)  # caller-01.wav, ...: turn order = name order
        (tmp / "script.txt").write_text("".join(f"{s}\n" for s in scripts), encoding="utf-8")
        os.replace(tmp, lines)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def refusal(text: str) -> tuple[int, str | None] | None:
    """(close code, the agent's reason) when ``text`` (dial's failure line) says the agent closed the line with
    1013 "try again later"; else None."""
    found = _CLOSE.search(text)
    if found is None or int(found.group(1)) != CLOSE_TRY_AGAIN:
        return None
    return CLOSE_TRY_AGAIN, found.group(2) or found.group(3)


def refused_error(code: int, reason: str | None) -> str:
    """One text for every refusal of the same agent (the step counts errors by their text)."""
    return f"refused: close code {code}" + (f" ({reason})" if reason else "")


@dataclass(frozen=True)
class CallId:
    """Whose call this was and when it was placed (time.time())."""

    worker: str
    caller: str
    call: int
    placed: float


def _blank(call: CallId, turn: int, start: float, phase: Phase) -> dict[str, Any]:
    sample: dict[str, Any] = {name: None for name in SAMPLE_FIELDS}
    sample.update({"step": phase.step, "callers": phase.callers, "phase": phase.phase, "worker": call.worker,
                   "caller": call.caller, "call": call.call, "turn": turn, "start": start, "cancelled": False,
                   "tokens": 0, "refused": False, "barge_in": False})
    sample.pop("slots", None)  # the load command adds the sweep's slots
    return sample


def _turn_samples(doc: DialDoc | None, call: CallId, clock: PhaseClock, error: str | None) -> list[dict[str, Any]]:
    """One sample per turn the call measured a heard gap for; a call that failed (``error``) adds one error sample
    for the turn it failed in (the first without a heard gap), and nothing after it."""
    rows: list[dict[str, Any]] = []
    for turn in doc.turns if doc is not None else ():
        assert doc is not None
        heard = turn.heard
        end, gap = turn.caller.speech_end_ms, turn.gap_ms
        # A turn starts when the caller stops speaking: the heard gap's clock starts there (as a text turn's
        # starts at its request); on the master's clock through the call's t0 (time.time_ns at sample 0).
        start = doc.t0_epoch_ns / 1e9 + end / 1000.0
        sample = _blank(call, turn.index, start, clock.at(start))
        sid = doc.line.stream_sid
        sample.update({"call_frames": doc.playout.frames, "late_frames": doc.playout.late_frames,
                       "speech_end_ms": end, "first_sound_ms": heard.first_sound_ms if heard is not None else None,
                       "stream_sid": sid if isinstance(sid, str) and sid else None, "t0_epoch_ns": doc.t0_epoch_ns})
        if gap is None and heard is not None and heard.talked_over is True:
            # dial's TALKED_OVER_RULE: the agent's audio still played at the caller's end, no reply to time; the
            # call goes on, so its later turns are still counted
            sample["error"] = "talked over: the agent's audio still playing at the caller's speech end"
            rows.append(sample)
            continue
        if gap is None and heard is not None and heard.late_tick is True:
            # dial's LATE_TICK_RULE: the caller's own tick ran late there, so the recording cannot time it; the
            # reply was heard and the call goes on. Not the agent's error: the turn is left unjudged (stats.judged)
            sample["unjudged"] = LATE_TICK
            rows.append(sample)
            continue
        if gap is None:
            sample["error"] = (error or "no heard reply after the caller's line")[:ERROR_CHARS]
            rows.append(sample)
            return rows
        sample["heard_gap_ms"] = gap
        if turn.barge_in is not None:
            sample["barge_in"] = True
            sample["barge_in_heard_after_onset_ms"] = turn.barge_in.heard_after_onset_ms
        if turn.agent_reported is not None:
            sample["agent_reported_ms"] = turn.agent_reported.latency_ms
        breakdown = turn.agent_breakdown  # when the call itself received the agent's spans (dial --otlp)
        if breakdown is not None:
            sample.update({stage_column(stage): breakdown.get(stage) for stage in AGENT_STAGES})
        rows.append(sample)
    if error is not None:  # failed after its last measured turn (e.g. the hang-up): the next turn is the miss
        sample = _blank(call, len(rows) + 1, call.placed if not rows else rows[-1]["start"], clock.at(
            call.placed if not rows else rows[-1]["start"]))
        sample["error"] = error[:ERROR_CHARS]
        rows.append(sample)
    return rows


def call_samples(out: Path, returncode: int | None, stderr: str, call: CallId, clock: PhaseClock) -> list[dict[str, Any]]:
    """The samples of one finished call, from its folder ``out``: its turns from dial.json (the call went
    through), or the turns measured until it failed and one error sample (dial-partial.json), or one error sample
    for the call (nothing written: it never got to the agent). A refusal (close code 1013) is an error whose text
    names the code and the agent's reason, with ``refused`` set: never a slow turn."""
    whole, partial = out / DIAL_JSON, out / DIAL_PARTIAL_JSON
    doc: DialDoc | None = None
    error: str | None = None
    try:
        if returncode == 0 and whole.is_file():
            doc = DialDoc.parse(read_json(whole), DIAL_JSON)
        elif partial.is_file():
            doc = DialPartialDoc.parse(read_json(partial), DIAL_PARTIAL_JSON)
            error = doc.error or ""
    except ArtifactError as exc:
        error = f"the call's {exc}"
    last_line = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "")
    if doc is None:
        why = error or last_line or "no output"
        error = f"dial exited with status {returncode}: {why}"
    elif returncode != 0 and not error:
        error = f"dial exited with status {returncode}: {last_line or 'no output'}"
    refused = refusal(error or "") or (refusal(last_line) if error else None)
    if refused is not None:
        sample = _blank(call, 1, call.placed, clock.at(call.placed))
        sample.update({"error": refused_error(*refused), "refused": True})
        return [sample]
    return _turn_samples(doc, call, clock, without_kept_where(error) if error else None)


__all__ = ["CallId", "Phase", "PhaseClock", "call_options", "call_samples", "dial_command", "keep_lines", "refusal",
           "refused_error", "settings_file", "turns_since"]

