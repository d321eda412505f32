"""docs/cli.md, the CLI reference, generated from the parser (voice_llm.cli.main.build_parser): never kept by hand.

    python scripts/cli_reference.py          # write docs/cli.md (make docs does)
    python scripts/cli_reference.py --check  # exit 1 when docs/cli.md is not what the parser says

Every command's `--help` is rendered in a child process with a fixed environment, so the page is the same on every
machine: 100 columns (argparse wraps to the terminal), HOME set to a stand-in shown as `~` (the default `--out` is
under the user's home), and no VOICE_LLM_* variable (VOICE_LLM_WITHOUT would drop commands, VOICE_LLM_MODEL would
change a default). tests/docs/test_cli_reference.py checks the page against this and against real `--help` output.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"
COLUMNS = "100"
HOME = "/home-of-the-reader"  # replaced by ~ on the page; a path no real home has, so nothing else is replaced

HEADER = """# CLI reference

Every command's `--help`, generated from the parser by `scripts/cli_reference.py` (`make docs` writes it;
`tests/docs/test_cli_reference.py` fails when this page and the parser differ). Exit statuses:
[guarantees](guarantees.md#exit-status).
"""


def environment() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("VOICE_LLM_")}
    env.update(COLUMNS=COLUMNS, HOME=HOME, LC_ALL="C.UTF-8")
    return env


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands, in the order `--help` lists them."""
    for action in parser._actions:  # argparse keeps its subparsers here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _render_here() -> str:
    """The page, from this process's parser (run in the fixed environment: see :func:`render`)."""
    from voice_llm.cli.main import build_parser

    parser = build_parser()
    parts = [HEADER, "## voice-llm", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in commands(parser).items():
        parts += [f"## voice-llm {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts).replace(HOME, "~")


def render() -> str:
    """The page as the parser says it, rendered in a child process with the fixed environment."""
    return subprocess.run([sys.executable, __file__, "--stdout"], env=environment(), capture_output=True,
                          text=True, check=True, timeout=120).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md differs from the parser")
    parser.add_argument("--stdout", action="store_true", help=argparse.SUPPRESS)  # the child of render()
    args = parser.parse_args(argv)
    if args.stdout:
        sys.stdout.write(_render_here())
        return 0
    page = render()
    if args.check:
        if PAGE.read_text(encoding="utf-8") != page:
            print("docs/cli.md differs from the parser: run python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
