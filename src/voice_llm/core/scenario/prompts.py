"""The brief's prompts and how documents are attached to a system prompt."""

from __future__ import annotations

from collections.abc import Sequence

from voice_llm.core.scenario.kb import KBDoc

ONE_SENTENCE_SYSTEM = "You are a clinic phone assistant. Answer in one short sentence."
THREE_SENTENCES_SYSTEM = "You are a clinic phone assistant. Answer in exactly three short sentences."
NEW_PATIENT_QUESTION = "What should a new patient bring?"
SATURDAY_QUESTION = "When is the clinic open on Saturday?"
FASTING_QUESTION = "How do I prepare for a fasting blood test?"
CANCEL_REQUEST = "List the numbers from 1 to 300, separated by commas."
SLOT_FILLER = "hi"
TIME_LINE = "Current time: 14:05. "

Message = dict[str, str]


def with_docs(system: str, docs: Sequence[KBDoc]) -> str:
    """The system prompt with documents appended after it (the fixed part first, so it can stay cached)."""
    if not docs:
        return system
    body = "\n\n".join(f"## {doc.name}\n{doc.text}" for doc in docs)
    return f"{system}\n\nClinic documents:\n\n{body}"


def cache_variants(system: str) -> tuple[tuple[str, str], ...]:
    """The cache step's system prompts in the order it sends them: the same long prompt twice, then one line
    changed at the end and at the front. The changed ones are the longest prompts of the lab."""
    return (
        ("first", system),
        ("second", system),
        ("changed_suffix", system + "\n" + TIME_LINE.strip()),
        ("changed_prefix", TIME_LINE + system),
    )


def chat(system: str, user: str) -> list[Message]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
