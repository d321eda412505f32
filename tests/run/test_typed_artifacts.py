"""Each core artifact parses a real saved run into its typed value, and refuses a malformed copy in one line that
names the file and the field (voice_llm.core.run.artifacts)."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from voice_llm.core.errors import ArtifactError, NoDataError
from voice_llm.core.run import artifacts as typed
from voice_llm.core.run.folder import RunFolder, UnknownSchemaError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAVED = [FIXTURES / "sample_run", FIXTURES / "sample_out"]


def _doc(folder: Path, kind: type[typed.Artifact]) -> Any:
    return json.loads((folder / kind.NAME).read_text())


@pytest.mark.parametrize("saved", SAVED, ids=lambda p: p.name)
@pytest.mark.parametrize("kind", list(typed.TYPED.values()), ids=lambda k: k.NAME)
def test_every_core_artifact_of_a_saved_run_parses(saved: Path, kind: type[typed.Artifact]) -> None:
    value = RunFolder(saved).artifact(kind)
    assert isinstance(value, kind) and value.doc == _doc(saved, kind)


def test_the_values_are_the_files_numbers() -> None:
    folder = RunFolder(FIXTURES / "sample_run")
    ttft = folder.artifact(typed.Ttft)
    doc = _doc(folder.path, typed.Ttft)
    assert [run.ttft_ms for run in ttft.runs] == [run["ttft_ms"] for run in doc["runs"]]
    assert ttft.ttft_p50 == doc["ttft_p50"]
    prefill = folder.artifact(typed.Prefill)
    assert [row.docs for row in prefill.rows] == [0, 4, 12]
    assert prefill.rows[0].samples("ttft_ms") == tuple(r["ttft_ms"] for r in _doc(folder.path, typed.Prefill)[0]["repeats"])
    cache = folder.artifact(typed.Cache)
    assert cache.second is not None and cache.first is not None and cache.second.ttft_ms < cache.first.ttft_ms
    cancel = folder.artifact(typed.Cancel)
    assert cancel.received_tokens == len(cancel.chunks) and cancel.cancel_logged is True
    report = folder.artifact(typed.Report)
    assert report.numbers["ttft_p50_ms"] == ttft.ttft_p50 and "noise" not in report.numbers


def test_a_value_is_parsed_once_per_folder() -> None:
    folder = RunFolder(FIXTURES / "sample_run")
    assert folder.artifact(typed.Sentence) is folder.artifact(typed.Sentence)


def _set(path: list[str | int], value: Any) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        for step in path[:-1]:
            doc = doc[step]
        doc[path[-1]] = value
    return edit


def _drop(path: list[str | int]) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        for step in path[:-1]:
            doc = doc[step]
        del doc[path[-1]]
    return edit


MALFORMED: dict[str, tuple[type[typed.Artifact], Callable[[Any], None], str]] = {
    "health not an object": (typed.Health, lambda d: d.clear() or d.update(route=3), "health.json: route is 3"),
    "props settings a list": (typed.Props, _set(["default_generation_settings"], []),
                              "props.json: default_generation_settings is [], not an object"),
    "ttft run a string": (typed.Ttft, _set(["runs", 2, "ttft_ms"], "x"), "ttft.json: runs[2].ttft_ms is 'x'"),
    "ttft no runs": (typed.Ttft, _drop(["runs"]), "ttft.json has no field 'runs'"),
    "ttft tokens a float": (typed.Ttft, _set(["runs", 0, "tokens"], 1.5), "runs[0].tokens is 1.5, not a whole"),
    "ttft median infinite": (typed.Ttft, _set(["ttft_p50"], float("inf")), "ttft.json: 'ttft_p50' is inf, not a measurement"),
    "prefill docs a string": (typed.Prefill, _set([1, "docs"], "4"), "prefill.json: [1].docs is '4'"),
    "prefill repeat a bool": (typed.Prefill, _set([0, "repeats", 1, "ttft_ms"], True),
                              "prefill.json: [0].repeats[1].ttft_ms is True"),
    "cache no hit": (typed.Cache, _drop(["second"]), "cache.json has no field 'second'"),
    "cache prompt_n a string": (typed.Cache, _set(["first", "prompt_n"], "many"), "cache.json: first.prompt_n is"),
    "sentence text a number": (typed.Sentence, _set(["text"], 5), "sentence.json: text is 5, not a string"),
    "sentence chunk time": (typed.Sentence, _set(["chunks", 3, "t_ms"], None), "sentence.json chunks[3]: 't_ms' is null"),
    "ttft no runs kept": (typed.Ttft, _set(["runs"], []), "ttft.json runs is an empty list"),
    "cancel closed null": (typed.Cancel, _set(["closed_at_ms"], None), "cancel.json: 'closed_at_ms' is null"),
    "cancel logged yes": (typed.Cancel, _set(["cancel_logged"], "yes"), "not true, false or null"),
    "cancel idle a string": (typed.Cancel, _set(["slot_idle_after_ms"], "soon"), "cancel.json: slot_idle_after_ms"),
    "report number a string": (typed.Report, _set(["cache_ttft_ms"], "fast"), "report.json: cache_ttft_ms is 'fast'"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=str)
def test_a_malformed_copy_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    kind, edit, said = MALFORMED[case]
    out = tmp_path / "out"
    shutil.copytree(FIXTURES / "sample_run", out)
    doc = _doc(out, kind)
    edit(doc)
    (out / kind.NAME).write_text(json.dumps(doc))
    folder = RunFolder(out)
    with pytest.raises(ArtifactError) as raised:
        folder.artifact(kind)
    message = str(raised.value)
    assert said in message and "\n" not in message and message.startswith(kind.NAME), message
    with pytest.raises(ArtifactError) as again:  # the refusal is remembered: every reader gets the same line
        folder.artifact(kind)
    assert again.value is raised.value
    # A step that measured nothing (null, NaN, no rows) is told from a malformed file: the report says "no data".
    assert isinstance(raised.value, NoDataError) == (case in NO_MEASUREMENT), case


NO_MEASUREMENT = {"ttft median infinite", "sentence chunk time", "ttft no runs kept", "cancel closed null"}


def test_a_newer_schema_is_refused_by_the_folders_rule() -> None:
    doc = copy.deepcopy(_doc(FIXTURES / "sample_run", typed.Sentence))
    doc["schema_version"] = 99
    with pytest.raises(UnknownSchemaError, match="sentence.json was written by a newer voice-llm"):
        typed.Sentence.parse(doc)


def test_a_document_handed_in_directly_is_held_to_finite_numbers() -> None:
    doc = _doc(FIXTURES / "sample_run", typed.Cancel)
    doc["closed_at_ms"] = float("nan")
    with pytest.raises(NoDataError, match=r"^cancel.json: 'closed_at_ms' is nan, not a measurement$"):
        typed.Cancel.parse(doc)
