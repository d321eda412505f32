"""One median rule (decision 0007, voice_llm.core.util.stats): every median the package, its benchmarks and its
scripts print is the upper middle of the sorted values, never ``statistics.median``'s mean of the two middles. A
benchmark table that put a mean-of-middles "agent's own median" beside dial's upper-middle heard median (the
protocol table did, 2026-12-07) compared two rules on one row."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("src", "benchmarks", "scripts")
OTHER_MEDIANS = {"median", "median_low", "median_high", "median_grouped"}


def other_median_rules(source: str) -> list[int]:
    """The lines of ``source`` that take a median from the statistics module (called, or imported by name)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr in OTHER_MEDIANS and isinstance(node.value, ast.Name)
                and node.value.id == "statistics"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "statistics" and any(
                alias.name in OTHER_MEDIANS for alias in node.names):
            lines.append(node.lineno)
    return lines


def test_every_median_is_the_one_rule() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}"
             for folder in SCANNED for path in sorted((ROOT / folder).rglob("*.py"))
             for line in other_median_rules(path.read_text(encoding="utf-8"))]
    assert not found, "use voice_llm.core.util.stats.median (the one median rule, decision 0007): " + ", ".join(found)


def test_the_scan_finds_a_planted_other_rule() -> None:
    assert other_median_rules("import statistics\nx = statistics.median([1, 2])\n") == [2]
    assert other_median_rules("from statistics import median_low as m\n") == [1]
    assert other_median_rules("from voice_llm.core.util.stats import median\nx = median([1, 2])\n") == []
