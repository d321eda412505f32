"""Score sentence splitting for text-to-speech: the streaming SentenceSplitter vs the brief's rule.

    python benchmarks/sentence_eval.py [cases.jsonl] [--out results.md]

Each case is one JSON object per line: {"text": ..., "sentences": [...], "rule": short tag}. Both methods see
the text one character at a time, as a stream:

* splitter — ``SentenceSplitter().feed(char)`` for every character, then ``flush()``;
* brief's rule — cut at ``first_sentence_end`` (a [.!?] followed by whitespace), strip, repeat on the rest; in
  a stream the first cut is known when that whitespace character arrives.

Reported per method: exact segmentation (the list of sentences equals the expected list), the share of
multi-sentence cases whose first sentence was emitted before the text ended, how many of those first sentences
were right, and the delay — characters fed after the true end of the first sentence when it was emitted
(for the right ones). The table goes to stdout and, as Markdown, to ``benchmarks/results/sentence_eval.md``
(for another cases file: ``sentence_eval.<name>.md`` beside it, unless ``--out`` says otherwise).
Imports only voice_llm and the standard library.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from voice_llm.core.sentences import SentenceSplitter, first_sentence_end
from voice_llm.core.util.stats import median  # the one median rule (decision 0007)

HERE = Path(__file__).resolve().parent
DEFAULT_CASES = HERE / "sentence_cases.jsonl"
RESULTS = HERE / "results"


@dataclass(frozen=True)
class Case:
    text: str
    sentences: list[str]
    rule: str


@dataclass(frozen=True)
class Outcome:
    """What one method did with one case. ``first_at`` is how many characters had been fed when the first
    sentence was emitted, or None when it only came out at the end of the text."""

    sentences: list[str]
    first_at: int | None


@dataclass(frozen=True)
class Score:
    name: str
    cases: int
    exact: int
    multi: int
    early: int  # multi-sentence cases whose first sentence was emitted before the text ended
    early_right: int  # ... and was the right first sentence
    delays: list[int]  # characters after the true end of the first sentence, for the early and right ones
    failures: list[tuple[Case, Outcome]]


def load(path: Path) -> list[Case]:
    cases = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record.get("text"), str) or not isinstance(record.get("sentences"), list):
            raise SystemExit(f"{path}:{number}: need 'text' (string) and 'sentences' (list)")
        cases.append(Case(record["text"], [str(s) for s in record["sentences"]], str(record.get("rule", ""))))
    return cases


def run_splitter(text: str) -> Outcome:
    splitter = SentenceSplitter()
    sentences: list[str] = []
    first_at = None
    for fed, char in enumerate(text, start=1):
        done = splitter.feed(char)
        if done and first_at is None:
            first_at = fed
        sentences += done
    sentences += splitter.flush()
    return Outcome(sentences, first_at)


def run_brief_rule(text: str) -> Outcome:
    sentences: list[str] = []
    rest = text
    while True:
        end = first_sentence_end(rest)
        if end is None:
            break
        if rest[:end].strip():
            sentences.append(rest[:end].strip())
        rest = rest[end:]
    if rest.strip():
        sentences.append(rest.strip())
    first = first_sentence_end(text)
    # Streamed, the cut is known when the whitespace after the punctuation arrives: first + 1 characters.
    return Outcome(sentences, None if first is None else first + 1)


def true_first_end(case: Case) -> int | None:
    """Where the expected first sentence ends in the text (None if it is not a verbatim part of it)."""
    if not case.sentences:
        return None
    at = case.text.find(case.sentences[0])
    return None if at < 0 else at + len(case.sentences[0])


def score(name: str, cases: list[Case], method) -> Score:
    exact = multi = early = early_right = 0
    delays: list[int] = []
    failures = []
    for case in cases:
        outcome = method(case.text)
        if outcome.sentences == case.sentences:
            exact += 1
        else:
            failures.append((case, outcome))
        if len(case.sentences) < 2:
            continue
        multi += 1
        if outcome.first_at is None:
            continue
        early += 1
        if outcome.sentences[:1] != case.sentences[:1]:
            continue
        early_right += 1
        end = true_first_end(case)
        if end is not None:
            delays.append(outcome.first_at - end)
    return Score(name, len(cases), exact, multi, early, early_right, delays, failures)


def pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "-"


def summary_rows(scores: list[Score]) -> list[list[str]]:
    rows = [["", *(s.name for s in scores)]]
    rows.append(["exact segmentation", *(pct(s.exact, s.cases) for s in scores)])
    rows.append(["first sentence emitted before the text ended (multi-sentence cases)",
                 *(pct(s.early, s.multi) for s in scores)])
    rows.append(["... and it was the right first sentence", *(pct(s.early_right, s.multi) for s in scores)])
    rows.append(["delay of a right first sentence after its true end, median / max (chars)",
                 *(f"{median(s.delays):g} / {max(s.delays)}" if s.delays else "-" for s in scores)])
    return rows


def failure_lines(score_: Score) -> list[str]:
    lines = []
    for case, outcome in score_.failures:
        lines.append(f"[{case.rule}] {json.dumps(case.text, ensure_ascii=False)}")
        lines.append(f"    expected {json.dumps(case.sentences, ensure_ascii=False)}")
        lines.append(f"    got      {json.dumps(outcome.sentences, ensure_ascii=False)}")
    return lines


def text_report(cases_path: Path, scores: list[Score]) -> str:
    rows = summary_rows(scores)
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    out = [f"Sentence splitting on {cases_path.name}: {scores[0].cases} cases, fed one character at a time", ""]
    for row in rows:
        out.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for s in scores:
        out += ["", f"{s.name}: {len(s.failures)} failing case(s)"]
        out += ["  " + line for line in failure_lines(s)]
    return "\n".join(out) + "\n"


def markdown_report(cases_path: Path, cases: list[Case], scores: list[Score]) -> str:
    def md(cell: str) -> str:
        return cell.replace("|", "\\|").replace("\n", "\\n")

    rows = summary_rows(scores)
    out = [
        "# Sentence splitting for TTS: SentenceSplitter vs the brief's rule",
        "",
        f"Generated by `python benchmarks/sentence_eval.py` from `{cases_path.name}` ({len(cases)} cases). "
        "Both methods see the text one character at a time. *Delay* is the number of characters fed after the "
        "true end of the first sentence when it was emitted (the splitter needs the next non-space character, "
        "sometimes the next word; the brief's rule needs the whitespace, and cuts too early at 'Dr.' or 'a.m.').",
        "",
        "| " + " | ".join(md(c) for c in rows[0]) + " |",
        "|" + "---|" * len(rows[0]),
    ]
    out += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows[1:]]
    for s in scores:
        out += ["", f"## Failing cases: {s.name} ({len(s.failures)})", ""]
        if s.failures:
            out += ["```", *failure_lines(s), "```"]
        else:
            out.append("None.")
    out += ["", "## First-sentence delay per multi-sentence case", "",
            "| rule | text | " + " | ".join(s.name for s in scores) + " |", "|---|---|" + "---|" * len(scores)]
    methods = {"splitter": run_splitter, "brief's rule": run_brief_rule}
    for case in cases:
        if len(case.sentences) < 2:
            continue
        end = true_first_end(case)
        cells = []
        for s in scores:
            outcome = methods[s.name](case.text)
            if outcome.first_at is None:
                cells.append("at end")
            else:
                mark = "" if outcome.sentences[:1] == case.sentences[:1] else " (wrong cut)"
                cells.append(("?" if end is None else f"{outcome.first_at - end:+d}") + mark)
        out.append(f"| {md(case.rule)} | {md(case.text)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="?", type=Path, default=DEFAULT_CASES, help="JSONL cases file")
    parser.add_argument("--out", type=Path, help="Markdown output (default: benchmarks/results/sentence_eval.md)")
    args = parser.parse_args(argv)
    cases = load(args.cases)
    if not cases:
        raise SystemExit(f"{args.cases}: no cases")
    scores = [score("splitter", cases, run_splitter), score("brief's rule", cases, run_brief_rule)]
    sys.stdout.write(text_report(args.cases, scores))
    out = args.out
    if out is None:
        same = args.cases.resolve() == DEFAULT_CASES.resolve()
        out = RESULTS / ("sentence_eval.md" if same else f"sentence_eval.{args.cases.stem}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown_report(args.cases, cases, scores), encoding="utf-8")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
