"""Speak an answer while it streams: the reader cuts segments, a synthesis thread beside it turns them into audio.

The reader (the one stream reader, :func:`voice_llm.core.sse.run_stream`) calls ``on_chunk`` for every content chunk;
the strategy's segmenter turns chunks into segments and puts each on a queue the moment its text is complete.
The synthesis thread takes them in order, as a device would: synthesis overlaps the rest of the answer streaming,
on the same CPU as the LLM.

Clock: every time is in ms on the request's clock (0 = just before the request was sent, the clock of
``Chunk.t_ms``). The reader stamps a chunk ``t_ms = (t_read - t0)`` and calls ``on_chunk`` right after, so
``perf_counter() - t_ms`` in ``on_chunk`` is ``t0`` plus the few microseconds of that call; the smallest value seen
is taken as ``t0``, and the synthesis thread's ``perf_counter`` stamps are converted with it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from voice_llm.core.util.children import stop_all
from voice_llm.core.errors import NothingToSpeakError, SynthesisError, TTSError
from voice_llm.core.sse import Chunk, StreamResult
from voice_llm.engines.speech_out.engine import AudioChunk, TTSEngine, duration_ms, speakable
from voice_llm.engines.speech_out.segmenting import DEFAULT_CLAUSE_WORDS, Segment, make_segmenter
from voice_llm.engines.speech_out.timeline import AudioPiece, Playback, playback

StreamRequest = Callable[[Callable[[Chunk], None]], StreamResult]


@dataclass(frozen=True)
class SpokenSegment:
    """One segment's life, all on the request's clock."""

    index: int
    text: str
    text_ready_ms: float
    synth_start_ms: float
    first_audio_ms: float | None  # None: the engine made no sound of it
    synth_end_ms: float
    audio: tuple[tuple[float, float], ...]  # (ready_ms, audio_ms) of each audible piece the engine yielded
    pcm: tuple[bytes, ...]  # the PCM of each of those pieces

    @property
    def audio_ms(self) -> float:
        return sum(ms for _, ms in self.audio)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "text": self.text, "text_ready_ms": self.text_ready_ms,
            "synth_start_ms": self.synth_start_ms, "first_audio_ms": self.first_audio_ms,
            "synth_end_ms": self.synth_end_ms, "audio_ms": self.audio_ms,
            "audio": [{"ready_ms": ready, "audio_ms": ms} for ready, ms in self.audio],
        }


@dataclass(frozen=True)
class SpokenAnswer:
    strategy: str
    stream: StreamResult
    segments: tuple[SpokenSegment, ...]
    playback: Playback


def pieces(segments: Sequence[SpokenSegment]) -> list[AudioPiece]:
    return [AudioPiece(s.index, ready, ms) for s in segments for ready, ms in s.audio]


@dataclass(frozen=True)
class _Synthesized:
    segment: Segment
    start: float
    chunks: tuple[AudioChunk, ...]
    end: float


class _SynthesisThread(threading.Thread):
    """Synthesizes queued segments in order; ``None`` ends it. A failure is kept and later segments skipped.

    ``stop`` (set from another thread: a barge-in) is checked before each segment and after each piece the engine
    yields: the segment in progress keeps the pieces it has, the engine's iterator is closed (espeak-ng's program
    stopped), and no later segment is started. ``on_audio(index, chunk)`` sees each audible piece as it is made."""

    def __init__(self, engine: TTSEngine, stop: threading.Event | None = None,
                 on_audio: Callable[[int, AudioChunk], None] | None = None) -> None:
        super().__init__(name="tts-synthesis", daemon=True)
        self.engine = engine
        self.stop = stop
        self.on_audio = on_audio
        self.segments: queue.SimpleQueue[Segment | None] = queue.SimpleQueue()
        self.done: list[_Synthesized] = []
        self.error: BaseException | None = None

    def _stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def run(self) -> None:
        while (segment := self.segments.get()) is not None:
            if self.error is not None or self._stopped():
                continue  # drain the queue; the reader finishes the stream so its evidence is complete
            start = time.perf_counter()
            try:
                chunks = self._synthesize(segment.text)
            except Exception as exc:  # kept and raised in the caller's thread, never lost in this one
                self.error = exc
                continue
            self.done.append(_Synthesized(segment, start, chunks, time.perf_counter()))

    def _synthesize(self, text: str) -> tuple[AudioChunk, ...]:
        if self.stop is None and self.on_audio is None:
            return tuple(self.engine.synthesize(text))
        made: list[AudioChunk] = []
        pieces = self.engine.synthesize(text)
        try:
            for chunk in pieces:
                made.append(chunk)
                if self.on_audio is not None and chunk.frames():
                    self.on_audio(len(self.done), chunk)
                if self._stopped():
                    break
        finally:
            getattr(pieces, "close", lambda: None)()  # stops the engine (espeak-ng's process) when cut short
        return tuple(made)


def _spoken(index: int, item: _Synthesized, t0: float, sample_rate: int) -> SpokenSegment:
    def ms(t: float) -> float:
        return (t - t0) * 1000.0

    audible = [c for c in item.chunks if c.frames()]
    audio = tuple((ms(c.ready_at), duration_ms(c.frames(), sample_rate)) for c in audible)
    return SpokenSegment(
        index=index, text=item.segment.text, text_ready_ms=item.segment.ready_ms, synth_start_ms=ms(item.start),
        first_audio_ms=audio[0][0] if audio else None, synth_end_ms=ms(item.end), audio=audio,
        pcm=tuple(c.pcm for c in audible),
    )


def _stream_and_synthesize(engine: TTSEngine, strategy: str, request: StreamRequest, clause_words: int,
                           stop: threading.Event | None = None,
                           on_audio: Callable[[int, AudioChunk], None] | None = None,
                           ) -> tuple[StreamResult, list[_Synthesized]]:
    segmenter = make_segmenter(strategy, clause_words)
    synthesis = _SynthesisThread(engine, stop, on_audio)

    def on_chunk(chunk: Chunk) -> None:
        if stop is not None and stop.is_set():
            return  # stopped: the text still arriving before the close is never spoken
        for segment in segmenter.feed(chunk.text, chunk.t_ms):
            synthesis.segments.put(segment)

    synthesis.start()
    try:
        result = request(on_chunk)
        if stop is None or not stop.is_set():
            for segment in segmenter.finish(result.total_ms):
                synthesis.segments.put(segment)
    except BaseException:
        # Ctrl-C, SIGTERM or a failed stream: the engine's program (espeak-ng) is stopped now, not waited for.
        stop_all()
        raise
    finally:
        synthesis.segments.put(None)
        synthesis.join()
    if synthesis.error is not None:
        if isinstance(synthesis.error, TTSError):
            raise synthesis.error
        raise SynthesisError(f"{engine.name} failed: {synthesis.error}") from synthesis.error
    return result, synthesis.done


def speak_live(engine: TTSEngine, strategy: str, request: StreamRequest,
               clause_words: int = DEFAULT_CLAUSE_WORDS) -> SpokenAnswer:
    """Stream one answer through ``request(on_chunk)`` and synthesize ``strategy``'s segments while it streams."""
    result, done = _stream_and_synthesize(engine, strategy, request, clause_words)
    if not result.chunks or not done:
        raise nothing_to_speak(engine, result.text, "answer")
    segments = _segments_on_clock(result, done, engine.sample_rate)
    if not any(s.audio for s in segments):
        raise nothing_to_speak(engine, result.text, "answer")
    return SpokenAnswer(strategy, result, segments, playback(pieces(segments)))


def nothing_to_speak(engine: TTSEngine, text: str, what: str = "answer") -> NothingToSpeakError:
    """Why an answer made no sound, said as its cause: the server sent no text at all (an empty reply: the
    engine was never given anything), the text has nothing speakable (punctuation alone), or the engine made no
    sound of speakable text."""
    if not text.strip():
        return NothingToSpeakError(f"the server sent an empty reply: the {what} has no text to speak")
    if not speakable(text):
        return NothingToSpeakError(f"the {what} has no speakable text: {text[:80]!r}")
    return NothingToSpeakError(f"{engine.name} made no sound of the {what} {text[:80]!r}")


def speak_stoppable(engine: TTSEngine, strategy: str, request: StreamRequest, stop: threading.Event,
                    clause_words: int = DEFAULT_CLAUSE_WORDS,
                    on_audio: Callable[[int, AudioChunk], None] | None = None,
                    ) -> tuple[StreamResult, tuple[SpokenSegment, ...]]:
    """:func:`speak_live` that another thread can stop (a barge-in, a cancelled preemptive reply): once ``stop``
    is set no more text is segmented and the synthesis thread stops after the piece it is making. ``request``
    closes the stream itself (the reader's ``should_stop``). An answer stopped before any audio is no error here:
    the segments may be empty, and no playback is built (the caller cuts it where the stop was)."""
    result, done = _stream_and_synthesize(engine, strategy, request, clause_words, stop, on_audio)
    return result, _segments_on_clock(result, done, engine.sample_rate)


def _segments_on_clock(result: StreamResult, done: Sequence[_Synthesized],
                       sample_rate: int) -> tuple[SpokenSegment, ...]:
    if result.started_at is None:
        raise ValueError("the stream result has no started_at: synthesis times cannot be put on its clock")
    # The reader's own 0 (the request sent, in perf_counter seconds) puts the synthesis times on the stream's clock.
    return tuple(_spoken(i, item, result.started_at, sample_rate) for i, item in enumerate(done))


def first_audio_alone_ms(engine: TTSEngine, text: str) -> float:
    """Time to the first audio of ``text`` with nothing else running: the engine's own share of TTFA."""
    start = time.perf_counter()
    chunks = engine.synthesize(text)
    try:
        first = next(iter(chunks), None)
    finally:
        getattr(chunks, "close", lambda: None)()  # stop the engine (espeak-ng's process) after the first piece
    if first is None:
        raise NothingToSpeakError(f"{engine.name} made no sound of {text[:80]!r}")
    return (first.ready_at - start) * 1000.0
