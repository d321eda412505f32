"""What the dialer measured against what the other side did, on the shared clock, with slack from measured lateness.

A test agent (tests/dial/fakeagent.py, webrtcagent.py) runs in the test's process beside the dialer: both stamp what
they do with time.perf_counter, so each leg of a turn is measured from the two sides' own logs, never assumed:

- the caller's speech end (the dialer's line) -> the agent heard its last loud frame (the agent's log): the uplink
  frame leaves once its audio was spoken, then the loopback transit and the agent's own loop; >= 0;
- the agent's delay: its last loud frame heard -> its reply's first audio sent (its log, not the delay it meant);
- the reply's first audio sent -> the dialer received it (ReceiveLog, below: its down media events): the loopback transit and the dialer's
  receive path, however late a loaded machine makes it; >= 0;
- received -> heard at the ear: the phone's rule (voice_llm.engines.line.playout), measured at the arrival: from an
  idle buffer the jitter delay; while waiting or playing, the audio buffered ahead of it (a WebRTC agent sends
  silence all the time, and audio that came in a burst after a stall of the receive path stays buffered ahead).

What only the dialer's clock decides is allowed for by what the dialer measured: its ticks' lateness
(playout.max_late_ms: a tick that runs late pops audio that arrived after its nominal time, heard sooner on the
recording than it arrived), plus EPS_MS for two event loops' scheduling. A test that assumed the transits were ~0 and
the buffer idle (slack = the dialer's lateness only) passed alone and failed on a loaded machine: the agent's and the
receive path's lateness were counted nowhere.

And LATE_TICK_RULE (voice_llm.capabilities.dial.measure): a turn near a tick more than a frame late has no heard gap,
its reason in unknown. A test of the gaps skips those turns (measured_turns), and fails if every turn was nulled or
if a null has another reason.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from voice_llm.engines.line import playout as playoutmod

FRAME_MS = 20.0
JITTER_MS = 40.0
EPS_MS = 3.0  # scheduling slack of two event loops in one process, beyond what each side measured


def slack(doc: dict) -> float:
    """How late the dialer's ticks ran (measured in the call; a late tick plays its frame at its nominal place in
    the recording but sends and pops later in real time), plus the event loops' slack."""
    return EPS_MS + doc["playout"]["max_late_ms"]


@dataclass(frozen=True)
class Arrival:
    """Audio the dialer received, as its playout buffer took it."""

    t_ms: float  # call clock: when the dialer received it (its down media event)
    ticks: int  # the ticks (pops) done by then
    state: str  # the buffer's state before it: idle, waiting, playing
    position: int  # the sample of the call at which the ear plays its first sample (the buffer's rule)
    samples: np.ndarray
    rate: int

    @property
    def position_ms(self) -> float:
        return self.position * 1000.0 / self.rate

    @property
    def ahead_ms(self) -> float:
        """What the ear plays before it from the next tick on: the jitter delay (idle), the jitter delay's rest and
        the audio buffered ahead (waiting), or the audio buffered ahead (playing)."""
        return self.position_ms - self.ticks * FRAME_MS

    def loud(self, floor: int) -> bool:
        return bool(self.samples.size) and int(np.abs(self.samples.astype(np.int32)).max()) > floor

    def loud_offset_ms(self, floor: int) -> float:
        """Where in it the first sample above ``floor`` is (a codec's onset; 0 for a square wave sent as is)."""
        loud = np.flatnonzero(np.abs(self.samples.astype(np.int32)) > floor)
        return float(loud[0]) * 1000.0 / self.rate if loud.size else float("nan")


@dataclass
class ReceiveLog:
    """The dialer's receive path as it happened: every chunk of audio it put into its playout buffer, with the
    buffer's state then (a spy on Playout.push: it records and passes the audio on unchanged), paired after the
    call with the dialer's own down media events (one each, logged just before), which give the call clock; and the
    call clock's zero on perf_counter, so the agent's own stamps go on the call clock with no wall-clock pairing."""

    raw: list[tuple[float, int, str, int, np.ndarray, int]] = field(default_factory=list)
    arrivals: list[Arrival] = field(default_factory=list)
    t0: float | None = None

    def read(self, out: Path) -> ReceiveLog:
        """Pair the pushes with ``out``'s down media events (the call written there: the last one dialled)."""
        rows = [json.loads(line) for line in (out / "dial" / "events.jsonl").read_text().splitlines()]
        downs = [row["t_ms"] for row in rows if row.get("dir") == "down" and row["event"] == "media"]
        raw = self.raw[len(self.raw) - len(downs):]
        assert len(raw) == len(downs), (len(self.raw), len(downs))
        # each event is stamped before its push: the call clock's zero is at most the earliest push less its stamp
        self.t0 = min(perf - t_ms / 1000.0 for (perf, *_), t_ms in zip(raw, downs))
        self.arrivals = [Arrival(t_ms, ticks, state, position, samples, rate)
                         for (_, ticks, state, position, samples, rate), t_ms in zip(raw, downs)]
        return self

    def call_ms(self, perf: float) -> float:
        assert self.t0 is not None, "read the call first"
        return (perf - self.t0) * 1000.0

    def first_loud(self, after_ms: float, floor: int) -> Arrival:
        """The first audio above ``floor`` the dialer received from ``after_ms`` on (less EPS_MS: two stamps)."""
        for arrival in self.arrivals:
            if arrival.t_ms >= after_ms - EPS_MS and arrival.loud(floor):
                return arrival
        raise AssertionError(f"no loud audio received after {after_ms:.1f} ms")


@contextmanager
def receiving() -> Iterator[ReceiveLog]:
    """A ReceiveLog of the calls dialled inside the block; ``read(out)`` after the call."""
    log = ReceiveLog()
    original = playoutmod.Playout.push
    starts: dict[int, int] = {}  # per buffer, the tick its current stretch of playout begins at

    def push(self: playoutmod.Playout, samples: np.ndarray) -> int:
        fs, ticks, state = self.frame_samples, self.ticks, self.state
        if state == playoutmod.IDLE:
            starts[id(self)] = ticks + self.jitter_frames
            position = starts[id(self)] * fs
        elif state == playoutmod.WAITING:
            position = starts[id(self)] * fs + self.buffered_samples
        else:
            position = ticks * fs + self.buffered_samples
        log.raw.append((time.perf_counter(), ticks, state, position, np.array(samples), self.rate))
        return original(self, samples)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(playoutmod.Playout, "push", push)
        yield log


def late_tick_nulled(doc: dict, row: dict) -> bool:
    """The turn's gap is null by LATE_TICK_RULE, and says so: heard.late_tick, the reason in unknown."""
    heard = row["heard"]
    if heard["gap_ms"] is not None or heard.get("late_tick") is not True:
        return False
    reason = doc["unknown"].get(f"turns[{row['index'] - 1}].heard.gap_ms", "")
    assert "late" in reason, (row["index"], reason)
    return True


def measured_turns(doc: dict, at_least: int = 1, after_barge_in: bool = False) -> list[int]:
    """The turns (0-based) whose heard gap was measured; every other one was nulled by LATE_TICK_RULE (with its
    reason): a loaded machine's late tick, never a gap lost otherwise. At least ``at_least`` are measured.

    ``after_barge_in``: the line that cut into a reply may also be talked over by it (TALKED_OVER_RULE), when the
    barged reply was still heard at the line's end: a WebRTC agent that has no clear stops sending only once it
    hears the caller, and on a loaded machine it hears late and what it sent before is still buffered ahead. That
    the heard silence follows the agent's stop is test_dial_webrtc's barge-in test; here its reason is required."""
    measured = []
    for i, row in enumerate(doc["turns"]):
        if row["heard"]["gap_ms"] is not None:
            measured.append(i)
        elif after_barge_in and i > 0 and row["heard"].get("talked_over") is True and doc["turns"][i - 1]["barge_in"]:
            silent = doc["turns"][i - 1]["barge_in"]["heard_silent_ms"]
            assert silent is None or silent >= row["caller"]["speech_end_ms"] - FRAME_MS, (row, silent)
            assert "talked over" in doc["unknown"].get(f"turns[{i}].heard.gap_ms", ""), doc["unknown"]
        else:
            assert late_tick_nulled(doc, row), (row, doc["unknown"])
    assert len(measured) >= at_least, ("too few turns measured", doc["turns"], doc["playout"])
    return measured


T = TypeVar("T")
TRIES = 3


def dialled(dial: Callable[[int], T], doc_of: Callable[[T], dict], tries: int = TRIES) -> T:
    """``dial(attempt)`` (1, 2, ...) until its call has a turn with a measured gap, at most ``tries`` calls: a test of
    the gaps needs one, and on a loaded machine every turn of a short call can be near a late tick (seen at load 8 on
    2 cores: all three turns of test_dial_call's call nulled). The nulls' reasons are asserted (measured_turns); if
    no call of ``tries`` has a measured turn, the test is skipped when the machine is loaded (its 1-minute load
    average above its cores: every null a late tick the dialer logged), and fails on a machine that is not (a
    dialer that stalls by itself)."""
    for attempt in range(1, tries + 1):
        result = dial(attempt)
        doc = doc_of(result)
        if any(row["heard"]["gap_ms"] is not None for row in doc["turns"]):
            return result
    measured_turns(doc, at_least=0)  # every null is a late tick's, with its reason
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores:
        pytest.skip(f"no turn measured in {tries} calls: every one near a late tick (max {doc['playout']['max_late_ms']}"
                    f" ms late) on a loaded machine (load {load:.1f} on {cores} cores); LATE_TICK_RULE nulled them")
    return result


@dataclass(frozen=True)
class Legs:
    """One turn's path from the caller's speech end to the ear, each leg from the side that did it (ms)."""

    heard_by_agent: float  # speech end -> the agent heard its last loud frame
    delay: float  # the agent's own delay, as it did it
    down: float  # its first reply audio sent -> the dialer received it
    ahead: float  # what the ear played before it from the next tick on (the jitter delay from idle)
    onset: float  # where in the received audio its first sound is (a codec's delay; 0 for a bare square wave)

    @property
    def expected_gap(self) -> float:
        return self.heard_by_agent + self.delay + self.down + self.ahead + self.onset


def heard_arrival(doc: dict, row: dict, sent: Any, log: ReceiveLog) -> Arrival:
    """The audio of the agent's reply that the ear first heard as a sound: the received audio the buffer played
    where the turn's first sound is. Mostly the reply's first audio; but a sound lasts at least a frame (FLOOR_RULE),
    and on a loaded machine a reply's first 10 ms can come alone, play, and leave the buffer dry before the rest
    arrives: the sound heard first is then where the rest began (after the jitter delay again)."""
    floor = doc["floor"]["heard"]
    first = row["heard"]["first_sound_ms"]
    sent_ms = log.call_ms(sent.sent)
    loud = [a for a in log.arrivals if a.t_ms >= sent_ms - EPS_MS and a.loud(floor)]
    assert loud, ("no loud audio received after the reply was sent", row["index"], sent_ms)
    # never heard before the reply's first audio could play
    assert first >= loud[0].position_ms + loud[0].loud_offset_ms(floor) - 0.5, (row["index"], first, loud[0])
    # the recording holds it where the buffer played it (one clock: the tick count), to the sample
    for arrival in loud:
        if abs(arrival.position_ms + arrival.loud_offset_ms(floor) - first) <= 0.5:
            return arrival
    raise AssertionError(("no received audio was played where the first sound is", row["index"], first,
                          [(a.t_ms, a.state, a.position_ms) for a in loud[:10]]))


def legs(doc: dict, row: dict, sent: Any, log: ReceiveLog) -> tuple[Legs, Arrival]:
    """``sent``: the agent's record of the turn (fakeagent.Sent: last_loud, sent perf_counter stamps)."""
    arrival = heard_arrival(doc, row, sent, log)
    sent_ms = log.call_ms(sent.sent)
    heard_by_agent = log.call_ms(sent.last_loud) - row["caller"]["speech_end_ms"]
    return Legs(heard_by_agent, sent.delay_ms, arrival.t_ms - sent_ms, arrival.ahead_ms,
                arrival.loud_offset_ms(doc["floor"]["heard"])), arrival


def assert_heard_as_it_happened(doc: dict, row: dict, sent: Any, log: ReceiveLog) -> Legs:
    """The heard gap against the two sides' logs: each leg causal (the agent hears the line's end after it was said,
    the reply arrives after it was sent), the first sound where the buffer played the reply's audio, and heard =
    the legs + the ear's wait, within a frame and the dialer's measured lateness, never less than that lateness
    allows."""
    leg, _ = legs(doc, row, sent, log)
    gap = row["heard"]["gap_ms"]
    where = (row["index"], row["heard"], leg)
    assert leg.heard_by_agent >= -EPS_MS and leg.down >= -EPS_MS, where
    # the ear's wait after the arrival, on the real clock: what it had ahead, within a frame (the arrival's place in
    # its tick) and the dialer's lateness (a late tick pops audio that came after its nominal time)
    assert abs(gap - leg.expected_gap) <= FRAME_MS + slack(doc), (where, leg.expected_gap, slack(doc))
    assert gap >= leg.expected_gap - slack(doc), (where, leg.expected_gap, slack(doc))
    return leg


def check_holds(check: Any, out: Path) -> None:
    """A check of a call's files holds: it passes; or it says what only the machine's load made of the call: not
    checkable because every turn it would measure was nulled by LATE_TICK_RULE, or (check_real_time, whose facts are
    the machine's) a finding of the late ticks or the dialer's cost it measured. Anything else fails."""
    from voice_llm.core.checks.base import Finding, NotCheckable

    doc = json.loads((out / "dial.json").read_text())
    try:
        check(out)
    except NotCheckable as exc:
        assert "late tick" in str(exc) and doc["playout"]["late_frames"] > 0, (check.__name__, str(exc))
    except Finding as exc:
        assert check.__name__ == "check_real_time", (check.__name__, str(exc))
        said = str(exc).split(" (")[0].split("; ")
        assert all("late frames of" in part or "the dialer's cost" in part for part in said), str(exc)
        assert doc["playout"]["late_frames"] > 0 or "the dialer's cost" in str(exc), str(exc)


__all__ = ["EPS_MS", "FRAME_MS", "JITTER_MS", "Arrival", "Legs", "ReceiveLog", "assert_heard_as_it_happened",
           "check_holds", "dialled", "heard_arrival", "late_tick_nulled", "legs", "measured_turns", "receiving", "slack"]
