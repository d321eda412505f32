"""Run identity from files alone: stamps, the manifest, joining or starting a run, and the lock on OUT."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import threading
from pathlib import Path

import pytest

from voice_llm.core.run.folder import RunFolder

from voice_llm.core.run import meta as runmeta
from voice_llm.core.checks.core import FAIL, run_checks
from voice_llm.core.errors import OutputBusyError
from voice_llm.core.run.lock import LOCK_NAME, locked_out

SERVER = runmeta.ServerFacts(url="http://127.0.0.1:1", build_info="b1-abc", model_path="/m/a.gguf", n_ctx=4096,
                             total_slots=1)
PLAN = {"ttft": ("ttft.json",), "sse": ("sse_raw.txt",)}


def _meta(tmp_path: Path, **server: object) -> dict:
    kb = tmp_path / "kb"
    kb.mkdir(exist_ok=True)
    (kb / "01.md").write_text("Open 8-5.")
    facts = runmeta.ServerFacts(**{**SERVER.__dict__, **server})
    return runmeta.collect_metadata(facts, kb)


def _write_run(out: Path, meta: dict) -> runmeta.RunRecord:
    out.mkdir(exist_ok=True)
    record = runmeta.RunRecord.start(out, meta, PLAN)
    data = (json.dumps(runmeta.stamp({"ttft_p50": 1.0}, record.run_id)) + "\n").encode()
    (out / "ttft.json").write_bytes(data)
    record.record_file(out / "ttft.json", data)
    (out / "sse_raw.txt").write_bytes(b"data: [DONE]\n\n")
    record.record_file(out / "sse_raw.txt")
    record.save()
    return record


def test_stamp_keeps_the_brief_shape() -> None:
    assert runmeta.stamp({"a": 1}, "R") == {"a": 1, "run_id": "R", "schema_version": runmeta.SCHEMA_VERSION}
    rows = runmeta.stamp([{"docs": 0}, {"docs": 4}], "R")
    assert isinstance(rows, list) and [r["docs"] for r in rows] == [0, 4] and runmeta.run_id_of(rows) == {"R"}


def test_metadata_names_what_was_measured(tmp_path: Path) -> None:
    meta = _meta(tmp_path)
    assert meta["kb"]["files"] == 1 and len(meta["kb"]["sha256"]) == 64
    assert meta["machine"]["cores"] >= 1 and meta["python"]
    assert meta["identity"]["server_build"] == "b1-abc" and meta["identity"]["model"] == "a.gguf"


def test_a_step_joins_a_matching_run_and_starts_a_new_one_otherwise(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = _write_run(out, _meta(tmp_path))
    joined, note = runmeta.RunRecord.join_or_start(out, _meta(tmp_path), {"cache": ("cache.json",)})
    assert note is None and joined.run_id == first.run_id and "cache.json" in joined.doc["expected_artifacts"]
    other, note = runmeta.RunRecord.join_or_start(out, _meta(tmp_path, build_info="b2-def"),
                                                  {"cache": ("cache.json",)})
    assert other.run_id != first.run_id
    assert note and "new run" in note and "b1-abc" in note and "b2-def" in note


def test_a_file_from_another_run_is_named(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write_run(a, _meta(tmp_path))
    run_b = _write_run(b, _meta(tmp_path))
    (a / "ttft.json").write_bytes((b / "ttft.json").read_bytes())
    found = RunFolder(a).membership()
    assert found.other_runs == {"ttft.json": run_b.run_id}
    with pytest.raises(runmeta.MixedRunsError, match=f"ttft.json \\(run {run_b.run_id}\\)"):
        RunFolder(a).require_one_run()
    one_run = next(r for r in run_checks(a) if r.name.startswith("one run"))
    assert one_run.status == FAIL and "ttft.json" in one_run.detail


def test_raw_evidence_is_tied_by_its_hash(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write_run(out, _meta(tmp_path))
    assert RunFolder(out).membership().changed == []
    (out / "sse_raw.txt").write_bytes(b"data: [DONE]\n\n\n")
    assert RunFolder(out).membership().changed == ["sse_raw.txt"]


def _hold(out: str, ready: "multiprocessing.synchronize.Event", release: "multiprocessing.synchronize.Event") -> None:
    with locked_out(Path(out), "lab"):
        ready.set()
        release.wait(30)


def test_a_second_writer_is_refused_naming_the_first(tmp_path: Path) -> None:
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(OutputBusyError, match=f"voice-llm lab` \\(pid {holder.pid}, since "):
            with locked_out(tmp_path, "cache"):
                pass
    finally:
        release.set()
        holder.join(30)
    with locked_out(tmp_path, "cache", wait=True):  # free again once the holder ended
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()


def test_wait_takes_the_lock_only_when_the_holder_is_done(tmp_path: Path) -> None:
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        threading.Timer(0.3, release.set).start()
        with locked_out(tmp_path, "cache", wait=True):
            assert release.is_set()  # the lock came only after the holder was told to let go
    finally:
        release.set()
        holder.join(30)


def test_a_step_that_asks_no_server_joins_the_run_whatever_server_answers(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = _write_run(out, _meta(tmp_path))
    gone = runmeta.collect_metadata(runmeta.ServerFacts(url="http://127.0.0.1:1"), tmp_path / "kb")  # no server up
    joined, note = runmeta.RunRecord.join_or_start(out, gone, {"report": ("report.json",)}, ask_server=False)
    assert note is None and joined.run_id == first.run_id and joined.doc["metadata"] == first.doc["metadata"]


def test_report_alone_with_the_server_stopped_keeps_the_run(tmp_path: Path) -> None:
    """`voice-llm report` re-renders a finished lab after `voice-llm down`: it must not start a new run over it
    (that replaced run.json and then refused the folder as mixing runs)."""
    from fakeserver import unused_port

    from voice_llm.core.lab import LabSettings, run_steps

    out = tmp_path / "out"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "sample_run", out)
    first = json.loads((out / "run.json").read_text())
    result = run_steps(LabSettings(out=out, url=f"http://127.0.0.1:{unused_port()}", render_html=False), ["report"])
    doc = json.loads((out / "run.json").read_text())
    assert result.note is None and doc["run_id"] == first["run_id"] and doc["metadata"] == first["metadata"]
    assert json.loads((out / "report.json").read_text())["run_id"] == first["run_id"]


def test_one_reading_of_n_ctx_from_props() -> None:
    from voice_llm.core.client.api import ServerProps

    def props_n_ctx(props):  # type: ignore[no-untyped-def]
        return ServerProps.parse(props).n_ctx

    assert props_n_ctx({"default_generation_settings": {"n_ctx": 4096}, "n_ctx": 8}) == 4096
    assert props_n_ctx({"n_ctx": 2048}) == 2048  # an older server puts it at the top
    assert [props_n_ctx(p) for p in ({"default_generation_settings": {"n_ctx": True}},
                                     {"default_generation_settings": {"n_ctx": 0}}, [], None)] == [None] * 4
    assert runmeta.ServerFacts.from_props("u", {"default_generation_settings": {"n_ctx": -1}}).n_ctx is None
