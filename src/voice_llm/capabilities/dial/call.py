"""The call in real time: voice-llm as the caller on a line (a WebSocket, or WebRTC), one 20 ms tick at a time.

Why asyncio (websockets' asyncio client) and not its sync client with threads: the call is one clock and one
state (the playout buffer, the turn schedule, the recording, the events), touched by two things, the tick and
what arrives. In one event loop they never run at once, so nothing is locked and the events are in the order they
happened by construction; the receive side pushes into the playout buffer when a message arrives (its arrival time
is the one the jitter delay counts from), and the tick sleeps to absolute deadlines (t0 + k * 20 ms on
perf_counter, never accumulated sleeps). Threads would need a lock around the buffer and would fight over the GIL
at every frame on a 2-core machine.

Tick k (docs/line.md "Clocks"): capture uplink frame k (the caller's line, or silence: the audio of [k, k+1)) and
send frame k-1, whose audio has now been captured (a phone packetizes a frame once its 20 ms were spoken: sending
frame k at tick k's start put it on the line a frame before its audio existed, and every gap came out up to a frame
short), pop downlink frame k from the phone's ear (voice_llm.engines.line.playout), append both to the live recording (left
the caller's audio at its own time, right heard), echo the marks that have played, advance the turn schedule from
what was heard. The last frame leaves at the hang-up, when its audio ends. A tick that starts more than one frame late is
counted; no frame of the recording is ever skipped. The dialer's own cost per frame (the tick's work plus the
receive work since the last tick: decode, playout push, mark handling) is measured on perf_counter.

Every way a call can go wrong ends it with a :class:`DialError` naming what happened and when, with what was
recorded so far kept (:class:`CallLog` is returned with ``error`` set, never lost): a URL that is not a WebSocket
(or, on WebRTC, not an agent's offer URL), an agent that hangs up, never answers (no reply within N s in turn K),
floods the line, sends garbage or audio that is not its codec.

What carries the messages is a :class:`voice_llm.capabilities.dial.transport.Transport` (the WebSocket, or
voice_llm.capabilities.dial.webrtc's peer connection): the call loop is the same on every line.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from voice_llm.engines.audio.wav import WavWriter
from voice_llm.engines.line import conditions, wire
from voice_llm.engines.line.framing import CLEAR, MARK, MEDIA
from voice_llm.engines.line.protocols import framing_for
from voice_llm.engines.line.playout import DEFAULT_CAP_S, DEFAULT_JITTER_MS, Playout
from voice_llm.capabilities.dial.caller_lines import CallerLine
from voice_llm.capabilities.dial.measure import SILENT_AFTER_MS as BARGE_SILENT_MS
from voice_llm.capabilities.dial import webrtc
# DialError and NotAWebSocketError live with the transports; imported from here as they always were
from voice_llm.capabilities.dial.transport import CLOSE_TIMEOUT_S, DialError, Hangup, NotAWebSocketError, Transport, connect_websocket
from voice_llm.engines.speech_in.caller_audio import FLOOR_MIN
from voice_llm.core.util.clocks import perf_and_epoch_ns

LEAD_MS = 500.0  # silence before turn 1 (a line that was quiet when the call connected)
THINK_MS = 300.0  # the caller's pause after a reply ended before the next line
REPLY_END_MS = 700.0  # the heard channel silent this long (after sounding) and the buffer idle: the reply ended
BARGE_IN_AFTER_MS = 500.0  # the barge-in line starts this long after the first heard sound of the reply
DEFAULT_BARGE_IN_TURNS = (3,)
DEFAULT_DEADLINE_S = 60.0
# A flood of small messages (issue 41 item 12: a mark flood took the dialer 75 -> 768 MB in 30 s with 1.1M events;
# empty-media and 1-byte floods 341 and 521 MB). Audio is bounded already (cap_s buffered ahead of playout); what is
# bounded here is the messages that carry next to no audio: a mark, a clear, an event the line does not take count 1
# each, a media message 1 less its share of FLOOD_AUDIO_MS of audio (a 10 ms or 20 ms chunk: 0; empty or 1 byte: 1).
# An agent that sends a mark per chunk, or seconds of audio at once, is far from the bound; one that sends what
# carries no audio at hundreds per second is over it. Over it in a 1 s window, or over the call's own allowance
# (FLOOD_CALL_BASE plus FLOOD_CALL_PER_S a second: a slow flood under the window's bound), the call ends "the agent
# flooded the line" with everything up to it kept (dial-partial.json), so the events kept stay bounded.
FLOOD_WINDOW_MS = 1000.0
FLOOD_AUDIO_MS = 5.0
FLOOD_PER_WINDOW = 500
FLOOD_CALL_BASE = 5_000
FLOOD_CALL_PER_S = 100


@dataclass(frozen=True)
class CallSettings:
    url: str
    line: wire.LineFormat
    jitter_ms: float = DEFAULT_JITTER_MS
    cap_s: float = DEFAULT_CAP_S
    deadline_s: float = DEFAULT_DEADLINE_S  # each wait: the connection, a reply's first sound, a reply's end
    reply_wait_s: float | None = None  # None: deadline_s
    lead_ms: float = LEAD_MS
    think_ms: float = THINK_MS
    # plus this share of the reply as heard (its first to its last sound): a caller takes longer to answer a longer
    # reply (load --dial's callers: think time scaled to the heard reply); 0: the fixed think_ms alone
    think_share: float = 0.0
    reply_end_ms: float = REPLY_END_MS
    barge_in_turns: tuple[int, ...] = DEFAULT_BARGE_IN_TURNS
    barge_in_after_ms: float = BARGE_IN_AFTER_MS
    # the live decisions (has the reply started, has it ended) use the floor's minimum: the heard channel's own
    # floor (dial.measure.FLOOR_RULE: over the frames that carried received audio) is only known after the call,
    # and is measured then
    live_floor: int = FLOOR_MIN
    # line conditions (voice_llm.engines.line.conditions): frames lost both ways (seeded), a speakerphone's echo
    loss_pct: float = 0.0
    seed: int = 1
    echo_db: float | None = None
    echo_delay_ms: float = conditions.ECHO_DELAY_MS

    @property
    def reply_wait(self) -> float:
        return self.reply_wait_s if self.reply_wait_s is not None else self.deadline_s


@dataclass
class TurnLog:
    """One turn as the schedule ran it (ticks are frame indices on the call clock)."""

    index: int
    offset_tick: int  # the caller's line starts at this frame
    sent_ticks: int = 0
    first_sound_tick: int | None = None  # live (floor minimum): the schedule's view, re-measured after the call
    barged: bool = False  # the next line started during this turn's reply


@dataclass(frozen=True)
class LiveNote:
    """What the schedule learned as it happened, for a live line on the terminal (issue 40 item 4): a turn's end with
    its heard gap, a barge-in's heard silence, a failure. Live numbers use the schedule's floor and frame steps;
    dial.json's are re-measured on the recording after the call."""

    kind: str  # "turn" (its reply ended or was cut into), "barge_in", "failed"
    turn: int
    speech_end_ms: float | None = None  # turn: the caller's true speech end (call clock)
    gap_ms: float | None = None  # turn: from that speech end to the first heard sound (None: nothing heard)
    silent_after_onset_ms: float | None = None  # barge_in: the heard channel stayed silent from this long after
    message: str | None = None  # failed: why
    t0_epoch_ns: int = 0  # the wall clock of call-clock 0 (an agent's spans are placed on the call clock by it)


@dataclass
class CallLog:
    """Everything the call left, complete or not."""

    settings: CallSettings
    lines: Sequence[CallerLine]
    t0_epoch_ns: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    stream_sid: str = ""
    call_sid: str = ""
    turns: list[TurnLog] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    frames: int = 0
    late_frames: int = 0
    max_late_ms: float = 0.0
    cost_ms: list[float] = field(default_factory=list)
    left: list[np.ndarray] = field(default_factory=list)  # frames sent
    right: list[np.ndarray] = field(default_factory=list)  # frames heard
    playout: dict[str, Any] = field(default_factory=dict)
    lost_up_frames: int = 0  # uplink frames lost in transit (numbered, never sent)
    lost_down_frames: int = 0  # 20 ms units of received audio removed before the playout buffer
    lost_down_samples: int = 0
    line_extra: dict[str, Any] = field(default_factory=dict)  # the transport's own block of dial.json's line
    error: DialError | None = None
    hung_up_by_caller: bool = False
    interrupted: bool = False  # Ctrl-C or SIGTERM: the step keeps the partial call, then stops as interrupted
    connected: bool = False  # the line to the agent opened (False: nothing was sent or heard)

    def channel(self, which: str) -> np.ndarray:
        frames = self.left if which == "left" else self.right
        return np.concatenate(frames) if frames else np.zeros(0, np.int16)


class ClockHolder:
    """The call clock for threads beside the call (the OTLP receiver stamps arrivals with it): perf_counter ms
    since call-clock 0, once the call has set its zero (before that, since the holder was made)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0


class LiveRecording:
    """dial/call.wav written as the call happens: stereo int16 at the line's rate, left sent, right heard, one
    frame per tick (voice_llm.engines.audio's one WAV writer). The header is fixed when the file is closed, so a call that
    failed still leaves a valid WAV of what happened until then."""

    def __init__(self, path: Path, rate: int) -> None:
        self.path = path
        self._file: BinaryIO = open(path, "xb")  # a new file: never through an existing name or link
        self._wav = WavWriter(self._file, rate, channels=2)

    def write(self, left: np.ndarray, right: np.ndarray) -> None:
        self._wav.write(np.column_stack((left, right)).astype("<i2").tobytes())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._wav.close()
        self._file.close()


class _Call:
    def __init__(self, settings: CallSettings, lines: Sequence[CallerLine], recording: LiveRecording | None,
                 clock: ClockHolder | None, on_note: Callable[[LiveNote], None] | None = None) -> None:
        self.clock = clock
        self.s = settings
        self.line = settings.line
        self.lines = list(lines)
        self.recording = recording
        self.frame_samples = self.line.frame_samples
        self.frame_s = self.line.frame_ms / 1000.0
        self.playout = Playout(self.frame_samples, self.line.rate, settings.jitter_ms, settings.cap_s)
        self.log = CallLog(settings, self.lines)
        self.t0 = 0.0
        self.transport: Transport | None = None
        self.rx_cost = 0.0
        self.done = False
        # the protocol's messages (voice_llm.engines.line.framing): one interface for Twilio, PCM and the phone bridges
        self.framing = framing_for(self.line)
        self.up_loss = conditions.Loss(settings.loss_pct, settings.seed, conditions.UP)
        self.down_loss = conditions.DownlinkLoss(settings.loss_pct, settings.seed, self.frame_samples)
        self._last_lost_down = -1
        self.echo_delay = round(settings.echo_delay_ms * self.line.rate / 1000)
        if settings.echo_db is not None and self.echo_delay < self.frame_samples:
            raise DialError(f"an echo {settings.echo_delay_ms:g} ms late would be heard before it is played: at least "
                            f"one frame ({self.line.frame_ms} ms)")
        self.log.stream_sid = self.framing.ids.stream_id
        self.log.call_sid = self.framing.ids.call_id
        # the schedule
        self.state = "lead"
        self.turn: TurnLog | None = None
        self.pending_line: np.ndarray | None = None
        self.line_frames: list[np.ndarray] = []
        self.speech_end_tick = 0
        self.last_sound_tick: int | None = None
        self.wait_from = 0
        self.think_until = 0
        self.heard_since_end = False
        self.first_sound_sample: int | None = None  # the current turn's first heard sample (live floor)
        self.barge_watch: tuple[int, float] | None = None  # (turn barged into, onset ms) until its heard silence
        self.on_note = on_note
        self.noted: set[int] = set()  # the turns whose end was told
        # the uplink frame captured at the last tick, sent at the next one (its audio has ended then)
        self.captured: tuple[int, np.ndarray] | None = None
        self.flood = _FloodGauge(self.line.rate)

    # --- clock and events ----------------------------------------------------------------------------------------

    def now_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0

    def event(self, **fields: Any) -> None:
        self.log.events.append({"t_ms": round(self.now_ms(), 3), **fields})

    def fail(self, message: str) -> None:
        if self.log.error is None:
            self.log.error = DialError(message)
            self.note(LiveNote("failed", self.turn.index if self.turn is not None else 0, message=message))
        self.done = True

    def note(self, note: LiveNote) -> None:
        """Tell the live listener (a line on the terminal); a listener that fails is dropped, never the call."""
        if self.on_note is None:
            return
        try:
            self.on_note(note)
        except Exception:  # a closed stderr, a console error: the call and its measurements go on
            self.on_note = None

    def _turn_ended(self, turn: TurnLog) -> None:
        if turn.index in self.noted:  # a reply that sounded again in the think pause: said once, at its first end
            return
        self.noted.add(turn.index)
        line = self.lines[turn.index - 1]
        end = turn.offset_tick * self.frame_samples + line.end
        gap = (self.first_sound_sample - end) * 1000.0 / self.line.rate \
            if turn.first_sound_tick is not None and self.first_sound_sample is not None else None
        self.note(LiveNote("turn", turn.index, round(end * 1000.0 / self.line.rate, 1),
                           round(gap, 1) if gap is not None else None, t0_epoch_ns=self.log.t0_epoch_ns))

    def _watch_barge_in(self, tick: int, sound: bool) -> None:
        """After a barge-in's onset: the first 200 ms the heard channel stays silent (measure.SILENT_AFTER_MS's rule,
        in whole frames), said once."""
        if self.barge_watch is None:
            return
        turn, onset_ms = self.barge_watch
        ms = self.line.frame_ms
        if (tick + 1) * ms <= onset_ms:
            return
        quiet_from = max(onset_ms, (self.last_sound_tick + 1) * ms) if self.last_sound_tick is not None else onset_ms
        if not sound and (tick + 1) * ms - quiet_from >= BARGE_SILENT_MS:
            self.barge_watch = None
            self.note(LiveNote("barge_in", turn, silent_after_onset_ms=round(quiet_from - onset_ms, 1)))

    def where(self) -> str:
        turn = f"in turn {self.turn.index}" if self.turn is not None else "before turn 1"
        return f"{turn}, {self.now_ms() / 1000.0:.2f} s into the call"

    # --- sending ---------------------------------------------------------------------------------------------------

    async def send_text(self, text: str | bytes) -> None:
        assert self.transport is not None
        await self.transport.send(text)

    async def send_media(self, frame: np.ndarray, index: int) -> None:
        """Uplink frame ``index`` (the audio of [index, index + 1) on the call clock), sent at tick index + 1."""
        payload = wire.encode(self.line, frame)
        # A frame lost in transit was numbered by the sender: the agent sees the gap in sequenceNumber, chunk and
        # timestamp (Twilio) or in time (pcm). The events say where (checks.check_uplink accepts only those gaps).
        lost = self.up_loss.lost(index)
        if lost:
            self.log.lost_up_frames += 1
        sent = self.framing.media(index, payload)  # numbered even when lost: the agent sees the gap
        if not lost:
            await self.send_text(sent.message)
        self.event(dir="up", event="lost" if lost else "media", **sent.fields)

    async def send_captured(self) -> None:
        """Send the frame captured at the last tick: its audio has been spoken by now (docs/line.md "Clocks")."""
        if self.captured is not None:
            index, frame = self.captured
            self.captured = None
            await self.send_media(frame, index)

    async def echo_marks(self, names: Sequence[str], queued: dict[str, deque[tuple[float, float]]]) -> None:
        for name in names:
            # the oldest sending of this name: the playout returns marks in the order they came (first in, first
            # out), so an agent that reuses a name gets each sending echoed with its own numbers
            pending = queued.get(name)
            queued_ms, before_ms = pending.popleft() if pending else (None, None)
            if pending is not None and not pending:
                del queued[name]
            sent = self.framing.mark_played(name)
            if sent is None:  # a line without marks never queues one (framing.marks)
                continue
            await self.send_text(sent.message)
            self.event(dir="up", event="mark", **sent.fields, name=name, queued_ms=queued_ms,
                       audio_before_ms=before_ms)

    # --- receiving -------------------------------------------------------------------------------------------------

    async def receive(self) -> None:
        assert self.transport is not None
        try:
            async for message in self.transport.receive():
                started = time.perf_counter()
                try:
                    await self.take(message)
                except wire.LineError as exc:
                    self.event(dir="down", event="bad", why=str(exc))
                    self.fail(f"the agent sent what the line does not carry {self.where()}: {exc}")
                self.rx_cost += time.perf_counter() - started
                if self.done:
                    return
                await asyncio.sleep(0)  # a flood of messages must not starve the tick
        except Exception as exc:
            hangup = self.transport.closed(exc)
            if hangup is None:
                raise
            self.closed_by_agent(hangup)
            return
        if not self.done:
            hangup = self.transport.closed(None)
            if hangup is not None:
                self.closed_by_agent(hangup)

    def closed_by_agent(self, hangup: Hangup) -> None:
        if self.done:
            return
        self.event(dir=hangup.direction, event="closed", how=hangup.how)
        self.fail(f"{hangup.before} {self.where()}{hangup.after}")

    async def take(self, message: str | bytes) -> None:
        received = self.framing.parse(message)  # a wire.LineError when the line does not carry it
        samples = wire.decode(self.line, received.payload) if received.kind == MEDIA else None
        flooded = self.flood.count(self.now_ms(), 0 if samples is None else len(samples))
        if flooded is not None:
            self.event(dir="down", event="flood", why=flooded)
            self.fail(f"the agent flooded the line {self.where()}: {flooded}; the call kept up to it")
            return
        if samples is not None:
            self.push(samples, len(received.payload))
        elif received.kind == MARK:
            name = received.name or ""
            self.event(dir="down", event="mark", name=name)
            # per sending, not per name: a name the agent reuses while an earlier mark of it is pending queued
            # over it (its echo had queued_ms null, and the check found an echo "the agent never sent"); the
            # arrival is the event's own stamp, one clock reading for both
            self.queued.setdefault(name, deque()).append((self.log.events[-1]["t_ms"],
                                                          round(self.playout.buffered_ms, 3)))
            self.playout.mark(name)
        elif received.kind == CLEAR:
            cleared = self.playout.clear()
            # frame: the frames popped before it (the heard floor's stretches of received audio end there)
            self.event(dir="down", event="clear", frame=self.playout.ticks,
                       dropped_ms=round(cleared.dropped_samples * 1000.0 / self.line.rate, 3))
            await self.echo_marks(cleared.marks, self.queued)
            answer = self.framing.cleared()  # Plivo's clearedAudio, Vonage's websocket:cleared
            if answer is not None:
                await self.send_text(answer.message)
                self.event(dir="up", event=answer.event, **answer.fields)
        else:
            # The bridges' side ignores what it does not know; the events keep it so a check can see it.
            self.event(dir="down", event="bad",
                       why=f"an event the caller's side does not take: {received.what[:40]!r}")

    def push(self, samples: np.ndarray, size: int) -> None:
        self.event(dir="down", event="media", bytes=size, samples=len(samples))
        samples, lost = self.down_loss.take(samples)
        for index, count in lost:  # removed from what the playout buffer receives, per 20 ms of received audio
            self.event(dir="down", event="lost", frame=index, samples=count)
            self.log.lost_down_samples += count
            if index != self._last_lost_down:
                self.log.lost_down_frames += 1
                self._last_lost_down = index
        dropped = self.playout.push(samples)
        if dropped:
            cap = self.s.cap_s
            self.fail(f"the agent flooded the line {self.where()}: more than {cap:g} s of audio buffered ahead of "
                      f"playout ({dropped * 1000.0 / self.line.rate:.0f} ms dropped)")

    # --- the schedule ----------------------------------------------------------------------------------------------

    def start_line(self, tick: int, index: int) -> None:
        line = self.lines[index - 1]
        self.turn = TurnLog(index, tick)
        self.log.turns.append(self.turn)
        self.line_frames = wire.frames(line.samples, self.frame_samples)
        self.state = "speaking"
        self.event(event="caller_line", turn=index, frame=tick)

    def uplink(self, tick: int) -> np.ndarray:
        if self.state == "speaking" and self.turn is not None and self.turn.sent_ticks < len(self.line_frames):
            frame = self.line_frames[self.turn.sent_ticks]
            self.turn.sent_ticks += 1
            return frame
        return np.zeros(self.frame_samples, np.int16)

    def advance(self, tick: int, heard: np.ndarray) -> None:
        """The turn schedule (docs/line.md "Turn scheduling"), after tick ``tick`` played ``heard``."""
        s = self.s
        ms = self.line.frame_ms
        loud = np.flatnonzero(np.abs(heard.astype(np.int32)) > s.live_floor)
        sound = loud.size > 0
        self._watch_barge_in(tick, sound)
        if sound:
            self.last_sound_tick = tick
        if self.state == "lead":
            if (tick + 1) * ms >= s.lead_ms:
                self.start_line(tick + 1, 1)
            return
        turn = self.turn
        assert turn is not None
        if self.state == "speaking":
            if turn.sent_ticks >= len(self.line_frames):
                self.state = "waiting"
                self.speech_end_tick = tick
                self.heard_since_end = False
            return
        if self.state == "waiting":
            if sound:
                turn.first_sound_tick = tick
                self.first_sound_sample = tick * self.frame_samples + int(loud[0])
                self.state = "hearing"
            elif (tick - self.speech_end_tick) * ms > s.reply_wait * 1000.0:
                self.fail(f"no reply within {s.reply_wait:g} s in turn {turn.index}")
            return
        if self.state == "hearing":
            assert turn.first_sound_tick is not None
            # The caller starts speaking barge_in_after_ms after the reply's first heard sound: the next line's
            # samples begin early by its own lead silence, so its speech starts then.
            lead_ms = self.lines[turn.index].speech_start_ms if turn.index < len(self.lines) else 0.0
            if (turn.index in s.barge_in_turns and turn.index < len(self.lines)
                    and (tick + 1 - turn.first_sound_tick) * ms >= s.barge_in_after_ms - lead_ms):
                turn.barged = True
                self._turn_ended(turn)
                self.start_line(tick + 1, turn.index + 1)
                onset = self.lines[turn.index].start * 1000.0 / self.line.rate
                self.barge_watch = (turn.index, (tick + 1) * ms + onset)
                return
            quiet_ms = (tick - (self.last_sound_tick or tick)) * ms
            # the buffer idle, or holding only silence (a line that carries audio all the time: WebRTC's agents
            # send silence when they have nothing to say, so its buffer never runs dry; docs/line.md "WebRTC")
            if quiet_ms >= s.reply_end_ms and (self.playout.idle or not self.playout.holds_sound(s.live_floor)):
                self.state = "thinking"
                self._turn_ended(turn)
                heard_ms = ((self.last_sound_tick or tick) - turn.first_sound_tick + 1) * ms
                # every wait counts against the deadline: a think share scales with the reply, never past it
                think_ms = min(s.think_ms + s.think_share * heard_ms, s.deadline_s * 1000.0)
                self.think_until = tick + round(think_ms / ms)
            elif (tick - turn.first_sound_tick) * ms > s.deadline_s * 1000.0:
                self.fail(f"the reply to turn {turn.index} did not end within {s.deadline_s:g} s")
            return
        if self.state == "thinking":
            if sound:  # the agent spoke again: the reply had not ended
                self.state = "hearing"
            elif tick >= self.think_until:
                if turn.index >= len(self.lines):
                    self.state = "done"
                    self.done = True
                else:
                    self.start_line(tick + 1, turn.index + 1)

    # --- the tick --------------------------------------------------------------------------------------------------

    async def tick(self, k: int) -> None:
        started = time.perf_counter()
        late_s = started - (self.t0 + k * self.frame_s)
        if late_s > self.frame_s:  # measure.LATE_TICK_RULE: the turns near it get no gap
            self.log.late_frames += 1
            self.event(event="late_tick", frame=k, late_ms=round(late_s * 1000.0, 3))
        self.log.max_late_ms = max(self.log.max_late_ms, late_s * 1000.0)
        up = self.uplink(k)
        if self.s.echo_db is not None:
            up = self.with_echo(up, k)
        await self.send_captured()
        self.captured = (k, up)
        popped = self.playout.pop()
        if popped.started:
            self.event(event="playout_start", frame=k)
        if popped.ran_dry:
            self.event(event="playout_idle", frame=k)
        self.log.left.append(up)
        self.log.right.append(popped.frame)
        if self.recording is not None:
            self.recording.write(up, popped.frame)
        self.log.frames = k + 1
        if popped.marks:
            await self.echo_marks(popped.marks, self.queued)
        self.advance(k, popped.frame)
        self.log.cost_ms.append((time.perf_counter() - started + self.rx_cost) * 1000.0)
        self.rx_cost = 0.0

    def with_echo(self, said: np.ndarray, k: int) -> np.ndarray:
        """Tick k's uplink frame with the heard audio of ``echo_delay`` samples earlier mixed in (already played:
        the delay is at least a frame), through the line's codec: the samples the agent decodes, and the recording's
        left channel (what was sent on the line)."""
        fs = self.frame_samples
        start = k * fs - self.echo_delay
        heard = np.zeros(fs, np.int16)
        if start + fs > 0:
            first, last = max(0, start) // fs, (start + fs - 1) // fs
            window = np.concatenate(self.log.right[first:last + 1])
            lo = max(0, start) - first * fs
            piece = window[lo:lo + fs - max(0, -start)]
            heard[fs - len(piece):] = piece
        mixed = conditions.echo_mix(said, heard, self.s.echo_db)  # type: ignore[arg-type]
        return wire.decode(self.line, wire.encode(self.line, mixed))

    async def run(self) -> CallLog:
        self.queued: dict[str, deque[tuple[float, float]]] = {}  # per mark name, its pending sendings in order
        try:
            self.transport = await connect_line(self.s, self.framing.ids)
        except DialError as exc:
            self.log.error = exc
            self.count_playout()
            return self.log
        self.log.connected = True
        transport = self.transport
        try:
            self.log.headers = dict(transport.headers)
            # one instant on both clocks (voice_llm.core.util.clocks: two reads a thread switch apart made a span offset)
            self.t0, self.log.t0_epoch_ns = perf_and_epoch_ns()
            if self.clock is not None:
                self.clock.t0 = self.t0
            await self.open_stream()
            receiver = asyncio.create_task(self.receive())
            k = 0
            try:
                while not self.done:
                    target = self.t0 + k * self.frame_s
                    wait = target - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if self.done:
                        break
                    await self.tick(k)
                    k += 1
            finally:
                if not receiver.done():
                    receiver.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await receiver
            if self.log.error is None:
                await self.hang_up()
        except Exception as exc:  # the line failed under us (closed while sending, an OS error)
            hangup = transport.closed(exc)
            if hangup is not None:
                # A send that met the close after the receiver had already said why the call ended (under load the
                # tick can be mid-send when the close is read) adds nothing: the first account stands, once.
                if self.log.error is None:
                    self.done = False
                    self.closed_by_agent(hangup)
            else:
                self.fail(f"the call failed {self.where()}: {type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                self.log.line_extra = await asyncio.wait_for(transport.describe(), CLOSE_TIMEOUT_S)
            await transport.close()
            self.count_playout()
        return self.log

    def count_playout(self) -> None:
        counts = self.playout.counts()
        rate = self.line.rate
        self.log.playout = {
            "frames": counts.frames, "audio_frames": counts.audio_frames, "underruns": counts.underruns,
            "max_buffered_ms": round(counts.max_buffered_samples * 1000.0 / rate, 3),
            "dropped_ms": round(counts.dropped_samples * 1000.0 / rate, 3),
            "cleared_ms": round(counts.cleared_samples * 1000.0 / rate, 3),
            "marks_returned": counts.marks_returned, "clears": counts.clears,
            "lost_frames": self.log.lost_down_frames,
            "lost_ms": round(self.log.lost_down_samples * 1000.0 / rate, 3),
            "late_frames": self.log.late_frames, "max_late_ms": round(self.log.max_late_ms, 3),
        }

    async def open_stream(self) -> None:
        for sent in self.framing.opening():  # Twilio's connected and start, a bridge's own; none on PCM
            await self.send_text(sent.message)
            self.event(dir="up", event=sent.event, **sent.fields)

    async def hang_up(self) -> None:
        # the last frame captured leaves when its audio has ended (the call's last tick + a frame), then the stop
        wait = self.t0 + self.log.frames * self.frame_s - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        await self.send_captured()
        self.log.hung_up_by_caller = True
        for sent in self.framing.closing():  # Twilio's stop, a bridge's own; PCM and Vonage: the close alone
            await self.send_text(sent.message)
            self.event(dir="up", event=sent.event, **sent.fields)


@contextlib.contextmanager
def collector_out_of_the_way() -> Iterator[None]:
    """The call's loop without the cyclic garbage collector's full passes over what the dialer loaded before it.

    Why: a tick must start within a frame of its deadline, and near a tick that does not (LATE_TICK_RULE) a turn's
    gap is not measured. Before the call the dialer holds every module it imported (numpy, PyAV, websockets, Piper
    and faster-whisper for the caller's lines and the words heard, OpenTelemetry's protobuf): a full collection
    over them took 31-47 ms on this 2-core machine under load (2026-12-07), two frames, and the collector runs it
    whenever allocations pile up (the call's events, frames and messages), at a moment nobody chooses. CI saw a
    turn nulled by a 165 ms stall of the whole dialer at a reply's first sound. Collected once and frozen
    (gc.freeze: the objects alive now are left out of every later collection), a collection during the call walks
    only what the call made: 0.001 ms measured right after the freeze. Unfrozen when the call ends."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _FloodGauge:
    """The bound on messages that carry next to no audio (FLOOD_* above): ``count`` each message as it arrives
    (the call clock, its samples); the reason the line is flooded, or None."""

    def __init__(self, rate: int) -> None:
        self.full = rate * FLOOD_AUDIO_MS / 1000.0  # the samples that make a media message cost nothing
        self.window_start = 0.0
        self.window = 0.0
        self.total = 0.0

    def count(self, now_ms: float, samples: int) -> str | None:
        if now_ms - self.window_start >= FLOOD_WINDOW_MS:
            self.window_start, self.window = now_ms, 0.0
        cost = 1.0 - min(1.0, samples / self.full)
        self.window += cost
        self.total += cost
        if self.window > FLOOD_PER_WINDOW:
            return (f"more than {FLOOD_PER_WINDOW} messages carrying next to no audio (under {FLOOD_AUDIO_MS:g} ms) "
                    f"within {FLOOD_WINDOW_MS / 1000:g} s")
        allowed = FLOOD_CALL_BASE + FLOOD_CALL_PER_S * max(0.0, now_ms) / 1000.0
        if self.total > allowed:
            return (f"{self.total:.0f} messages carrying next to no audio in {max(0.0, now_ms) / 1000:.0f} s of call "
                    f"(at most {FLOOD_CALL_BASE} plus {FLOOD_CALL_PER_S} a second)")
        return None


async def connect_line(settings: CallSettings, ids: Any) -> Transport:
    """The call's transport to the agent: WebRTC (an SDP offer POSTed to the URL) or the WebSocket at the URL."""
    if settings.line.protocol == wire.WEBRTC:
        return await webrtc.connect(settings.url, settings.deadline_s, ids, settings.line)
    return await connect_websocket(settings.url, settings.deadline_s)


async def _quietly(call: _Call) -> None:
    """The call as asyncio.run's main task, with no result. Why: asyncio.run (Python 3.11) keeps its SIGINT handler
    as a partial holding the main task, and restoring the handler at the end builds an enum error message with that
    partial's repr, so the task's repr, so the repr of its result: a CallLog with every frame's arrays, 5-13 s of CPU
    per call on this 2-core machine after the call ended (measured under load --dial, where it taxed the agent)."""
    await call.run()


def run_call(settings: CallSettings, lines: Sequence[CallerLine], recording: LiveRecording | None = None,
             clock: ClockHolder | None = None, on_note: Callable[[LiveNote], None] | None = None) -> CallLog:
    """The call, in real time, in its own event loop; returns what it left (``error`` set when it failed).
    ``on_note``: told of each turn's end, barge-in and failure as it happens (in the call's loop: it must be quick)."""
    if not lines:
        raise DialError("no caller line to say")
    call = _Call(settings, lines, recording, clock, on_note)
    try:
        with collector_out_of_the_way():
            asyncio.run(_quietly(call))
        return call.log
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM as the CLI turns it: the call so far is kept, then it stops
        call.log.interrupted = True
        if call.log.error is None:
            call.log.error = DialError(f"interrupted {call.where()}")
        if not call.log.playout:
            call.count_playout()
        return call.log
