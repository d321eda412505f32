"""The playback timeline: what the caller hears, built from when each piece of audio was ready. Pure.

Model (chunk level): an engine yields a segment's audio in pieces (Piper: one per sentence it was given), and a
player can start a piece as soon as it is ready — it need not wait for the rest of the segment. Playback starts
when the first piece is ready (time to first audio, TTFA); every later piece starts when it is ready and the one
before has finished. Any silence after playback started — the player waiting for audio — is a stall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AudioPiece:
    segment: int
    ready_ms: float
    audio_ms: float


@dataclass(frozen=True)
class Played:
    segment: int
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class Stall:
    at_ms: float  # when the silence began: the previous audio had finished
    ms: float
    segment: int  # the segment whose audio was late


@dataclass(frozen=True)
class Playback:
    ttfa_ms: float
    end_ms: float  # when the caller hears the end
    played: tuple[Played, ...]
    stalls: tuple[Stall, ...]

    @property
    def stall_count(self) -> int:
        return len(self.stalls)

    @property
    def stall_ms(self) -> float:
        return sum(stall.ms for stall in self.stalls)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ttfa_ms": self.ttfa_ms,
            "end_ms": self.end_ms,
            "stall_count": self.stall_count,
            "stall_ms": self.stall_ms,
            "stalls": [{"at_ms": s.at_ms, "ms": s.ms, "segment": s.segment} for s in self.stalls],
            "played": [{"segment": p.segment, "start_ms": p.start_ms, "end_ms": p.end_ms} for p in self.played],
        }


def playback(pieces: Sequence[AudioPiece]) -> Playback:
    """The timeline of ``pieces`` in the order they are to be heard. Pieces without sound are skipped."""
    audible = [piece for piece in pieces if piece.audio_ms > 0]
    if not audible:
        raise ValueError("no audio to play")
    played: list[Played] = []
    stalls: list[Stall] = []
    clock = audible[0].ready_ms
    for piece in audible:
        start = max(piece.ready_ms, clock)
        if start > clock:
            stalls.append(Stall(clock, start - clock, piece.segment))
        clock = start + piece.audio_ms
        played.append(Played(piece.segment, start, clock))
    return Playback(audible[0].ready_ms, clock, tuple(played), tuple(stalls))
