"""Word error rate: the words of the transcript against the script's, case and punctuation aside.

Errors are the word-level Levenshtein distance (substitutions + deletions + insertions); the rate is errors over
the script's word count. Normalizing: lower case, apostrophes kept inside words ("i'd"), every other character
that is not a letter or digit is a space.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NOT_WORD = re.compile(r"[^a-z0-9']+")


def normalize(text: str) -> list[str]:
    words = _NOT_WORD.sub(" ", text.lower().replace("\u2019", "'")).split()
    return [w.strip("'") for w in words if w.strip("'")]


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, start=1):
        current = [i]
        for j, hyp in enumerate(hypothesis, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class WER:
    errors: int
    words: int

    @property
    def rate(self) -> float | None:
        return self.errors / self.words if self.words else None

    def as_dict(self) -> dict[str, Any]:
        return {"errors": self.errors, "words": self.words, "rate": self.rate}


def wer(script: str, transcript: str) -> WER:
    reference = normalize(script)
    return WER(edit_distance(reference, normalize(transcript)), len(reference))


def total(parts: list[WER]) -> WER:
    return WER(sum(p.errors for p in parts), sum(p.words for p in parts))
