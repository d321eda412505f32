"""converse/interrupt.py: the words-heard rule on hand-made segments, and a real barge-in on a real llama-server
with the real Piper voice (the slot goes idle after the stop, fewer words heard than generated, the history holds
a prefix of the reply). Relations only, never a time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from voice_llm.client.api import ServerClient
from voice_llm.converse.interrupt import (
    CallClock, LiveReply, heard_prefix, history_message, outcome, start_reply, words_heard,
)
from voice_llm.scenario.kb import default_kb_dir
from voice_llm.lab.context import LabContext
from voice_llm.sse import Chunk, StreamResult
from voice_llm.tts import TTSEngine, load_engine
from voice_llm.tts.engine import SAMPLE_WIDTH
from voice_llm.tts.live import SpokenSegment

from conftest import RunningServer

# --- the words-heard rule, by hand ------------------------------------------------------------------------------


def test_words_are_heard_in_proportion_to_the_samples_played() -> None:
    # "aa bbbb cc": 8 characters over 800 samples: aa = 0-200, bbbb = 200-600, cc = 600-800.
    assert words_heard("aa bbbb cc", 800, 0) == 0
    assert words_heard("aa bbbb cc", 800, 199) == 0
    assert words_heard("aa bbbb cc", 800, 200) == 1  # a word counts once all of its share has played
    assert words_heard("aa bbbb cc", 800, 599) == 1
    assert words_heard("aa bbbb cc", 800, 600) == 2
    assert words_heard("aa bbbb cc", 800, 800) == 3
    assert words_heard("aa bbbb cc", 800, 5000) == 3
    assert words_heard("— aa", 100, 100) == 1  # punctuation alone is no word
    assert words_heard("", 100, 50) == 0 and words_heard("aa", 0, 0) == 0


def test_the_heard_text_is_a_prefix_of_the_reply() -> None:
    reply = " Please bring your ID, and your insurance card.\nArrive early."
    segments = ["Please bring your ID,", "and your insurance card.", "Arrive early."]
    assert heard_prefix(reply, segments, [4, 2, 0]) == " Please bring your ID, and your"
    assert heard_prefix(reply, segments, [4, 4, 2]) == reply
    assert heard_prefix(reply, segments, [2, 0, 0]) == " Please bring"
    assert heard_prefix(reply, segments, [0, 0, 0]) == ""
    # A segment not verbatim in the reply (a soft-wrapped line joined): the reply's first words, as many as heard.
    assert heard_prefix("It was a cold \nnight. Go.", ["It was a cold night.", "Go."], [3, 0]) == "It was a"
    assert history_message("  ") is None
    assert history_message(" Please bring") == {"role": "assistant", "content": "Please bring"}


RATE = 1000  # one sample per ms: the hand-made numbers read as times


def _segment(index: int, text: str, pieces: list[tuple[float, int]]) -> SpokenSegment:
    """A synthesized segment whose pieces were ready at ``ready_ms`` (request clock) with ``frames`` samples."""
    return SpokenSegment(index=index, text=text, text_ready_ms=pieces[0][0] - 10, synth_start_ms=pieces[0][0] - 10,
                         first_audio_ms=pieces[0][0], synth_end_ms=pieces[-1][0],
                         audio=tuple((ready, frames * 1000.0 / RATE) for ready, frames in pieces),
                         pcm=tuple(b"\x01\x00" * frames for _, frames in pieces))


def _stream(text: str, closed_at_ms: float | None) -> StreamResult:
    words = text.split(" ")
    chunks = tuple(Chunk(t_ms=50.0 + 10 * i, text=(" " if i else "") + w) for i, w in enumerate(words))
    return StreamResult(chunks=chunks, total_ms=(closed_at_ms or 500.0), timings=None, first_event_ms=40.0,
                        finish_reason=None, usage=None, request_body={}, received_bytes=0, done=closed_at_ms is None,
                        closed_early=closed_at_ms is not None, closed_at_ms=closed_at_ms, started_at=10.0)


def test_playback_is_cut_at_the_stop_and_the_words_follow_the_samples() -> None:
    clock = CallClock(origin=9.0)  # the request was sent at 1000 ms on the call clock
    stream = _stream("aa bbbb, cc dd. ee ff.", closed_at_ms=400.0)
    segments = [_segment(0, "aa bbbb,", [(100.0, 600)]), _segment(1, "cc dd.", [(300.0, 400)]),
                _segment(2, "ee ff.", [(900.0, 400)])]
    # Playback 1100-1700 (segment 0), 1700-2100 (segment 1), cut at 1900: half of segment 1 ("cc" of "cc dd.").
    stop = {"cut_at": 1900.0, "onset_true": 1090.0, "stop_called": 1900.0, "synthesis_stopped": 1910.0}
    done = outcome(stream, segments, RATE, clock, stop=stop)
    assert done.request_sent == 1000.0 and done.playback_start == 1100.0 and done.first_audio_ready == 1100.0
    heard = [(a.segment, a.start_ms, len(a.pcm) // SAMPLE_WIDTH) for a in done.audio]
    assert heard == [(0, 1100.0, 600), (1, 1700.0, 200)]
    assert done.stopped is not None and done.stopped.playback_silent == 1900.0 == done.playback_end
    assert done.stopped.stream_closed == 1400.0
    assert (done.words_heard, done.words_generated) == (3, 6) and done.heard_text == "aa bbbb, cc"
    # Tokens stamped at or after the true onset (1090 ms = the request's 90 ms): 50, 60, 70, 80 ms are before it.
    assert done.stopped.tokens_after_onset == len(stream.chunks) - 4
    assert done.barge_in_dict(1120.0)["history_text"] == "aa bbbb, cc"


def test_a_held_reply_cancelled_before_release_was_heard_by_nobody() -> None:
    stream = _stream("aa bbbb, cc dd.", closed_at_ms=300.0)
    segments = [_segment(0, "aa bbbb,", [(100.0, 600)])]
    stop = {"cut_at": 1250.0, "onset_true": None, "stop_called": 1250.0, "synthesis_stopped": 1250.0}
    done = outcome(stream, segments, RATE, CallClock(origin=9.0), held=True, stop=stop)
    assert done.audio == () and done.heard_text == "" and done.history_message() is None
    assert done.stopped is not None and done.stopped.playback_silent is None and done.stopped.tokens_after_onset is None
    # Released at 1200 ms: the piece ready at 1100 starts then, and is cut at 1250.
    released = outcome(stream, segments, RATE, CallClock(origin=9.0), release_ms=1200.0, held=True, stop=stop)
    assert [(a.start_ms, len(a.pcm) // SAMPLE_WIDTH) for a in released.audio] == [(1200.0, 50)]


# --- a real barge-in ----------------------------------------------------------------------------------------------

LONG_REPLY = [
    {"role": "system", "content": "You are a clinic phone assistant. Speak in plain sentences, never a list."},
    {"role": "user", "content": "Tell me everything a new patient should know before the first visit."},
]


@pytest.fixture(scope="module")
def piper() -> TTSEngine:
    return load_engine("piper")


@pytest.fixture
def ctx(module_server: RunningServer, tmp_path: Path) -> Iterator[LabContext]:
    yield LabContext(out=tmp_path, client=ServerClient(module_server.url), kb_dir=default_kb_dir(),
                     server_log=module_server.log)


def _until(reply: LiveReply, ready: str) -> float:
    for _ in range(12000):  # a guard against a hang (60 s), not a speed target
        value = getattr(reply, ready)()
        if value is not None:
            return value
        assert not reply.finished() or ready == "first_audio_ms", "the reply ended before it was heard"
        time.sleep(0.005)
    raise AssertionError(f"no {ready} within 60 s")


def _slots_idle(ctx: LabContext) -> bool:
    with ctx.client.poller("/slots") as poller:
        return not any(slot.get("is_processing") for slot in poller.get())


@pytest.mark.server
def test_barge_in_on_a_real_server_stops_the_reply_and_keeps_only_what_was_heard(ctx: LabContext,
                                                                               piper: TTSEngine) -> None:
    clock = CallClock(time.perf_counter())
    reply = start_reply(ctx, "converse-01", LONG_REPLY, piper, clock, max_tokens=256)
    start = _until(reply, "playback_start_ms")
    while clock.now() < start + 700:  # the caller barges in 0.7 s into the assistant's audio
        time.sleep(0.005)
    onset = clock.now()
    done = reply.stop(onset + 40, onset_ms=onset)  # the VAD saw it a little later: playback is cut there
    stopped = done.stopped
    assert stopped is not None
    assert stopped.stream_closed is not None, "generation finished before the barge-in: nothing was cut"
    assert stopped.slot_idle_source == "/slots" and stopped.slot_idle is not None
    assert stopped.onset_true <= stopped.stop_called and stopped.stream_closed <= stopped.slot_idle
    assert stopped.stop_called <= stopped.synthesis_stopped and _slots_idle(ctx)
    assert stopped.playback_silent is not None and stopped.playback_silent <= stopped.cut_at
    assert all(piece.end_ms(done.sample_rate) <= stopped.cut_at + 1e-6 for piece in done.audio)
    assert 0 <= stopped.tokens_after_onset <= done.tokens_generated  # StreamCancel: the close needs no next token
    assert 0 < done.words_heard < done.words_generated
    heard = sum(len(p.pcm) for p in done.audio)
    assert heard < sum(len(pcm) for s in done.segments for pcm in s.pcm) or len(done.segments) < 2
    message = done.history_message()
    assert message is not None and message["role"] == "assistant"
    assert done.text.lstrip().startswith(message["content"]) and len(message["content"]) < len(done.text.strip())
    raw = (ctx.out / "raw" / "converse-01.sse").read_bytes()
    assert raw and b"[DONE]" not in raw  # the evidence of a stream we closed


@pytest.mark.server
def test_a_preemptive_reply_cancelled_while_held_plays_nothing_and_frees_the_slot(ctx: LabContext,
                                                                                  piper: TTSEngine) -> None:
    clock = CallClock(time.perf_counter())
    reply = start_reply(ctx, "converse-02-preemptive", LONG_REPLY, piper, clock, max_tokens=256, hold=True)
    _until(reply, "first_audio_ms")  # synthesized while held, never played
    assert reply.playback_start_ms() is None
    done = reply.stop(clock.now())
    assert done.stopped is not None and done.stopped.stream_closed is not None
    assert done.stopped.slot_idle is not None and _slots_idle(ctx)
    assert done.audio == () and done.words_heard == 0 < done.words_generated and done.history_message() is None
    assert done.tokens_generated > 0  # the preemptive reply's wasted tokens


@pytest.mark.server
def test_a_reply_nobody_stops_is_heard_whole(ctx: LabContext, piper: TTSEngine) -> None:
    clock = CallClock(time.perf_counter())
    reply = start_reply(ctx, "converse-03", LONG_REPLY, piper, clock, max_tokens=20)
    for _ in range(12000):  # a guard against a hang (60 s)
        if reply.finished():
            break
        time.sleep(0.005)
    preview = reply.tentative()
    done = reply.wait()
    assert preview is not None and preview.playback_end == done.playback_end and done.stopped is None
    assert done.words_heard == done.words_generated > 0 and done.stream.finish_reason == "length"
    message = done.history_message()
    assert message is not None and done.text.strip().startswith(message["content"])
    assert reply.tentative() is not None  # the preview stays readable after wait
