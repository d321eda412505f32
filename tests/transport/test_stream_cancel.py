"""A stop from another thread (sse.StreamCancel) closes the stream between two tokens, as a barge-in needs: the
reader does not wait for the next token, and the result is a stream closed early, not a broken one."""

from __future__ import annotations

import threading

from voice_llm.core import sse

from fakeserver import FakeServer, Reply, event, chunk_payload

# The role chunk and one word at once, then a token 30 s later: a reader that waited for it would be there 30 s.
SLOW = Reply.stream([(0.0, event(chunk_payload({"role": "assistant", "content": None}))),
                     (0.0, event(chunk_payload({"content": "Hello"}))),
                     (30.0, event(chunk_payload({"content": " world"})))])


def test_a_cancel_between_tokens_closes_the_stream_without_the_next_token() -> None:
    cancel = sse.StreamCancel()
    seen = threading.Event()
    with FakeServer(SLOW) as fake:
        def on_chunk(chunk: sse.Chunk) -> None:
            seen.set()

        stopper = threading.Thread(target=lambda: (seen.wait(10), cancel.cancel()))
        stopper.start()
        result = sse.run_stream([{"role": "user", "content": "hi"}], base_url=fake.url, on_chunk=on_chunk,
                                cancel=cancel, timeout=60, deadline_s=60)
        stopper.join()
    assert result.closed_early and not result.done
    assert [c.text for c in result.chunks] == ["Hello"]  # " world" was never waited for
    assert cancel.requested and result.closed_at_ms is not None


def test_a_cancel_before_the_request_closes_it_at_the_first_read() -> None:
    cancel = sse.StreamCancel()
    cancel.cancel()
    with FakeServer(SLOW) as fake:
        result = sse.run_stream([{"role": "user", "content": "hi"}], base_url=fake.url, cancel=cancel,
                                timeout=60, deadline_s=60)
    assert result.closed_early and result.chunks == ()


def test_without_a_cancel_the_stream_reads_to_done() -> None:
    cancel = sse.StreamCancel()
    fast = Reply.stream([(0.0, e) for e in (event(chunk_payload({"role": "assistant", "content": None})),
                                             event(chunk_payload({"content": "Hi"})), sse_done())])
    with FakeServer(fast) as fake:
        result = sse.run_stream([{"role": "user", "content": "hi"}], base_url=fake.url, cancel=cancel)
    assert result.done and not result.closed_early and not cancel.requested


def sse_done() -> bytes:
    return event("[DONE]")
