"""SSEDecoder against the HTML standard's "Interpreting an event stream" rules, one rule per test.

https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation

Every test runs with the input fed whole, one byte at a time, and in random splits (fixed seeds): the decoder is
incremental, so how the bytes happen to arrive must never change the events.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import pytest

from voice_llm.core.sse import ServerSentEvent, SSEDecoder

RANDOM_SEEDS = (1, 2, 3, 7, 2024)
SPLITS = ("whole", "bytewise", *(f"random-{seed}" for seed in RANDOM_SEEDS))


def E(data: str, event: str = "message", id: str = "") -> ServerSentEvent:  # noqa: N802 - reads like the spec
    return ServerSentEvent(data=data, event=event, id=id)


def split_bytes(data: bytes, how: str) -> list[bytes]:
    if how == "whole":
        return [data]
    if how == "bytewise":
        return [data[i:i + 1] for i in range(len(data))]
    rng = random.Random(int(how.split("-")[1]))
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(1, 8)))) if len(data) > 1 else []
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


class Decoded:
    def __init__(self, events: list[ServerSentEvent], tail: list[ServerSentEvent], retry: int | None) -> None:
        self.events, self.tail, self.retry = events, tail, retry


def decode_pieces(pieces: Sequence[bytes]) -> Decoded:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for piece in pieces:
        events += decoder.feed(piece)
    return Decoded(events, decoder.end(), decoder.retry)


@pytest.fixture(params=SPLITS)
def split(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def decode(split: str):
    """decode(bytes) -> events, fed the way this run's ``split`` says; end() must never return anything."""

    def run(data: bytes) -> list[ServerSentEvent]:
        result = decode_pieces(split_bytes(data, split))
        assert result.tail == [], "end() must drop pending data, never dispatch it"
        return result.events

    return run


def test_the_splits_really_split() -> None:
    data = b"data: abcdefghijklmnopqrstuvwxyz\n\n"
    for how in SPLITS:
        pieces = split_bytes(data, how)
        assert b"".join(pieces) == data
        if how != "whole":
            assert len(pieces) > 1, how


# --- bytes -> text ------------------------------------------------------------------------------------------------


def test_leading_bom_is_stripped(decode) -> None:
    assert decode(b"\xef\xbb\xbfdata: a\n\n") == [E("a")]


def test_second_bom_at_start_is_part_of_the_field_name(decode) -> None:
    # Only ONE leading U+FEFF is ignored; the second makes the field name "\ufeffdata", which is unknown.
    assert decode(b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: b\n\n") == [E("b")]


def test_bom_later_in_the_stream_is_kept(decode) -> None:
    stream = b"data: a\n\n\xef\xbb\xbfdata: ignored\n\ndata: \xef\xbb\xbfx\n\n"
    assert decode(stream) == [E("a"), E("\ufeffx")]


def test_bom_stripped_once_across_feeds() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"\xef\xbb") == []
    assert decoder.feed(b"\xbfdata: a\n\n") == [E("a")]
    # A later feed that starts with a BOM is not "the start of the stream".
    assert decoder.feed(b"\xef\xbb\xbfdata: b\n\n") == []
    assert decoder.feed(b"data: c\n\n") == [E("c")]


def test_multibyte_utf8_split_across_feeds(decode) -> None:
    text = "héllo € 𝄞 日本語"
    assert decode(f"data: {text}\n\n".encode()) == [E(text)]


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_four_byte_character_split_at_every_position(cut: int) -> None:
    clef = "𝄞".encode()
    decoder = SSEDecoder()
    assert decoder.feed(b"data: " + clef[:cut]) == []
    assert decoder.feed(clef[cut:] + b"\n\n") == [E("𝄞")]


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"a\xffb", "a\ufffdb"),  # a byte that is never UTF-8
        (b"\xc0\xaf", "\ufffd\ufffd"),  # an overlong form
        (b"\xed\xa0\x80", "\ufffd\ufffd\ufffd"),  # a surrogate
        (b"\xe2\x82", "\ufffd"),  # a truncated sequence right before the line end
        (b"\xf0\x9f\x98x", "\ufffdx"),  # a truncated sequence before an ASCII byte
    ],
)
def test_invalid_utf8_becomes_replacement_character(decode, raw: bytes, text: str) -> None:
    assert decode(b"data: " + raw + b"\n\n") == [E(text)]


# --- lines --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CRLF"])
def test_each_line_end(decode, eol: bytes) -> None:
    stream = b"data: a" + eol + b"data: b" + eol + eol + b"data: c" + eol + eol
    assert decode(stream) == [E("a\nb"), E("c")]


def test_mixed_line_ends(decode) -> None:
    assert decode(b"data: a\rdata: b\ndata: c\r\n\r\n") == [E("a\nb\nc")]


def test_cr_cr_is_two_line_ends(decode) -> None:
    assert decode(b"data: a\r\rdata: b\r\r") == [E("a"), E("b")]


def test_lf_cr_is_two_line_ends(decode) -> None:
    assert decode(b"data: a\n\rdata: b\n\r") == [E("a"), E("b")]


def test_crlf_split_across_feeds_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    # The "\n" completes the CRLF begun above; only the following "\r\n" is the blank line: ONE event.
    assert decoder.feed(b"\n\r\n") == [E("a")]
    assert decoder.feed(b"data: b\r") == []
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"") == []  # an empty feed does not forget the pending CR
    assert decoder.feed(b"\n") == [E("b")]
    assert decoder.end() == []


def test_cr_then_other_text_is_a_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"data: b\r") == []
    assert decoder.feed(b"\r") == [E("a\nb")]


def test_comment_lines_are_ignored(decode) -> None:
    stream = b":hello\ndata: a\n: a comment with data: inside\n\n:\n\n"
    assert decode(stream) == [E("a")]


def test_keep_alive_comment_alone_dispatches_nothing(decode) -> None:
    assert decode(b":\n\n:\n\n") == []


# --- fields -------------------------------------------------------------------------------------------------------


def test_field_without_colon_has_empty_value(decode) -> None:
    assert decode(b"data\ndata\ndata: x\n\n") == [E("\n\nx")]


def test_data_alone_dispatches_an_empty_string(decode) -> None:
    # The data buffer is "\n" (not empty), so an event fires; its last LF is then removed.
    assert decode(b"data\n\n") == [E("")]
    assert decode(b"data:\n\n") == [E("")]


@pytest.mark.parametrize(
    ("line", "value"),
    [(b"data:x", "x"), (b"data: x", "x"), (b"data:  x", " x"), (b"data:   x ", "  x "), (b"data:\tx", "\tx")],
)
def test_exactly_one_leading_space_is_removed(decode, line: bytes, value: str) -> None:
    assert decode(line + b"\n\n") == [E(value)]


def test_colon_in_value_is_kept(decode) -> None:
    assert decode(b'data: {"a": "b:c"}\n\n') == [E('{"a": "b:c"}')]


def test_several_data_lines_are_joined_with_lf(decode) -> None:
    assert decode(b"data: one\ndata: two\ndata:\ndata: four\n\n") == [E("one\ntwo\n\nfour")]


def test_unknown_fields_are_ignored(decode) -> None:
    # Field names are case-sensitive and exact: "DATA", "Data" and "data " are not "data".
    stream = b"foo: bar\ndata: a\nDATA: b\nData: c\ndata : d\nevent2: x\n\n"
    assert decode(stream) == [E("a")]


def test_event_type_then_reset_after_dispatch(decode) -> None:
    stream = b"event: add\ndata: 1\n\ndata: 2\n\nevent:\ndata: 3\n\n"
    assert decode(stream) == [E("1", "add"), E("2"), E("3")]


def test_event_type_reset_even_when_nothing_dispatched(decode) -> None:
    assert decode(b"event: add\n\ndata: 2\n\n") == [E("2")]


def test_last_event_id_persists_across_events(decode) -> None:
    stream = b"id: 1\ndata: a\n\ndata: b\n\nid: 2\ndata: c\n\nid\ndata: d\n\n"
    assert decode(stream) == [E("a", id="1"), E("b", id="1"), E("c", id="2"), E("d", id="")]


def test_id_without_data_still_sets_the_last_event_id(decode) -> None:
    assert decode(b"id: 7\n\ndata: x\n\n") == [E("x", id="7")]


def test_id_containing_nul_is_ignored(decode) -> None:
    stream = b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n"
    assert decode(stream) == [E("a", id="1"), E("b", id="1")]


@pytest.mark.parametrize(
    ("lines", "retry"),
    [
        (b"retry: 3000\n", 3000),
        (b"retry:0\n", 0),
        (b"retry: 10\nretry: 20\n", 20),
        (b"retry: 10\nretry: 30a0\n", 10),  # a non-digit value is ignored, the earlier one stays
        (b"retry: -1\n", None),
        (b"retry: 1.5\n", None),
        (b"retry: \n", None),
        (b"retry\n", None),
        (b"retry:  100\n", None),  # the value is " 100": not all digits
        (b"retry: 1e3\n", None),
        ("retry: \u0661\u0662\n".encode(), None),  # Arabic-Indic digits are digits, but not ASCII digits
        ("retry: \uff11\n".encode(), None),  # a fullwidth digit
    ],
)
def test_retry_only_ascii_digits(split: str, lines: bytes, retry: int | None) -> None:
    result = decode_pieces(split_bytes(lines + b"data: x\n\n", split))
    assert result.events == [E("x")]  # retry never dispatches or changes the event
    assert result.retry == retry


@pytest.mark.parametrize("stream", [b"\n\n\n", b"event: x\n\n", b"id: 5\n\n", b"retry: 5\n\n", b"foo\n\n", b"\r\n\r\n"])
def test_empty_data_buffer_dispatches_nothing(decode, stream: bytes) -> None:
    assert decode(stream) == []


# --- end of stream ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tail", [b"data: b", b"data: b\n", b"data: b\r", b"data: b\ndata: c\n", b"event: x\ndata: b\n"])
def test_unterminated_last_event_is_dropped(split: str, tail: bytes) -> None:
    result = decode_pieces(split_bytes(b"data: a\n\n" + tail, split))
    assert result.events == [E("a")]
    assert result.tail == []


def test_end_returns_nothing_even_with_pending_data() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\ndata: b\n") == []
    assert decoder.end() == []


# --- llama-server's shape -----------------------------------------------------------------------------------------


def llama_stream() -> tuple[bytes, list[dict]]:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    payloads = [
        {**chunk, "choices": [{"index": 0, "finish_reason": None, "delta": {"role": "assistant", "content": None}}]},
        {**chunk, "choices": [{"index": 0, "finish_reason": None, "delta": {"content": "Bring"}}]},
        {**chunk, "choices": [{"index": 0, "finish_reason": None, "delta": {"content": " your ID — ✓"}}]},
        {**chunk, "choices": [{"index": 0, "finish_reason": "stop", "delta": {}}],
         "timings": {"cache_n": 0, "prompt_n": 30, "predicted_n": 2}},
    ]
    body = b"".join(b"data: " + json.dumps(p, ensure_ascii=False).encode() + b"\n\n" for p in payloads[:2])
    body += b":\n\n"  # a keep-alive comment between events
    body += b"".join(b"data: " + json.dumps(p, ensure_ascii=False).encode() + b"\n\n" for p in payloads[2:])
    body += b"data: [DONE]\n\n"
    return body, payloads


def test_llama_server_stream(decode) -> None:
    body, payloads = llama_stream()
    events = decode(body)
    assert [e.event for e in events] == ["message"] * 5
    assert [json.loads(e.data) for e in events[:-1]] == payloads
    assert events[-1] == E("[DONE]")
    contents = [json.loads(e.data)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert contents == [None, "Bring", " your ID — ✓", None]


def test_llama_server_stream_with_crlf(decode) -> None:
    body, payloads = llama_stream()
    events = decode(body.replace(b"\n", b"\r\n"))
    assert [json.loads(e.data) for e in events[:-1]] == payloads
    assert events[-1].data == "[DONE]"


def test_events_come_out_as_soon_as_their_blank_line_arrives() -> None:
    body, _ = llama_stream()
    decoder = SSEDecoder()
    first_event_end = body.index(b"\n\n") + 2
    assert decoder.feed(body[: first_event_end - 1]) == []
    assert len(decoder.feed(body[first_event_end - 1: first_event_end])) == 1
