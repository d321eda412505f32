"""What a step run alone says when it is done: its key numbers, as the lab's summary table shows them.

The rows are the key numbers (voice_llm.core.analysis.keynumbers, the core's and each capability's) whose source is
one of the step's artifacts, read back from the files it wrote (never from memory), with their labels; a step
whose artifact holds no key number may say its own in a ``numbers(out) -> list[(label, value)]`` function of its
module (call: the cache on against off). A step with nothing to show (health, sse, report) shows no table.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from voice_llm.core.analysis import keynumbers
from voice_llm.core.errors import ArtifactError
from voice_llm.core.lab.steps import steps as registered_steps
from voice_llm.core.run.folder import RunFolder


def shown(value: Any, unit: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"  # a number the server did not expose (null in the artifact)
    return f"{value:.0f} ms" if unit == "ms" else f"{value:g} {unit}"


def step_numbers(out: Path, step: str) -> list[tuple[str, str]]:
    """(label, value) of each key number ``step``'s artifacts in ``out`` hold, in the report's order."""
    entry = registered_steps()[step]
    own = getattr(importlib.import_module(entry.module), "numbers", None)
    if own is not None:
        return list(own(out))
    folder = RunFolder.of(out)
    labels = keynumbers.labels(folder)
    rows = []
    for number in keynumbers.all_key_numbers():
        if number.source not in entry.artifacts or not folder.is_file(number.source):
            continue
        try:
            value = keynumbers.value_of(folder, number)
        except ArtifactError:  # a field the file lacks: the step's own check says so; the table shows the rest
            continue
        rows.append((labels[number.key][0], shown(value, number.unit)))
    return rows
