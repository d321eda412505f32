"""docs/cli.md is the parser's own `--help` (issue 42 item 6: a CLI reference generated, never hand-kept): the
committed page is what scripts/cli_reference.py renders now, and every command's real `--help`, as `voice-llm`
prints it, is on the page word for word. A flag added to any command (another capability's included) fails here
until `make docs` (or the script) is run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


sys.path.insert(0, str(ROOT / "scripts"))  # the script is not a package module: imported from its folder
try:
    import cli_reference as REFERENCE
finally:
    sys.path.remove(str(ROOT / "scripts"))

# Every command's --help as the installed CLI prints it (voice_llm.cli.main.main, the console script's entry),
# one child process for all of them, in the reference's fixed environment.
HELPS = """
import contextlib, io, json, sys
from voice_llm.cli import main as cli
names = sys.argv[1:]
out = {}
for name in names:
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        try:
            cli.main(([name] if name else []) + ["--help"])
        except SystemExit as stop:
            assert stop.code == 0, (name, stop.code)
    out[name] = text.getvalue()
print(json.dumps(out))
"""


def test_the_committed_reference_is_what_the_parser_says() -> None:
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == REFERENCE.render(), \
        "docs/cli.md is stale: run python scripts/cli_reference.py (make docs does)"


def test_every_commands_real_help_is_on_the_page() -> None:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    from voice_llm.cli.main import build_parser

    names = list(REFERENCE.commands(build_parser()))
    assert {"lab", "dial", "agent", "load", "check", "compare"} <= set(names)
    done = subprocess.run([sys.executable, "-c", HELPS, "", *names], env=REFERENCE.environment(),
                          capture_output=True, text=True, timeout=120, check=True)
    helps = json.loads(done.stdout)
    for name, text in helps.items():
        shown = text.rstrip().replace(REFERENCE.HOME, "~")
        assert f"## voice-llm {name}".rstrip() in page, name
        assert shown in page, f"voice-llm {name} --help is not on docs/cli.md"
        assert shown.startswith(f"usage: voice-llm {name}".rstrip()), shown[:80]


def test_the_page_has_no_machine_of_its_own(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The same page on every machine: another terminal width, home folder or VOICE_LLM_* setting (one that drops a
    capability's command) of the one who runs the script changes nothing."""
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("VOICE_LLM_WITHOUT", "load")
    page = REFERENCE.render()
    assert page == (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "## voice-llm load" in page and str(tmp_path) not in page
    assert "(default: ~/voice/llm)" in page and "(default: ~/voice/dial)" in page


def test_a_stale_page_is_refused_by_check(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    stale = tmp_path / "cli.md"
    stale.write_text(REFERENCE.render().replace("--jitter-ms", "--jitter-msec"), encoding="utf-8")
    monkeypatch.setattr(REFERENCE, "PAGE", stale)
    assert REFERENCE.main(["--check"]) == 1
    assert REFERENCE.main([]) == 0  # writes the page again
    assert REFERENCE.main(["--check"]) == 0
