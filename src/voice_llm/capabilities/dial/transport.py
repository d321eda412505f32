"""The seam between the call (voice_llm.capabilities.dial.call: the clock, the playout, the recording, the schedule) and what
carries the call's messages: a WebSocket (Twilio Media Streams, raw PCM, the phone bridges) or WebRTC
(voice_llm.capabilities.dial.webrtc, issue 40 item 2).

A :class:`Transport` only moves messages: ``send`` one of the caller's (what the line's framing made of a frame,
a mark echo, a start or a stop), ``receive`` the agent's as they arrive (what the framing parses), ``closed`` says
how the line went away under the call (a :class:`Hangup`, or None when an error is not the line closing), and
``close`` hangs up. What the transport adds to dial.json's ``line`` block (WebRTC's codec as negotiated, RTP loss
and jitter as received) comes from ``describe``, read once, after the call and before the close.

Every way the connection can fail is a :class:`DialError` (a :class:`NotAWebSocketError` for a URL that is not
the agent's WebSocket) with one line saying what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.frames import CloseCode

from voice_llm import __version__
from voice_llm.core.errors import VoiceLLMError
from voice_llm.engines.line import wire

CONNECT_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
HANDSHAKE_HEADERS = frozenset({"upgrade", "connection", "sec-websocket-accept", "sec-websocket-extensions",
                               "sec-websocket-protocol"})


class DialError(VoiceLLMError):
    """The call could not be made or did not finish; the message says what happened, in which turn, when."""


class NotAWebSocketError(DialError):
    """The URL answers, but not as a WebSocket (an HTTP server, a wrong path), or nothing answers there."""


@dataclass(frozen=True)
class Hangup:
    """How the line closed under the call: the event logged (``direction``: down, the agent closed it; up, the
    dialer's own side did) with ``how``, and the failure's words around where in the call it happened
    (``before`` + " " + where + ``after``)."""

    direction: str
    how: str
    before: str
    after: str = ""


class Transport(ABC):
    """One call's connection to the agent, made by its module's ``connect``."""

    headers: dict[str, str]  # what the agent answered the connection with (dial.json agent.headers)

    @abstractmethod
    async def send(self, message: str | bytes) -> None:
        """One of the caller's messages on the line."""

    @abstractmethod
    def receive(self) -> AsyncIterator[str | bytes]:
        """The agent's messages as they arrive; ends (or raises what ``closed`` explains) when the line closes."""

    @abstractmethod
    def closed(self, exc: BaseException | None) -> Hangup | None:
        """How the line closed: ``exc`` is what a send or ``receive`` raised (None: ``receive`` ended); None when
        ``exc`` is not the line closing (the caller reports it as a failure of its own)."""

    @abstractmethod
    async def close(self) -> None:
        """Hang up (bounded: never waits past CLOSE_TIMEOUT_S)."""

    async def describe(self) -> dict[str, Any]:
        """What this transport adds to dial.json's ``line`` block, keyed by its name ({} for a WebSocket)."""
        return {}


# --- the WebSocket ---------------------------------------------------------------------------------------------------


class WebSocketLine(Transport):
    """A WebSocket (websockets' asyncio client): text and binary frames are the messages."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        response = getattr(ws, "response", None)
        self.headers = {k.lower(): v for k, v in response.headers.raw_items()
                        if k.lower() not in HANDSHAKE_HEADERS} if response is not None else {}

    async def send(self, message: str | bytes) -> None:
        await self.ws.send(message)

    async def receive(self) -> AsyncIterator[str | bytes]:
        async for message in self.ws:
            yield message

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), CLOSE_TIMEOUT_S)

    def closed(self, exc: BaseException | None) -> Hangup | None:
        if exc is not None and not isinstance(exc, ConnectionClosed):
            return None
        sent = getattr(exc, "sent", None)
        if sent is not None and not getattr(exc, "rcvd_then_sent", False):
            # The dialer's own websockets closed the line first (the call had not ended): a message over our
            # max_size (1009), or one that broke the protocol (1002, 1007). Not the agent hanging up: the close
            # code the agent "sent" is then 1006 only because no close frame came back.
            how = f"close code {sent.code} {sent.reason[:120]!r}"
            if sent.code == CloseCode.MESSAGE_TOO_BIG:
                return Hangup("up", how, f"the agent sent a message over the dialer's "
                                         f"{_size(wire.MAX_MESSAGE_BYTES)} cap ({sent.code})",
                              "; the call kept up to it")
            return Hangup("up", how, "the agent broke the WebSocket protocol",
                          f": the dialer closed the line ({sent.code} {sent.reason[:120]!r}); the call kept up to it")
        received = getattr(exc, "rcvd", None)
        code = received.code if received is not None else getattr(self.ws, "close_code", None)
        reason = received.reason if received is not None else getattr(self.ws, "close_reason", None)
        how = f"close code {code}{' ' + repr(reason) if reason else ''}" if code is not None else "no close frame"
        if code == 1013:  # "try again later" (RFC 6455 7.4.1): an agent at its call limit says so in the reason
            return Hangup("down", how, "the agent refused the call", f" ({how}): try again later")
        return Hangup("down", how, "the agent hung up mid-call", f" ({how})")


def _size(count: int) -> str:
    """A byte count as people say it: 1 MiB, 64 KiB, 300 bytes."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift} {unit}"
    return f"{count} bytes"


async def connect_websocket(url: str, deadline_s: float) -> WebSocketLine:
    """The agent's WebSocket at ``url``, or a NotAWebSocketError saying why not (within min(10 s, deadline))."""
    wait = min(CONNECT_TIMEOUT_S, deadline_s)
    try:
        ws = await asyncio.wait_for(
            connect(url, open_timeout=wait, ping_interval=None, max_size=wire.MAX_MESSAGE_BYTES, compression=None,
                    proxy=None, close_timeout=CLOSE_TIMEOUT_S, user_agent_header=f"voice-llm/{__version__} dial"),
            wait + 1.0)
    except InvalidURI as exc:
        raise NotAWebSocketError(f"{url} is not a ws:// or wss:// URL ({exc})") from exc
    except InvalidHandshake as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        said = f"HTTP {status}" if status is not None else str(exc)
        if status is None and exc.__cause__ is not None:  # InvalidMessage: why the answer was not HTTP/1.1
            said += f": {str(exc.__cause__)[:120]}"
        raise NotAWebSocketError(f"{url} does not answer as a WebSocket ({said}): is it the agent's stream URL?") \
            from exc
    except (TimeoutError, asyncio.TimeoutError) as exc:
        raise NotAWebSocketError(f"{url}: no WebSocket handshake within {wait:g} s") from exc
    except ssl.SSLCertVerificationError as exc:
        raise NotAWebSocketError(f"{url}: the agent speaks TLS, but its certificate is not trusted "
                                 f"({exc.verify_message or why(exc)})") from exc
    except OSError as exc:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "wss" and isinstance(exc, (ssl.SSLError, ConnectionResetError, ConnectionAbortedError)):
            # Something answered, but not TLS: a plain websockets agent resets the ClientHello (a
            # ConnectionResetError without any text, which read "(HOST:PORT: )"), anything else answers bytes
            # that are no TLS record (an SSLError)
            plain = urllib.parse.urlunsplit(parts._replace(scheme="ws"))
            raise NotAWebSocketError(f"{url}: the TLS handshake failed ({why(exc)}): the agent does not speak TLS "
                                     f"there (a plain agent is {plain})") from exc
        raise NotAWebSocketError(f"nothing answers at {url} ({parts.netloc}: {why(exc)})") from exc
    return WebSocketLine(ws)


def why(exc: BaseException) -> str:
    """An exception as a reason: its class and its text (some, a reset connection's, have no text at all)."""
    text = getattr(exc, "strerror", None) or str(exc)
    return f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__}, no reason given"


__all__ = ["CLOSE_TIMEOUT_S", "CONNECT_TIMEOUT_S", "DialError", "Hangup", "NotAWebSocketError", "Transport",
           "WebSocketLine", "connect_websocket", "why"]
