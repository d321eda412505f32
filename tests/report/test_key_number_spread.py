"""A key number's range cell comes from the metric the key-number table names (no alias in the page): the
12-document first token, kept as prefill_12docs_ttft_ms among the metrics, shows its three repeats."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from voice_llm.core.analysis.keynumbers import all_key_numbers
from voice_llm.core.analysis.metrics import by_key
from voice_llm.core.report.page import render_report

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_every_key_numbers_metric_exists_or_is_its_own_key() -> None:
    metrics = by_key()
    named = [number for number in all_key_numbers() if number.metric is not None]
    assert named and all(number.metric in metrics for number in named)


def test_the_12_documents_row_shows_the_range_of_its_repeats(tmp_path: Path) -> None:
    out = Path(shutil.copytree(FIXTURES / "sample_run", tmp_path / "out"))
    rows = json.loads((out / "prefill.json").read_text())[-1]["repeats"]
    page = render_report(out, None).read_text()
    row = re.search(r"<tr><th>time to first token with 12 documents[^<]*</th>(.*?)</tr>", page, re.S)
    assert row, page[:2000]
    assert f"over {len(rows)}</td>" in row.group(1), row.group(1)
