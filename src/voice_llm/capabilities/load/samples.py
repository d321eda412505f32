"""The raw samples CSV of a load run: one row per turn, written and read back with the same columns and types.

Floats are written with ``repr`` so that reading them back gives the very same numbers: `check` recomputes every
percentile of load.json from this file and compares them exactly.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from voice_llm.core.util.artifacts import read_artifact_text, write_bytes_atomic
from voice_llm.core.errors import ArtifactError
from voice_llm.capabilities.load.stats import AGENT_STAGES, DIAL_FIELDS, SAMPLE_FIELDS, stage_column

_INTS = ("slots", "step", "callers", "call", "turn", "tokens", "prompt_n", "cache_n", "call_frames", "late_frames",
         "t0_epoch_ns")
_FLOATS = ("start", "ttft_ms", "first_sentence_ms", "e2e_ms", "itl_p50_ms", "itl_p99_ms", "prompt_ms",
           "heard_gap_ms", "speech_end_ms", "first_sound_ms", "barge_in_heard_after_onset_ms", "agent_reported_ms",
           *(stage_column(stage) for stage in AGENT_STAGES))
_BOOLS = ("cancelled", "refused", "barge_in")
# Columns added after the first load runs: a file without them reads as None there rather than being refused.
_ADDED_LATER = ("prompt_ms", *DIAL_FIELDS)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_samples(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(SAMPLE_FIELDS)
    for row in rows:
        writer.writerow([_cell(row.get(name)) for name in SAMPLE_FIELDS])
    return write_bytes_atomic(path, buf.getvalue().encode("utf-8"))


def _parse(name: str, text: str) -> Any:
    if text == "":
        return None
    if name in _INTS:
        return int(text)
    if name in _FLOATS:
        return float(text)
    if name in _BOOLS:
        return text == "true"
    return text


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path``, read through artifacts.read_artifact_text (a regular file inside OUT, bounded);
    anything the csv module refuses (a field over its 131,072-character limit, a stray NUL) is one ArtifactError."""
    text = read_artifact_text(path)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        missing = set(SAMPLE_FIELDS) - set(reader.fieldnames or ()) - set(_ADDED_LATER)
        if missing:
            raise ArtifactError(f"{path.name} lacks the columns {', '.join(sorted(missing))}")
        return [{name: _parse(name, row.get(name) or "") for name in SAMPLE_FIELDS} for row in reader]
    except csv.Error as exc:
        raise ArtifactError(f"{path.name} is not a readable CSV file: {exc}") from exc
    except ValueError as exc:
        raise ArtifactError(f"{path.name} has a cell that is not a number where one is expected: {exc}") from exc
