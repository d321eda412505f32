"""The cancel step's logic against a scripted server (no llama-server): what it writes, and when it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voice_llm.core.errors import MeasurementError
from voice_llm.core.scenario.kb import default_kb_dir
from voice_llm.core.lab import cancel
from voice_llm.core.run.context import StepOptions

from fakeserver import FakeServer, Reply, at, llama_events

IDLE = Reply.json(200, [{"id": 0, "is_processing": False}])


def numbers(count: int) -> list[str]:
    return [f"{n}," for n in range(1, count + 1)]


def run_against(step_context, *answers: list[tuple[float, bytes]]) -> Path:  # type: ignore[no-untyped-def]
    """One repeat; each answer is one attempt at the cut (warm-up, idle, the answer, idle)."""
    replies = [r for answer in answers for r in (Reply.stream(at(0.0, llama_events(["1"]))), IDLE, Reply.stream(answer), IDLE)]
    with FakeServer(replies) as fake:
        ctx = step_context(fake.url, timeout=10, kb_dir=default_kb_dir(), options=StepOptions(repeat=1))
        cancel.run(ctx)  # one repeat: the script has its attempts
    return ctx.out / "cancel.json"


def test_the_step_writes_the_cut_and_the_answer_s_own_token_time(step_context) -> None:
    # 256 tokens 40 ms apart: about 12 arrive before the cut at 500 ms
    doc = json.loads(run_against(step_context, at(0.04, llama_events(numbers(256)))).read_text())
    times = [chunk["t_ms"] for chunk in doc["chunks"]]
    assert doc["received_tokens"] == len(times) >= 2
    assert doc["token_ms"] == pytest.approx((times[-1] - times[0]) / (len(times) - 1))
    assert times[-1] <= doc["closed_at_ms"] and doc["closed_at_ms"] >= 500
    assert doc["slot_idle_after_ms"] >= 0 and doc["poll_interval_ms"] == 2.0
    assert doc["cancel_logged"] is None  # no server log of ours


def test_one_token_before_the_cut_is_not_a_measurement(tmp_path: Path, step_context, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cancel, "CUT_RETRY_PAUSE_S", 0.0)  # the pause between attempts is not what is tested
    monkeypatch.setattr(cancel, "CLOSE_AFTER_MS", 100.0)  # five cuts in the silence after the token, 0.1 s each
    one_then_silence = [(0.0, e) for e in llama_events(["1,"], done=False)[:2]] + [(2.0, b": keep-alive\n\n")]
    with pytest.raises(MeasurementError, match="only 1 token"):
        run_against(step_context, *[one_then_silence] * cancel.CUT_ATTEMPTS)
    assert not (tmp_path / "cancel.json").exists()


def test_a_cut_the_busy_machine_made_too_early_is_made_again(step_context, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cancel, "CUT_RETRY_PAUSE_S", 0.0)  # the pause between attempts is not what is tested
    one_then_silence = [(0.0, e) for e in llama_events(["1,"], done=False)[:2]] + [(2.0, b": keep-alive\n\n")]
    doc = json.loads(run_against(step_context, one_then_silence, at(0.04, llama_events(numbers(256)))).read_text())
    assert doc["discarded_cuts"] == 1 == doc["repeats"][0]["discarded_cuts"] and doc["received_tokens"] >= 2


def test_an_answer_that_ends_before_the_cut_is_kept_as_not_cut(step_context) -> None:
    """A server fast enough to write the brief's 256 tokens before the 0.5 s cut (here: 3 tokens at once, as a
    newcomer's fake server did) cut nothing: cancel.json keeps what arrived, its close, idle time and log null with
    the reason, and the lab goes on (the step stopped it with exit 1 before). check says not checkable, never
    FAIL; the report's section says "no data" with the reason; report.json's words say it too."""
    from voice_llm.capabilities.repeats.checks import check_cancel_repeats
    from voice_llm.core.checks.base import NotCheckable
    from voice_llm.core.checks.core import check_cancel, check_cancel_cut
    from voice_llm.core.errors import NoDataError
    from voice_llm.core.lab.report import _barge_in
    from voice_llm.core.report.charts import cancel_chart
    from voice_llm.core.run import artifacts as typed
    from voice_llm.core.run.folder import RunFolder

    path = run_against(step_context, at(0.0, llama_events(["1,", " 2,", " 3."])))
    doc = json.loads(path.read_text())
    assert (doc["received_tokens"], doc["closed_at_ms"], doc["slot_idle_after_ms"], doc["cancel_logged"]) == (
        3, None, None, None)
    reason = doc["unknown"]["closed_at_ms"]
    assert "the answer finished (3 tokens in" in reason and "before the 500 ms cut, so nothing was cancelled" in reason
    assert doc["unknown"]["slot_idle_after_ms"] == reason and doc["repeats"][0]["closed_at_ms"] is None
    out = path.parent
    for check in (check_cancel_cut, check_cancel, check_cancel_repeats):
        with pytest.raises(NotCheckable, match="nothing was cancelled"):
            check(out)
    with pytest.raises(NoDataError, match="nothing was cancelled"):
        cancel_chart(RunFolder.of(out).artifact(typed.Cancel))
    assert "nothing was cancelled" in _barge_in(doc, None)
