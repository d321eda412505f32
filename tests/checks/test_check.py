"""`check` reads only files: on the session's live lab every check passes; on a saved real run each broken
relation is caught."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from checkfolders import clean_run

from voice_llm.core.checks.core import run_checks


def edit(name: str, change: Callable[[object], None]) -> Callable[[Path], None]:
    def apply(out: Path) -> None:
        doc = json.loads((out / name).read_text())
        change(doc)
        (out / name).write_text(json.dumps(doc))
    return apply


def set_in(path: list, value: object) -> Callable[[object], None]:
    def change(doc: object) -> None:
        for key in path[:-1]:
            doc = doc[key]  # type: ignore[index]
        doc[path[-1]] = value  # type: ignore[index]
    return change


def swap_prefill(doc: list) -> None:
    doc[1]["ttft_ms"], doc[2]["ttft_ms"] = doc[2]["ttft_ms"], doc[1]["ttft_ms"]


def drop_done(out: Path) -> None:
    raw = (out / "sse_raw.txt").read_bytes()
    (out / "sse_raw.txt").write_bytes(raw[: raw.rindex(b"data: [DONE]")])


def edit_chunks(out: Path) -> None:
    lines = (out / "chunks.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["text"] = first["text"] + "X"
    (out / "chunks.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")


def reverse_times(out: Path) -> None:
    rows = [json.loads(line) for line in (out / "chunks.jsonl").read_text().splitlines()]
    times = [r["t_ms"] for r in rows][::-1]
    for row, t in zip(rows, times):
        row["t_ms"] = t
    (out / "chunks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


TAMPERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "missing file": (lambda out: (out / "cache.json").unlink(), "files present"),
    "no [DONE]": (drop_done, "sse_raw"),
    "chunk text differs": (edit_chunks, "chunks.jsonl"),
    "chunk times decrease": (reverse_times, "chunks.jsonl"),
    "ttft above total": (edit("ttft.json", lambda d: d["runs"][1].update(ttft_ms=d["runs"][1]["total_ms"] + 1)), "ttft < total"),
    "wrong median": (edit("ttft.json", lambda d: d.update(ttft_p50=d["ttft_p50"] + 1)), "ttft < total"),
    "prefill not growing": (edit("prefill.json", swap_prefill), "first token grows"),
    "cache second not a hit": (edit("cache.json", lambda d: d["second"].update(d["first"])), "cache hit"),
    # A changed prefix computing only a few tokens is possible on a server that reuses shifted chunks (a finding);
    # computing no more than the identical prompt's hit is not.
    "changed prefix reused": (edit("cache.json", lambda d: d["changed_prefix"].update(prompt_n=d["second"]["prompt_n"])),
                              "cache hit"),
    "changed suffix missed": (edit("cache.json", lambda d: d["changed_suffix"].update(d["first"])), "cache hit"),
    "first sentence after total": (edit("sentence.json", lambda d: d.update(first_sentence_ms=d["total_ms"] + 1)), "first sentence"),
    "cancel not cut": (edit("cancel.json", set_in(["received_tokens"], 256)), "cancel"),
    "cancel not logged": (edit("cancel.json", set_in(["cancel_logged"], False)), "cancel"),
    "report not from sources": (edit("report.json", lambda d: d.update(cache_ttft_ms=d["cache_ttft_ms"] + 5)), "report equals"),
}


@pytest.fixture
def live_copy(lab_run, tmp_path: Path) -> Path:
    """A copy of the session's live lab run (that every check passes on this machine's run is the point)."""
    out, _ = lab_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    return copy


@pytest.fixture
def lab_copy(tmp_path: Path) -> Path:
    """A real lab run's saved files (tests/fixtures/sample_run), clean, to break one relation in: no server."""
    return clean_run(tmp_path / "out")


@pytest.mark.server
def test_all_checks_pass_on_the_real_run(live_copy: Path) -> None:
    results = run_checks(live_copy)
    assert [r for r in results if not r.ok] == []
    # Passed, or a finding about this machine (an expectation such as which strategy is heard first): never a
    # failure, never "not checkable" on llama-server.
    assert all(r.status in ("pass", "finding") for r in results), [r for r in results if r.status not in ("pass", "finding")]
    names = " | ".join(r.name for r in results)
    for relation in ("one run", "ttft < total", "first token grows", "cache hit", "first sentence", "cancel cut",
                     "report equals", "audio"):
        assert relation in names, (relation, names)


@pytest.mark.parametrize("tamper", list(TAMPERS), ids=list(TAMPERS))
def test_each_broken_relation_is_caught(lab_copy: Path, tamper: str) -> None:
    apply, failing = TAMPERS[tamper]
    apply(lab_copy)
    failed = [r for r in run_checks(lab_copy) if not r.ok]
    assert failed, f"{tamper} was not caught"
    assert any(failing in r.name for r in failed), [r.name for r in failed]
