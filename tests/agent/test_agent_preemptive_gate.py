"""The preemptive reply's gates (voice_llm.capabilities.agent.preemptive), pure: the transcript's and the slots'.
The transcripts are Moonshine's own on the caller lines' pauses (benchmarks/preemptive_gate.py, its raw results in
benchmarks/results/preemptive-2026-12-07/gate.json)."""

from __future__ import annotations

import pytest

from voice_llm.capabilities.agent.preemptive import ends_sentence, idle_slots, last_word, looks_finished, slots_allow

# the caller lines' endpoints, as Moonshine wrote them at the speech end
FINISHED = ["Okay, do you take Medicare?", "Can I come for the blood test on a Saturday morning?",
            "\"'Where do I park when I get there?'", "Next Tuesday afternoon, if you have anything.",
            "Hi, I'd like to come in for the first time. What should I bring as a new patient?", "Where do I park?"]
# pauses that were not the end: mid-sentence (a comma, none at all), and the pause line's "... to." whose full stop
# is the decoder's, not the caller's
UNFINISHED = ["And if something comes up,", "Good, my doctor, also wants a fasting blood test,",
              "I need to move my appointment to.", "I need to move my appointment to", "I was wondering if...",
              "So, um…", "", "   ", "Can I come in and"]


@pytest.mark.parametrize("text", FINISHED)
def test_a_finished_sentence_passes(text: str) -> None:
    assert looks_finished(text)


@pytest.mark.parametrize("text", UNFINISHED)
def test_an_unfinished_one_does_not(text: str) -> None:
    assert not looks_finished(text)


def test_the_last_word_is_read_without_its_punctuation_and_quotes() -> None:
    assert last_word("I need to move my appointment TO.") == "to"
    assert last_word("\"'Where do I park?'") == "park"
    assert last_word("") == ""
    assert ends_sentence("Okay.\"") and not ends_sentence("Okay...") and not ends_sentence("Okay,")


def test_idle_slots_counts_llama_servers_slots_that_are_not_processing() -> None:
    assert idle_slots([{"id": 0, "is_processing": True}]) == 0
    assert idle_slots([{"id": 0, "is_processing": False}, {"id": 1, "is_processing": True}]) == 1


@pytest.mark.parametrize("doc", [None, [], {"slots": []}, [{"id": 0}], [{"is_processing": "no"}], "busy"])
def test_a_document_that_is_not_a_slots_list_says_nothing(doc: object) -> None:
    assert idle_slots(doc) is None


def test_a_guess_needs_a_spare_slot_besides_its_own() -> None:
    assert not slots_allow(0) and not slots_allow(1) and slots_allow(2) and slots_allow(4)
    assert not slots_allow(None)  # a server that lists no slots (not llama-server) is not guessed about
