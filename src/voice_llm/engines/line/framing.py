"""The one wire interface of the caller's side: how a call's audio, marks, clears and hang-up are framed on one
protocol (issue 40 item 1). The dialer (voice_llm.capabilities.dial.call) owns the socket, the clock and the event log; a
framing only turns what the caller does into messages and what the agent sent into what it means, so the same ear
(playout, recording, floor and barge-in rules) serves every line.

One framing module per protocol beside it (twilio, pcm, telnyx, plivo, exotel, vonage), each a :class:`Framing`
registered in :data:`FRAMINGS` by :func:`register`; voice_llm.engines.line.protocols imports them all and makes a call's
(``framing_for``). What a protocol lacks is a
class attribute the dialer and the docs read: ``marks`` (the agent can ask to be told when its audio before a point
has played) and ``clear`` (the agent can drop the audio it queued: a barge-in's silence is then heard at once; on a
line without it the agent can only stop sending, and the heard silence comes when the buffer runs dry).
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from voice_llm.engines.line import wire

MEDIA, MARK, CLEAR, OTHER = "media", "mark", "clear", "other"


@dataclass(frozen=True)
class Sent:
    """One message of the caller's side: what goes on the wire, the event log's name for it, and the numbers the
    log keeps of it (a sequence number, chunk, timestamp or frame)."""

    message: str | bytes
    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Received:
    """What one message of the agent's means: audio (its payload in the line's codec), a mark (its name), a clear,
    or something the caller's side does not take (``what``: its event, kept in the event log)."""

    kind: str
    payload: bytes = b""
    name: str | None = None
    what: str = ""


@dataclass(frozen=True)
class CallIds:
    """The identifiers a telephony bridge announces for a call (made up per call: no real account is involved)."""

    stream_id: str
    call_id: str
    account_id: str

    @classmethod
    def new(cls) -> CallIds:
        return cls("MZ" + secrets.token_hex(16), "CA" + secrets.token_hex(16), "AC" + "0" * 32)


class Framing(ABC):
    """A protocol's caller side. Stateful per call: the sequence numbers and chunk counters it keeps."""

    protocol: ClassVar[str]
    marks: ClassVar[bool] = True
    clear: ClassVar[bool] = True

    def __init__(self, line: wire.LineFormat, ids: CallIds) -> None:
        self.line = line
        self.ids = ids

    def opening(self) -> list[Sent]:
        """What the caller's side sends when the call connects, before the first frame."""
        return []

    @abstractmethod
    def media(self, index: int, payload: bytes) -> Sent:
        """Uplink frame ``index`` (its payload in the line's codec). Called for a frame lost in transit too: the
        sender numbered it, so the agent sees the gap."""

    def mark_played(self, name: str) -> Sent | None:
        """The echo of a mark whose audio has played (None: the protocol has no marks)."""
        return None

    def cleared(self) -> Sent | None:
        """What the caller's side answers a clear with, if anything (Vonage: websocket:cleared)."""
        return None

    def closing(self) -> list[Sent]:
        """What the caller's side sends when it hangs up, before the close."""
        return []

    @abstractmethod
    def parse(self, message: str | bytes) -> Received:
        """One message from the agent; a wire.LineError (one line: what arrived) when the line does not carry it."""

    # shared by the JSON bridges

    def _json(self, message: str | bytes, key: str = "event") -> dict[str, Any]:
        if isinstance(message, bytes):
            raise wire.LineError(f"a binary frame of {len(message)} bytes on a {self.protocol.capitalize()} line "
                                 "(JSON text expected)")
        return wire.parse_message(message, key)


class JsonEventFraming(Framing):
    """What the JSON bridges share (Twilio, Telnyx, Plivo, Exotel): a sequence number on every message the caller's
    side sends (from ``first_seq``), a chunk counter on its media, and the agent's messages told apart by their
    ``event`` (``agent_events``: which of its events is audio, a mark, a clear; any other is kept as other)."""

    first_seq: ClassVar[int] = 1
    agent_events: ClassVar[Mapping[str, str]] = {"media": MEDIA, "mark": MARK, "clear": CLEAR}

    def __init__(self, line: wire.LineFormat, ids: CallIds) -> None:
        super().__init__(line, ids)
        self.seq = self.first_seq - 1
        self.chunk = 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _next_chunk(self) -> int:
        self.chunk += 1
        return self.chunk

    def mark_name(self, message: Mapping[str, Any]) -> str:
        """The name of the agent's mark message (mark.name, as Twilio has it)."""
        return wire.mark_name(message)

    def parse(self, message: str | bytes) -> Received:
        parsed = self._json(message)
        event = parsed["event"]  # a string: wire.parse_message refuses a message without one
        kind = self.agent_events.get(event, OTHER)
        if kind == MEDIA:
            return Received(MEDIA, wire.payload_of(parsed))
        if kind == MARK:
            return Received(MARK, name=self.mark_name(parsed))
        if kind == CLEAR:
            return Received(CLEAR)
        return Received(OTHER, what=event)


FRAMINGS: dict[str, type[Framing]] = {}  # filled by register() as voice_llm.engines.line.protocols imports each module


def register(cls: type[Framing]) -> type[Framing]:
    """Class decorator: the framing of ``cls.protocol`` (one per protocol)."""
    if cls.protocol in FRAMINGS:
        raise ValueError(f"a framing for {cls.protocol!r} is registered already")
    FRAMINGS[cls.protocol] = cls
    return cls


__all__ = ["CLEAR", "FRAMINGS", "MARK", "MEDIA", "OTHER", "CallIds", "Framing", "JsonEventFraming", "Received", "Sent",
           "register"]
