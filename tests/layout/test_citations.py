"""Every citation of a document heading resolves (issue 42 item 6). The code cites its reasons by heading:
`BENCHMARKS.md "Capacity as heard"`, `docs/line.md "Clocks"`. One cited heading ("Cores on purpose") never
existed, and LINE.md, the line contract cited 16 times, was not in the repository. A citation is a document's
name followed (after an optional comma, colon or parenthesis) by a quoted heading; it resolves when a heading of
that document contains the quoted text (case aside). A bare name of a document that is not in the repository
fails too."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("BENCHMARKS.md", "README.md", "docs/line.md", "docs/artifacts.md")
# where citations are written: the package, the benchmarks, the build, the docs themselves
SOURCES = ("src", "benchmarks", "scripts", "docs", "README.md", "BENCHMARKS.md", "Makefile")
CITATION = re.compile(r"(?P<doc>(?:docs/)?[A-Za-z_-]+\.md)[,:]?\s*\(?\s*\"(?P<heading>[^\"\n]{3,120})\"")
BARE_DOCUMENT = re.compile(r"(?<![\w/.-])(?P<doc>(?:docs/)?[A-Z][A-Z_-]+\.md)\b")


def headings(document: Path) -> list[str]:
    return [line.lstrip("#").strip().casefold() for line in document.read_text().splitlines()
            if line.startswith("#")]


def citations(text: str) -> Iterator[tuple[str, str]]:
    for found in CITATION.finditer(text):
        yield found["doc"], found["heading"]


def unresolved(text: str, root: Path = ROOT) -> list[str]:
    """The citations in ``text`` that name no heading of their document, and the documents named that are absent."""
    bad = []
    for doc, heading in citations(text):
        path = root / doc
        if doc not in DOCUMENTS and not path.is_file():
            continue  # a file of someone else's (a quoted name in a docstring), not one of ours
        if not path.is_file():
            bad.append(f"{doc} (no such document)")
        elif not any(heading.casefold() in h for h in headings(path)):
            bad.append(f'{doc} "{heading}"')
    for found in BARE_DOCUMENT.finditer(text):
        if not (root / found["doc"]).is_file():
            bad.append(f"{found['doc']} (no such document)")
    return bad


def _files() -> Iterator[Path]:
    for source in SOURCES:
        path = ROOT / source
        if path.is_file():
            yield path
        else:
            yield from (p for p in path.rglob("*") if p.suffix in (".py", ".md", ".sh", ".txt") and p.is_file())


def test_every_cited_heading_and_document_exists() -> None:
    bad = [f"{path.relative_to(ROOT)}: {what}" for path in _files() for what in unresolved(path.read_text())]
    assert not bad, "\n".join(bad)


def test_a_planted_bad_citation_is_found() -> None:
    assert unresolved('# see BENCHMARKS.md "Capacity as heard" and docs/line.md "Clocks"') == []
    assert unresolved('# see BENCHMARKS.md, "Cores on purpose"') == ['BENCHMARKS.md "Cores on purpose"']
    assert unresolved('"""the contract is LINE.md\'s."""') == ["LINE.md (no such document)"]
    assert unresolved('(docs/line.md "No such heading")') == ['docs/line.md "No such heading"']
