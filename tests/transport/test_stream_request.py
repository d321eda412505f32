"""run_stream takes one request value (sse.StreamRequest, its stop one sse.StreamStop); the keyword call the README
shows builds the same request."""

from __future__ import annotations

import io
import json

import pytest

from voice_llm.core import sse

from fakeserver import FakeServer, Reply, event, chunk_payload

HI = [{"role": "user", "content": "hi"}]
# The role chunk and two words at once, then a token 30 s later: only a stop ends the read before it.
SLOW = Reply.stream([(0.0, event(chunk_payload({"role": "assistant", "content": None}))),
                     (0.0, event(chunk_payload({"content": "Hello"}))),
                     (0.0, event(chunk_payload({"content": " there"}))),
                     (30.0, event(chunk_payload({"content": " world"})))])


def test_a_request_value_streams_and_its_body_is_what_it_says(tmp_path) -> None:
    done = Reply.stream([(0.0, e) for e in (event(chunk_payload({"role": "assistant", "content": None})),
                                             event(chunk_payload({"content": "Hi"})), event("[DONE]"))])
    with FakeServer(done) as fake:
        request = sse.StreamRequest(HI, max_tokens=7, cache_prompt=False, model="m", base_url=fake.url,
                                    extra={"seed": 3}, timeout=10, deadline_s=10)
        raw = io.BytesIO()
        result = sse.run_stream(request, raw_out=raw)
    assert result.done and [c.text for c in result.chunks] == ["Hi"]
    assert b"data: [DONE]" in raw.getvalue()
    assert {k: result.request_body[k] for k in ("max_tokens", "cache_prompt", "model", "seed")} == \
        {"max_tokens": 7, "cache_prompt": False, "model": "m", "seed": 3}


@pytest.mark.parametrize("way", ["when", "cancel_first"])
def test_each_way_to_stop_is_one_stop_value(way: str) -> None:
    cancel = sse.StreamCancel()
    if way == "cancel_first":
        cancel.cancel()
    stop = sse.StreamStop(when=lambda chunk: chunk.text == "Hello") if way == "when" else sse.StreamStop(cancel=cancel)
    with FakeServer(SLOW) as fake:
        result = sse.run_stream(sse.StreamRequest(HI, base_url=fake.url, timeout=60, deadline_s=60, stop=stop))
    assert result.closed_early and not result.done
    assert [c.text for c in result.chunks] == ([] if way == "cancel_first" else ["Hello"])


def test_the_readme_keyword_call_is_the_same_request() -> None:
    with FakeServer(SLOW) as fake:
        result = sse.run_stream(HI, stop_after_ms=300, base_url=fake.url, timeout=60, deadline_s=60)
    assert result.closed_early and [c.text for c in result.chunks] == ["Hello", " there"]
    assert sse.stream_request(HI, 5, False, base_url="http://x", stop_after_ms=500) == sse.StreamRequest(
        HI, 5, False, base_url="http://x", stop=sse.StreamStop(after_ms=500))
    assert sse.stream_request(HI).stop is None


def test_a_request_value_takes_no_second_set_of_options() -> None:
    with pytest.raises(TypeError, match="max_tokens"):
        sse.run_stream(sse.StreamRequest(HI), max_tokens=3)


def test_the_old_positional_raw_out_still_receives_the_bytes(tmp_path) -> None:
    done = Reply.stream([(0.0, e) for e in (event(chunk_payload({"role": "assistant", "content": None})),
                                             event(chunk_payload({"content": "Hi"})), event("[DONE]"))])
    raw = tmp_path / "raw.sse"
    with FakeServer(done) as fake:
        chunks, total_ms, _ = sse.stream(HI, 16, True, raw, base_url=fake.url)
        result = sse.run_stream(HI, 16, True, tmp_path / "again.sse", base_url=fake.url)
    assert chunks == [{"t_ms": chunks[0]["t_ms"], "text": "Hi"}] and total_ms >= chunks[0]["t_ms"]
    assert raw.read_bytes().endswith(b"data: [DONE]\n\n") and result.done
    assert (tmp_path / "again.sse").read_bytes() == raw.read_bytes()
    json.dumps(result.request_body)  # the body sent is JSON
