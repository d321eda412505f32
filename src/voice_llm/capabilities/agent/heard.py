"""What the caller heard of a reply, from the agent's side of the line: which segments' audio has played at the
caller by a moment (a barge-in), and the words of them that were heard. Pure: no clock, no I/O.

The agent knows, per spoken segment, when its first frame left (``first_sent``), how long its audio is, and, on a
Twilio line, when the caller echoed the mark sent after it (Twilio echoes a mark once the audio before it has
played: https://www.twilio.com/docs/voice/media-streams/websocket-messages#mark-message). A segment starts playing
when the one before it has finished (its mark's echo, or on a PCM line with no marks the estimated end: start +
length) and not before its own audio was sent; what played of it by ``at`` is the time since then, at most its
length. The caller's jitter delay is not known to the agent and is not added: the share is an upper bound.

The words heard of a segment (moved from converse's interrupt.py, the same rule): the engine gives no word timings,
so a segment's samples are shared among its words in proportion to their length in characters, in order; a word
counts as heard only when all of its share has played.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_WORD = re.compile(r"\S+")
_SPEAKABLE = re.compile(r"\w")


def _words(text: str) -> list[re.Match[str]]:
    """The spoken words of ``text``: whitespace-separated tokens with a letter or digit in them."""
    return [m for m in _WORD.finditer(text) if _SPEAKABLE.search(m.group())]


def word_count(text: str) -> int:
    return len(_words(text))


def words_heard(text: str, samples: int, played: int) -> int:
    """How many words of one segment were heard when ``played`` of its ``samples`` had played."""
    words = _words(text)
    if samples <= 0 or played <= 0 or not words:
        return 0
    if played >= samples:
        return len(words)
    total = sum(len(m.group()) for m in words)
    heard, share = 0, 0
    for m in words:
        share += len(m.group())
        if share * samples > played * total:  # integer form of share / total > played / samples
            break
        heard += 1
    return heard


def heard_prefix(reply: str, segments: Sequence[str], heard: Sequence[int]) -> str:
    """The prefix of ``reply`` the caller heard: up to the end of the last heard word of the last segment heard.
    Each segment is found in the reply after the one before; when one is not found verbatim, the prefix ends after
    as many of the reply's words as were heard in all. Always a prefix of ``reply``."""
    cursor, end = 0, 0
    for text, count in zip(segments, heard):
        at = reply.find(text, cursor)
        if at < 0:
            return _first_words(reply, sum(heard))
        if count:
            words = _words(text)
            end = at + (len(text) if count >= len(words) else words[count - 1].end())
        if count < len(_words(text)):
            break
        cursor = at + len(text)
    return reply[:end]


def _first_words(text: str, count: int) -> str:
    words = _words(text)
    return text[: words[min(count, len(words)) - 1].end()] if count > 0 and words else ""


@dataclass(frozen=True)
class SentSegment:
    """One segment's audio as the agent sent it (times in seconds on the agent's clock)."""

    first_sent: float
    audio_s: float  # its length at the caller's ear
    echoed: float | None = None  # when the caller echoed the mark after it (Twilio); None: not (yet), or PCM


def played_s(segments: Sequence[SentSegment], at: float) -> list[float]:
    """Seconds of each segment played at the caller by ``at`` (see the module's docstring)."""
    out: list[float] = []
    end_before: float | None = None
    for segment in segments:
        start = segment.first_sent if end_before is None else max(end_before, segment.first_sent)
        if segment.echoed is not None and segment.echoed <= at:
            out.append(segment.audio_s)
            end_before = segment.echoed
            continue
        out.append(min(segment.audio_s, max(0.0, at - start)))
        end_before = start + segment.audio_s
    return out


def playing_until(segments: Sequence[SentSegment]) -> float | None:
    """When the last segment's audio will have played (the last echo, or the estimate after the last known one)."""
    end: float | None = None
    for segment in segments:
        start = segment.first_sent if end is None else max(end, segment.first_sent)
        end = segment.echoed if segment.echoed is not None else start + segment.audio_s
    return end
