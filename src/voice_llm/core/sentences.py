r"""Where does a sentence end? The brief's rule, and a streaming splitter a voice pipeline can speak from.

A voice assistant starts text-to-speech when the first sentence is complete. Cut too early ("Dr." / "3." /
"a.m.") and it says nonsense; cut too late and the caller waits. Two tools, standard library only, no I/O:

* :func:`first_sentence_end` — the brief's rule, literally: the index just past the first ``.``, ``!`` or ``?``
  that is immediately followed by a whitespace character. It is the baseline the lab reports.
* :func:`first_sentence_by_rule` and :func:`first_sentence_by_splitter` — the two on a timed stream of chunks
  (anything with ``text`` and ``t_ms``, as ``voice_llm.core.sse.Chunk``): the first sentence and the time of the
  chunk that settled it. The lab's sentence step, `voice-llm call` and the Locust caller all time a first
  sentence through these, so they agree on what it is.
* :class:`SentenceSplitter` — an incremental splitter. ``feed(text)`` returns the sentences that the text so far
  has settled; ``flush()`` returns the rest at the end of the stream. It never emits a sentence that later text
  could contradict (no retractions), and it emits as soon as the text that follows settles the question —
  usually the next non-space character, at most the next word.

Rules of the splitter (each one is a unit test in ``tests/transport/test_sentences.py``):

* A sentence ends after a run of terminal punctuation (``. ! ? …``, also "?!", "!!", ". . .") plus any closing
  quotes or brackets, when whitespace follows and the next word does not start with a lower-case letter.
  Punctuation glued to more text ("3.5", "U.S.A", "example.com", "Jr.'s", "mean...see") never ends one;
  the exception is a lower-case word glued to a capitalised one ("world.Today"), a sentence missing its space.
* ``?`` and ``!`` end a sentence unless a lower-case word follows ("Yahoo! in", '"Really?" she asked'). No
  sentence starts with a dash, a slash or an emoji: "9 a.m. – 5 p.m." and "See you soon! 😊" go on.
* An ellipsis ends a sentence only before a capitalised word other than the pronoun "I"
  ("I never meant that.... She left" vs "the thing is . . . I didn't mean it"), never inside brackets
  ("[...]"). A period glued to a word and then a spaced ellipsis ("compounds. . . . The") ends the sentence
  at the period; the ellipsis opens the next one.
* A period after a known abbreviation: titles (Dr. Mr. Mrs. Prof. Mt. ...) and "e.g./i.e./vs./approx." never end
  a sentence before a capital; "No./p./ext./Rm./Jan." never end one before a number. Ambiguous abbreviations
  (Jr. U.S. E.U. Ph.D. initials like "E.") end one only when a common sentence-starting word follows ("I live
  in the U.S. How about you?" vs "the U.S. Government"); "etc." and "Inc./Co./Ltd." end one before any
  capital. "a.m."/"p.m." and day/month abbreviations end one unless a day, month or time zone follows ("at
  5 p.m. Call us" vs "at 8 a.m. Saturday"), or the sentence so far is only an opening phrase ("At 5 a.m.
  Mr. Smith left.") or a yes/no question ("Is 10 a.m. OK?"). Street abbreviations (St. Ave. Rd. Blvd.) end
  one unless an address continues ("Suite 4", "Apt. 2"); "St." before a name is "Saint".
* Numbered and lettered list items keep their marker ("1. Fill out the form." is one sentence); an inline list
  started by a marker is split before the next marker ("1) The first item 2) The second item").
* Line breaks (the decision for voice): a line break ends a sentence, so a list item or heading without final
  punctuation is a sentence of its own ("Please bring:\n- your ID" is two). The one exception is a soft-wrapped
  line — a space before a single line break and a lower-case letter after it ("It was a cold \nnight") —
  which is joined, and read with a single space where the line break was. Otherwise a sentence is the text
  verbatim, with the whitespace around it stripped.

Heuristics are heuristics: the ambiguous cases above are decided by word lists, chosen so the common cases
of a clinic phone assistant's answers come out right.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Sentence", "SentenceSplitter", "TimedText", "first_sentence_by_rule", "first_sentence_by_splitter",
           "first_sentence_end", "split_sentences"]


# ---------------------------------------------------------------------------------------------------------------
# The brief's rule.
# ---------------------------------------------------------------------------------------------------------------

_BRIEF_PUNCT = re.compile(r"[.!?]")


def first_sentence_end(text: str) -> int | None:
    """The brief's rule: the index just past the first ``.``, ``!`` or ``?`` immediately followed by a
    whitespace character (``str.isspace``), or None when there is none.

    Literal on purpose — it is the baseline: "It costs 3.5 dollars. Bring cash." ends after "dollars." because
    the period in "3.5" has no whitespace after it, but "Dr. Smith" ends after "Dr.".
    """
    for match in _BRIEF_PUNCT.finditer(text):
        after = match.end()
        if after < len(text) and text[after].isspace():
            return after
    return None


# ---------------------------------------------------------------------------------------------------------------
# Word lists. All lower case; a curly apostrophe in the text is read as "'".
# ---------------------------------------------------------------------------------------------------------------

_TERMINALS = frozenset(".!?…‽")
_QE = frozenset("!?‽")
# Closing quotes and brackets that belong to the sentence they follow ('"This is great." She ...'), and the
# Markdown emphasis an LLM wraps around a sentence ("**Bring your ID.** Then ...").
_CLOSERS = frozenset("\"'”’»›)]}*")
# Opening quotes and brackets skipped when looking at the first letter of the next sentence.
_OPENERS = frozenset("\"'“‘«‹([{¿¡*")
_APOSTROPHES = frozenset("'’")
# Symbols a sentence may start with; any other symbol after the punctuation ("–", "/", "&", an emoji) means the
# sentence goes on.
_STARTING_SYMBOLS = frozenset("$€£¥#@•·▪◦‣⁃")
# Bullets that may start a list item; an inline list of them is split before each one.
_BULLETS = frozenset("•·▪◦‣⁃")

# Titles and name prefixes: never the end of a sentence before a capital or a number ("Dr. Smith", "Mt. Fuji").
_TITLES = frozenset(
    "mr mrs ms mx dr drs prof profs rev fr hon gov gen col capt cpt lt sgt maj adm cmdr sen rep pres supt insp "
    "det messrs mme mlle mt ft atty sra srta".split()
)
# Abbreviations that always introduce something ("e.g. Tylenol", "Tylenol vs. Advil", "approx. $80").
_NEVER_END = frozenset("e.g i.e eg ie vs v cf viz approx appx incl".split())
# Abbreviations that never end a sentence before a number ("No. 5", "p. 55", "ext. 4", "Rm. 204").
_NUMBER_ABBR = frozenset(
    "no nos nr n° nº num p pp pg pgs vol vols fig figs ch chap ext x rm apt ste bldg fl flr tel ph fax ca est "
    "art sec sect para ref op tab tabs rte rt #".split()
)
# Ambiguous abbreviations: they end a sentence only when a common sentence-starting word follows. Not here,
# because before a capital they nearly always end one: "etc." and company suffixes ("Inc.", "Co.", "Ltd.").
_AMBIGUOUS = frozenset(
    "jr sr al dept univ assn assoc govt esp misc appt hosp intl natl mfg "
    "rm apt ste bldg fl flr ext tel vol ch chap fig figs pp pg op ref".split()
)
# Street types: the end of a sentence unless the address goes on ("123 Main St. Suite 4").
_STREETS = frozenset("ave av rd blvd ln hwy pkwy pky cir ct pl sq ter terr trl expy fwy".split())
_ADDRESS_GOES_ON = frozenset(
    "suite ste apt apartment unit floor fl flr building bldg room rm level lvl box po p "
    "north south east west n s e w ne nw se sw".split()
)
_DAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
_MONTHS = "january february march april may june july august september october november december".split()
# Day and month abbreviations, taken as abbreviations only when capitalised ("Sat." but not "sat.").
_DAY_MONTH_ABBR = frozenset(
    "mon tue tues wed thu thur thurs fri sat sun jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_AM_PM = frozenset("a.m p.m am pm".split())
# What may follow "a.m."/"p.m."/"Sat." without a new sentence ("8 a.m. Saturday", "5 p.m. Eastern").
_TIME_GOES_ON = frozenset(
    _DAYS + [d + "s" for d in _DAYS] + _MONTHS + list(_DAY_MONTH_ABBR)
    + "eastern central pacific mountain atlantic hawaii alaska est edt cst cdt mst mdt pst pdt akst hst et ct mt "
      "pt gmt utc bst cet".split()
)
# An opening time phrase is not a sentence: "At 5 a.m. Mr. Smith went to the bank."
_INTRO_PREPOSITIONS = frozenset("at by from until till before after around since starting between on".split())
# A yes/no question is not over at "a.m.": "Is 10 a.m. OK?", "Would 3 p.m. Dr. Lee's time work?"
_QUESTION_OPENERS = frozenset("is are was were do does did can could would will should shall".split())
# Capitalised words that commonly start a sentence; after an ambiguous abbreviation they mean a new sentence.
# Words that are also common names (Will Smith, Grace, Mark, Park, Chase, Hope ...) are left out on purpose,
# except the modals "Will" and "May", which start questions far more often than they follow an initial.
_STARTERS = frozenset(
    # pronouns and contractions
    "i i'm i'll i've i'd we we're we'll we've we'd you you're you'll you've you'd he he's he'll he'd she she's "
    "she'll she'd they they're they'll they've they'd it it's it'll its this that that's these those there "
    "there's here here's what what's where where's when why how how's who who's which whether "
    "someone anyone everyone nobody nothing everything something "
    # determiners
    "a an the my our your his her their some any all each every most many both one no not none another "
    # conjunctions, adverbs, prepositions opening a sentence
    "and but or so if as because since although though unless until while once after before also however "
    "then now today tonight tomorrow yesterday still just only even again otherwise meanwhile finally first "
    "next additionally instead unfortunately fortunately luckily usually generally typically normally "
    "in on at for from to with by during about of over under without "
    # interjections and politeness
    "please thank thanks sorry yes yeah ok okay sure alright hello hi hey great good well oh welcome bye goodbye "
    "congratulations never always sometimes often later soon afterwards important reminder "
    # auxiliaries and modals (questions)
    "is isn't are aren't was wasn't were weren't do don't does doesn't did didn't can can't could couldn't "
    "would wouldn't should shouldn't will won't shall may might must have haven't has hasn't had be let let's "
    # imperatives a clinic assistant uses
    "call bring take make remember note keep try use ask tell see visit check go come get give feel arrive "
    "book schedule contact email text press hold stay wait avoid seek stop drink eat rest wear follow fill "
    "sign send apply continue start return monitor watch read click log reply expect plan allow prepare "
    "consider talk speak leave enter head turn look find confirm cancel reschedule update verify share "
    "provide dial push select choose pay ensure".split()
) | (_TITLES - {"st"})  # a title after an initial or acronym starts a sentence: "vitamin D. Dr. Lee will ..."
# A sentence-start list marker: "1." "1.)" "1)" "(1)" "a." "b)" "(c)", maybe glued to a bullet ("⁃9.").
_MARKER = re.compile(r"([•·▪◦‣⁃]?\(?)(\d{1,3}|[A-Za-z])(\.\)|\.|\))")
# Dotted abbreviations such as U.S., E.U., Ph.D., M.D., b.i.d. (but not example.com: segments are 1-2 letters).
_DOTTED = re.compile(r"(?:[A-Za-z]{1,2}\.)+[A-Za-z]{1,2}")
_ORDINAL = re.compile(r"\d+(?:st|nd|rd|th)", re.IGNORECASE)
_NUMBER = re.compile(r"[$€£]?\d[\d,.]*")

# Bounds that keep each re-examination O(1): a token longer than this before a period is a URL or the like
# (treated as an ordinary word), and a following word longer than this is not in any word list.
_MAX_TOKEN = 64
_MAX_WORD = 40


def _prefixes(words: frozenset[str]) -> frozenset[str]:
    """Every prefix of every word, so a half-streamed word can be ruled out of a list before it is complete."""
    return frozenset(word[:k] for word in words for k in range(len(word) + 1))


_STARTER_PREFIXES = _prefixes(_STARTERS)
_TIME_PREFIXES = _prefixes(_TIME_GOES_ON)
_ADDRESS_PREFIXES = _prefixes(_ADDRESS_GOES_ON)


_LINE_BREAK_CHARS = "\n\r\u2028\u2029\x0b\x0c\x85"
_LINE_BREAKS = re.compile(f"[{_LINE_BREAK_CHARS}]")
_WRAPPED = re.compile(f"\\s*[{_LINE_BREAK_CHARS}]\\s*")


def _is_line_break(char: str) -> bool:
    return char in _LINE_BREAK_CHARS


# ---------------------------------------------------------------------------------------------------------------
# The splitter.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sentence:
    """One emitted sentence, with where it sits in the stream and when it was known.

    ``start``/``end`` are offsets into the concatenated stream (``end`` is just past the sentence's last
    character; ``stream[start:end] == text`` except that a soft-wrapped line break is read as one space);
    ``emitted_at`` is how many characters had been fed when the sentence was emitted, so ``emitted_at - end`` is
    the look-ahead the decision needed.
    """

    text: str
    start: int
    end: int
    emitted_at: int


# Verdicts of one boundary question.
_YES, _NO, _MORE = "yes", "no", "more"


class SentenceSplitter:
    """Incremental sentence splitter for a token stream (see the module docstring for the rules).

    ``feed(text)`` takes any split of the stream (one character, one LLM token, or everything) and returns the
    sentences completed so far; ``flush()`` returns the rest and resets the splitter for a new stream. The
    result does not depend on how the stream was split: a boundary is only decided once the text after it
    settles the question, and a decided boundary is never revisited.
    """

    def __init__(self) -> None:
        self._reset()
        self._fed = 0

    def _reset(self) -> None:
        # The pending text as a list of characters: appending a token is O(token), while `str +=` on an
        # attribute copies the whole pending text every time.
        self._buf: list[str] = []
        self._offset = 0  # stream offset of self._buf[0]
        self._start = 0  # index where the current sentence starts (first non-space character)
        self._pos = 0  # everything before this index has been examined and is not a boundary
        # The list-item successor that splits an inline list ("2)" after "1) ..."): None = not yet known,
        # "" = the sentence does not start with a list marker.
        self._list_next: str | None = None
        self._list_caps = False  # the inline list came after a colon: split only before a capitalised item
        self._ws_memo: tuple[int, int, int] = (-1, -1, 0)  # (from, to, line breaks) of a whitespace run
        self._token_memo: tuple[int, str, int] = (-1, "", 0)  # (period index, token, token start)
        self._run_memo: tuple[int, int, int, bool, bool] = (-1, -1, 0, False, False)  # punctuation run read so far

    # -- public API ------------------------------------------------------------------------------------------

    def feed(self, text: str) -> list[str]:
        """Add streamed text; return the sentences it completed (stripped), in order."""
        return [sentence.text for sentence in self.feed_spans(text)]

    def flush(self) -> list[str]:
        """End of stream: return every sentence still pending, and reset for a new stream."""
        return [sentence.text for sentence in self.flush_spans()]

    def feed_spans(self, text: str) -> list[Sentence]:
        """Like :meth:`feed`, with each sentence's offsets and the moment it was emitted.

        Cost: O(len(text)) amortised. Scanning resumes at ``self._pos`` and never goes back over examined text;
        the only re-examination is of a single undecided boundary, whose look-behind and look-ahead are capped
        at ``_MAX_TOKEN``/``_MAX_WORD`` characters, and emitted text is dropped from the buffer in amortised
        O(1). A long answer fed token by token therefore costs time linear in its length.
        """
        self._buf.extend(text)
        self._fed += len(text)
        return self._scan(final=False)

    def flush_spans(self) -> list[Sentence]:
        """Like :meth:`flush`, with offsets (see :class:`Sentence`)."""
        out = self._scan(final=True)
        self._emit(len(self._buf), len(self._buf), out)
        self._reset()
        self._fed = 0
        return out

    # -- the scan --------------------------------------------------------------------------------------------

    def _scan(self, final: bool) -> list[Sentence]:
        """Examine pending text from ``self._pos``; stop at the first boundary that needs more text.

        ``final`` means no more text will come, so the end of the buffer ends every word and whitespace run.
        """
        out: list[Sentence] = []
        buf = self._buf
        while self._pos < len(buf):
            i = self._pos
            char = buf[i]
            if i == self._start and char.isspace():
                self._start = self._pos = i + 1  # leading whitespace belongs to no sentence
                continue
            if char in _TERMINALS:
                verdict, end = self._terminal(i, final)
                if verdict == _MORE:
                    break
                if verdict == _YES:
                    self._emit(end, end, out)
                else:
                    self._pos = max(end, i + 1)
                continue
            if char.isspace():
                verdict, end = self._whitespace(i, final)
                if verdict == _MORE:
                    break
                if verdict == _YES:
                    self._emit(i, end, out)
                else:
                    self._pos = max(end, i + 1)
                continue
            self._pos = i + 1
        self._compact()
        return out

    def _emit(self, cut: int, next_start: int, out: list[Sentence]) -> None:
        """Emit ``buf[start:cut]`` (stripped, if not empty) and start the next sentence at ``next_start``."""
        raw = "".join(self._buf[self._start:cut])
        text = raw.strip()
        if _LINE_BREAKS.search(text):
            text = _WRAPPED.sub(" ", text)  # a soft-wrapped line is read as one line
        if text:
            start = self._offset + self._start + len(raw) - len(raw.lstrip())
            end = self._offset + self._start + len(raw.rstrip())
            out.append(Sentence(text, start, end, self._fed))
        self._start = self._pos = next_start
        self._list_next = None
        self._list_caps = False

    def _compact(self) -> None:
        """Drop emitted text once it is most of the buffer, so memory and slicing stay proportional to the
        pending sentence (amortised O(1) per character)."""
        cut = self._start
        if cut > 256 and cut * 2 > len(self._buf):
            del self._buf[:cut]
            self._offset += cut
            self._start = 0
            self._pos -= cut
            self._ws_memo = (-1, -1, 0)
            self._token_memo = (-1, "", 0)
            self._run_memo = (-1, -1, 0, False, False)

    # -- helpers over the buffer -----------------------------------------------------------------------------

    def _skip_ws(self, j: int) -> tuple[int, int]:
        """End of the whitespace run starting at ``j`` and how many line breaks it holds ("\\r\\n" is one).
        Memoised so a long run streamed one space at a time is scanned once."""
        buf = self._buf
        memo_from, k, breaks = self._ws_memo
        if memo_from != j:
            k, breaks = j, 0
        while k < len(buf) and buf[k].isspace():
            if _is_line_break(buf[k]) and not (buf[k] == "\n" and k > 0 and buf[k - 1] == "\r"):
                breaks += 1
            k += 1
        self._ws_memo = (j, k, breaks)
        return k, breaks

    def _token_before(self, i: int) -> tuple[str, int]:
        """The word before the period at ``i`` (opening/closing punctuation stripped) and where it starts.
        A token longer than ``_MAX_TOKEN`` comes back as a placeholder that is in no list: an ordinary word."""
        memo_i, token, start = self._token_memo
        if memo_i == i:
            return token, start
        buf = self._buf
        k = i
        while k > self._start and not buf[k - 1].isspace() and i - k <= _MAX_TOKEN:
            k -= 1
        if i - k > _MAX_TOKEN:
            token = "\x00long"
        else:
            token = "".join(buf[k:i]).lstrip("".join(_OPENERS)).rstrip("".join(_CLOSERS))
        self._token_memo = (i, token, k)
        return token, k

    def _previous_token(self, k: int) -> tuple[str, int] | None:
        """The whitespace-delimited token that ends before index ``k`` (skipping whitespace), or None."""
        buf = self._buf
        j = k
        while j > self._start and buf[j - 1].isspace() and k - j <= _MAX_TOKEN:
            j -= 1
        if j <= self._start:
            return None
        s = j
        while s > self._start and not buf[s - 1].isspace() and j - s <= _MAX_TOKEN:
            s -= 1
        return "".join(buf[s:j]), s

    def _word_in(self, m: int, words: frozenset[str], prefixes: frozenset[str], final: bool,
                 initials: bool = False) -> bool | None:
        """Is the word starting at ``m`` in ``words``? None if the text so far cannot tell yet.

        A word is letters with inner apostrophes ("It's"). It is known to be outside the list as soon as what
        has arrived is no prefix of a list word, so the look-ahead is usually a letter or two, at most a word.
        With ``initials``, a single letter followed by "." is an initial ("J. R. Smith"), never a list word.
        """
        buf = self._buf
        word: list[str] = []
        k = m
        while True:
            if k >= len(buf):
                if final:
                    break
                return False if "".join(word).lower() not in prefixes else None
            char = buf[k]
            if char.isalpha():
                word.append(char)
            elif char in _APOSTROPHES and word:
                if k + 1 >= len(buf):
                    if final:
                        break
                    current = "".join(word).lower()
                    if current in words or current + "'" in prefixes:
                        return None
                    return False
                if not buf[k + 1].isalpha():
                    break
                word.append("'")
            else:
                break
            k += 1
            if len(word) > _MAX_WORD:
                return False
        lowered = "".join(word).lower()
        if initials and len(lowered) == 1 and k < len(buf) and buf[k] == ".":
            return False
        return lowered in words

    # -- boundary questions ----------------------------------------------------------------------------------

    def _terminal(self, i: int, final: bool) -> tuple[str, int]:
        """Does the run of terminal punctuation starting at ``i`` end the sentence?

        Returns (_YES, index just past the sentence), (_NO, index to resume scanning) or (_MORE, i).
        """
        buf = self._buf
        n = len(buf)
        memo_i, j, dots, question, ellipsis = self._run_memo
        if memo_i != i:
            j, dots, question, ellipsis = i, 0, False, False
        while True:
            # Remember how far the run has been read, so a long run streamed piece by piece is read once.
            self._run_memo = (i, j, dots, question, ellipsis)
            if j >= n:
                return (_NO, n) if final else (_MORE, i)
            char = buf[j]
            if char == ".":
                dots += 1
            elif char in _QE:
                question = True
            elif char == "…":
                ellipsis = True
            elif char == " " and buf[j - 1] == ".":
                # A spaced ellipsis ". . ." continues the run.
                if j + 1 >= n:
                    return (_NO, n) if final else (_MORE, i)
                if buf[j + 1] != ".":
                    break
            else:
                break
            j += 1
        closers_from = j
        while j < n and buf[j] in _CLOSERS:
            j += 1
        if j >= n:
            return (_NO, n) if final else (_MORE, i)
        end = j
        if not buf[j].isspace():
            if dots == 1 and not question and not ellipsis and j == i + 1 and buf[j].isupper():
                return self._glued(i, final)
            return _NO, j
        if i == self._start:
            return _NO, end  # punctuation opening a sentence ends nothing (". . . The practice was ...")
        if (dots >= 2 or ellipsis) and not question and buf[i - 1] in "[(":
            return _NO, end  # "[...]" marks an omission inside a sentence
        k, breaks = self._skip_ws(j)
        if k >= n:
            return (_NO, n) if final else (_MORE, i)
        if breaks:
            return _NO, end  # a line break decides by itself, in _whitespace
        m = k
        while m < n and buf[m] in _OPENERS and m - k < 8:
            m += 1
        if m >= n:
            return (_YES, end) if final else (_MORE, i)
        first = buf[m]
        if first.islower() or not (first.isalnum() or first in _STARTING_SYMBOLS):
            return _NO, end  # "in the ...", "9 a.m. – 5 p.m.", "See you soon! 😊"
        if question:
            return _YES, end
        if dots >= 2 or ellipsis:
            if first.isupper():
                if first == "I":
                    if m + 1 >= n:
                        return (_NO, end) if final else (_MORE, i)
                    if not buf[m + 1].isalpha():
                        return _NO, end  # "the thing is . . . I didn't mean it"
                spaced_after_period = buf[i + 1] == " " and not buf[i - 1].isspace()
                if dots >= 4 and not ellipsis and end == closers_from and spaced_after_period:
                    # A period, then a spaced ellipsis that opens the next sentence:
                    # "... compounds. . . . The practice" -> "... compounds." + ". . . The practice"
                    return _YES, i + 1
                return _YES, end
            return (_NO, end) if first.isdigit() else (_YES, end)
        closers = "".join(buf[closers_from:end])
        verdict = self._after_period(i, closers, m, final)
        if verdict == _MORE:
            return _MORE, i
        return verdict, end

    def _after_period(self, i: int, closers: str, m: int, final: bool) -> str:
        """A single period at ``i``, whitespace after it, and the next word (not lower case) at ``m``."""
        buf = self._buf
        token, token_start = self._token_before(i)
        low = token.lower()
        first = buf[m]

        # "1. Fill out the form." — a list marker at the start of the sentence (after an optional bullet).
        if closers in ("", ")") and _MARKER.fullmatch(token + ".") and self._at_marker_position(token_start):
            return _NO
        # "Please bring: 1. Your ID 2. Your card" — a number right after a colon is a list marker, and the
        # next number starts the next item.
        if token.isdigit() and len(token) <= 2:
            before = self._previous_token(token_start)
            if before is not None and before[0].endswith(":"):
                self._list_next, self._list_caps = f"{int(token) + 1}.", True
                return _NO

        if first.isdigit() or first == "#":
            if (low in _NUMBER_ABBR or low in _TITLES or low in _NEVER_END or low in _STREETS or low == "st"
                    or low in _AM_PM or low in _DAY_MONTH_ABBR):
                return _NO  # "No. 5", "p. 55", "ext. 4", "Jan. 5", "a.m. 7 days a week"
            return _YES

        if low in _TITLES or low in _NEVER_END:
            return _NO
        if low == "st":
            return self._street(token_start, m, final) if self._is_street(token_start) else _NO
        if low in _STREETS:
            return self._street(token_start, m, final)
        if low in _AM_PM:
            if self._opening_phrase(token_start) or self._first_word() in _QUESTION_OPENERS:
                return _NO
            return self._unless(m, _TIME_GOES_ON, _TIME_PREFIXES, final)
        if low in _DAY_MONTH_ABBR and token[:1].isupper():
            return self._unless(m, _TIME_GOES_ON, _TIME_PREFIXES, final)
        if low in _AMBIGUOUS or (len(token) == 1 and token.isalpha()) or _DOTTED.fullmatch(token):
            found = self._word_in(m, _STARTERS, _STARTER_PREFIXES, final, initials=True)
            if found is None:
                return _MORE
            return _YES if found else _NO
        return _YES

    def _at_marker_position(self, token_start: int) -> bool:
        """Is ``token_start`` where a list marker sits: the sentence's start, or right after a bullet?"""
        gap = token_start - self._start
        return gap == 0 or (gap <= 4 and "".join(self._buf[self._start:token_start]).strip() in _BULLETS)

    def _unless(self, m: int, words: frozenset[str], prefixes: frozenset[str], final: bool) -> str:
        """A boundary unless the next word is in ``words``."""
        found = self._word_in(m, words, prefixes, final)
        if found is None:
            return _MORE
        return _NO if found else _YES

    def _street(self, token_start: int, m: int, final: bool) -> str:
        """After a street type: a boundary unless the address goes on ("Main St. Suite 4")."""
        if self._buf[m] == "#":
            return _NO
        return self._unless(m, _ADDRESS_GOES_ON, _ADDRESS_PREFIXES, final)

    def _is_street(self, token_start: int) -> bool:
        """"St." is a street after an ordinal or a capitalised word that is not the sentence's first word
        ("5th St.", "Main St."), otherwise "Saint" ("St. Michael's", "Visit St. Luke's", "10 St. Paul St.")."""
        previous = self._previous_token(token_start)
        if previous is None:
            return False
        word, word_start = previous
        word = word.strip("".join(_OPENERS | _CLOSERS))
        if _ORDINAL.fullmatch(word):
            return True
        return word[:1].isupper() and word_start != self._start

    def _first_word(self) -> str:
        """The current sentence's first word, lower case (letters only, at most a dozen read)."""
        buf = self._buf
        k = self._start
        while k < len(buf) and buf[k].isalpha() and k - self._start < 12:
            k += 1
        return "".join(buf[self._start:k]).lower()

    def _opening_phrase(self, token_start: int) -> bool:
        """Is the sentence so far only an opening time phrase ("At 5 a.m.", "Starting at 9 p.m.")?"""
        if token_start - self._start > _MAX_TOKEN:
            return False
        words = "".join(self._buf[self._start:token_start]).split()
        return 1 <= len(words) <= 3 and words[0].strip("".join(_OPENERS)).lower() in _INTRO_PREPOSITIONS

    def _glued(self, i: int, final: bool) -> tuple[str, int]:
        """A period glued to a capitalised word: a sentence missing its space ("world.Today is ...") when
        a plain word or number comes before and a plain word of 2+ letters after, ended by whitespace or
        punctuation. Not "Jane.Doe@example.com", "Ph.D", "Mr.Smith" or "www.Example.com"."""
        token, _ = self._token_before(i)
        low = token.lower()
        plain_word = token.isalpha() and len(token) >= 2 and not token.isupper()
        known = low in _TITLES or low in _NEVER_END or low in _AMBIGUOUS or low in _NUMBER_ABBR or low in _STREETS
        if not ((plain_word and not known) or _NUMBER.fullmatch(token)):
            return _NO, i + 1
        buf = self._buf
        k = i + 1
        while k < len(buf) and (buf[k].isalpha() or (buf[k] in _APOSTROPHES and k > i + 1)):
            k += 1
            if k - i > _MAX_WORD:
                return _NO, i + 1
        if k >= len(buf):
            return ((_YES, i + 1) if k - i > 2 else (_NO, i + 1)) if final else (_MORE, i)
        if k - i - 1 < 2:
            return _NO, i + 1
        char = buf[k]
        if char.isspace():
            return _YES, i + 1
        if char in ".!?,;:":
            if k + 1 >= len(buf):
                return (_YES, i + 1) if final else (_MORE, i)
            return (_YES, i + 1) if buf[k + 1].isspace() else (_NO, i + 1)
        return _NO, i + 1

    def _whitespace(self, i: int, final: bool) -> tuple[str, int]:
        """Whitespace inside a sentence: a line break may end it, and so may the next marker of an inline list.

        Returns (_YES, start of the next sentence), (_NO, index to resume) or (_MORE, i); a _YES cuts at ``i``.
        """
        buf = self._buf
        n = len(buf)
        if _is_line_break(buf[i]):
            k, breaks = self._skip_ws(i)
            if k >= n:
                return (_NO, n) if final else (_MORE, i)
            # A soft-wrapped line ("It was a cold \nnight in the city."): a space before the only line break and
            # a lower-case letter after it. Everything else ends the line's sentence.
            previous = buf[i - 1] if i > 0 else ""
            if breaks == 1 and buf[k].islower() and previous.isspace() and not _is_line_break(previous):
                return _NO, k
            return _YES, k
        if self._list_next is None:
            self._list_next = self._list_successor(i)
            if self._list_next is None:
                return _NO, i + 1  # a bullet so far; the marker after it is not complete yet
        successor = self._list_next
        if not successor:
            return _NO, i + 1
        for offset, expected in enumerate(successor, start=i + 1):
            if offset >= n:
                return (_NO, i + 1) if final else (_MORE, i)
            if buf[offset] != expected:
                return _NO, i + 1
        after = i + 1 + len(successor)
        if after >= n:
            return (_NO, i + 1) if final else (_MORE, i)
        if not buf[after].isspace():
            return _NO, i + 1
        if self._list_caps:
            k, _ = self._skip_ws(after)
            if k >= n:
                return (_NO, i + 1) if final else (_MORE, i)
            if buf[k].islower():
                return _NO, i + 1  # "bring: 1. your ID, 2. your card" is one sentence
        return _YES, i + 1

    def _list_successor(self, i: int) -> str | None:
        """The marker that would start the next inline list item, from the sentence's opening (before ``i``):
        "2)" after "1)", "b." after "a.", "• 10." after "• 9.", "•" after "•"; "" if the sentence is no list
        item, None if a bullet has been seen but not yet what follows it."""
        words = "".join(self._buf[self._start:i]).split()
        if not words:
            return None
        bullet = ""
        if words[0] in _BULLETS:
            bullet = words[0] + " "
            if len(words) < 2:
                return None
            words = words[1:]
        match = _MARKER.fullmatch(words[0])
        if match is None:
            return bullet.strip()
        paren, label, suffix = match.groups()
        if label.isdigit():
            following = str(int(label) + 1)
        elif label in "zZ":
            return bullet.strip()
        else:
            following = chr(ord(label) + 1)
        return bullet + (paren or "") + following + suffix


def split_sentences(text: str) -> list[str]:
    """Split a whole text at once (the same result as feeding it in any pieces and flushing)."""
    splitter = SentenceSplitter()
    return splitter.feed(text) + splitter.flush()


# ---------------------------------------------------------------------------------------------------------------
# On a timed stream: when was the first sentence known?
# ---------------------------------------------------------------------------------------------------------------


class TimedText(Protocol):
    """A piece of a streamed answer and when it arrived (``voice_llm.core.sse.Chunk`` is one); a Protocol, so this
    module stays stand-alone."""

    @property
    def text(self) -> str: ...

    @property
    def t_ms(self) -> float: ...


def first_sentence_by_rule(chunks: Iterable[TimedText], total_ms: float) -> tuple[str, float]:
    """The brief's rule on a stream: the first chunk after which the concatenated text has [.!?] followed by
    whitespace — the moment the whitespace arrives, since only then is the period known to end a sentence
    ('3.5', 'a.m.'). Never: the whole text is one sentence, known at the end of the stream (``total_ms``)."""
    text = ""
    for chunk in chunks:
        text += chunk.text
        end = first_sentence_end(text)
        if end is not None:
            return text[:end].strip(), chunk.t_ms
    return text.strip(), total_ms


def first_sentence_by_splitter(chunks: Iterable[TimedText], total_ms: float) -> tuple[str, float]:
    """The smart splitter fed chunk by chunk: its first emitted sentence and the time of the chunk that settled
    it; with none before the end, what ``flush`` gives, known at ``total_ms``."""
    splitter = SentenceSplitter()
    for chunk in chunks:
        done = splitter.feed(chunk.text)
        if done:
            return done[0], chunk.t_ms
    rest = splitter.flush()
    return (rest[0] if rest else ""), total_ms
