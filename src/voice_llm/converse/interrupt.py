"""A live assistant reply that can be stopped mid-way: barge-in, and a preemptive reply cancelled.

One reply runs in a background thread through the project's one stream reader (:meth:`LabContext.request`, so
its raw stream is kept as evidence) and the speak pipeline (:func:`voice_llm.tts.live.speak_stoppable`: the
segmenter and the synthesis thread of ``speak``). :meth:`LiveReply.cancel` stops it: the reader closes the
connection after the chunk it is reading (its ``should_stop``, the hard close llama-server notices as a cancel,
as in :mod:`voice_llm.lab.cancel`), the synthesis thread stops after the piece it is making, and playback is cut
at the given time. :meth:`LiveReply.wait` then returns what happened, every time on the caller's call clock.

Playback follows the speak step's player model (:func:`voice_llm.tts.timeline.playback`): a piece plays once it is
ready and the piece before has finished. A held reply (preemptive: started before the endpoint confirmed the turn)
plays nothing before :meth:`LiveReply.release`; a reply cancelled while held was heard by nobody.

Limits, said once: the close happens when the reader holds a chunk, so a stop during prefill closes at the first
token; tokens the server generated after the close are not seen (``tokens_generated`` counts tokens received).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from voice_llm.client.capabilities import SOURCE_METRICS, SOURCE_SLOTS
from voice_llm.errors import MeasurementError
from voice_llm.lab.cancel import stop_source, wait_until_idle, wait_until_no_request
from voice_llm.lab.context import LabContext
from voice_llm.sse import StreamCancel, StreamError, StreamResult
from voice_llm.tts import (DEFAULT_CLAUSE_WORDS, SAMPLE_WIDTH, AudioChunk, AudioPiece, SpokenSegment, TTSEngine, playback,
                           nothing_to_speak, speak_stoppable, speakable)

DEFAULT_STRATEGY = "clauses"

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class CallClock:
    """The call clock: ms since ``origin``, a ``time.perf_counter()`` reading (the first caller frame fed)."""

    origin: float

    def ms(self, t: float) -> float:
        return (t - self.origin) * 1000.0

    def now(self) -> float:
        return self.ms(time.perf_counter())


# --- words heard: pure -----------------------------------------------------------------------------------------


def _words(text: str) -> list[re.Match[str]]:
    """The spoken words of ``text``: whitespace-separated tokens with a letter or digit in them."""
    return [m for m in _WORD.finditer(text) if speakable(m.group())]


def words_heard(text: str, samples: int, played: int) -> int:
    """How many words of one segment were heard when ``played`` of its ``samples`` had played.

    The engine gives no word timings, so the segment's samples are shared among its words in proportion to their
    length in characters (a long word takes longer to say), in order; a word counts as heard only when all of its
    share has played. All of a segment played: all of its words heard; none played: none.
    """
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

    ``segments`` are the spoken segments' texts in order (each a stripped piece of ``reply``) and ``heard`` the
    words heard of each. Each segment is found in the reply after the one before; when one is not found verbatim
    (the sentence splitter joins a soft-wrapped line with a space), the prefix ends after as many of the reply's
    words as were heard in all. Always a prefix of ``reply``, so the history never says what the reply did not.
    """
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


def history_message(heard_text: str) -> dict[str, str] | None:
    """The assistant message to keep in the history after a reply: only what the caller heard (pipecat #2791).
    None when nothing was heard: the history then goes on without an assistant turn."""
    text = heard_text.strip()
    return {"role": "assistant", "content": text} if text else None


# --- the outcome -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeardAudio:
    """One piece of assistant audio as the caller heard it: from ``start_ms`` (call clock), cut at the stop."""

    segment: int
    start_ms: float
    pcm: bytes  # mono int16 at the engine's sample rate

    def end_ms(self, sample_rate: int) -> float:
        return self.start_ms + len(self.pcm) / SAMPLE_WIDTH * 1000.0 / sample_rate


@dataclass(frozen=True)
class Stopped:
    """The stop, on the call clock (ms). None: the event did not happen (the stream had ended before the stop:
    nothing to close; nothing was playing: no sample to be the last)."""

    cut_at: float  # where playback was cut (the caller's ``at``)
    onset_true: float | None  # the caller's true onset (for tokens_after_onset)
    stop_called: float  # when cancel() was called
    stream_closed: float | None  # the reader's hard close
    synthesis_stopped: float  # the synthesis thread's last work ended (the stop itself when it was idle)
    playback_silent: float | None  # the end of the last assistant sample played
    slot_idle: float | None  # the first /slots (or /metrics) answer showing the server idle after the close
    slot_idle_source: str  # "/slots", "/metrics", or why the idle time is not known
    tokens_after_onset: int | None  # received tokens stamped at or after onset_true


@dataclass(frozen=True)
class ReplyOutcome:
    """One reply, stopped or not. Times on the call clock (ms); ``segments`` keep the speak step's own clock (the
    request's), as its artifact does."""

    stream: StreamResult
    segments: tuple[SpokenSegment, ...]
    sample_rate: int
    request_sent: float
    first_token: float | None
    first_segment_text: float | None
    first_audio_ready: float | None
    playback_start: float | None
    playback_end: float | None  # the last sample heard
    audio: tuple[HeardAudio, ...]  # what the caller heard, in order
    heard_text: str
    words_generated: int
    words_heard: int
    stopped: Stopped | None

    @property
    def text(self) -> str:
        return self.stream.text

    @property
    def tokens_generated(self) -> int:
        return len(self.stream.chunks)

    def history_message(self) -> dict[str, str] | None:
        return history_message(self.heard_text)

    def barge_in_dict(self, onset_detected: float | None) -> dict[str, Any]:
        """The ``barge_in`` entry of converse.json (``onset_detected`` is the VAD's, which the loop knows)."""
        s = self.stopped
        if s is None:
            raise ValueError("the reply was not stopped: it has no barge-in")
        return {
            "onset_true": s.onset_true, "onset_detected": onset_detected, "cut_at": s.cut_at,
            "stop_called": s.stop_called, "stream_closed": s.stream_closed, "synthesis_stopped": s.synthesis_stopped,
            "playback_silent": s.playback_silent, "slot_idle": s.slot_idle, "slot_idle_source": s.slot_idle_source,
            "tokens_generated": self.tokens_generated, "tokens_after_onset": s.tokens_after_onset,
            "words_generated": self.words_generated, "words_heard": self.words_heard,
            "history_text": self.heard_text,
        }


def _played_audio(segments: Sequence[SpokenSegment], offset_ms: float, release_ms: float | None,
                  cut_ms: float | None, sample_rate: int) -> list[HeardAudio]:
    """The audio heard: the speak player's timeline with the pieces on the call clock (``offset_ms`` = the
    request's 0 there), none starting before ``release_ms``, every sample from ``cut_ms`` on dropped."""
    items = [(s.index, offset_ms + ready, ms, pcm) for s in segments for (ready, ms), pcm in zip(s.audio, s.pcm)]
    if not items:
        return []
    floor = release_ms if release_ms is not None else -float("inf")
    timeline = playback([AudioPiece(index, max(ready, floor), ms) for index, ready, ms, _ in items])
    heard = []
    for played, (_, _, _, pcm) in zip(timeline.played, items):  # every piece is audible: one Played each
        if cut_ms is not None and played.start_ms >= cut_ms:
            break
        frames = len(pcm) // SAMPLE_WIDTH
        if cut_ms is not None and played.end_ms > cut_ms:
            frames = min(frames, math.floor((cut_ms - played.start_ms) * sample_rate / 1000.0))  # none past the cut
        if frames > 0:
            heard.append(HeardAudio(played.segment, played.start_ms, pcm[: frames * SAMPLE_WIDTH]))
    return heard


def outcome(stream: StreamResult, segments: Sequence[SpokenSegment], sample_rate: int, clock: CallClock,
            release_ms: float | None = None, held: bool = False, stop: dict[str, Any] | None = None) -> ReplyOutcome:
    """What the caller heard of one reply. ``held`` with no ``release_ms``: nothing played. ``stop``: the stop's
    raw readings (cut_at, onset_true, stop_called, synthesis_stopped, slot_idle, slot_idle_source)."""
    if stream.started_at is None:
        raise ValueError("the stream result has no started_at: its times cannot be put on the call clock")
    zero = clock.ms(stream.started_at)
    cut = stop["cut_at"] if stop is not None else None
    audio = [] if held and release_ms is None else _played_audio(segments, zero, release_ms, cut, sample_rate)
    played: dict[int, int] = {}
    for piece in audio:
        played[piece.segment] = played.get(piece.segment, 0) + len(piece.pcm) // SAMPLE_WIDTH
    counts = [words_heard(s.text, sum(len(p) for p in s.pcm) // SAMPLE_WIDTH, played.get(s.index, 0))
              for s in segments]
    heard_text = heard_prefix(stream.text, [s.text for s in segments], counts)
    audible = [s.first_audio_ms for s in segments if s.first_audio_ms is not None]
    stopped = None
    if stop is not None:
        onset = stop.get("onset_true")
        stopped = Stopped(
            cut_at=cut, onset_true=onset, stop_called=stop["stop_called"],
            stream_closed=(zero + stream.closed_at_ms) if stream.closed_early and stream.closed_at_ms is not None
            else None,
            synthesis_stopped=stop["synthesis_stopped"],
            playback_silent=audio[-1].end_ms(sample_rate) if audio else None,
            slot_idle=stop.get("slot_idle"), slot_idle_source=stop.get("slot_idle_source", ""),
            tokens_after_onset=None if onset is None else sum(1 for c in stream.chunks if zero + c.t_ms >= onset),
        )
    return ReplyOutcome(
        stream=stream, segments=tuple(segments), sample_rate=sample_rate, request_sent=zero,
        first_token=zero + stream.chunks[0].t_ms if stream.chunks else None,
        first_segment_text=zero + segments[0].text_ready_ms if segments else None,
        first_audio_ready=zero + audible[0] if audible else None,
        playback_start=audio[0].start_ms if audio else None,
        playback_end=audio[-1].end_ms(sample_rate) if audio else None,
        audio=tuple(audio), heard_text=heard_text, words_generated=len(_words(stream.text)),
        words_heard=len(_words(heard_text)), stopped=stopped,
    )


# --- the live reply ----------------------------------------------------------------------------------------------


class LiveReply:
    """One assistant reply streaming, being synthesized and played in the background; stoppable from outside.

    ``start()`` sends the request (named ``name``: its raw stream is ``raw/<name>.sse``); ``cancel(at)`` stops it
    without waiting; ``wait()`` returns the :class:`ReplyOutcome` (after a cancel: once the stream is closed, the
    synthesis stopped and the server's slot seen idle). ``stop(at)`` is both. ``hold=True`` (a preemptive reply)
    plays nothing until ``release(at)``.
    """

    def __init__(self, ctx: LabContext, name: str, messages: list[dict[str, str]], engine: TTSEngine,
                 clock: CallClock, strategy: str = DEFAULT_STRATEGY, max_tokens: int = 64,
                 clause_words: int = DEFAULT_CLAUSE_WORDS, hold: bool = False, cache_prompt: bool = True) -> None:
        self.ctx, self.name, self.messages, self.engine, self.clock = ctx, name, messages, engine, clock
        self.strategy, self.max_tokens, self.clause_words = strategy, max_tokens, clause_words
        self.cache_prompt = cache_prompt
        self.held = hold
        self._stop = threading.Event()
        self._cancel = StreamCancel()  # closes the stream at once, between two tokens (not at the next chunk)
        self._lock = threading.Lock()
        self._first_audio: float | None = None  # perf_counter of the first audible piece
        self._release_ms: float | None = None
        self._stop_called: float | None = None  # perf_counter
        self._cut_at: float | None = None
        self._onset: float | None = None
        self._result: tuple[StreamResult, tuple[SpokenSegment, ...]] | None = None
        self._error: BaseException | None = None
        self._outcome: ReplyOutcome | None = None
        self._idle: tuple[float | None, str] = (None, "the stream had ended before the stop: nothing to cancel")
        self._thread = threading.Thread(target=self._run, name=f"reply-{name}", daemon=True)

    def start(self) -> LiveReply:
        self._thread.start()
        return self

    def _on_audio(self, index: int, chunk: AudioChunk) -> None:
        with self._lock:
            if self._first_audio is None:
                self._first_audio = chunk.ready_at

    def _run(self) -> None:
        def request(on_chunk: Any) -> StreamResult:
            # No X-Conversation-Id header: with it llama-server keeps generating after a disconnect.
            result = self.ctx.request(self.name, self.messages, max_tokens=self.max_tokens,
                                      cache_prompt=self.cache_prompt, on_chunk=on_chunk,
                                      should_stop=lambda _chunk: self._stop.is_set(), cancel=self._cancel)
            # The server is watched from the close on, here, while the synthesis thread finishes its piece.
            self._idle = self._slot_idle(result)
            return result
        try:
            self._result = speak_stoppable(self.engine, self.strategy, request, self._stop, self.clause_words,
                                           self._on_audio)
        except BaseException as exc:  # raised again in the caller's thread by wait()
            self._error = exc

    # live view, for the conversation loop

    def first_audio_ms(self) -> float | None:
        """When the first audio was ready (call clock), as soon as it is; None before."""
        with self._lock:
            return None if self._first_audio is None else self.clock.ms(self._first_audio)

    def playback_start_ms(self) -> float | None:
        """When playback starts (call clock) as soon as that is known: the first audio, not before the release."""
        first = self.first_audio_ms()
        if first is None or (self.held and self._release_ms is None):
            return None
        return max(first, self._release_ms) if self._release_ms is not None else first

    def finished(self) -> bool:
        """The stream and the synthesis are over (the reply may still be playing: see the outcome's playback)."""
        return self._thread.ident is not None and not self._thread.is_alive()

    def tentative(self) -> ReplyOutcome | None:
        """A finished, unstopped reply's outcome as it stands if nothing stops it (when its playback will end), without
        fixing it as :meth:`wait` does: a later :meth:`cancel` still cuts it. None while it runs, after a stop, after
        a failure, or when it made no sound."""
        if not self.finished() or self._result is None or self._stop_called is not None:
            return None
        stream, segments = self._result
        if not any(s.audio for s in segments):
            return None
        return outcome(stream, segments, self.engine.sample_rate, self.clock, self._release_ms, self.held)

    # control

    def release(self, at_ms: float) -> None:
        """A held reply may play from ``at_ms`` (call clock): the endpoint confirmed the turn."""
        self._release_ms = at_ms

    def cancel(self, at_ms: float, onset_ms: float | None = None) -> None:
        """Stop now: close the stream, stop synthesis; playback is cut at ``at_ms`` (call clock).
        ``onset_ms``: the caller's true onset, for the tokens generated after it."""
        if self._stop_called is None:
            self._stop_called = time.perf_counter()
            self._cut_at, self._onset = at_ms, onset_ms
            self._stop.set()
            self._cancel.cancel()

    def stop(self, at_ms: float, onset_ms: float | None = None) -> ReplyOutcome:
        self.cancel(at_ms, onset_ms)
        return self.wait()

    def wait(self) -> ReplyOutcome:
        if self._outcome is not None:
            return self._outcome
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        stream, segments = self._result
        rate = self.engine.sample_rate
        stop = None
        if self._stop_called is not None:
            assert self._cut_at is not None
            stop_called = self.clock.ms(self._stop_called)
            ends = [self.clock.ms(stream.started_at or 0.0) + s.synth_end_ms for s in segments]
            idle, source = self._idle
            stop = {"cut_at": self._cut_at, "onset_true": self._onset, "stop_called": stop_called,
                    "synthesis_stopped": max([stop_called, *ends]), "slot_idle": idle, "slot_idle_source": source}
        elif not any(s.audio for s in segments):
            raise nothing_to_speak(self.engine, stream.text, "reply")
        self._outcome = outcome(stream, segments, rate, self.clock, self._release_ms, self.held, stop)
        return self._outcome

    def _slot_idle(self, stream: StreamResult) -> tuple[float | None, str]:
        """When the server was seen idle after the close (call clock), by :mod:`voice_llm.lab.cancel`'s polls."""
        if not stream.closed_early or stream.started_at is None or stream.closed_at_ms is None:
            return None, "the stream had ended before the stop: nothing to cancel"
        closed = stream.started_at + stream.closed_at_ms / 1000.0
        source, reason = stop_source(self.ctx)
        try:
            if source == SOURCE_SLOTS:
                with self.ctx.client.poller("/slots") as poller:
                    idle_ms = wait_until_idle(poller, closed)
            elif source == SOURCE_METRICS and self.ctx.capabilities is not None and self.ctx.capabilities.busy_gauge:
                idle_ms = wait_until_no_request(self.ctx, self.ctx.capabilities.busy_gauge, closed)
            else:
                return None, reason or "the server shows no way to see it stop"
        except (MeasurementError, StreamError) as exc:  # the reply itself is complete: the idle time is unknown
            return None, f"not seen: {exc}"
        # A cancelled request sends no timings: count the time the server was busy with it, as the cancel step does.
        self.ctx.ledger.add_busy(stream.closed_at_ms + idle_ms)
        return self.clock.ms(closed) + idle_ms, source


def start_reply(ctx: LabContext, name: str, messages: list[dict[str, str]], engine: TTSEngine, clock: CallClock,
                strategy: str = DEFAULT_STRATEGY, max_tokens: int = 64, clause_words: int = DEFAULT_CLAUSE_WORDS,
                hold: bool = False) -> LiveReply:
    """Start one reply in the background (see :class:`LiveReply`)."""
    return LiveReply(ctx, name, messages, engine, clock, strategy, max_tokens, clause_words, hold).start()
