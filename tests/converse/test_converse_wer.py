"""Word error rate: normalization and the word-level edit distance."""

from __future__ import annotations

from voice_llm.speech.wer import normalize, total, wer


def test_case_and_punctuation_do_not_count() -> None:
    assert wer("Hi, I'd like to come in.", "hi I'd like to come in").errors == 0
    assert normalize("Okay. Do you take Medicare?") == ["okay", "do", "you", "take", "medicare"]


def test_substitution_deletion_insertion() -> None:
    assert wer("a b c d", "a x c d").errors == 1
    assert wer("a b c d", "a c d").errors == 1
    assert wer("a b c d", "a b b c d").errors == 1
    score = wer("on a Saturday morning", "on the Saturday morning")
    assert (score.errors, score.words, score.rate) == (1, 4, 0.25)


def test_total_and_empty() -> None:
    assert total([wer("a b", "a"), wer("c d e", "c d e")]).as_dict() == {"errors": 1, "words": 5, "rate": 0.2}
    assert wer("", "something").rate is None
