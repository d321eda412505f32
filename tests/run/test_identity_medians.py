"""One median rule for every artifact: walk the files of the session lab (a real llama-server, make lab's two
repeats, a 4-turn call with a barge-in: every median over the repeats is over an even count, where the upper middle,
the lower middle and their mean differ) and verify that every median field equals ``stats.median`` of its samples;
load's p50 follows the same rule."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from voice_llm.core.util.stats import median
from voice_llm.capabilities.load import stats
from voice_llm.capabilities.speak.artifact import median_run

# Medians whose samples the artifact does not keep, so no walk can recompute them: dial.json's dialer cost is over
# every 20 ms frame of the call (thousands), and the file keeps its median, p90 and max only.
UNSAMPLED = {"dial.json": {("dialer_cost_ms", "median")}}
# Fields beside a ``_min``/``_max`` range that are not medians by design: cancel.json's received tokens and close
# time are the median cut's own (voice_llm.core.lab.cancel.summary_document: together they are one cut, with its
# chunks), the cut picked by the median slot idle time. Verified as that repeat's values instead. (A fake server's
# two cuts made them look like medians: their order followed the close time's; a real server's need not.)
OF_THE_MEDIAN_REPEAT = {"cancel.json": ("received_tokens", "closed_at_ms")}
# The artifacts with one sample per repeat: with the session lab's two repeats, each has a median over an even
# count of distinct samples, so a step that took the lower middle or the mean would be caught in each.
PER_REPEAT = ("prefill.json", "cache.json", "sentence.json", "cancel.json", "audio.json")


@pytest.fixture(scope="module")
def two_repeats(lab_run: tuple[Path, Any]) -> Path:
    """The session lab's folder (read only): two repeats of every step, and the call's four turns."""
    out, _ = lab_run
    return out


def _at(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _medians(doc: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], float, list[float]]]:
    """(where, the median the file states, its samples) for every median in one artifact:
    ``<field>`` beside ``<field>_min``/``_max`` over ``repeats`` (prefill, cache, sentence, cancel); ``<x>_p50``
    over ``runs[].<x>_ms`` (ttft); ``summary.<field>.median`` over ``runs[].<field>`` (audio.json);
    ``summary.heard_gap_ms.median`` over ``turns[].heard.gap_ms``, ``summary.barge_in_heard_after_onset_ms.median``
    over ``turns[].barge_in.heard_after_onset_ms`` and ``summary.heard_minus_reported_ms.median`` over
    ``turns[].heard_minus_reported_ms`` (dial.json, the lab's converse step)."""
    if isinstance(doc, list):
        for i, row in enumerate(doc):
            yield from _medians(row, (*path, str(i)))
        return
    if not isinstance(doc, Mapping):
        return
    turns, summary = doc.get("turns"), doc.get("summary")
    if isinstance(turns, list) and isinstance(summary, Mapping) and isinstance(summary.get("heard_gap_ms"), Mapping):
        # dial.json: each median over the turns that have the number (a turn without it is null, never 0)
        for field, samples in (
                ("heard_gap_ms", [t["heard"]["gap_ms"] for t in turns]),
                ("barge_in_heard_after_onset_ms", [(t["barge_in"] or {}).get("heard_after_onset_ms") for t in turns]),
                ("heard_minus_reported_ms", [t["heard_minus_reported_ms"] for t in turns])):
            if isinstance(summary.get(field), Mapping):
                yield ((*path, "summary", field, "median"), summary[field]["median"],
                       [value for value in samples if value is not None])
    repeats = doc.get("repeats")
    if isinstance(repeats, list) and repeats:
        yield from _beside_ranges(doc, repeats, path, ())
    runs = doc.get("runs")
    if isinstance(runs, list) and runs:
        for key, value in doc.items():
            if key.endswith("_p50"):
                field = key[: -len("_p50")] + "_ms"
                yield (*path, key), value, [run[field] for run in runs]
        summary = doc.get("summary")
        if isinstance(summary, Mapping):
            for field, entry in summary.items():
                yield (*path, "summary", field, "median"), entry["median"], [run[field] for run in runs]
    for key, value in doc.items():
        if key not in ("repeats", "runs", "summary") and isinstance(value, (Mapping, list)):
            yield from _medians(value, (*path, key))


def _beside_ranges(doc: Mapping[str, Any], repeats: list[Any], path: tuple[str, ...],
                   inner: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], float, list[float]]]:
    here = _at(doc, inner)
    for key, value in here.items():
        if isinstance(value, Mapping) and key != "repeats":
            yield from _beside_ranges(doc, repeats, path, (*inner, key))
        elif f"{key}_min" in here and value is not None:
            yield (*path, *inner, key), value, [_at(row, inner)[key] for row in repeats]


def _median_repeat_fields(doc: Any, fields: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """The ``fields`` of a document that are its ``median_repeat``'s own values (cancel.json's), each asserted to be
    that repeat's; the one the step picked the repeat by (the slot idle time, else the close time) stays a median
    for the walk to verify, so the repeat they come from is the median one."""
    if not fields:
        return
    middle = doc["median_repeat"]
    repeat = doc["repeats"][middle - 1]
    by = "slot_idle_after_ms" if doc["slot_idle_after_ms"] is not None else "closed_at_ms"
    assert doc[by] == repeat[by], f"{by} {doc[by]} is not the median repeat's ({middle}): {repeat[by]}"
    for field in fields:
        assert doc[field] == repeat[field], f"{field} {doc[field]} is not the median repeat's ({middle}): {repeat[field]}"
        if field != by:
            yield (field,)


def _every_median_key(doc: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(doc, list):
        for i, row in enumerate(doc):
            yield from _every_median_key(row, (*path, str(i)))
    elif isinstance(doc, Mapping):
        for key, value in doc.items():
            if key == "median" or key.endswith("_p50"):
                yield (*path, key)
            if key != "repeats":
                yield from _every_median_key(value, (*path, key))


@pytest.mark.slow
def test_every_median_of_the_run_is_the_one_rule(two_repeats: Path) -> None:
    out = two_repeats
    checked: dict[str, int] = {}
    even_and_apart: dict[str, int] = {}
    for path in sorted(out.glob("*.json")):
        if path.name in ("run.json", "capabilities.json", "report.json"):
            continue
        doc = json.loads(path.read_text())
        found = list(_medians(doc))
        representative = set(_median_repeat_fields(doc, OF_THE_MEDIAN_REPEAT.get(path.name, ())))
        found = [entry for entry in found if entry[0] not in representative]
        verified = {where for where, _, _ in found} | representative
        apart = 0
        for where, stated, samples in found:
            if not samples:  # a median of nothing is null (dial.json: no turn had the number), never 0
                assert stated is None, f"{path.name} {'.'.join(where)}: {stated} is a median of no sample"
                continue
            assert stated == median(samples), f"{path.name} {'.'.join(where)}: {stated} != median of {samples}"
            if len(samples) % 2 == 0 and len(set(samples)) > 1:
                apart += 1
        # No median field escapes the walk (a new artifact's median must be verifiable the same way).
        unverified = [w for w in _every_median_key(doc) if w not in verified and w not in UNSAMPLED.get(path.name, ())]
        assert not unverified, (path.name, unverified)
        checked[path.name] = len(found)
        even_and_apart[path.name] = apart
    for name in ("ttft.json", *PER_REPEAT, "dial.json"):
        assert checked.get(name), (name, checked)
    # With two repeats the rule matters, in every step that repeats: the upper middle is neither the lower one nor
    # the mean of the two.
    assert all(even_and_apart[name] > 0 for name in PER_REPEAT), even_and_apart
    # audio.json's WAVs are of the run whose TTFA is that median.
    audio = json.loads((out / "audio.json").read_text())
    for strategy in audio["strategies"].values():
        index = median_run(strategy["runs"])
        assert strategy["runs"][index]["ttfa_ms"] == strategy["summary"]["ttfa_ms"]["median"]
        assert strategy["wavs"]["heard"]["run"] == index + 1
    # report.json copies those medians unchanged.
    report = json.loads((out / "report.json").read_text())
    assert report["ttfa_sentences_ms"] == audio["strategies"]["sentences"]["summary"]["ttfa_ms"]["median"]


def test_loads_p50_is_the_same_rule() -> None:
    # Four turns: the nearest-rank p50 was the lower middle (20), the one rule says the upper middle (30).
    samples = [{"ttft_ms": t, "first_sentence_ms": t + 100, "itl_p50_ms": t / 10, "itl_p99_ms": t / 5, "worker": "w"}
               for t in (40.0, 10.0, 30.0, 20.0)]
    step = stats.summarize_step(samples, slo_ms=1000.0, window_s=10.0)
    assert step["ttft_ms"]["p50"] == median([40.0, 10.0, 30.0, 20.0]) == 30.0
    assert step["first_sentence_ms"]["p50"] == 130.0 and step["itl_ms"]["p50"] == 3.0
    assert stats.percentile([1.0, 2.0], 50) == 2.0 and stats.percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 90) == 4.0  # the other percentiles keep nearest rank
