"""The README a newcomer reads (issue 42 item 6): at most 200 lines; exactly two set-up commands, `make lab` and
`make test`; every example command is one the parser takes; every link resolves; every page of the docs is linked
from it, so the README is the way in and the pages hold the rest."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from voice_llm.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?:#[^)\s]*)?\)")


def example_commands(text: str) -> list[str]:
    """The indented code lines of a Markdown text that run a command, without their comments and `&`."""
    found = []
    for line in text.splitlines():
        if line.startswith("    ") and line.strip() and not line.lstrip().startswith(("-", "#", "|")):
            found.append(line.split("#", 1)[0].strip().removesuffix("&").strip())
    return found


def test_the_readme_is_at_most_200_lines() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def test_the_only_set_up_commands_are_make_lab_and_make_test() -> None:
    makes = [c for c in example_commands(README.read_text(encoding="utf-8")) if c.startswith("make")]
    assert makes == ["make lab", "make test"]


def test_every_example_is_a_command_the_parser_takes() -> None:
    examples = [c for c in example_commands(README.read_text(encoding="utf-8")) if c.startswith("voice-llm ")]
    assert len(examples) >= 20
    parser = build_parser()
    for example in examples:
        try:
            parser.parse_args(shlex.split(example)[1:])
        except SystemExit:
            pytest.fail(f"the README's example does not parse: {example}")


def test_a_planted_bad_example_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    [example] = example_commands("    voice-llm dial ws://h/ --jitter-msec 40 &  # misspelt\n")
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split(example)[1:])
    assert "--jitter-msec" in capsys.readouterr().err


def test_every_link_resolves_and_every_page_is_linked() -> None:
    text = README.read_text(encoding="utf-8")
    targets = [m["target"] for m in LINK.finditer(text) if not re.match(r"[a-z]+:", m["target"])]
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md") if p.name != "index.md"}
    assert pages - set(targets) == set(), "pages the README does not link"
    assert {"BENCHMARKS.md", "benchmarks/README.md", "docs/decisions/index.md"} <= set(targets)
