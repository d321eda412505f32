"""check's cancel relation and leftover partial files, on copies of tests/fixtures/sample_out (no server).

The cancel relation: the count must equal the chunks listed, the close must come after the 0.5 s mark and after
every listed token, the slot go idle after the close (invariants: a FAIL). The answer's own decode speed (the
gaps between the tokens cancel.json lists) bounds the stop at two token times + 50 ms and dates the answer's end:
time bounds a loaded machine can miss on an honest run, so a miss is a finding.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from voice_llm.core.checks import core as check

SAMPLE_OUT = Path(__file__).parents[1] / "fixtures" / "sample_out"


@pytest.fixture
def out(tmp_path: Path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(SAMPLE_OUT, copy)
    return copy


def edit_cancel(out: Path, change: Callable[[dict], None]) -> None:
    doc = json.loads((out / "cancel.json").read_text())
    change(doc)
    (out / "cancel.json").write_text(json.dumps(doc))


def token_ms(doc: dict) -> float:
    times = [c["t_ms"] for c in doc["chunks"]]
    return (times[-1] - times[0]) / (len(times) - 1)


def raw_stream(texts: list[str], done: bool) -> bytes:
    events = [{"choices": [{"delta": {"role": "assistant", "content": None}}]}]
    events += [{"choices": [{"delta": {"content": text}}]} for text in texts]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b'data: {"choices": [{"delta": {"cont')


def test_the_sample_cancel_passes_and_says_its_limit(out: Path) -> None:
    detail = check.check_cancel(out)
    assert "limit 92.8 ms" in detail and "cancel logged" in detail


def test_cancel_logged_null_passes(out: Path) -> None:
    edit_cancel(out, lambda d: d.update(cancel_logged=None))
    assert "server log not ours to read" in check.check_cancel(out)


BROKEN: dict[str, tuple[Callable[[dict], None], str]] = {
    # invariants: the slot cannot go idle before the close, the count is the chunks listed, one clock, a cut
    "negative idle": (lambda d: d.update(slot_idle_after_ms=-1.0), "before the close"),
    "count differs from the chunks listed": (
        lambda d: d.update(received_tokens=d["received_tokens"] - 1), "chunks are listed"),
    "a chunk dropped from the list": (lambda d: d["chunks"].pop(), "chunks are listed"),
    "a token after the close": (lambda d: d["chunks"][-1].update(t_ms=d["closed_at_ms"] + 1), "after the close"),
    "closed before the cut": (lambda d: d.update(closed_at_ms=499.0), "before the 500 ms cut"),
    "not a cut": (lambda d: d.update(max_tokens=d["received_tokens"]), "not a cut"),
    "not logged": (lambda d: d.update(cancel_logged=False), "no 'cancel task'"),
    "logged is not a bool": (lambda d: d.update(cancel_logged="yes"), "not true, false or null"),
}


@pytest.mark.parametrize("broken", list(BROKEN), ids=list(BROKEN))
def test_each_broken_cancel_relation_fails(out: Path, broken: str) -> None:
    change, says = BROKEN[broken]
    edit_cancel(out, change)
    # The cancel relation is two checks, the client's cut and the server's stop; a broken fact fails the one (or
    # both) that read it.
    cancel = [r for r in check.run_checks(out) if r.name.startswith("cancel") and "repeats" not in r.name]
    assert len(cancel) == 2
    failed = [r for r in cancel if not r.ok]
    assert failed and any(says in r.detail for r in failed), [r.detail for r in cancel]


# Time bounds, which a loaded machine exceeds on an honest run: findings with their numbers, never a failure.
EXPECTED: dict[str, tuple[Callable[[dict], None], str]] = {
    "idle above two token times + 50 ms": (
        lambda d: d.update(slot_idle_after_ms=2 * token_ms(d) + 50.5), "above two token times"),
    "idle minutes later": (lambda d: d.update(slot_idle_after_ms=120_000.0), "slot idle 120000.0 ms after the close"),
    "close after the whole answer would have ended at the first tokens' speed": (
        lambda d: d.update(max_tokens=d["received_tokens"] + 1, closed_at_ms=520.0),
        "after the whole answer would have ended"),
}


@pytest.mark.parametrize("expected", list(EXPECTED), ids=list(EXPECTED))
def test_a_missed_time_bound_of_the_cancel_is_a_finding(out: Path, expected: str) -> None:
    change, says = EXPECTED[expected]
    edit_cancel(out, change)
    cancel = [r for r in check.run_checks(out) if r.name.startswith("cancel") and "repeats" not in r.name]
    assert all(r.ok for r in cancel), [r.detail for r in cancel]
    (found,) = [r for r in cancel if r.status == check.FINDING]
    assert says in found.detail and found.label == "FIND"


def test_one_token_before_the_cut_is_a_cut_without_a_token_time(out: Path) -> None:
    edit_cancel(out, lambda d: d.update(chunks=d["chunks"][:1], received_tokens=1))
    cut, stop = [r for r in check.run_checks(out) if r.name.startswith("cancel") and "repeats" not in r.name]
    assert cut.status == check.PASS and "no token time" in cut.detail
    assert stop.status == check.NOT_CHECKABLE and "no token time" in stop.detail


def test_the_raw_cancel_stream_is_read_when_kept(out: Path) -> None:
    doc = json.loads((out / "cancel.json").read_text())
    texts = [c["text"] for c in doc["chunks"]]
    (out / "raw").mkdir()
    (out / "raw" / "cancel.sse").write_bytes(raw_stream(texts, done=False))
    check.check_cancel_cut(out)  # the same tokens, cut: passes
    (out / "raw" / "cancel.sse").write_bytes(raw_stream(texts, done=True))
    with pytest.raises(check._Failed, match="answer finished"):
        check.check_cancel_cut(out)
    (out / "raw" / "cancel.sse").write_bytes(raw_stream(texts[:-2], done=False))
    with pytest.raises(check._Failed, match=f"holds {len(texts) - 2} content chunks"):
        check.check_cancel_cut(out)


def test_the_raw_stream_read_is_the_one_of_the_repeat_the_document_is(out: Path) -> None:
    """With repeats, cancel.json is the median repeat, whose stream may be raw/cancel-2.sse, not raw/cancel.sse."""
    texts = [c["text"] for c in json.loads((out / "cancel.json").read_text())["chunks"]]
    (out / "raw").mkdir()
    (out / "raw" / "cancel.sse").write_bytes(raw_stream(texts[:5], done=False))  # the first repeat: another cut
    (out / "raw" / "cancel-2.sse").write_bytes(raw_stream(texts, done=False))
    edit_cancel(out, lambda d: d.update(raw="raw/cancel-2.sse"))
    check.check_cancel_cut(out)
    edit_cancel(out, lambda d: d.update(raw="../health.json"))
    with pytest.raises(check._Failed, match="not a raw/cancel"):
        check.check_cancel_cut(out)


def test_leftover_partial_files_are_a_warning(out: Path) -> None:
    assert not [r for r in check.run_checks(out) if r.name == check.PARTIALS_CHECK]  # nothing to say: no line
    (out / "raw").mkdir()
    (out / "raw" / "prefill-12docs.sse.partial").write_bytes(b"data: {")
    (result,) = [r for r in check.run_checks(out) if r.name == check.PARTIALS_CHECK]
    assert result.ok and result.status == check.PASS  # evidence of what arrived, not a failed relation
    assert result.detail.startswith("warning: 1 left by a failed or interrupted request")
    assert "raw/prefill-12docs.sse.partial (7 bytes)" in result.detail
