"""When the built-in agent starts a preemptive reply (``--preemptive``, issue 28 item 3; gated in issue 39 item 3).

A preemptive reply is a chat request started from the speculative transcript of a pause, before the endpoint. A
pause that does not become the endpoint (the caller goes on) drops it, and what a dropped request costs is the
server's: llama-server lets go of a request whose connection was closed before its first token only at that first
token or at its next 1 s poll (tools/server/server-context.cpp HTTP_POLLING_SECONDS; measured in BENCHMARKS.md
"The preemptive reply, gated"), so on a 1-slot server the endpoint's own request waits behind it. The gates here
decide from what the agent has in hand: the transcript (pure), and whether the server has a spare slot (its /slots
document, parsed here; fetched by the agent).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from voice_llm.core.client.api import slots_processing

# A transcript that ends on one of these is a sentence still going: measured on the pause line, where Moonshine
# writes the first half as "I need to move my appointment to." (its full stop, not the caller's); the other words are
# of the same kind (articles, prepositions, conjunctions, fillers, a subject with no verb yet).
CONTINUATION_WORDS = frozenset({
    "a", "an", "the", "to", "of", "for", "with", "and", "or", "but", "so", "because", "if", "that", "my", "your",
    "our", "in", "on", "at", "from", "about", "than", "into", "um", "uh", "like", "is", "are", "was", "i", "we",
})
SENTENCE_ENDS = (".", "?", "!")
QUOTES = "\"'“”‘’ )]"


def last_word(text: str) -> str:
    words = text.strip().rstrip(QUOTES).rstrip(".?!,;:-… ").split()
    return words[-1].lower().strip(QUOTES + "(\"'") if words else ""


def ends_sentence(text: str) -> bool:
    """Moonshine writes punctuation: a transcript that ends in . ? or ! (quotes and brackets aside), not in an
    ellipsis."""
    stripped = text.strip().rstrip(QUOTES)
    return stripped.endswith(SENTENCE_ENDS) and not stripped.endswith(("...", "…"))


def looks_finished(text: str) -> bool:
    """The gate on the transcript: a sentence end, and not on a word that carries the sentence on (a Moonshine
    full stop after "to" is the decoder closing what it heard, not the caller)."""
    return ends_sentence(text) and last_word(text) not in CONTINUATION_WORDS


# The gates benchmarks/preemptive_gate.py scores on the caller lines' real pauses (its table is in BENCHMARKS.md).
STUDIED_GATES: dict[str, Callable[[str], bool]] = {
    "any transcript": lambda text: bool(text.strip()),
    "sentence end": ends_sentence,
    "sentence end, not a continuation word": looks_finished,
}


# The idle slots llama-server must have for a preemptive reply to start: one for the guess and one left for the
# endpoint's own request. A dropped request holds its slot until llama-server notices the closed connection (at its
# first token, or its next 1 s poll when it is still in its prefill) and then until the batch under way ends: on a
# 1-slot server the endpoint's request waited behind it (BENCHMARKS.md "The preemptive reply, gated": cancels
# answered 0-3071 ms after the close at load 3.3-5.6, 4 requests of 48 launched straight after a cancelled one's
# release). With two idle slots a dropped guess can never delay a reply that is not a guess; on a 1-slot server
# (or a busy shared one) no preemptive reply starts. A server that lists no slots (not llama-server, or started
# with --no-slots) is not guessed about: no preemptive reply starts there either (only llama-server was measured).
MIN_IDLE_SLOTS = 2


def slots_allow(idle: int | None) -> bool:
    """Whether the server's idle slots (None: it lists none) let a preemptive reply start."""
    return idle is not None and idle >= MIN_IDLE_SLOTS


def idle_slots(doc: Any) -> int | None:
    """How many of llama-server's slots are idle, from its /slots document (core.client.api.slots_processing, the
    one reader of it); None when the document is not a slots list, or lists none (another server, /slots off)."""
    processing = slots_processing(doc)
    return processing.count(False) if processing else None
