"""Every exit status comes from the one table (voice_llm.core.errors.EXIT_TABLE; issue 42 item 4: load/sweep.py
returned 2/1/130 of its own): a command's entry function (main, cmd_*, run_command) returns a name of the table, never
a number, except sse.py, which stands alone on the standard library and says which of the table's values it uses."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "voice_llm"
STANDS_ALONE = {"sse.py"}


def literal_exits(source: str) -> list[int]:
    """Line numbers of ``return <int>`` in the entry functions of ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name in ("main", "run_command") or node.name.startswith("cmd_")):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return) and isinstance(inner.value, ast.Constant) and \
                        type(inner.value.value) is int:
                    found.append(inner.lineno)
    return found


def test_entry_functions_return_the_tables_names() -> None:
    bad = [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
           if path.name not in STANDS_ALONE for line in literal_exits(path.read_text())]
    assert not bad, bad


def test_a_planted_number_is_found() -> None:
    assert literal_exits("def main():\n    return 130\n") == [2]
    assert literal_exits("def main():\n    return EXIT_OK\n") == []
