"""run_stream / stream: every failure path against a scripted fake server, then the real llama-server, then the
stand-alone copy of sse.py run as a script.

For each failure: the exception class, a message that says what went wrong, ``exc.chunks`` = the content chunks
that arrived before it, and ``raw_out`` = exactly the body bytes that arrived before it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakeserver import (
    CONTEXT_OVERFLOW,
    DONE,
    TIMINGS,
    UNAUTHORIZED,
    FakeServer,
    RawServer,
    RecordingProxy,
    Reply,
    at,
    chunk_payload,
    event,
    llama_events,
    split_http_response,
    unused_port,
)
from voice_llm.core import sse
from voice_llm.core.client.api import ServerClient
from voice_llm.core.sse import (
    HTTPStatusError,
    DeadlineExceededError,
    MalformedEventError,
    NoContentTimeoutError,
    NotEventStreamError,
    NotTLSError,
    ServerEventError,
    ServerUnreachableError,
    SSEDecoder,
    StreamError,
    StreamTimeoutError,
    StreamTruncatedError,
    run_stream,
    stream,
)

MESSAGES = [{"role": "system", "content": "Answer in one short sentence."}, {"role": "user", "content": "Hi?"}]
CHAT = "/v1/chat/completions"


def expect_failure(url: str, tmp_path: Path, exc_type: type[StreamError], **options) -> tuple[StreamError, bytes]:
    """Run a request that must fail with exactly ``exc_type``; return the exception and the raw file's bytes."""
    raw = tmp_path / "raw.sse"
    options.setdefault("timeout", 5.0)
    with pytest.raises(StreamError) as info:
        run_stream(MESSAGES, raw_out=raw, base_url=url, **options)
    assert type(info.value) is exc_type, f"{type(info.value).__name__}: {info.value}"
    assert "\n" not in str(info.value), "an error message is one line"
    return info.value, raw.read_bytes()


def texts(chunks) -> list[str]:
    return [c.text for c in chunks]


# ---------------------------------------------------------------------------------------------------------------
# a) Failure paths against the fake server
# ---------------------------------------------------------------------------------------------------------------


def test_connection_refused(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    exc, raw = expect_failure(url, tmp_path, ServerUnreachableError)
    message = str(exc)
    assert url in message
    assert "refused" in message
    assert "voice-llm up" in message
    assert exc.chunks == ()
    assert exc.received_bytes == 0
    assert raw == b""


def test_not_an_http_url(tmp_path: Path) -> None:
    with pytest.raises(ServerUnreachableError, match="not an http"):
        run_stream(MESSAGES, base_url="127.0.0.1:8080")


def test_http_400_context_overflow(tmp_path: Path) -> None:
    with FakeServer(Reply.json(400, CONTEXT_OVERFLOW)) as fake:
        exc, raw = expect_failure(fake.url, tmp_path, HTTPStatusError)
    message = str(exc)
    assert exc.status == 400
    assert exc.error["type"] == "exceed_context_size_error"
    assert fake.url + CHAT in message
    assert "400" in message
    assert "exceeds the available context size" in message  # the server's own words
    assert "5000" in message and "4096" in message
    assert "fewer documents" in message and "--ctx" in message
    assert exc.chunks == ()
    assert raw == b""


def test_http_401_hints_at_the_api_key(tmp_path: Path) -> None:
    with FakeServer(Reply.json(401, UNAUTHORIZED)) as fake:
        exc, raw = expect_failure(fake.url, tmp_path, HTTPStatusError)
    message = str(exc)
    assert exc.status == 401
    assert "401" in message and "Invalid API Key" in message
    assert "--api-key" in message
    assert raw == b""


def test_http_error_without_json_body_quotes_the_body(tmp_path: Path) -> None:
    with FakeServer(Reply.body(503, b"upstream connect error", "text/plain")) as fake:
        exc, _ = expect_failure(fake.url, tmp_path, HTTPStatusError)
    assert exc.status == 503
    assert "503" in str(exc) and "upstream connect error" in str(exc)


def test_error_event_mid_stream(tmp_path: Path) -> None:
    head = llama_events(["Hello", " world"])[:3]
    error = event({"error": {"code": 500, "message": "the slot crashed", "type": "server_error"}})
    pieces = [(0.0, b"".join(head)), (0.05, error)]  # llama-server closes after an error event: no [DONE]
    with FakeServer(Reply.stream(pieces)) as fake:
        exc, raw = expect_failure(fake.url, tmp_path, ServerEventError)
    assert "the slot crashed" in str(exc)
    assert fake.url in str(exc)
    assert texts(exc.chunks) == ["Hello", " world"]
    assert raw == b"".join(head) + error
    assert exc.received_bytes == len(raw)


@pytest.mark.parametrize(
    ("bad", "quoted"),
    [(b"data: <html>oops</html>\n\n", "<html>oops</html>"), (b"data: [1, 2]\n\n", "[1, 2]")],
    ids=["not-json", "not-an-object"],
)
def test_malformed_data_line(tmp_path: Path, bad: bytes, quoted: str) -> None:
    head = b"".join(llama_events(["Hello"])[:2])
    later = b"".join(llama_events(["never read"])[1:])
    # The later piece comes well after the failure: it must not be in the raw file.
    pieces = [(0.0, head), (0.05, bad), (0.5, later)]
    with FakeServer(Reply.stream(pieces)) as fake:
        exc, raw = expect_failure(fake.url, tmp_path, MalformedEventError)
    assert repr(quoted) in str(exc)  # the bad data, quoted
    assert "JSON" in str(exc)
    assert texts(exc.chunks) == ["Hello"]
    assert raw == head + bad


def test_html_answer_is_not_an_event_stream(tmp_path: Path) -> None:
    with FakeServer(Reply.html()) as fake:
        exc, raw = expect_failure(fake.url, tmp_path, NotEventStreamError)
    message = str(exc)
    assert fake.url + CHAT in message
    assert "text/html" in message and "text/event-stream" in message
    assert "<!DOCTYPE html>" in message  # a sample of what came instead
    assert exc.chunks == ()
    assert raw == b""


def test_stall_before_the_answer_times_out(tmp_path: Path) -> None:
    with FakeServer(Reply.stream(b"".join(llama_events(["late"])), stall_s=5.0)) as fake:
        t0 = time.monotonic()
        exc, raw = expect_failure(fake.url, tmp_path, NoContentTimeoutError, timeout=0.5)
        elapsed = time.monotonic() - t0
    assert "sent no answer within 0.5 s" in str(exc) and fake.url in str(exc)
    assert "no-content timeout" in str(exc) and exc.limit == "no-content timeout"
    assert elapsed < 4.0  # it gave up on its own timeout, not the server's 5 s
    assert exc.chunks == ()
    assert raw == b""


def test_stall_mid_stream_times_out(tmp_path: Path) -> None:
    head = b"".join(llama_events(["Hello"])[:2])
    pieces = [(0.0, head), (5.0, b"".join(llama_events(["too late"])[1:]))]
    with FakeServer(Reply.stream(pieces)) as fake:
        t0 = time.monotonic()
        exc, raw = expect_failure(fake.url, tmp_path, NoContentTimeoutError, timeout=0.5)
        elapsed = time.monotonic() - t0
        record = fake.wait_finished()
    message = str(exc)
    assert "sent no content for 0.5 s" in message
    assert f"{len(head)} bytes" in message
    assert elapsed < 4.0
    assert texts(exc.chunks) == ["Hello"]
    assert raw == head
    assert record.client_closed  # the reader closed the connection when it gave up


@pytest.mark.parametrize("framing", ["chunked", "close"])
@pytest.mark.parametrize("end", ["cut", "reset"], ids=["fin", "rst"])
def test_connection_cut_in_the_middle_of_a_line(tmp_path: Path, framing: str, end: str) -> None:
    events = llama_events(["Hello", " world"])
    head = b"".join(events[:2])
    half_line = events[2][: len(events[2]) // 2]
    # The half line is sent on its own, a moment before the cut, so it has surely arrived when the socket goes.
    pieces = [(0.0, head), (0.05, half_line)]
    with FakeServer(Reply.stream(pieces, framing=framing, end=end)) as fake:
        exc, raw = expect_failure(fake.url, tmp_path, StreamTruncatedError)
    sent = head + half_line
    assert "stream ended early" in str(exc) and fake.url in str(exc)
    assert f"{len(sent)} bytes" in str(exc)
    assert texts(exc.chunks) == ["Hello"]
    assert raw == sent  # the half line too: every byte that arrived is kept
    assert exc.received_bytes == len(sent)


def test_stream_without_done(tmp_path: Path) -> None:
    events = llama_events(["Hello", " world"], done=False)
    with FakeServer(Reply.stream(at(0.01, events))) as fake:
        exc, raw = expect_failure(fake.url, tmp_path, StreamTruncatedError)
    body = b"".join(events)
    assert "stream ended early" in str(exc) and "[DONE]" in str(exc) and fake.url in str(exc)
    assert f"{len(body)} bytes" in str(exc)
    assert texts(exc.chunks) == ["Hello", " world"]
    assert raw == body


def test_failure_keeps_raw_in_a_file_object_too(tmp_path: Path) -> None:
    """raw_out may be an open binary file: it gets the same bytes and is left open for the caller."""
    events = llama_events(["Hi"], done=False)
    with FakeServer(Reply.stream(events[0] + events[1][:10], end="cut")) as fake, open(tmp_path / "r", "wb") as fh:
        with pytest.raises(StreamTruncatedError):
            run_stream(MESSAGES, raw_out=fh, base_url=fake.url, timeout=5)
        assert not fh.closed
    assert (tmp_path / "r").read_bytes() == events[0] + events[1][:10]


# ---------------------------------------------------------------------------------------------------------------
# a) What a good answer gives, against the fake server
# ---------------------------------------------------------------------------------------------------------------


def test_only_non_empty_content_makes_chunks(tmp_path: Path) -> None:
    events = [
        event(chunk_payload({"role": "assistant", "content": None})),  # llama-server's first chunk
        event(chunk_payload({"content": ""})),
        event(chunk_payload({"content": "Bring"})),
        event(chunk_payload({})),
        event(chunk_payload({"content": None})),
        b":\n\n",  # keep-alive comment
        event(chunk_payload({"content": " your ID."})),
        event(chunk_payload({}, "stop", timings=TIMINGS)),
        DONE,
    ]
    seen = []
    with FakeServer(Reply.stream(at(0.0, events))) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, on_chunk=seen.append, timeout=5)
    assert texts(result.chunks) == ["Bring", " your ID."]
    assert seen == list(result.chunks)
    assert result.text == "Bring your ID."
    assert result.done and not result.closed_early
    assert result.finish_reason == "stop"
    assert result.events == 8  # every event but the comment, [DONE] included
    assert result.received_bytes == sum(map(len, events))


def test_role_only_first_chunk_is_never_the_first_token(tmp_path: Path) -> None:
    # The role chunk arrives 0.4 s before the first content: the first token time is the content's.
    events = llama_events(["Hi"])
    with FakeServer(Reply.stream([(0.0, events[0]), (0.4, b"".join(events[1:]))])) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, timeout=5)
    assert texts(result.chunks) == ["Hi"]
    assert result.first_event_ms is not None and result.ttft_ms is not None
    assert result.ttft_ms - result.first_event_ms >= 300


def test_timings_come_from_the_chunk_that_has_them(tmp_path: Path) -> None:
    events = llama_events(["a", "b"], timings=None)[:-2]  # role, a, b
    events.append(event(chunk_payload({}, "length", timings=TIMINGS)))
    events.append(event({"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 12, "total_tokens": 14}}))
    events.append(DONE)
    with FakeServer(Reply.stream(at(0.0, events))) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, timeout=5)
    assert result.timings == TIMINGS
    assert result.finish_reason == "length"
    assert result.usage == {"completion_tokens": 2, "prompt_tokens": 12, "total_tokens": 14}


def test_no_timings_gives_none(tmp_path: Path) -> None:
    with FakeServer(Reply.stream(b"".join(llama_events(["a"], timings=None)))) as fake:
        chunks, total_ms, timings = stream(MESSAGES, base_url=fake.url, timeout=5)
    assert timings is None and [c["text"] for c in chunks] == ["a"]


def test_request_body_and_api_key(tmp_path: Path) -> None:
    body = b"".join(llama_events(["ok"]))
    with FakeServer(Reply.stream(body)) as fake:
        run_stream(MESSAGES, base_url=fake.url, api_key="s3cret-key", timeout=5)
        run_stream(MESSAGES, 16, False, base_url=fake.url, timeout=5)
    with_key, without_key = fake.requests
    assert with_key.method == "POST" and with_key.path == CHAT
    assert with_key.headers["authorization"] == "Bearer s3cret-key"
    assert with_key.headers["content-type"] == "application/json"
    assert "text/event-stream" in with_key.headers["accept"]
    assert with_key.json == {
        "messages": MESSAGES, "stream": True, "max_tokens": 64, "temperature": 0, "seed": 7, "cache_prompt": True,
    }
    assert list(with_key.json) == ["messages", "stream", "max_tokens", "temperature", "seed", "cache_prompt"]
    assert "authorization" not in without_key.headers
    assert without_key.json == {
        "messages": MESSAGES, "stream": True, "max_tokens": 16, "temperature": 0, "seed": 7, "cache_prompt": False,
    }
    # No header that would make llama-server keep generating after a disconnect.
    assert "x-conversation-id" not in with_key.headers


def test_base_url_with_a_path_prefix(tmp_path: Path) -> None:
    with FakeServer(Reply.stream(b"".join(llama_events(["ok"])))) as fake:
        run_stream(MESSAGES, base_url=fake.url + "/llm/", timeout=5)
    assert fake.requests[0].path == "/llm" + CHAT


def test_stop_after_ms_closes_the_socket(tmp_path: Path) -> None:
    events = llama_events([f" tok{i}" for i in range(40)])
    pieces = [(0.0, events[0] + events[1])] + at(0.1, events[2:])  # ~4 s of tokens if nobody stops it
    with FakeServer(Reply.stream(pieces)) as fake:
        t0 = time.monotonic()
        result = run_stream(MESSAGES, base_url=fake.url, stop_after_ms=350, raw_out=tmp_path / "raw", timeout=5)
        returned_after = time.monotonic() - t0
        record = fake.wait_finished()
    assert result.closed_early and not result.done
    assert result.closed_at_ms is not None and result.closed_at_ms >= 350
    assert returned_after < 2.5
    # the first two tokens went out with the headers: read before the close, unless the server itself sent them that
    # late (its own log, on the same clock: a loaded machine starves its thread), or no sooner before the cut than
    # the client's own stop came after it (its measured lateness); never all forty
    first_sent_ms, client_late_ms = (record.sent_at[0] - t0) * 1000.0, result.closed_at_ms - 350
    assert len(result.chunks) < 40 and (len(result.chunks) >= 1 or first_sent_ms >= 350 - client_late_ms), (
        len(result.chunks), first_sent_ms, client_late_ms)
    assert all(c.t_ms <= result.closed_at_ms for c in result.chunks)
    assert record.client_closed  # the server saw EOF (or a failed write): the socket is really closed
    assert record.sent_bytes < sum(len(p) for _, p in pieces)
    assert (tmp_path / "raw").read_bytes() == b"".join(p for _, p in pieces)[: result.received_bytes]


def test_stop_after_ms_also_bounds_the_wait_for_the_answer(tmp_path: Path) -> None:
    # A slow prompt: no headers for 3 s. The cut must still come at ~300 ms, not when the answer starts.
    with FakeServer(Reply.stream(b"".join(llama_events(["late"])), stall_s=3.0)) as fake:
        t0 = time.monotonic()
        result = run_stream(MESSAGES, base_url=fake.url, stop_after_ms=300, timeout=5)
        returned_after = time.monotonic() - t0
        record = fake.wait_finished()
    assert result.closed_early and not result.done
    assert result.chunks == () and result.received_bytes == 0
    assert 300 <= result.closed_at_ms < 2500
    assert returned_after < 2.5
    assert record.client_closed and record.sent_bytes == 0


def test_should_stop_closes_after_that_chunk(tmp_path: Path) -> None:
    events = llama_events([f" tok{i}" for i in range(40)])
    with FakeServer(Reply.stream([(0.0, events[0])] + at(0.05, events[1:]))) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, should_stop=lambda c: c.text == " tok2", timeout=5)
        record = fake.wait_finished()
    assert texts(result.chunks) == [" tok0", " tok1", " tok2"]
    assert result.closed_early and not result.done
    assert record.client_closed


def test_should_stop_ignores_later_events_in_the_same_read(tmp_path: Path) -> None:
    with FakeServer(Reply.stream(b"".join(llama_events(["a", "b", "c"])))) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, should_stop=lambda c: c.text == "a", timeout=5)
    assert texts(result.chunks) == ["a"]
    assert result.closed_early


def test_chunk_time_is_when_its_bytes_arrived(tmp_path: Path) -> None:
    events = llama_events(["one", "two", "three"])
    pieces = [(0.0, events[0] + events[1]), (0.3, events[2]), (0.3, events[3] + b"".join(events[4:]))]
    with FakeServer(Reply.stream(pieces)) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, timeout=5)
    t = [c.t_ms for c in result.chunks]
    assert texts(result.chunks) == ["one", "two", "three"]
    assert 0 <= t[0] < 250  # sent at once (generous: a slow CI machine)
    assert 200 <= t[1] - t[0] <= 1500
    assert 200 <= t[2] - t[1] <= 1500
    assert result.ttft_ms == t[0]
    assert result.total_ms >= t[2]


def test_chunk_time_is_when_its_event_was_completed(tmp_path: Path) -> None:
    events = llama_events(["split"])
    cut = len(events[1]) // 2
    # The content event arrives in two halves 0.3 s apart: its time is that of the second half.
    pieces = [(0.0, events[0] + events[1][:cut]), (0.3, events[1][cut:] + b"".join(events[2:]))]
    with FakeServer(Reply.stream(pieces)) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, timeout=5)
    assert texts(result.chunks) == ["split"]
    assert result.ttft_ms - result.first_event_ms >= 200


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_each_framing_with_crlf_lines(tmp_path: Path, framing: str) -> None:
    events = [e.replace(b"\n", b"\r\n") for e in llama_events(["α", "β"])]
    with FakeServer(Reply.stream(at(0.01, events), framing=framing)) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, raw_out=tmp_path / "raw", timeout=5)
    assert texts(result.chunks) == ["α", "β"]
    assert result.done and result.timings == TIMINGS
    assert (tmp_path / "raw").read_bytes() == b"".join(events)


def test_stream_returns_the_brief_tuple(tmp_path: Path) -> None:
    with FakeServer(Reply.stream(at(0.01, llama_events(["Bring", " ID."])))) as fake:
        chunks, total_ms, timings = stream(MESSAGES, 64, True, base_url=fake.url, timeout=5)
    assert [set(c) for c in chunks] == [{"t_ms", "text"}] * 2
    assert [c["text"] for c in chunks] == ["Bring", " ID."]
    assert all(isinstance(c["t_ms"], float) for c in chunks)
    assert isinstance(total_ms, float) and total_ms >= chunks[-1]["t_ms"]
    assert timings == TIMINGS


# ---------------------------------------------------------------------------------------------------------------
# a) Limits, hostile streams, base URLs and the request body (issues 13 and 16)
# ---------------------------------------------------------------------------------------------------------------

HOLD_S = 10.0  # how long a fake holds the connection open after its last piece


@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_returns_at_done_while_the_server_holds_the_body_open(tmp_path: Path, framing: str) -> None:
    # After [DONE] the fake neither ends the body nor closes: the reader must not wait for it.
    events = llama_events(["Bring", " ID."])
    pieces = [(0.0, b"".join(events)), (HOLD_S, b": still here\n\n")]
    with FakeServer(Reply.stream(pieces, framing=framing)) as fake:
        t0 = time.monotonic()
        result = run_stream(MESSAGES, base_url=fake.url, raw_out=tmp_path / "raw", timeout=30)
        returned_after = time.monotonic() - t0
        record = fake.wait_finished(timeout=HOLD_S / 2)  # the fake saw the close long before its hold ended
    assert result.done and not result.closed_early
    assert texts(result.chunks) == ["Bring", " ID."] and result.timings == TIMINGS
    assert returned_after < HOLD_S / 4
    assert record.client_closed
    assert record.sent_bytes == len(b"".join(events))  # the held piece was never sent
    assert (tmp_path / "raw").read_bytes() == b"".join(events)


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning_deltas_are_timed_apart_and_never_content(tmp_path: Path, key: str) -> None:
    role = event(chunk_payload({"role": "assistant", "content": None}))
    thoughts = [event(chunk_payload({key: text, "content": None})) for text in ("The user", " wants a list.")]
    answer = llama_events(["Bring", " ID."])[1:]
    pieces = [(0.0, role + thoughts[0]), (0.05, thoughts[1]), (0.4, b"".join(answer))]
    seen: list[sse.Chunk] = []
    with FakeServer(Reply.stream(pieces)) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, on_chunk=seen.append, timeout=5)
    assert texts(result.chunks) == ["Bring", " ID."] and result.text == "Bring ID."
    assert texts(result.reasoning_chunks) == ["The user", " wants a list."]
    assert result.reasoning_text == "The user wants a list."
    assert seen == list(result.chunks)  # progress and should_stop see spoken tokens only
    assert result.first_reasoning_ms is not None and result.ttft_ms is not None
    assert result.first_event_ms <= result.first_reasoning_ms < result.ttft_ms
    assert result.ttft_ms - result.first_reasoning_ms >= 300  # the time to first token is the spoken one's


def test_no_reasoning_gives_none(tmp_path: Path) -> None:
    with FakeServer(Reply.stream(b"".join(llama_events(["a"])))) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, timeout=5)
    assert result.reasoning_chunks == () and result.first_reasoning_ms is None


PINGS = {
    "comment": b": keep-alive\n\n",
    "role-only": event(chunk_payload({"role": "assistant", "content": None})),
    "empty-content": event(chunk_payload({"content": ""})),
}


@pytest.mark.parametrize("ping", list(PINGS))
@pytest.mark.parametrize("content_first", [False, True], ids=["before-content", "after-content"])
def test_pings_do_not_reset_the_no_content_timeout(tmp_path: Path, ping: str, content_first: bool) -> None:
    head = b"".join(llama_events(["Hi"])[:2]) if content_first else b""
    pings = at(0.3, [PINGS[ping]] * 20)  # 6 s of pings, one every 0.3 s: each read resets a plain read timeout
    with FakeServer(Reply.stream(([(0.0, head)] if head else []) + pings)) as fake:  # an empty chunk ends a body
        t0 = time.monotonic()
        exc, raw = expect_failure(fake.url, tmp_path, NoContentTimeoutError, timeout=1.0, deadline_s=60)
        elapsed = time.monotonic() - t0
        record = fake.wait_finished()
    assert exc.limit == "no-content timeout" and "no-content timeout" in str(exc) and fake.url in str(exc)
    assert "sent no content for 1 s" in str(exc)
    assert 0.9 <= elapsed < 3.0  # the 1 s timeout fired, well before the pings stopped
    assert texts(exc.chunks) == (["Hi"] if content_first else [])
    assert raw.startswith(head + PINGS[ping]) and len(raw) == exc.received_bytes
    assert record.client_closed


def test_tokens_reset_the_no_content_timeout(tmp_path: Path) -> None:
    # Tokens 0.5 s apart for 3 s with a 1.5 s timeout: slow but alive, never a timeout. The answer outlasts the
    # timeout twice over, and each gap leaves a second for a loaded machine's stalls.
    events = llama_events([f" t{i}" for i in range(6)])
    tokens = events[1:6] + [b"".join(events[6:])]  # the last token comes with the final chunk and [DONE]
    with FakeServer(Reply.stream([(0.0, events[0])] + at(0.5, tokens))) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, timeout=1.5)
    assert result.done and len(result.chunks) == 6
    assert result.total_ms > 1500  # longer than the timeout, yet no timeout


def test_reasoning_tokens_reset_the_no_content_timeout(tmp_path: Path) -> None:
    # As above: thoughts 0.5 s apart for 3 s with a 1.5 s timeout.
    thoughts = [event(chunk_payload({"reasoning_content": f" step{i}"})) for i in range(5)]
    answer = llama_events(["Done."])[1:]
    with FakeServer(Reply.stream(at(0.5, thoughts) + [(0.5, b"".join(answer))])) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, timeout=1.5)
    assert result.done and len(result.reasoning_chunks) == 5 and texts(result.chunks) == ["Done."]
    assert result.total_ms > 1500  # longer than the timeout, yet no timeout


def test_the_deadline_bounds_a_stream_that_never_stops(tmp_path: Path) -> None:
    events = llama_events([f" t{i}" for i in range(40)])  # a token every 0.15 s: 6 s in all
    with FakeServer(Reply.stream([(0.0, events[0])] + at(0.15, events[1:]))) as fake:
        t0 = time.monotonic()
        exc, raw = expect_failure(fake.url, tmp_path, DeadlineExceededError, timeout=5.0, deadline_s=1.0)
        elapsed = time.monotonic() - t0
        record = fake.wait_finished()
    message = str(exc)
    assert exc.limit == "deadline" and "deadline of 1 s" in message and fake.url in message
    assert f"{len(exc.chunks)} content chunks" in message
    assert 0.9 <= elapsed < 3.0
    assert 3 <= len(exc.chunks) < 40
    assert len(raw) == exc.received_bytes
    assert record.client_closed


def test_the_deadline_also_bounds_the_wait_for_the_answer(tmp_path: Path) -> None:
    with FakeServer(Reply.stream(b"".join(llama_events(["late"])), stall_s=5.0)) as fake:
        t0 = time.monotonic()
        exc, _ = expect_failure(fake.url, tmp_path, DeadlineExceededError, timeout=30.0, deadline_s=0.5)
        elapsed = time.monotonic() - t0
    assert "deadline of 0.5 s" in str(exc) and elapsed < 3.0


def test_both_limits_are_stream_timeouts() -> None:
    assert issubclass(NoContentTimeoutError, StreamTimeoutError)
    assert issubclass(DeadlineExceededError, StreamTimeoutError)


DEEP = "[" * 50_000 + "]" * 50_000


@pytest.mark.parametrize("payload", [DEEP, '{"a":' * 50_000 + "1" + "}" * 50_000], ids=["list", "object"])
def test_deeply_nested_json_is_a_malformed_event(tmp_path: Path, payload: str) -> None:
    head = b"".join(llama_events(["Hello"])[:2])
    bad = f"data: {payload}\n\n".encode()
    with FakeServer(Reply.stream([(0.0, head), (0.05, bad)])) as fake:
        exc, raw = expect_failure(fake.url, tmp_path, MalformedEventError)
    assert "nested too deeply" in str(exc) and fake.url in str(exc)
    assert len(str(exc)) < 600  # the bad data is quoted, not copied
    assert texts(exc.chunks) == ["Hello"]
    assert raw == head + bad


def test_parse_json_never_raises_recursion_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        sse.parse_json(DEEP)
    assert sse.parse_json('{"a": [1]}') == {"a": [1]}


def test_deeply_nested_error_body_and_json_endpoint(tmp_path: Path) -> None:
    with FakeServer(Reply.body(500, DEEP.encode(), "application/json")) as fake:
        exc, _ = expect_failure(fake.url, tmp_path, HTTPStatusError)
    assert exc.status == 500 and "[[[[" in str(exc)
    with FakeServer(Reply.body(200, DEEP.encode(), "application/json"), script_props=True) as fake:
        with pytest.raises(MalformedEventError, match="nested too deeply"):
            ServerClient(fake.url, timeout=5).props()


def test_hostile_choices_do_not_crash(tmp_path: Path) -> None:
    odd = [event({"choices": {"0": {"delta": {"content": "x"}}}}), event({"choices": ["x"]}),
           event({"choices": [{"delta": "text"}]}), event({"choices": [{"delta": {"content": 5}}]})]
    with FakeServer(Reply.stream(b"".join(odd + llama_events(["ok"])))) as fake:
        result = run_stream(MESSAGES, base_url=fake.url, timeout=5)
    assert texts(result.chunks) == ["ok"] and result.done


@pytest.mark.parametrize(
    ("given", "root"),
    [
        ("http://h:8080", "http://h:8080"),
        ("http://h:8080/", "http://h:8080"),
        ("http://h:8080/v1", "http://h:8080"),
        ("http://h:8080/v1/", "http://h:8080"),
        ("https://h/llm/v1", "https://h/llm"),
        ("http://v1:8080", "http://v1:8080"),  # a host named v1 is not a /v1 path
        ("http://h:8080/v10", "http://h:8080/v10"),
        ("127.0.0.1:8080", "127.0.0.1:8080"),  # not a URL: left for open_connection to reject
    ],
)
def test_server_root(given: str, root: str) -> None:
    assert sse.server_root(given) == root


@pytest.mark.parametrize("suffix", ["/v1", "/v1/"])
def test_a_base_url_ending_in_v1_reaches_every_endpoint(tmp_path: Path, suffix: str) -> None:
    replies = [Reply.stream(b"".join(llama_events(["ok"]))), Reply.json(200, {"n_ctx": 4096})]
    with FakeServer(replies, script_props=True) as fake:
        result = run_stream(MESSAGES, base_url=fake.url + suffix, timeout=5)
        client = ServerClient(fake.url + suffix, timeout=5)
        props = client.props()
    assert texts(result.chunks) == ["ok"] and props == {"n_ctx": 4096}
    assert [r.path for r in fake.requests] == [CHAT, "/props"]
    assert client.base_url == fake.url


def test_https_against_a_plain_http_server_that_answers(tmp_path: Path) -> None:
    # A plain server answers the TLS ClientHello with an HTTP 400: OpenSSL reads it as a bad record.
    plain_400 = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    with RawServer(plain_400) as raw_server:
        port = raw_server.port
        url = f"https://127.0.0.1:{port}"
        t0 = time.monotonic()
        exc, raw = expect_failure(url, tmp_path, NotTLSError, timeout=30)
        elapsed = time.monotonic() - t0
    assert "does not speak TLS" in str(exc) and url in str(exc)
    assert f"use http://127.0.0.1:{port}" in str(exc)
    assert isinstance(exc, ServerUnreachableError)
    assert elapsed < 3.0 and raw == b""


def test_https_against_a_plain_http_server_that_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A plain server that waits for the end of a request line never answers the handshake: bounded by the
    # handshake timeout, not by the request timeout (30 s here).
    monkeypatch.setattr(sse, "TLS_HANDSHAKE_TIMEOUT_S", 0.5)
    with RawServer() as raw_server:
        url = f"https://127.0.0.1:{raw_server.port}"
        t0 = time.monotonic()
        exc, _ = expect_failure(url, tmp_path, NotTLSError, timeout=30)
        elapsed = time.monotonic() - t0
    assert "no TLS handshake within 0.5 s" in str(exc) and "does not speak TLS" in str(exc)
    assert elapsed < 3.0


def test_https_against_the_fake_http_server_fails_fast(tmp_path: Path) -> None:
    # The same through an ordinary HTTP server (whether it answers the ClientHello or waits).
    with FakeServer(Reply.json(200, {})) as fake:
        url = fake.url.replace("http://", "https://")
        t0 = time.monotonic()
        exc, _ = expect_failure(url, tmp_path, NotTLSError, timeout=60)
        elapsed = time.monotonic() - t0
    assert "does not speak TLS" in str(exc)
    assert elapsed < sse.TLS_HANDSHAKE_TIMEOUT_S + 3.0
    with FakeServer(Reply.json(200, {})) as fake, pytest.raises(NotTLSError):
        ServerClient(fake.url.replace("http://", "https://"), timeout=60).health()


def test_model_and_include_usage_go_into_the_body(tmp_path: Path) -> None:
    with FakeServer(Reply.stream(b"".join(llama_events(["ok"])))) as fake:
        run_stream(MESSAGES, base_url=fake.url, model="smollm2", include_usage=True, timeout=5)
        ServerClient(fake.url, timeout=5).chat(MESSAGES, 8, model="m2")
        run_stream(MESSAGES, base_url=fake.url, timeout=5)
    first, second, plain = (r.json for r in fake.requests)
    assert first["model"] == "smollm2" and first["stream_options"] == {"include_usage": True}
    assert first["messages"] == MESSAGES and first["stream"] is True
    assert second["model"] == "m2" and "stream_options" not in second and second["max_tokens"] == 8
    assert "model" not in plain and "stream_options" not in plain


# ---------------------------------------------------------------------------------------------------------------
# a) ServerClient.poller: one kept-alive connection for polling /slots
# ---------------------------------------------------------------------------------------------------------------

SLOTS = [{"id": 0, "is_processing": False}]


def test_poller_keeps_one_connection(tmp_path: Path) -> None:
    with FakeServer(Reply.json(200, SLOTS), keep_alive=100) as fake:
        with ServerClient(fake.url, api_key="k", timeout=5).poller() as slots:
            answers = [slots.get() for _ in range(6)]
        assert slots.connections == 1
    assert answers == [SLOTS] * 6
    assert [r.path for r in fake.requests] == ["/slots"] * 6
    assert len({r.client_port for r in fake.requests}) == 1  # the server saw one connection
    assert all(r.headers["authorization"] == "Bearer k" for r in fake.requests)


def test_poller_reconnects_when_the_server_closed_the_connection(tmp_path: Path) -> None:
    # The server closes each connection silently after 2 answers (a keep-alive limit): every poll still answers.
    with FakeServer(Reply.json(200, SLOTS), keep_alive=2) as fake:
        with ServerClient(fake.url, timeout=5).poller("/slots") as slots:
            answers = []
            for _ in range(5):
                answers.append(slots.get())
                time.sleep(0.05)  # let the close arrive, as between real polls
        assert slots.connections == 3
    assert answers == [SLOTS] * 5
    assert len({r.client_port for r in fake.requests}) == 3


def test_poller_with_a_server_that_closes_each_time(tmp_path: Path) -> None:
    with FakeServer(Reply.json(200, SLOTS)) as fake:  # "Connection: close" on every answer
        with ServerClient(fake.url, timeout=5).poller() as slots:
            answers = [slots.get() for _ in range(3)]
    assert answers == [SLOTS] * 3 and slots.connections == 3


def test_poller_errors_are_stream_errors(tmp_path: Path) -> None:
    with FakeServer(Reply.json(404, {"error": {"message": "no slots endpoint"}}), keep_alive=100) as fake:
        with ServerClient(fake.url, timeout=5).poller() as slots, pytest.raises(HTTPStatusError, match="404"):
            slots.get()
    with ServerClient(f"http://127.0.0.1:{unused_port()}", timeout=5).poller() as slots:
        with pytest.raises(ServerUnreachableError, match="refused"):
            slots.get()


# ---------------------------------------------------------------------------------------------------------------
# b) The real llama-server
# ---------------------------------------------------------------------------------------------------------------


def decoded_events(raw: bytes) -> list[dict | str]:
    decoder = SSEDecoder()
    events = decoder.feed(raw) + decoder.end()
    return [e.data if e.data == "[DONE]" else json.loads(e.data) for e in events]


def content_texts(events: list[dict | str]) -> list[str]:
    out = []
    for e in events:
        if isinstance(e, dict):
            content = ((e.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if content:
                out.append(content)
    return out


@pytest.mark.server
def test_real_server_stream(module_server, tmp_path: Path) -> None:
    raw_path = tmp_path / "sse_raw.txt"
    with RecordingProxy(module_server.url) as proxy:
        result = run_stream(MESSAGES, 24, True, raw_out=raw_path, base_url=proxy.url, timeout=120)
    raw = raw_path.read_bytes()

    # The raw file is exactly the body that came over the wire.
    assert len(proxy.downstream) == 1
    head, body = split_http_response(bytes(proxy.downstream[0]))
    assert head.startswith(b"HTTP/1.1 200")
    assert raw == body
    assert result.received_bytes == len(raw)
    assert raw.endswith(b"data: [DONE]\n\n")

    events = decoded_events(raw)
    first = events[0]
    assert isinstance(first, dict)
    assert first["choices"][0]["delta"].get("role") == "assistant"
    assert first["choices"][0]["delta"].get("content") is None
    assert events[-1] == "[DONE]"
    # Decoding the file again gives the same chunks the live reader timed.
    assert content_texts(events) == texts(result.chunks)
    assert result.chunks and result.chunks[0].text == content_texts(events)[0]

    timings = result.timings
    assert timings is not None
    assert timings["prompt_n"] >= 1 and timings["predicted_n"] >= 1
    assert timings["predicted_n"] >= len(result.chunks)
    assert result.done and not result.closed_early
    t = [c.t_ms for c in result.chunks]
    assert t == sorted(t)
    assert result.first_event_ms <= t[0]
    assert result.ttft_ms < result.total_ms


@pytest.mark.server
def test_real_server_stream_tuple(module_server) -> None:
    chunks, total_ms, timings = stream(MESSAGES, 16, True, base_url=module_server.url, timeout=120)
    assert chunks and all(set(c) == {"t_ms", "text"} and isinstance(c["text"], str) and c["text"] for c in chunks)
    assert isinstance(total_ms, float) and chunks[0]["t_ms"] < total_ms
    assert isinstance(timings, dict) and "predicted_n" in timings and "prompt_n" in timings


@pytest.mark.server
def test_real_server_cache_prompt(module_server) -> None:
    def cache_n(text: str, cache_prompt: bool) -> int:
        messages = [{"role": "system", "content": text}, {"role": "user", "content": "What should I bring?"}]
        result = run_stream(messages, 4, cache_prompt, base_url=module_server.url, timeout=120)
        assert result.timings is not None
        return result.timings["cache_n"]

    no_cache = "You are a clinic phone assistant for Maple Street Clinic. Answer briefly."
    cache_n(no_cache, False)
    assert cache_n(no_cache, False) == 0  # repeated, but nothing reused

    cached = "You are a clinic phone assistant for Birch Road Clinic. Answer in one sentence."
    cache_n(cached, True)
    assert cache_n(cached, True) > 0  # the repeat reuses the prompt's KV


@pytest.mark.server
def test_real_server_stop_after_ms_cancels(module_server) -> None:
    long_answer = [{"role": "user", "content": "Count from 1 to 200, one number per line."}]
    result = run_stream(long_answer, 400, False, base_url=module_server.url, stop_after_ms=400, timeout=120)
    assert result.closed_early and not result.done
    assert result.timings is None  # the final chunk (with timings) never came


@pytest.mark.server
def test_real_server_v1_url_poller_and_stop_at_done(module_server) -> None:
    client = ServerClient(module_server.url + "/v1", timeout=120)
    assert client.base_url == module_server.url
    assert "default_generation_settings" in client.props()
    result = client.chat(MESSAGES, 8, include_usage=True)
    assert result.done and result.chunks and result.reasoning_chunks == ()
    with client.poller() as slots:
        polls = [slots.get() for _ in range(12)]
    assert all(isinstance(p, list) and p for p in polls)
    assert slots.connections < len(polls)  # llama-server keeps the connection alive between polls
    with pytest.raises(NotTLSError, match="does not speak TLS"):  # llama-server waits: the handshake timeout ends it
        ServerClient(module_server.url.replace("http://", "https://"), timeout=120).health()


# ---------------------------------------------------------------------------------------------------------------
# c) The stand-alone copy: python sse.py, no voice_llm on the path
# ---------------------------------------------------------------------------------------------------------------


def standalone(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a copy of sse.py from a folder of its own, with a clean environment and without site-packages
    (``-S``), so voice_llm cannot be imported."""
    folder = tmp_path / "standalone"
    folder.mkdir(exist_ok=True)
    copy = Path(shutil.copyfile(sse.__file__, folder / "sse.py"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-S", str(copy), *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=180)


def test_standalone_really_cannot_import_voice_llm(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    probe = subprocess.run([sys.executable, "-S", "-c", "import voice_llm"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr


def test_standalone_refused(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    out = tmp_path / "out"
    out.mkdir()
    done = standalone(tmp_path, "--url", url, "--out", str(out))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert url in lines[0] and "refused" in lines[0]
    assert sorted(p.name for p in out.iterdir()) == []  # no artifact, no empty .partial


def test_standalone_out_not_writable(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("x")
    done = standalone(tmp_path, "--url", f"http://127.0.0.1:{unused_port()}", "--out", str(not_a_folder))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(not_a_folder) in lines[0], done.stderr


def test_standalone_cut_keeps_the_partial_bytes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "sse_raw.txt").write_bytes(b"earlier complete run\n")
    events = llama_events(["Bring"], done=False)
    sent = events[0] + events[1] + events[2][:9]
    with FakeServer(Reply.stream([(0.0, events[0] + events[1]), (0.05, events[2][:9])], end="cut")) as fake:
        done = standalone(tmp_path, "--url", fake.url, "--out", str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    line, = done.stderr.strip().splitlines()
    assert "stream ended early" in line and str(out / "sse_raw.txt.partial") in line
    assert (out / "sse_raw.txt.partial").read_bytes() == sent
    assert (out / "sse_raw.txt").read_bytes() == b"earlier complete run\n"
    assert not (out / "chunks.jsonl").exists()


def test_standalone_against_the_fake_server(tmp_path: Path) -> None:
    body = b"".join(llama_events(["Bring", " your ID."]))
    out = tmp_path / "out"
    out.mkdir()
    with FakeServer(Reply.stream(at(0.01, [body]))) as fake:
        done = standalone(tmp_path, "--url", fake.url, "--out", str(out), "--api-key", "k1")
    assert done.returncode == 0, done.stderr
    assert (out / "sse_raw.txt").read_bytes() == body
    rows = [json.loads(line) for line in (out / "chunks.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in rows] == ["Bring", " your ID."]
    assert fake.requests[0].headers["authorization"] == "Bearer k1"
    assert not (out / "sse_raw.txt.partial").exists()


@pytest.mark.server
def test_standalone_against_the_real_server(module_server, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    done = standalone(tmp_path, "--url", module_server.url, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    raw = (out / "sse_raw.txt").read_bytes()
    assert raw.endswith(b"data: [DONE]\n\n")
    rows = [json.loads(line) for line in (out / "chunks.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows and all(set(r) == {"t_ms", "text"} for r in rows)
    assert [r["text"] for r in rows] == content_texts(decoded_events(raw))
    assert [r["t_ms"] for r in rows] == sorted(r["t_ms"] for r in rows)
    assert f"{len(rows)} chunks" in done.stdout
    assert not (out / "sse_raw.txt.partial").exists()


def test_standalone_deeply_nested_event(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    head = b"".join(llama_events(["Bring"])[:2])
    with FakeServer(Reply.stream([(0.0, head), (0.05, f"data: {DEEP}\n\n".encode())])) as fake:
        done = standalone(tmp_path, "--url", fake.url + "/v1", "--out", str(out))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    line, = done.stderr.strip().splitlines()
    assert "nested too deeply" in line and str(out / "sse_raw.txt.partial") in line
    assert not (out / "chunks.jsonl").exists()


def test_standalone_no_content_timeout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with FakeServer(Reply.stream(at(0.3, [PINGS["comment"]] * 20))) as fake:
        t0 = time.monotonic()
        done = standalone(tmp_path, "--url", fake.url, "--out", str(out), "--timeout", "1")
        elapsed = time.monotonic() - t0
    assert done.returncode == 1 and "Traceback" not in done.stderr
    line, = done.stderr.strip().splitlines()
    assert "no-content timeout" in line
    assert elapsed < 5.0  # well before the 6 s of pings end



# ---------------------------------------------------------------------------------------------------------------
# d) The CLI: --timeout reaches the reader, --url may end in /v1
# ---------------------------------------------------------------------------------------------------------------


def test_cli_timeout_reaches_the_reader(tmp_path: Path, env: dict[str, str]) -> None:
    from clihelpers import assert_clean_failure, cli

    with FakeServer(Reply.stream(at(0.3, [PINGS["comment"]] * 20))) as fake:
        t0 = time.monotonic()
        result = cli("sse", "--quiet", "--url", fake.url, "--out", str(tmp_path / "out"), "--timeout", "1",
                     env=env, timeout=60)
        elapsed = time.monotonic() - t0
    assert_clean_failure(result, "no-content timeout:", "sent no content for 1 s", "keep-alive comments")
    assert elapsed < 5.5  # the 1 s limit fired, not the 120 s default nor the end of the 6 s of pings


def test_cli_deadline_reaches_the_reader(tmp_path: Path, env: dict[str, str]) -> None:
    from clihelpers import assert_clean_failure, cli

    # Tokens keep coming (so the no-content timeout never fires), but the whole answer is too long.
    with FakeServer(Reply.stream(at(0.2, llama_events(["tick"] * 40)))) as fake:
        result = cli("sse", "--quiet", "--url", fake.url, "--out", str(tmp_path / "out"), "--deadline", "1",
                     env=env, timeout=60)
    assert_clean_failure(result, "deadline:")
    assert not (tmp_path / "out" / "sse_raw.txt").exists()  # the partial evidence is kept beside, not renamed


def test_cli_url_ending_in_v1(tmp_path: Path, env: dict[str, str]) -> None:
    from clihelpers import cli

    # One answer that serves as /health and as /props (the run also asks /props for its metadata).
    with FakeServer(Reply.json(200, {"status": "ok", "n_ctx": 4096}), script_props=True) as fake:
        result = cli("health", "--url", fake.url + "/v1", "--out", str(tmp_path / "out"), env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert {r.path for r in fake.requests} == {"/health", "/props"}  # never /v1/props
    assert json.loads((tmp_path / "out" / "props.json").read_text())["n_ctx"] == 4096


def test_cli_sse_deeply_nested_event(tmp_path: Path, env: dict[str, str]) -> None:
    from clihelpers import assert_clean_failure, cli

    head = b"".join(llama_events(["Bring"])[:2])
    with FakeServer(Reply.stream([(0.0, head), (0.05, f"data: {DEEP}\n\n".encode())])) as fake:
        result = cli("sse", "--quiet", "--url", fake.url, "--out", str(tmp_path / "out"), env=env, timeout=60)
    err = assert_clean_failure(result, "nested too deeply", "sse_raw.txt.partial")
    assert "RecursionError" not in err
