"""report.html and check on a run from a server without llama-server's evidence: token counts and the slot's
idle time are null with a reason; charts still draw from the client clock, the capability table shows what the
server exposed, and check marks the relations it cannot see as not checkable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from voice_llm.core.util.artifacts import CACHE, CANCEL, PREFILL, PROPS, REPORT
from voice_llm.core.client.capabilities import Capabilities, EndpointProbe, StreamProbe
from voice_llm.core.checks.core import NOT_CHECKABLE, run_checks
from voice_llm.core.lab.report import build_report
from voice_llm.core.report.page import render_report

SAMPLE_OUT = Path(__file__).parents[1] / "fixtures" / "sample_out"
NO_TIMINGS = "the stream carries no timings.prompt_n and no usage.prompt_tokens"
NO_SLOTS = "server stop not observable: /slots answered HTTP 404 and /metrics has no requests-in-flight gauge"


def openai_only_capabilities() -> Capabilities:
    endpoints = tuple(EndpointProbe(path, 404) for path in ("/health", "/props", "/slots", "/metrics"))
    stream = StreamProbe(timings_fields=(), usage_fields=(), include_usage_accepted=True, line_ending="LF",
                         comment_lines=0, role_chunk_first=True, done=True, content_chunks=3)
    return Capabilities(base_url="http://127.0.0.1:1", endpoints=(*endpoints, EndpointProbe("/v1/models", 200)),
                        model_ids=("smol",), model="smol", model_source="/v1/models", stream=stream)


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """The sample run as a server without timings, /props or /slots would have left it."""
    out = Path(shutil.copytree(SAMPLE_OUT, tmp_path / "out"))
    (out / "capabilities.json").write_text(json.dumps(openai_only_capabilities().as_dict()))
    (out / "health.json").write_text(json.dumps({"status": "ok", "source": "/v1/models",
                                                 "unknown": {"/health": "/health answered HTTP 404"}}))
    (out / PROPS).write_text(json.dumps({"source": "/v1/models", "default_generation_settings": {"n_ctx": None},
                                         "total_slots": None, "unknown": {"n_ctx": "/props answered HTTP 404"}}))

    def prefill(rows):
        for row in rows:
            row.update(prompt_n=None, prompt_ms=None, cache_n=None,
                       unknown={"prompt_n": NO_TIMINGS, "prompt_ms": NO_TIMINGS, "cache_n": NO_TIMINGS})

    def cache(doc):
        for case in ("first", "second", "changed_suffix", "changed_prefix"):
            doc[case].update(prompt_n=None, cache_n=None)
        doc["unknown"] = {"prompt_n": NO_TIMINGS, "cache_n": NO_TIMINGS}

    edit(out / PREFILL, prefill)
    edit(out / CACHE, cache)
    edit(out / CANCEL, lambda doc: doc.update(slot_idle_after_ms=None, cancel_logged=None,
                                              unknown={"slot_idle_after_ms": NO_SLOTS}))
    (out / REPORT).write_text(json.dumps(build_report(out)))
    return out


def test_check_names_what_it_cannot_see_and_passes_the_rest(out: Path) -> None:
    results = run_checks(out)
    # (The sample folder has no run.json and no repeats: the whole-run and repeat checks are not checkable either.)
    # (Its real call's agent reported no transcript of the caller's lines: dial's WER is not checkable either.)
    unchecked = {r.name: r.detail for r in results
                 if r.status == NOT_CHECKABLE and "run" not in r.name and "repeats" not in r.name
                 and r.name not in ("dial: WER recomputed from the agent's transcripts",
                                    # the fixture's call was made before dial counted false barge-ins
                                    "dial: false barge-ins (the agent cut itself, the caller silent) counted from "
                                    "the files")}
    assert set(unchecked) == {
        "props: context size", "prefill: prompt tokens grow 0 -> 4 -> 12 docs",
        "prefill: server prefill time grows 0 -> 4 -> 12 docs", "cache hit far below miss: prompt tokens",
        "cancel: the server stopped (slot went idle)",
    }
    assert unchecked["cancel: the server stopped (slot went idle)"] == f"slot_idle_after_ms is null: {NO_SLOTS}"
    assert all(" is null: " in detail for detail in unchecked.values())
    # (The sample run has no sse_raw.txt, call.json or load.json: the checks of those fail here.)
    failed = {r.name for r in results if not r.ok}
    assert not failed & set(unchecked)
    checked = {r.name for r in results if r.status != NOT_CHECKABLE}
    assert {"prefill: first token grows 0 -> 4 -> 12 docs", "cache hit far below miss: first-token time",
            "cancel cut the answer", "server answered (health)"} <= checked


def test_a_null_that_was_not_explained_is_still_not_passed(out: Path) -> None:
    edit(out / CANCEL, lambda doc: doc.pop("unknown"))
    result = next(r for r in run_checks(out) if r.name == "cancel: the server stopped (slot went idle)")
    assert result.status == NOT_CHECKABLE and "no reason recorded" in result.detail


def test_the_report_shows_the_capability_table_and_draws_from_the_client_clock(out: Path) -> None:
    page = render_report(out, run_checks(out)).read_text()
    assert 'id="section-capabilities"' in page
    assert "server stop after cancel: null (server stop not observable" in page
    assert "HTTP 404" in page and "model sent: smol (from /v1/models)" in page
    for section in ("prefill", "cache", "cancel"):  # every chart still draws, from the times
        html = page[page.index(f'<section id="section-{section}">'):]
        assert "not available" not in html[: html.index("</section>")], section
    assert "prompt token counts are not shown" in page and "Token counts are not shown" in page
    assert "N/C" in page and " not checkable from these files" in page
