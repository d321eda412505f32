"""The conversation loop: the caller's line fed in real time through the VAD; at the endpoint (or, with
preemptive, at the short pause) the turn's audio goes to STT in a worker thread, its transcript to the LLM, and the
reply through the speak pipeline, played on the same clock; the caller barges in where the script says.

Decisions use only what the pipeline could know live: the frames fed so far, the VAD's probabilities, and the
replies' own progress. The script is used for two things only, neither a decision: when the caller says the next
line (after the reply has been heard, or ``barge_in_after_ms`` into it), and the evidence (true speech times,
the WER reference).

Rules, one place:
- A speech start while a reply is playing (or still being made, and not dropped) is a barge-in: the reply is
  stopped (stream closed, synthesis stopped, playback cut at the detection) through
  :class:`voice_llm.converse.interrupt.LiveReply`, and the history keeps only what the caller heard.
- A speech start after an endpoint whose reply has not started playing means the caller went on: that reply is
  dropped (its tokens wasted) and the utterance goes on in the same buffer, so the next endpoint transcribes all
  of it. A preemptive reply is dropped the same way when speech resumes before the endpoint.
- A preemptive reply (started at the short pause) is held: it plays nothing before the endpoint releases it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
import numpy as np

from voice_llm.speech import vad as vadmod
from voice_llm.speech.caller import FRAME_SAMPLES, SAMPLE_RATE, Utterance
from voice_llm.converse.frames import CallerLine, FrameClock, frame_ms
from voice_llm.converse.interrupt import CallClock, LiveReply, ReplyOutcome, outcome
from voice_llm.converse.recording import PlacedAudio, sample_at, to_line_rate
from voice_llm.speech.stt import STTError, Transcriber
from voice_llm.errors import MeasurementError, NothingToSpeakError
from voice_llm.lab.context import LabContext
from voice_llm.tts import DEFAULT_CLAUSE_WORDS, TTSEngine

PRE_ROLL_FRAMES = 5  # frames kept before the VAD's speech start (its onset lags the true start by 24-110 ms)
TAIL_MS = 500  # the line is fed this long after the last reply has played, so the recording holds its end
MAX_WAIT_S = 600.0  # default of CallSettings.wait_s: the lab's request deadline


@dataclass(frozen=True)
class CallSettings:
    endpoint_ms: float = vadmod.DEFAULT_ENDPOINT_MS
    preemptive: bool = False
    preemptive_ms: float = vadmod.DEFAULT_PREEMPTIVE_MS
    threshold: float = vadmod.DEFAULT_THRESHOLD
    strategy: str = "clauses"
    clause_words: int = DEFAULT_CLAUSE_WORDS
    max_tokens: int = 48
    cache_prompt: bool = True
    barge_in_turns: tuple[int, ...] = ()  # during the reply to these turns the caller says the next line
    barge_in_max_tokens: int = 64  # a reply the caller will talk over is a long one: the stream is live then
    barge_in_after_ms: float = 500.0  # ...this long after the reply's playback started (to the true onset)
    # A turn that finds no endpoint, or a reply that never plays, this long after its line is an error. The
    # request's deadline (--deadline), not a fixed minute: a loaded 2-core machine streams a token every few
    # seconds, and a slow reply is a measurement, not a failure.
    wait_s: float = MAX_WAIT_S


@dataclass
class Attempt:
    """One run of STT + reply for what the pipeline took to be the end of a turn."""

    turn: int  # the scripted turn being answered (bookkeeping, not a decision)
    number: int  # 1, 2, ... over the call: names the raw stream
    kind: str  # "endpoint" or "preemptive"
    detected_ms: float  # turn_detected: when the pipeline committed (the endpoint, or the short pause)
    samples: np.ndarray
    vad_speech_end: float | None
    endpoint_ms: float | None = None  # the endpoint that confirmed it (== detected_ms for kind endpoint)
    stt_start: float | None = None
    stt_end: float | None = None
    transcript: str | None = None
    sent_messages: list[dict[str, str]] | None = None
    reply: LiveReply | None = None
    dropped: str | None = None  # why the pipeline dropped it ("speech resumed", "caller went on")
    dropped_at: float | None = None
    barged_at: float | None = None  # the VAD's onset of the barge-in that stopped it
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    result: Future[ReplyOutcome] | None = None

    @property
    def live(self) -> bool:
        return self.dropped is None


@dataclass
class TurnLog:
    """What the loop saw of one scripted turn."""

    utterance: Utterance
    offset: int  # sample of the call where the utterance (its lead silence included) was fed from
    vad_speech_start: float | None = None
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def offset_ms(self) -> float:
        return self.offset * 1000.0 / SAMPLE_RATE

    @property
    def speech_start(self) -> float:
        return self.offset_ms + self.utterance.speech_start_ms

    @property
    def speech_end(self) -> float:
        return self.offset_ms + self.utterance.speech_end_ms

    def kept(self) -> Attempt | None:
        live = [a for a in self.attempts if a.live]
        return live[-1] if live else None


@dataclass
class CallResult:
    turns: list[TurnLog]
    frames: int
    left: np.ndarray
    outcomes: dict[int, ReplyOutcome]  # attempt number -> outcome (attempts that made a request)
    assistant: list[PlacedAudio]
    late_frames: int
    history: list[dict[str, str]]
    error: BaseException | None = None  # the STT (or a reply) failing mid-call: the evidence so far is here


class Conversation:
    """One call. ``run()`` feeds the line until the last reply has played and returns what happened."""

    def __init__(self, ctx: LabContext, utterances: Sequence[Utterance], system: str, engine: TTSEngine,
                 stt: Transcriber, vad: vadmod.SileroVAD, settings: CallSettings, raw_prefix: str = "converse") -> None:
        self.ctx, self.utterances, self.engine, self.stt, self.vad = ctx, list(utterances), engine, stt, vad
        self.settings = settings
        self.raw_prefix = raw_prefix
        self.history: list[dict[str, str]] = [{"role": "system", "content": system}]
        self.endpointer = vadmod.Endpointer(settings.endpoint_ms,
                                            settings.preemptive_ms if settings.preemptive else None,
                                            settings.threshold)
        self.line = CallerLine()
        self.turns: list[TurnLog] = []
        self.attempts: list[Attempt] = []
        self.frames: list[np.ndarray] = []
        self.buffer_start: int | None = None  # first frame of the utterance being collected; None: none open
        self.last_speech_end: float | None = None  # the VAD's first silent frame of the current pause
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="converse")
        self.clock: FrameClock | None = None
        self.call_clock: CallClock | None = None
        self.error: BaseException | None = None
        self.stt_lock = threading.Lock()

    # -- the script: when the caller says its next line ------------------------------------------------------

    def _schedule(self, index: int, at_sample: int, frame: int) -> None:
        earliest = (frame + 1) * FRAME_SAMPLES  # never into a frame already fed
        offset = max(at_sample, earliest, self.line.busy_until())
        offset = -(-offset // FRAME_SAMPLES) * FRAME_SAMPLES  # on a frame boundary
        utterance = self.utterances[index]
        self.line.schedule(offset, utterance.samples)
        self.turns.append(TurnLog(utterance, offset))

    def _answered(self, turn: TurnLog) -> Attempt | None:
        """The live attempt whose reply answers ``turn`` (the one the caller will hear), if any."""
        kept = turn.kept()
        return kept if kept is not None and kept.reply is not None else None

    def _maybe_schedule_next(self, frame: int) -> None:
        # Scheduling the next line makes it the last turn, which has no reply yet: this then waits for that one.
        if not self.turns or len(self.turns) >= len(self.utterances):
            return
        turn = self.turns[-1]
        attempt = self._answered(turn)
        if attempt is None or attempt.reply is None:
            return
        reply = attempt.reply
        index = len(self.turns)  # the next utterance's position
        if turn.utterance.index in self.settings.barge_in_turns:
            start = reply.playback_start_ms()
            if start is None:
                return
            onset = start + self.settings.barge_in_after_ms
            self._schedule(index, sample_at(onset) - self.utterances[index].start, frame)
            return
        if not reply.finished():
            return
        heard = reply.tentative()
        if heard is None or heard.playback_end is None:
            return
        self._schedule(index, sample_at(heard.playback_end), frame)

    def _current_turn(self, frame: int) -> TurnLog | None:
        """The scripted turn whose audio is being (or was last) fed at ``frame``."""
        start = frame * FRAME_SAMPLES
        fed = [t for t in self.turns if t.offset <= start]
        return fed[-1] if fed else None

    # -- attempts ------------------------------------------------------------------------------------------------

    def _start_attempt(self, kind: str, frame: int, now: float) -> Attempt:
        turn = self._current_turn(frame)
        assert turn is not None and self.buffer_start is not None
        samples = np.concatenate(self.frames[self.buffer_start:frame + 1])
        attempt = Attempt(turn=turn.utterance.index, number=len(self.attempts) + 1, kind=kind, detected_ms=now,
                          samples=samples, vad_speech_end=self.last_speech_end,
                          endpoint_ms=now if kind == "endpoint" else None)
        self.attempts.append(attempt)
        turn.attempts.append(attempt)
        threading.Thread(target=self._run_attempt, args=(attempt, turn), name=f"attempt-{attempt.number}",
                         daemon=True).start()
        return attempt

    def _messages_for(self, attempt: Attempt) -> list[dict[str, str]]:
        """The history (each earlier turn: what the caller said as transcribed, and what they heard of the reply)
        and this turn's transcript. Earlier replies' outcomes are final by now: the caller has spoken since (a
        barge-in was decided at this utterance's speech start, before this attempt existed)."""
        messages = list(self.history[:1])
        for turn in list(self.turns):
            if turn.utterance.index >= attempt.turn:
                break
            kept = turn.kept()
            if kept is None or kept.reply is None or kept.transcript is None:
                continue
            with kept.lock:
                if kept.result is None:
                    kept.result = self.pool.submit(kept.reply.wait)
            messages.append({"role": "user", "content": kept.transcript})
            heard = kept.result.result().history_message()
            if heard is not None:
                messages.append(heard)
        assert attempt.transcript is not None
        messages.append({"role": "user", "content": attempt.transcript})
        return messages

    def _run_attempt(self, attempt: Attempt, turn: TurnLog) -> None:
        assert self.call_clock is not None
        try:
            # One decode at a time: a dropped speculative decode cannot be stopped, and two at once would each
            # run on every core; the lock makes the later one wait instead (its wait counts as its STT time).
            with self.stt_lock:
                attempt.stt_start = self.call_clock.now()
                transcript = self.stt.transcribe(attempt.samples, turn.utterance.script)
                attempt.stt_end = self.call_clock.now()
            attempt.transcript = transcript
            if not attempt.live:
                return  # dropped while transcribing: a started decode cannot be stopped, its result goes
            messages = self._messages_for(attempt)  # may wait for a stopped reply's outcome: not under the lock
            with attempt.lock:
                if not attempt.live:
                    return
                attempt.sent_messages = messages
                reply = LiveReply(self.ctx, self.raw_name(attempt), attempt.sent_messages,
                                  self.engine, self.call_clock, self.settings.strategy, self._max_tokens(attempt),
                                  self.settings.clause_words, hold=attempt.kind == "preemptive",
                                  cache_prompt=self.settings.cache_prompt)
                if attempt.kind == "preemptive" and attempt.endpoint_ms is not None:
                    reply.release(attempt.endpoint_ms)  # the endpoint came while STT ran
                attempt.reply = reply.start()
        except BaseException as exc:  # raised in the loop's thread at its next frame
            attempt.error = exc
        finally:
            attempt.done.set()

    def _max_tokens(self, attempt: Attempt) -> int:
        if attempt.turn in self.settings.barge_in_turns:
            return self.settings.barge_in_max_tokens
        return self.settings.max_tokens

    def raw_name(self, attempt: Attempt) -> str:
        """raw/converse-01.sse for a turn's first request; -try2, -try3 for the requests after a dropped one."""
        tries = [a for a in self.attempts if a.turn == attempt.turn]
        n = tries.index(attempt) + 1
        return f"{self.raw_prefix}-{attempt.turn:02d}" + (f"-try{n}" if n > 1 else "")

    def _drop(self, attempt: Attempt, reason: str, now: float) -> None:
        with attempt.lock:
            if not attempt.live:
                return
            attempt.dropped, attempt.dropped_at = reason, now
            if attempt.reply is not None:
                attempt.reply.cancel(now)
                attempt.result = self.pool.submit(attempt.reply.wait)

    def _barge_in(self, attempt: Attempt, now: float, onset_true: float) -> None:
        with attempt.lock:
            attempt.barged_at = now
            assert attempt.reply is not None
            attempt.reply.cancel(now, onset_true)
            attempt.result = self.pool.submit(attempt.reply.wait)

    def _playing(self, attempt: Attempt, now: float) -> bool:
        """Whether the caller hears (or is about to hear) ``attempt``'s reply at ``now``."""
        reply = attempt.reply
        if reply is None or attempt.result is not None:
            return False
        start = reply.playback_start_ms()
        if start is None or start > now:
            return False
        if not reply.finished():
            return True
        heard = reply.tentative()
        return heard is not None and heard.playback_end is not None and heard.playback_end > now

    # -- the loop ------------------------------------------------------------------------------------------------

    def _on_event(self, event: vadmod.Event, now: float) -> None:
        frame = event.frame
        turn = self._current_turn(frame)
        if event.kind == vadmod.SPEECH_START:
            if turn is not None and turn.vad_speech_start is None:
                turn.vad_speech_start = now
            previous = self.attempts[-1] if self.attempts else None
            new_utterance = True
            if previous is not None and previous.live:
                if self._playing(previous, now):  # the caller talks over the reply: barge-in
                    onset = turn.speech_start if turn is not None and turn.utterance.index != previous.turn else None
                    self._barge_in(previous, now, onset)
                elif previous.reply is None or previous.reply.playback_start_ms() is None:
                    # not heard yet: the caller went on after the endpoint; the same utterance continues
                    self._drop(previous, "caller went on after the endpoint", now)
                    new_utterance = self.buffer_start is None
            if new_utterance:
                self.buffer_start = max(0, frame - PRE_ROLL_FRAMES)
        elif event.kind == vadmod.SPEECH_END:
            self.last_speech_end = now
        elif event.kind == vadmod.RESUMED:
            pending = [a for a in self.attempts if a.live and a.kind == "preemptive" and a.endpoint_ms is None]
            for attempt in pending:
                self._drop(attempt, "speech resumed before the endpoint", now)
        elif event.kind == vadmod.PREEMPTIVE:
            if self.buffer_start is not None:
                self._start_attempt("preemptive", frame, now)
        elif event.kind == vadmod.ENDPOINT:
            pending = [a for a in self.attempts if a.live and a.kind == "preemptive" and a.endpoint_ms is None]
            if pending:
                attempt = pending[-1]
                with attempt.lock:
                    attempt.endpoint_ms = now
                    if attempt.reply is not None:
                        attempt.reply.release(now)
            elif self.buffer_start is not None:
                self._start_attempt("endpoint", frame, now)

    def _finished(self, now: float) -> bool:
        if len(self.turns) < len(self.utterances):
            return False
        last = self._answered(self.turns[-1])
        if last is None or last.reply is None or not last.reply.finished():
            return False
        heard = last.reply.tentative()
        end = heard.playback_end if heard is not None and heard.playback_end is not None else last.detected_ms
        return now >= end + TAIL_MS and self.line.busy_until() <= len(self.frames) * FRAME_SAMPLES

    def _check_errors(self) -> None:
        for attempt in self.attempts:
            if attempt.error is not None and attempt.live:
                raise attempt.error

    def run(self) -> CallResult:
        self.clock = FrameClock()
        self.call_clock = CallClock(self.clock.t0)
        self._schedule(0, 0, -1)
        frame = 0
        try:
            while True:
                self.clock.wait(frame)
                samples = self.line.frame(frame)
                self.frames.append(samples)
                probability = self.vad(samples.tobytes())
                now = self.clock.now_ms()
                for event in self.endpointer.push(probability):
                    self._on_event(event, now)
                self._check_errors()
                self._maybe_schedule_next(frame)
                if self._finished(now):
                    break
                last_fed = self.turns[-1].offset_ms + self.turns[-1].utterance.duration_ms
                if now - max(last_fed, frame_ms(0)) > self.settings.wait_s * 1000.0:
                    raise MeasurementError(f"turn {self.turns[-1].utterance.index}: no reply was heard within "
                                           f"{self.settings.wait_s:.0f} s of the caller's line (no endpoint, or no "
                                           "audio; --deadline sets this)")
                frame += 1
        except (STTError, MeasurementError, NothingToSpeakError, OSError) as exc:
            self.error = exc
            self._stop_all()
        except BaseException:
            self._stop_all()
            raise
        return self._result()

    def _stop_all(self) -> None:
        now = self.call_clock.now() if self.call_clock else 0.0
        for attempt in self.attempts:
            attempt.done.wait(self.settings.wait_s)
            if attempt.reply is not None and attempt.result is None:
                attempt.reply.cancel(now)

    def _result(self) -> CallResult:
        outcomes: dict[int, ReplyOutcome] = {}
        for attempt in self.attempts:
            attempt.done.wait(self.settings.wait_s)
            if attempt.reply is None:
                continue
            try:
                outcomes[attempt.number] = (attempt.result.result() if attempt.result is not None
                                            else attempt.reply.wait())
            except NothingToSpeakError as exc:
                if self.error is None and attempt.live:
                    self.error = exc
            except BaseException as exc:  # a reply failing: kept as the call's error, the rest stays evidence
                if self.error is None:
                    self.error = exc
        self.pool.shutdown(wait=True)
        assistant = []
        for number, result in outcomes.items():
            for piece in result.audio:
                assistant.append(PlacedAudio(piece.start_ms, to_line_rate(piece.pcm, result.sample_rate)))
        left = np.concatenate(self.frames) if self.frames else np.zeros(0, np.int16)
        return CallResult(self.turns, len(self.frames) * FRAME_SAMPLES, left, outcomes, assistant,
                          self.clock.late_frames if self.clock else 0, self.history, self.error)


def prime(ctx: LabContext, system: str, name: str = "converse-prime") -> None:
    """One short request with the call's system prompt before the call, so its prefix is in the slot's cache as on
    a line that has been answering calls: turn 1 then prefills only its own words, like every later turn."""
    ctx.request(name, [{"role": "system", "content": system}, {"role": "user", "content": "Hello."}], max_tokens=1,
                cache_prompt=True)

