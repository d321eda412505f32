"""load.json's top as one type (voice_llm.capabilities.load.doc.LoadDoc, issue 42 item 1): what a sweep is judged on is one
property, read by load's checks, report, compare and the command's verdict line alike."""

from __future__ import annotations

from typing import Any

import pytest

from voice_llm.core.errors import ArtifactError
from voice_llm.capabilities.load import checks, cli, compare, report, stats
from voice_llm.capabilities.load.doc import LoadDoc, judged_on
from voice_llm.capabilities.load.document import LOAD_SCHEMA_VERSION, load_document
from voice_llm.capabilities.load.settings import LoadSettings


def a_load(mode: str | None, **more: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"load_schema_version": LOAD_SCHEMA_VERSION, "slo_heard_ms": 1500.0,
                           "slo_first_sentence_ms": 800.0, "goodput_target": 0.9, "sweeps": [], **more}
    if mode is not None:
        doc["mode"] = mode
        doc["metric"] = stats.DIAL_METRIC if mode == "dial" else stats.TEXT_METRIC
    return doc


@pytest.mark.parametrize(("mode", "metric", "slo", "name"), [
    ("dial", stats.DIAL_METRIC, 1500.0, "heard gap"),
    ("text", stats.TEXT_METRIC, 800.0, "first sentence"),
    (None, stats.TEXT_METRIC, 800.0, "first sentence"),  # a file of load_schema_version 1 states no mode
])
def test_a_sweep_is_judged_on_the_heard_gap_when_it_dials(mode: str | None, metric: str, slo: float,
                                                          name: str) -> None:
    judged = LoadDoc.parse(a_load(mode)).judged_on
    assert (judged.metric, judged.slo_ms, judged.name, judged.dialing) == (metric, slo, name, mode == "dial")
    assert judged_on(a_load(mode)) == judged


def test_the_four_readers_say_the_same_rule() -> None:
    """load's checks, report, compare and the verdict line each take the rule from LoadDoc.judged_on."""
    for mode, words in (("dial", "heard gap"), ("text", "first sentence")):
        doc = a_load(mode)
        judged = judged_on(doc)
        assert checks._judged_on(doc) == (judged.metric, judged.slo_ms)
        assert report._judged_on(doc) == (judged.metric, judged.slo_ms, words)
        assert compare._judged(doc) == (judged.metric, judged.slo_ms, words)
        sweep = {"slots": None, "url": "ws://127.0.0.1:18590/", "steps": [],
                 "verdict": {"max_callers": 2, "limited_by": None, "judged_turns": 40, "goodput_target": 0.9,
                             "tested_up_to": 3}}
        assert f"({words} <= {judged.slo_ms:.0f} ms for >= 90 % of turns" in cli.verdict_line(doc, sweep)


def test_a_dial_sweep_judged_on_another_metric_or_without_a_budget_fails_the_check() -> None:
    with pytest.raises(checks.CheckFailed, match="mode dial judged on 'first_sentence_ms'"):
        checks._judged_on({**a_load("dial"), "metric": stats.TEXT_METRIC})
    with pytest.raises(checks.CheckFailed, match="slo_heard_ms is not a finite number: None"):
        checks._judged_on({**a_load("dial"), "slo_heard_ms": None})


def test_a_malformed_or_newer_load_json_is_one_line() -> None:
    with pytest.raises(ArtifactError, match=r"^load.json: slo_heard_ms is 'fast', not a finite number$"):
        LoadDoc.parse(a_load("dial", slo_heard_ms="fast"))
    with pytest.raises(ArtifactError, match=r"load_schema_version 6; this one reads up to 5"):
        LoadDoc.parse(a_load("dial", load_schema_version=LOAD_SCHEMA_VERSION + 1))
    with pytest.raises(ArtifactError, match="load.json is not an object"):
        LoadDoc.parse([])


def test_load_json_round_trips() -> None:
    doc = a_load("dial", sweeps=[{"slots": None, "steps": [{"callers": 1}]}], interrupted=None, caller={"turns": 4})
    assert LoadDoc.parse(doc).as_dict() == doc


def test_the_writer_builds_load_json_as_the_type() -> None:
    """load_document builds load.json through LoadDoc: read back, it is the same document, judged as it says."""
    for settings, metric in ((LoadSettings(), stats.TEXT_METRIC),
                             (LoadSettings(dial="ws://127.0.0.1:18591/", callers=(1, 2)), stats.DIAL_METRIC)):
        doc = load_document(settings, {"turns": 4}, [{"slots": None, "steps": []}])
        found = LoadDoc.parse(doc)
        assert found.as_dict() == doc and list(found.as_dict()) == list(doc)
        assert found.judged_on.metric == metric == found.metric and found.version == LOAD_SCHEMA_VERSION
