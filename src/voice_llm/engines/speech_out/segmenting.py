"""Where to cut a streaming answer into segments for the TTS. Pure: fed chunk by chunk, no I/O.

Each strategy emits a :class:`Segment` with the time (on the stream's clock) at which its text was complete:

* ``whole`` — the whole answer, when the stream ended;
* ``brief_rule`` — the first sentence by the brief's rule (``[.!?]`` then whitespace), then all the rest at the end;
* ``sentences`` — one segment per sentence of :class:`voice_llm.core.sentences.SentenceSplitter`;
* ``clauses`` — the first segment ends at the first clause boundary (``,`` ``;`` ``:`` or a dash, with the
  whitespace after it arrived) once it holds at least ``clause_words`` words — or at the end of the first sentence
  if that comes first; later segments are whole sentences.

Segments with nothing to say (punctuation only) are dropped: a TTS makes no sound of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from voice_llm.core.errors import ConfigError
from voice_llm.core.sentences import SentenceSplitter, first_sentence_end
from voice_llm.engines.speech_out.engine import speakable

STRATEGIES = ("whole", "brief_rule", "sentences", "clauses")
STRATEGY_LABELS = {
    "whole": "whole answer",
    "brief_rule": "brief's first sentence, then the rest",
    "sentences": "sentence by sentence",
    "clauses": "first clause, then sentences",
}
DEFAULT_CLAUSE_WORDS = 4

# A clause ends after , ; : or a spaced dash once the whitespace after it is known ("3,000" and "9:30" go on),
# or after a dash glued between two words ("today—bring").
_CLAUSE_END = re.compile(r"(?:[,;:]|(?<=\s)[-–—]|[–—])(?=\s)|(?<=\w)[–—](?=\w)")


@dataclass(frozen=True)
class Segment:
    text: str
    ready_ms: float  # when the last character of the segment had arrived and the cut was known


class Segmenter(Protocol):
    def feed(self, text: str, t_ms: float) -> list[Segment]: ...

    def finish(self, t_ms: float) -> list[Segment]: ...


def _segments(texts: Iterable[str], t_ms: float) -> list[Segment]:
    return [Segment(text.strip(), t_ms) for text in texts if speakable(text)]


class WholeSegmenter:
    def __init__(self) -> None:
        self._text = ""

    def feed(self, text: str, t_ms: float) -> list[Segment]:
        self._text += text
        return []

    def finish(self, t_ms: float) -> list[Segment]:
        return _segments([self._text], t_ms)


class BriefRuleSegmenter:
    def __init__(self) -> None:
        self._text = ""
        self._cut: int | None = None

    def feed(self, text: str, t_ms: float) -> list[Segment]:
        self._text += text
        if self._cut is None:
            self._cut = first_sentence_end(self._text)
            if self._cut is not None:
                return _segments([self._text[: self._cut]], t_ms)
        return []

    def finish(self, t_ms: float) -> list[Segment]:
        return _segments([self._text[self._cut or 0 :]], t_ms)


class SentenceSegmenter:
    def __init__(self) -> None:
        self._splitter = SentenceSplitter()

    def feed(self, text: str, t_ms: float) -> list[Segment]:
        return _segments(self._splitter.feed(text), t_ms)

    def finish(self, t_ms: float) -> list[Segment]:
        return _segments(self._splitter.flush(), t_ms)


def clause_end(text: str, min_words: int) -> int | None:
    """The index just past the first clause boundary preceded by at least ``min_words`` words, or None."""
    for match in _CLAUSE_END.finditer(text):
        if sum(1 for word in text[: match.end()].split() if speakable(word)) >= min_words:
            return match.end()
    return None


class ClauseSegmenter:
    def __init__(self, min_words: int = DEFAULT_CLAUSE_WORDS) -> None:
        self._min_words = min_words
        self._text = ""  # the stream until the first segment is cut
        self._splitter = SentenceSplitter()
        self._first_done = False

    def feed(self, text: str, t_ms: float) -> list[Segment]:
        if self._first_done:
            return _segments(self._splitter.feed(text), t_ms)
        self._text += text
        sentences = self._splitter.feed_spans(text)
        cut = clause_end(self._text, self._min_words)
        if sentences and (cut is None or sentences[0].end <= cut):
            self._first_done = True  # the first sentence ended before any long-enough clause
            return _segments((s.text for s in sentences), t_ms)
        if cut is None:
            return []
        # Cut the clause; the rest of its sentence and everything after go to a fresh splitter.
        self._first_done = True
        self._splitter = SentenceSplitter()
        return _segments([self._text[:cut]], t_ms) + _segments(self._splitter.feed(self._text[cut:]), t_ms)

    def finish(self, t_ms: float) -> list[Segment]:
        return _segments(self._splitter.flush(), t_ms)


def make_segmenter(strategy: str, clause_words: int = DEFAULT_CLAUSE_WORDS) -> Segmenter:
    if strategy == "whole":
        return WholeSegmenter()
    if strategy == "brief_rule":
        return BriefRuleSegmenter()
    if strategy == "sentences":
        return SentenceSegmenter()
    if strategy == "clauses":
        return ClauseSegmenter(clause_words)
    raise ConfigError(f"unknown segmenting strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")


def segment_stream(strategy: str, chunks: Sequence[tuple[float, str]], end_ms: float,
                   clause_words: int = DEFAULT_CLAUSE_WORDS) -> list[Segment]:
    """Replay a recorded stream ``[(t_ms, text), ...]`` that ended at ``end_ms`` through ``strategy``."""
    segmenter = make_segmenter(strategy, clause_words)
    out: list[Segment] = []
    for t_ms, text in chunks:
        out.extend(segmenter.feed(text, t_ms))
    return out + segmenter.finish(end_ms)
