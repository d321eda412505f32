"""Segmenting strategies, fed chunk by chunk: which text becomes a segment, and when its text was complete."""

from __future__ import annotations

import pytest

from voice_llm.core.errors import ConfigError
from voice_llm.engines.speech_out.segmenting import STRATEGIES, Segment, clause_end, make_segmenter, segment_stream

# A three-sentence answer streamed in tokens, one every 10 ms.
TOKENS = ["Fast", " for", " 8", " to", " 12", " hours,", " drinking", " only", " water.", " Take", " your",
          " usual", " medicines", " unless", " told", " otherwise.", " Arrive", " 10", " minutes", " early."]
CHUNKS = [(10.0 * (i + 1), token) for i, token in enumerate(TOKENS)]
END_MS = 250.0


def test_whole_is_one_segment_at_the_end() -> None:
    assert segment_stream("whole", CHUNKS, END_MS) == [Segment("".join(TOKENS).strip(), END_MS)]


def test_brief_rule_cuts_the_first_sentence_when_the_space_arrives() -> None:
    segments = segment_stream("brief_rule", CHUNKS, END_MS)
    # "water." arrives at 90 ms; the space that settles it comes with " Take" at 100 ms.
    assert segments[0] == Segment("Fast for 8 to 12 hours, drinking only water.", 100.0)
    assert segments[1] == Segment("Take your usual medicines unless told otherwise. Arrive 10 minutes early.", END_MS)


def test_sentences_one_segment_per_sentence() -> None:
    segments = segment_stream("sentences", CHUNKS, END_MS)
    assert [s.text for s in segments] == [
        "Fast for 8 to 12 hours, drinking only water.",
        "Take your usual medicines unless told otherwise.",
        "Arrive 10 minutes early.",
    ]
    assert [s.ready_ms for s in segments] == [100.0, 170.0, END_MS]


def test_clauses_first_segment_is_the_first_long_enough_clause() -> None:
    segments = segment_stream("clauses", CHUNKS, END_MS)
    # "hours," is the 5th word; its comma is settled by the space of " drinking" at 70 ms.
    assert segments[0] == Segment("Fast for 8 to 12 hours,", 70.0)
    assert [s.text for s in segments[1:]] == [
        "drinking only water.", "Take your usual medicines unless told otherwise.", "Arrive 10 minutes early.",
    ]
    assert segments[1].ready_ms == 100.0


def test_clauses_needs_enough_words_before_the_boundary() -> None:
    chunks = [(1.0, "Yes, you"), (2.0, " can eat; but only"), (3.0, " water, later.")]
    segments = segment_stream("clauses", chunks, 4.0, clause_words=4)
    assert segments[0] == Segment("Yes, you can eat;", 2.0)
    assert segment_stream("clauses", chunks, 4.0, clause_words=2)[0] == Segment("Yes, you can eat;", 2.0)
    assert segment_stream("clauses", chunks, 4.0, clause_words=1)[0] == Segment("Yes,", 1.0)


def test_clauses_takes_the_first_sentence_when_it_ends_before_any_clause() -> None:
    chunks = [(1.0, "Yes. Bring"), (2.0, " your card, your ID, and water.")]
    assert segment_stream("clauses", chunks, 3.0) == [Segment("Yes.", 1.0), Segment("Bring your card, your ID, and water.", 3.0)]


@pytest.mark.parametrize("text, expected", [
    ("It costs 3,000 dollars in all, sadly", "It costs 3,000 dollars in all,"),
    ("Open from 9:30 to noon: come early", "Open from 9:30 to noon:"),
    ("Come in early today - the lab opens", "Come in early today -"),
    ("Come in early today—the lab opens", "Come in early today—"),
    ("Come in early today,", None),  # the comma is not settled until the whitespace after it arrives
])
def test_clause_boundaries(text: str, expected: str | None) -> None:
    end = clause_end(text, 4)
    assert (text[:end] if end is not None else None) == expected


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_speaks_the_whole_answer_in_order(strategy: str) -> None:
    segments = segment_stream(strategy, CHUNKS, END_MS)
    assert " ".join(s.text for s in segments).split() == "".join(TOKENS).split()
    times = [s.ready_ms for s in segments]
    assert times == sorted(times) and times[-1] <= END_MS


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_punctuation_alone_is_not_a_segment(strategy: str) -> None:
    assert segment_stream(strategy, [(1.0, "... "), (2.0, "!")], 3.0) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_split_of_the_stream_does_not_change_the_text(strategy: str) -> None:
    text = "".join(TOKENS)
    by_char = segment_stream(strategy, [(float(i), c) for i, c in enumerate(text)], 1000.0)
    assert [s.text for s in by_char] == [s.text for s in segment_stream(strategy, CHUNKS, END_MS)]


def test_unknown_strategy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="whole, brief_rule, sentences, clauses"):
        make_segmenter("words")
