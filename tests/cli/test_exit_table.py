"""One exit-code table for every command (issue 26.4): each code one meaning, the same table in `--help` and in
docs/guarantees.md, and no command keeping codes of its own. In-process: nothing here starts a server."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from voice_llm.core import errors
from voice_llm.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]


def test_each_code_has_one_meaning_and_every_constant_is_in_the_table() -> None:
    codes = [entry.code for entry in errors.EXIT_TABLE]
    assert len(codes) == len(set(codes)), codes
    constants = {name: value for name, value in vars(errors).items() if name.startswith("EXIT_") and isinstance(value, int)}
    assert set(constants.values()) == set(codes), constants
    assert len(set(constants.values())) == len(constants), "two names for one code"
    # the two meanings 4 used to have are two codes now
    assert errors.EXIT_NO_VERDICT != errors.EXIT_REPORT_INCOMPLETE


def test_no_module_defines_exit_codes_of_its_own() -> None:
    """Every command returns the table's names (load included); a literal `EXIT_X = 4` elsewhere is a second table."""
    own = re.compile(r"^\s*EXIT_\w+\s*(?::\s*int\s*)?=\s*\d", re.M)
    found = [str(path.relative_to(ROOT)) for path in (ROOT / "src" / "voice_llm").rglob("*.py")
             if path.name != "errors.py" and own.search(path.read_text(encoding="utf-8"))]
    assert found == []
    from voice_llm.capabilities.load import cli as load_cli

    assert load_cli.EXIT_NO_VERDICT is errors.EXIT_NO_VERDICT
    assert cli.EXIT_REPORT_INCOMPLETE is errors.EXIT_REPORT_INCOMPLETE


def test_the_help_ends_with_the_table() -> None:
    text = cli.build_parser().format_help()
    assert errors.exit_table_text() in text
    for entry in errors.EXIT_TABLE:
        assert re.search(rf"^  {entry.code}\s+{re.escape(entry.meaning)}$", text, re.M), entry
    assert "no verdict" in text and "could not be drawn" in text


def test_the_guarantees_page_quotes_the_same_table() -> None:
    page = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    start = page.index("Exit status of every command")
    block = page[page.index("```\n", start) + 4:]
    block = block[:block.index("```")]
    assert block.rstrip("\n") == errors.exit_table_text()


def _parsed(*argv: str) -> object:
    return cli.build_parser().parse_args(list(argv))


def test_lab_settings_are_told_the_command_not_guessing_it(tmp_path: Path) -> None:
    lab = cli._lab_settings(_parsed("lab", "--port", "18601", "--out", str(tmp_path), "--model", "m.gguf"), "lab")
    assert lab.server.port == 18601 and lab.request_model is None  # the lab starts the GGUF it names
    step = cli._lab_settings(_parsed("ttft", "--url", "http://127.0.0.1:18602", "--out", str(tmp_path),
                                     "--model", "served-name"), "ttft")
    assert step.url == "http://127.0.0.1:18602" and step.request_model == "served-name"


def test_a_usage_error_is_the_tables_usage_code() -> None:
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as stop:
        cli.main(["ttft", "--port", "0"])
    assert stop.value.code == errors.EXIT_USAGE


def test_log_follow_ended_by_ctrl_c_exits_130_like_every_interrupted_command(monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`log -f` is ended by Ctrl-C (or SIGTERM), as `tail -f` is: the table's 130, after the lines it printed, with
    no error line (it was 0, against the table in --help and docs/guarantees.md)."""
    def following(port: int, lines: int, follow: bool = False) -> object:
        yield "srv  listening\n"
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.server, "resolve_log_port", lambda port: 8080)
    monkeypatch.setattr(cli.server, "follow_log", following)
    assert cli.main(["log", "-f"]) == errors.EXIT_INTERRUPTED == 130
    said = capsys.readouterr()
    assert said.out == "srv  listening\n" and said.err == ""
