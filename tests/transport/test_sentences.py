"""Unit tests for voice_llm.core.sentences: the brief's rule and the streaming SentenceSplitter.

Every splitter case is checked three ways — the whole text at once, one character at a time, and in LLM-like
token pieces — because the splitter must give the same answer however the stream is cut.
"""

from __future__ import annotations

import random
import re
import time

import pytest

from voice_llm.core.sentences import (
    Sentence, SentenceSplitter, first_sentence_by_rule, first_sentence_by_splitter, first_sentence_end, split_sentences,
)
from voice_llm.core.sse import Chunk

# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------

_PIECE = re.compile(r"\s*(?:[A-Za-z]+|\d{1,3}|[^\sA-Za-z\d])|\s+")


def llm_pieces(text: str) -> list[str]:
    """Cut text roughly the way an LLM tokenizer does: a leading space glued to a word, digits in groups of up
    to three, punctuation on its own (" We", " open", " at", " 8", " a", ".", "m", ".")."""
    pieces = _PIECE.findall(text)
    assert "".join(pieces) == text
    return pieces


def run(chunks: list[str]) -> tuple[list[str], list[list[str]]]:
    """Feed chunks; return all sentences (feeds then flush) and what each feed() call returned."""
    splitter = SentenceSplitter()
    per_feed = [splitter.feed(chunk) for chunk in chunks]
    return [s for batch in per_feed for s in batch] + splitter.flush(), per_feed


def assert_splits(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected, "whole text"
    assert run(list(text))[0] == expected, "one character at a time"
    assert run(llm_pieces(text))[0] == expected, "LLM-like token pieces"


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


# ---------------------------------------------------------------------------------------------------------------
# The brief's rule
# ---------------------------------------------------------------------------------------------------------------


def test_first_sentence_end_is_literal():
    text = "It costs 3.5 dollars. Bring cash."
    assert first_sentence_end(text) == text.index("dollars.") + len("dollars.")
    assert first_sentence_end("Hi") is None
    assert first_sentence_end("Hi.") is None  # no whitespace after the period yet
    assert first_sentence_end("Hi. ") == 3
    assert first_sentence_end("Wait! Now") == 5
    assert first_sentence_end("Why?\nBecause") == 4
    assert first_sentence_end("Dr. Smith") == 3  # the rule's known weakness
    assert first_sentence_end("a.m.\tx") == 4
    assert first_sentence_end("") is None
    assert first_sentence_end("U.S.A") is None


def test_first_sentence_end_uses_str_isspace():
    for space in ["\u00a0", "\u2003", "\x1c", "\r", "\u3000"]:
        assert space.isspace()
        assert first_sentence_end("Yes." + space + "No") == 4


# ---------------------------------------------------------------------------------------------------------------
# Splitter rules, one group per rule
# ---------------------------------------------------------------------------------------------------------------

RULES: dict[str, list[tuple[str, list[str]]]] = {
    "plain": [
        ("Thank you for calling. How can I help?", ["Thank you for calling.", "How can I help?"]),
        ("Hello there.", ["Hello there."]),
        ("No punctuation at the end", ["No punctuation at the end"]),
        ("  Leading and trailing space.  Second one.  ", ["Leading and trailing space.", "Second one."]),
    ],
    "question_exclamation": [
        ("Is it urgent? Please tell me.", ["Is it urgent?", "Please tell me."]),
        ("Great! See you then.", ["Great!", "See you then."]),
        ("Really?! That soon?", ["Really?!", "That soon?"]),
        ("Today!? Are you sure?", ["Today!?", "Are you sure?"]),
        ("Hello?? Anyone there?", ["Hello??", "Anyone there?"]),
        ("Wow!! Thank you.", ["Wow!!", "Thank you."]),
        ("You can book on Yahoo! in a minute.", ["You can book on Yahoo! in a minute."]),
        ("Is it 3? 4? Let me check.", ["Is it 3?", "4?", "Let me check."]),
        ("See you soon! 😊", ["See you soon! 😊"]),
        ("Ready? – Yes, all set.", ["Ready? – Yes, all set."]),
        ("The fee is $20. $5 is for parking.", ["The fee is $20.", "$5 is for parking."]),
    ],
    "titles": [
        ("Dr. Patel will see you at noon.", ["Dr. Patel will see you at noon."]),
        ("Mr. and Mrs. Lee are in Room 2.", ["Mr. and Mrs. Lee are in Room 2."]),
        ("Ms. Ortiz and Prof. Adams are here. Please wait.", ["Ms. Ortiz and Prof. Adams are here.", "Please wait."]),
        ("Ask for Dr. Will Chen.", ["Ask for Dr. Will Chen."]),
        ("Our lab is near Mt. Sinai.", ["Our lab is near Mt. Sinai."]),
        ("Dr. O'Brien is in. Dr. Shah is out.", ["Dr. O'Brien is in.", "Dr. Shah is out."]),
        ("That is Dr. Lee Jr.'s office.", ["That is Dr. Lee Jr.'s office."]),
    ],
    "common_abbreviations": [
        ("Bring your meds, e.g. Tylenol or Advil.", ["Bring your meds, e.g. Tylenol or Advil."]),
        ("Use the side door, i.e. The one by the pharmacy.", ["Use the side door, i.e. The one by the pharmacy."]),
        ("Tylenol vs. Advil is a common question.", ["Tylenol vs. Advil is a common question."]),
        ("It takes approx. 20 minutes.", ["It takes approx. 20 minutes."]),
        ("The visit is approx. $80 without insurance.", ["The visit is approx. $80 without insurance."]),
        ("Ask for extension No. 5. She will help.", ["Ask for extension No. 5.", "She will help."]),
        ("Is it contagious? No. It is not.", ["Is it contagious?", "No.", "It is not."]),
        ("See p. 12 of the leaflet.", ["See p. 12 of the leaflet."]),
        ("Bring your ID, card, etc. to the desk.", ["Bring your ID, card, etc. to the desk."]),
        ("We take Aetna, Cigna, etc. Do you have one?", ["We take Aetna, Cigna, etc.", "Do you have one?"]),
        ("It is run by Acme Health Inc. They own the building.",
         ["It is run by Acme Health Inc.", "They own the building."]),
        ("We treat colds, sprains, etc. Walk-ins are welcome.",
         ["We treat colds, sprains, etc.", "Walk-ins are welcome."]),
        ("Billing is done by Pitt & Co. at the front desk.", ["Billing is done by Pitt & Co. at the front desk."]),
        ("Ask Jones Dept. Store.", ["Ask Jones Dept. Store."]),
        ("Call ext. 204 for billing.", ["Call ext. 204 for billing."]),
        ("The lab is in Bldg. 3, Rm. 12. Go up the stairs.", ["The lab is in Bldg. 3, Rm. 12.", "Go up the stairs."]),
        ("Your appt. is on Jan. 5. Please confirm.", ["Your appt. is on Jan. 5.", "Please confirm."]),
        ("Wait about 10 min. The nurse will call you.", ["Wait about 10 min.", "The nurse will call you."]),
    ],
    "days_and_months": [
        ("We are open Mon. Wed. and Fri.", ["We are open Mon. Wed. and Fri."]),
        ("We close early on Sat. Please plan ahead.", ["We close early on Sat.", "Please plan ahead."]),
        ("The clinic reopens Jan. 3 after the holidays.", ["The clinic reopens Jan. 3 after the holidays."]),
        ("Hours are Mon. through Fri. Weekend hours vary.", ["Hours are Mon. through Fri.", "Weekend hours vary."]),
    ],
    "decimals_and_money": [
        ("Take 2.5 mg twice a day.", ["Take 2.5 mg twice a day."]),
        ("The copay is $12.50. Please bring cash.", ["The copay is $12.50.", "Please bring cash."]),
        ("Your balance is $1,250.00 in total.", ["Your balance is $1,250.00 in total."]),
        ("A fever is above 100.4 degrees. Call us if it is higher.",
         ["A fever is above 100.4 degrees.", "Call us if it is higher."]),
        ("The dose is 0.5 ml. Shake it first.", ["The dose is 0.5 ml.", "Shake it first."]),
        ("Version 2.0.1 of the app is out.", ["Version 2.0.1 of the app is out."]),
    ],
    "numbers_end_sentences": [
        ("Please go to Room 204. The nurse is there.", ["Please go to Room 204.", "The nurse is there."]),
        ("Call 555-0123. We answer all day.", ["Call 555-0123.", "We answer all day."]),
        ("The clinic opened in 2015. 40 doctors work here.", ["The clinic opened in 2015.", "40 doctors work here."]),
        ("Call 555-0123 and press 2. A nurse will answer.", ["Call 555-0123 and press 2.", "A nurse will answer."]),
    ],
    "times": [
        ("We open at 8 a.m. on Saturday.", ["We open at 8 a.m. on Saturday."]),
        ("We close at 5 p.m. Call us tomorrow.", ["We close at 5 p.m.", "Call us tomorrow."]),
        ("Your slot is at 2 p.m. Friday.", ["Your slot is at 2 p.m. Friday."]),
        ("We open at 9 a.m. Eastern time.", ["We open at 9 a.m. Eastern time."]),
        ("Come at 10 a.m. Dr. Lee will be in.", ["Come at 10 a.m.", "Dr. Lee will be in."]),
        ("At 9 a.m. Dr. Lee starts her rounds.", ["At 9 a.m. Dr. Lee starts her rounds."]),
        ("Is 10 a.m. OK? Great.", ["Is 10 a.m. OK?", "Great."]),
        ("We are open 8 a.m. 7 days a week.", ["We are open 8 a.m. 7 days a week."]),
        ("Call between 9 a.m.-5 p.m. We are closed at night.",
         ["Call between 9 a.m.-5 p.m.", "We are closed at night."]),
        ("The lab closes at 4 PM. Please come early.", ["The lab closes at 4 PM.", "Please come early."]),
        ("Fasting starts at 10 p.m. the night before.", ["Fasting starts at 10 p.m. the night before."]),
        ("Hours: 9 a.m. – 5 p.m. on weekdays.", ["Hours: 9 a.m. – 5 p.m. on weekdays."]),
        ("Walk-ins 8 a.m. / 6 p.m. Saturday.", ["Walk-ins 8 a.m. / 6 p.m. Saturday."]),
    ],
    "initials": [
        ("Your doctor is J. R. Smith.", ["Your doctor is J. R. Smith."]),
        ("Please ask for Anna E. Lopez at the desk.", ["Please ask for Anna E. Lopez at the desk."]),
        ("That is plan B. It covers dental.", ["That is plan B.", "It covers dental."]),
        ("You need vitamin D. Did the doctor say so?", ["You need vitamin D.", "Did the doctor say so?"]),
        ("You need vitamin D. Dr. Lee will explain.", ["You need vitamin D.", "Dr. Lee will explain."]),
        ("Dr. A. Nguyen will call.", ["Dr. A. Nguyen will call."]),
    ],
    "acronyms": [
        ("We accept U.S. insurance plans.", ["We accept U.S. insurance plans."]),
        ("We only treat patients in the U.S. Do you live here?",
         ["We only treat patients in the U.S.", "Do you live here?"]),
        ("He served in the U.S. Army for years.", ["He served in the U.S. Army for years."]),
        ("She trained in the U.S.A. and Canada.", ["She trained in the U.S.A. and Canada."]),
        ("We have a site in Washington, D.C. It opened in May.",
         ["We have a site in Washington, D.C.", "It opened in May."]),
        ("Take it b.i.d. Avoid alcohol.", ["Take it b.i.d.", "Avoid alcohol."]),
        ("Dr. Kim, M.D. will see you.", ["Dr. Kim, M.D. will see you."]),
    ],
    "addresses": [
        ("We are at 123 Main St. Suite 4.", ["We are at 123 Main St. Suite 4."]),
        ("We are at 123 Main St. Parking is in the back.", ["We are at 123 Main St.", "Parking is in the back."]),
        ("Our clinic is at 450 Oak Ave. Apt. 2 is upstairs.", ["Our clinic is at 450 Oak Ave. Apt. 2 is upstairs."]),
        ("It is on 5th St. near the light.", ["It is on 5th St. near the light."]),
        ("Visit St. Luke's clinic today.", ["Visit St. Luke's clinic today."]),
        ("She trained at St. Mary's. Now she is here.", ["She trained at St. Mary's.", "Now she is here."]),
        ("It's at 10 St. Paul St. Suite 5.", ["It's at 10 St. Paul St. Suite 5."]),
        ("Go to 9 Elm Rd. The door is blue.", ["Go to 9 Elm Rd.", "The door is blue."]),
        ("The office is at 1 Park Ave. NW, second floor.", ["The office is at 1 Park Ave. NW, second floor."]),
    ],
    "web_and_email": [
        ("Visit www.riverside-clinic.com. You can book online.",
         ["Visit www.riverside-clinic.com.", "You can book online."]),
        ("Email appointments@clinic.org. We reply in a day.", ["Email appointments@clinic.org.", "We reply in a day."]),
        ("Email Jane.Doe@clinic.org for forms.", ["Email Jane.Doe@clinic.org for forms."]),
        ("Go to https://clinic.example.org/book?day=mon. Pick a time.",
         ["Go to https://clinic.example.org/book?day=mon.", "Pick a time."]),
        ("Our site clinic.com/forms has the forms.", ["Our site clinic.com/forms has the forms."]),
    ],
    "quotes_and_brackets": [
        ('The nurse said, "Drink water." Then she left.', ['The nurse said, "Drink water."', "Then she left."]),
        ('The nurse said, "Drink water." she told me twice.', ['The nurse said, "Drink water." she told me twice.']),
        ("He asked, 'Is it covered?' and I said yes.", ["He asked, 'Is it covered?' and I said yes."]),
        ("She said, ‘Bring your card.’ Then she hung up.", ["She said, ‘Bring your card.’", "Then she hung up."]),
        ("Bring your card (and an ID). We need both.", ["Bring your card (and an ID).", "We need both."]),
        ("Take it with food (Dr. Lee said so.) and water.", ["Take it with food (Dr. Lee said so.) and water."]),
        ("(Please bring your ID.) Then check in.", ["(Please bring your ID.)", "Then check in."]),
        ('He said "no". Then he called back.', ['He said "no".', "Then he called back."]),
    ],
    "ellipses": [
        ("Let me check... yes, we have an opening.", ["Let me check... yes, we have an opening."]),
        ("Let me check... Dr. Kim is free at 3.", ["Let me check...", "Dr. Kim is free at 3."]),
        ("Hmm... I think so.", ["Hmm... I think so."]),
        ("Let me see…Tuesday works.", ["Let me see…Tuesday works."]),
        ("Your results are fine… Please call if you feel worse.",
         ["Your results are fine…", "Please call if you feel worse."]),
        ("It was . . . well, fine . . . . Next time call us.",
         ["It was . . . well, fine . . . .", "Next time call us."]),
        # A period, then a spaced ellipsis opening the next sentence (the golden rules' "4-dot ellipsis").
        ("We checked. . . . The results are fine.", ["We checked.", ". . . The results are fine."]),
        ("The leaflet says “rest [...] and drink water” (page 2).",
         ["The leaflet says “rest [...] and drink water” (page 2)."]),
        ("Omitted [...] Then it goes on.", ["Omitted [...] Then it goes on."]),
        ("The count is 1... 2... 3 now.", ["The count is 1... 2... 3 now."]),
        ("I never meant that.... She left.", ["I never meant that....", "She left."]),
    ],
    "lists": [
        ("1. Fill out the form. 2. Sign it.", ["1. Fill out the form.", "2. Sign it."]),
        ("1. Bring ID.\n2. Bring your insurance card.", ["1. Bring ID.", "2. Bring your insurance card."]),
        ("1. Bring ID\n2. Bring your insurance card", ["1. Bring ID", "2. Bring your insurance card"]),
        ("1) Bring ID 2) Bring your card", ["1) Bring ID", "2) Bring your card"]),
        ("1.) Check in 2.) Wait to be called", ["1.) Check in", "2.) Wait to be called"]),
        ("a. Call us b. Book a slot c. Come in", ["a. Call us", "b. Book a slot", "c. Come in"]),
        ("• Bring ID • Bring your card", ["• Bring ID", "• Bring your card"]),
        ("Bring three things: 1. your ID, 2. your card, and 3. a list of medicines.",
         ["Bring three things: 1. your ID, 2. your card, and 3. a list of medicines."]),
        ("Steps: 1. Call us. 2. Come in.", ["Steps: 1. Call us.", "2. Come in."]),
        ("Please bring: 1. Your ID 2. Your card", ["Please bring: 1. Your ID", "2. Your card"]),
        ("1. Take 2 tablets daily.", ["1. Take 2 tablets daily."]),
    ],
    "newlines": [
        ("Thank you for calling.\n\nHow can I help?", ["Thank you for calling.", "How can I help?"]),
        ("Our hours:\nMonday to Friday 8 to 5\nSaturday 9 to 12",
         ["Our hours:", "Monday to Friday 8 to 5", "Saturday 9 to 12"]),
        ("Please bring:\n- your ID\n- your insurance card", ["Please bring:", "- your ID", "- your insurance card"]),
        ("Please arrive fifteen minutes \nearly for paperwork.",
         ["Please arrive fifteen minutes early for paperwork."]),
        ("Our hours:\nweekdays 8 to 5\nweekends closed", ["Our hours:", "weekdays 8 to 5", "weekends closed"]),
        ("A wrapped line \nthen a break.\nthen a new line.", ["A wrapped line then a break.", "then a new line."]),
        ("Take it at night.\nthen rest", ["Take it at night.", "then rest"]),
        ("A soft wrap \n\nis a paragraph when the line is blank.",
         ["A soft wrap", "is a paragraph when the line is blank."]),
        ("We are on Main St.\nParking is free.", ["We are on Main St.", "Parking is free."]),
        ("Windows line ends.\r\nSecond line.\r\n", ["Windows line ends.", "Second line."]),
        ("\n\nLeading blank lines.\n", ["Leading blank lines."]),
    ],
    "missing_space": [
        ("Hello there.Today is Tuesday.", ["Hello there.", "Today is Tuesday."]),
        ("We billed 1,000.That is all.", ["We billed 1,000.", "That is all."]),
        ("She has a Ph.D. in nursing.", ["She has a Ph.D. in nursing."]),
        ("Ask Mr.Smith please.", ["Ask Mr.Smith please."]),
    ],
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [pytest.param(text, expected, id=f"{rule}-{n}") for rule, cases in RULES.items() for n, (text, expected)
     in enumerate(cases)],
)
def test_rule(text: str, expected: list[str]) -> None:
    assert_splits(text, expected)


def test_brief_token_pieces():
    """The token pieces of the issue: " a", ".m", "." must not end the sentence at "a." or "a.m."."""
    pieces = [" We", " open", " at", " 8", " a", ".m", ".", " on", " Saturday", ".", " Call", " us", "."]
    sentences, per_feed = run(pieces)
    assert sentences == ["We open at 8 a.m. on Saturday.", "Call us."]
    assert per_feed[pieces.index(" Call")] == ["We open at 8 a.m. on Saturday."]
    assert all(not batch for k, batch in enumerate(per_feed) if k != pieces.index(" Call"))


# ---------------------------------------------------------------------------------------------------------------
# Streaming behaviour
# ---------------------------------------------------------------------------------------------------------------


def emitted_after(text: str) -> int | None:
    """How many characters had been fed when the first sentence came out of feed() (None: only at flush)."""
    splitter = SentenceSplitter()
    for k, char in enumerate(text, start=1):
        if splitter.feed(char):
            return k
    return None


@pytest.mark.parametrize(
    ("text", "first", "lookahead"),
    [
        ("Hello there. We", "Hello there.", 2),  # the space and the next letter
        ("Is it urgent? Please", "Is it urgent?", 2),
        ('He said "Stop." Then', 'He said "Stop."', 2),
        ("We close at 5 p.m. Call", "We close at 5 p.m.", 3),  # "Ca" is no time zone, day or month
        ("We close at 5 p.m. Thanks", "We close at 5 p.m.", 4),  # "Th" could be Thursday, "Tha" not
        ("He is Lee Jr. They said", "He is Lee Jr.", 6),  # the whole "They" and what ends it
        ("Thank you.\n\nBye", "Thank you.", 3),
        ("Our hours:\nMonday", "Our hours:", 2),
    ],
)
def test_emits_as_soon_as_settled(text: str, first: str, lookahead: int) -> None:
    end = text.index(first) + len(first)
    assert emitted_after(text) == end + lookahead
    splitter = SentenceSplitter()
    assert splitter.feed(text[: end + lookahead - 1]) == []
    assert splitter.feed(text[end + lookahead - 1]) == [first]


def test_waits_when_not_settled():
    splitter = SentenceSplitter()
    assert splitter.feed("Please see Dr.") == []
    assert splitter.feed(" ") == []
    assert splitter.feed("S") == []  # a title: never a boundary, but nothing else is complete either
    assert splitter.feed("mith today. ") == []
    assert splitter.feed("T") == ["Please see Dr. Smith today."]
    assert splitter.flush() == ["T"]


def test_first_sentence_before_stream_ends():
    """Whenever the next sentence has begun, the first one comes out of feed(), not flush()."""
    for rule, cases in RULES.items():
        for text, expected in cases:
            if len(expected) < 2:
                continue
            end = len(text) - len(text.lstrip()) + len(expected[0])
            k = emitted_after(text)
            assert k is not None and k <= len(text), (rule, text)
            assert k - end <= 8, (rule, text, k - end)


def test_flush_returns_rest_and_resets():
    splitter = SentenceSplitter()
    assert splitter.feed("First one. Second") == ["First one."]
    assert splitter.flush() == ["Second"]
    assert splitter.flush() == []
    assert splitter.feed("Again. And") == ["Again."]
    assert splitter.flush() == ["And"]


def test_flush_decides_pending_boundaries():
    """At the end of the stream an undecided look-ahead is decided with what there is."""
    assert split_sentences("We close at 5 p.m. Call") == ["We close at 5 p.m.", "Call"]
    assert split_sentences("We close at 5 p.m. Sat") == ["We close at 5 p.m. Sat"]
    assert split_sentences("Hello.") == ["Hello."]
    assert split_sentences("") == []
    assert split_sentences("   \n ") == []


def test_spans_and_emission_times():
    text = "  Thank you.  Dr. Lee is in.\nBye"
    splitter = SentenceSplitter()
    spans: list[Sentence] = []
    for char in text:
        spans += splitter.feed_spans(char)
    spans += splitter.flush_spans()
    assert [s.text for s in spans] == ["Thank you.", "Dr. Lee is in.", "Bye"]
    for span in spans:
        assert text[span.start:span.end] == span.text
        assert span.emitted_at >= span.end
    assert spans[0].emitted_at == text.index("Dr") + 1
    assert spans[1].emitted_at == text.index("Bye") + 1
    assert spans[2].emitted_at == len(text)


def test_spans_survive_buffer_compaction():
    text = " ".join(f"Sentence number {k} is here." for k in range(300))
    splitter = SentenceSplitter()
    spans: list[Sentence] = []
    for piece in llm_pieces(text):
        spans += splitter.feed_spans(piece)
    spans += splitter.flush_spans()
    assert len(spans) == 300
    assert all(text[s.start:s.end] == s.text for s in spans)


# ---------------------------------------------------------------------------------------------------------------
# Properties: any chunking gives the same answer; nothing is lost; nothing is retracted
# ---------------------------------------------------------------------------------------------------------------

_VOCAB = [
    "Dr.", "Smith", "we", "open", "at", "8", "a.m.", "p.m.", "on", "Saturday", "Call", "us", "U.S.", "3.5", "mg",
    "$12.50", "etc.", "It", "is", "St.", "Main", "Suite", "4", "No.", "5", "e.g.", "J.", "R.", "I", "...", "…",
    "?", "!", "?!", ".", ".", ".", "\n", "\n\n", "1.", "2)", "(", ")", '"', "“", "”", "'", "www.clinic.com",
    "info@clinic.org", "The", "Please", "bring", "ID", "Inc.", "Co.", "approx.", "Jan.", "Mon.", "vs.", "Rm.",
    "world.Today", "E.", "St.", "Paul", "5th", "•", "a.", "b.", ",", ":", "-",
]


def random_text(rng: random.Random, words: int) -> str:
    out = []
    for _ in range(words):
        out.append(rng.choice(_VOCAB))
        out.append(rng.choice([" ", " ", " ", "", "  ", "\t"]))
    return "".join(out)


def random_chunks(rng: random.Random, text: str) -> list[str]:
    chunks, k = [], 0
    while k < len(text):
        step = rng.choice([1, 1, 2, 3, 5, 8, 13])
        chunks.append(text[k:k + step])
        k += step
    return chunks


@pytest.mark.parametrize("seed", range(40))
def test_any_chunking_same_sentences_no_retraction(seed: int) -> None:
    rng = random.Random(seed)
    text = random_text(rng, rng.randint(5, 80))
    whole = split_sentences(text)
    for chunks in (list(text), llm_pieces(text), random_chunks(rng, text), random_chunks(rng, text)):
        splitter = SentenceSplitter()
        got: list[str] = []
        for chunk in chunks:
            got += splitter.feed(chunk)
            # No retraction: what has been emitted is already, and stays, a prefix of the final answer.
            assert got == whole[: len(got)]
        got += splitter.flush()
        assert got == whole


@pytest.mark.parametrize("seed", range(40))
def test_reproduces_text_modulo_whitespace(seed: int) -> None:
    rng = random.Random(1000 + seed)
    text = random_text(rng, rng.randint(5, 80))
    sentences = split_sentences(text)
    assert squash(" ".join(sentences)) == squash(text)
    assert all(s == s.strip() and s for s in sentences)
    # Each sentence is verbatim text, in order (a soft-wrapped line break is read as one space).
    position = 0
    for sentence in sentences:
        pattern = r"\s+".join(re.escape(part) for part in sentence.split())
        match = re.compile(pattern).search(text, position)
        assert match is not None and not text[position:match.start()].strip()
        position = match.end()


@pytest.mark.parametrize("seed", range(10))
def test_rule_cases_under_random_chunkings(seed: int) -> None:
    rng = random.Random(2000 + seed)
    for cases in RULES.values():
        for text, expected in cases:
            assert run(random_chunks(rng, text))[0] == expected, text


# ---------------------------------------------------------------------------------------------------------------
# Cost: linear in the length of the stream
# ---------------------------------------------------------------------------------------------------------------


def _time_feed(pieces: list[str]) -> float:
    splitter = SentenceSplitter()
    started = time.perf_counter()
    for piece in pieces:
        splitter.feed(piece)
    splitter.flush()
    return time.perf_counter() - started


@pytest.mark.parametrize(
    "unit",
    [
        "Dr. Lee sees patients at 8 a.m. on Mon. and Wed. The copay is $12.50. Call 555-0123! ",
        "and then we wait and wait, with no end in sight ",  # one endless sentence: the buffer keeps growing
        "etc ",  # a pending question re-examined often
    ],
)
def test_feed_is_linear(unit: str) -> None:
    small = llm_pieces(unit * 400)
    large = llm_pieces(unit * 3200)
    best_small = min(_time_feed(small) for _ in range(3))
    best_large = min(_time_feed(large) for _ in range(3))
    # 8x the text: linear is about 8x the time, quadratic about 64x.
    assert best_large < best_small * 20 + 0.05


# ---------------------------------------------------------------------------------------------------------------
# On a timed stream (the lab's sentence step, `voice-llm call`, the Locust caller)
# ---------------------------------------------------------------------------------------------------------------


def _timed(*pieces: str) -> list[Chunk]:
    return [Chunk(10.0 * (i + 1), text) for i, text in enumerate(pieces)]


def test_the_rule_on_a_stream_is_known_when_the_whitespace_arrives() -> None:
    chunks = _timed("It costs 3", ".5 dollars", ".", " Bring", " cash.")
    assert first_sentence_by_rule(chunks, 99.0) == ("It costs 3.5 dollars.", 40.0)  # the space, not the period


def test_the_rule_on_a_stream_without_a_sentence_end_is_the_whole_text_at_the_end() -> None:
    assert first_sentence_by_rule(_timed("Yes", " please"), 99.0) == ("Yes please", 99.0)
    assert first_sentence_by_rule([], 5.0) == ("", 5.0)


def test_the_splitter_on_a_stream_settles_at_the_next_word() -> None:
    chunks = _timed("See Dr", ".", " Smith", " at", " 5 p", ".m", ".", " Bring", " ID.")
    assert first_sentence_by_splitter(chunks, 99.0) == ("See Dr. Smith at 5 p.m.", 80.0)
    assert first_sentence_by_rule(chunks, 99.0) == ("See Dr.", 30.0)  # the brief's literal rule cuts at "Dr."


def test_the_splitter_on_a_stream_without_an_end_flushes_at_the_end() -> None:
    assert first_sentence_by_splitter(_timed("Hello", " there"), 99.0) == ("Hello there", 99.0)
