"""The one run Session (voice_llm.core.run.session): the phases in one order for every command, whatever its hooks;
a failure in a step still finishes run.json (marked with the step) after the close hook; the lock is gone after."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from fakeshapes import VLLM, ShapedServer

from voice_llm.core.errors import MeasurementError
from voice_llm.core.run import session
from voice_llm.core.run.lock import LOCK_NAME
from voice_llm.core.util.progress import NullProgress


def plan(out: Path, url: str, whole_run: bool) -> session.Plan:
    return session.Plan(out=out, command="test", asked=session.Asked(url), kb=None, steps={"one": ("one.json",)},
                        whole_run=whole_run)


def hooks(calls: list[str], url: str, servers: int = 1, fail: bool = False) -> session.Hooks:
    @contextlib.contextmanager
    def up(n: int):  # type: ignore[no-untyped-def]
        calls.append(f"bring-up {n}")
        try:
            yield session.given_target(url)
        finally:  # load stops the server it started, however the sweep ends
            calls.append(f"down {n}")

    def step(live: session.Live) -> None:
        calls.append(f"step (run {'known' if live.record.run_id else '?'}, lock {(live.out / LOCK_NAME).exists()})")
        live.state.step = "one"
        if fail:
            raise MeasurementError("no content chunk")
        live.step_finished({"step": "one", "wall_ms": 1.0, "server_compute_ms": 0.0})

    return session.Hooks(
        servers=lambda: (up(n) for n in range(1, servers + 1)),
        preflight=lambda client, target, first: calls.append(f"preflight (first {first})"),
        step=step,
        close=lambda live, error: calls.append(f"close ({type(error).__name__ if error else 'ok'}, "
                                               f"run.json {'saved' if (live.out / 'run.json').exists() else 'not yet'})"),
        after=lambda live: calls.append("after") or live.record.doc,
    )


@pytest.mark.parametrize("whole_run", [True, False], ids=["the lab", "a step, call, load"])
def test_the_phases_run_in_one_order(whole_run: bool, tmp_path: Path) -> None:
    calls: list[str] = []
    with ShapedServer(VLLM) as fake:
        doc = session.Session(plan(tmp_path / "out", fake.url, whole_run), NullProgress()).run(
            hooks(calls, fake.url, servers=2))
    assert calls == ["bring-up 1", "preflight (first True)", "step (run known, lock True)", "down 1",
                     "bring-up 2", "preflight (first False)", "step (run known, lock True)", "down 2",
                     f"close (ok, run.json {'saved' if whole_run else 'not yet'})", "after"]
    saved = json.loads((tmp_path / "out" / "run.json").read_text())
    assert saved["run_id"] == doc["run_id"] and (tmp_path / "out" / "capabilities.json").is_file()
    assert not (tmp_path / "out" / LOCK_NAME).exists()


def test_a_failed_step_is_closed_and_named_in_run_json(tmp_path: Path) -> None:
    calls: list[str] = []
    with ShapedServer(VLLM) as fake:
        with pytest.raises(MeasurementError) as failure:
            session.Session(plan(tmp_path / "out", fake.url, True), NullProgress()).run(hooks(calls, fake.url, fail=True))
    assert calls[-2:] == ["down 1", "close (MeasurementError, run.json saved)"]  # no "after" for a failed run
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["failed_step"] == "one" and run["failure"] == "MeasurementError: no content chunk"
    assert failure.value.__notes__ == ["step one"]
