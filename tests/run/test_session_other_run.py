"""Issue 31 items 9 and 16 (first half), through the one run session (voice_llm.core.run.session.Session).

16: a step that would start a new run in a folder holding another run's files refuses before its first measuring
request, in one line naming the fix (another --out, or --new-run); with --new-run the earlier run is replaced and
its files go once the new run's first step has finished. 9: a failed step against another server leaves the
earlier run as it was (run.json, capabilities.json and every earlier file), whether it fails at its first request
or later. In-process CLI calls against in-process fake servers (vLLM-shaped, so no llama-server is needed).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fakeshapes import VLLM, ShapedServer

from voice_llm.cli import main as cli
from voice_llm.core.checks.core import run_checks
from voice_llm.core.errors import EXIT_FAILURE


def fast(**given: object) -> ShapedServer:
    return ShapedServer(VLLM, base_s=0.001, token_s=0.0005, prefill_s_per_char=0.0, **given)  # type: ignore[arg-type]


def snapshot(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".voice-llm.lock"}


def run_id(out: Path) -> str:
    return json.loads((out / "run.json").read_text())["run_id"]


def voice_llm(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main([*args, "-q"])
    said = capsys.readouterr()
    return code, said.out, said.err


def chats(server: ShapedServer) -> int:
    return sum(1 for method, path, _ in server.requests if method == "POST" and path.endswith("/chat/completions"))


@pytest.fixture
def old(tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """A folder holding run A: the sse and ttft steps against server A."""
    out = tmp_path / "old"
    with fast(model="model-a") as a:
        for step in ("sse", "ttft"):
            code, _, err = voice_llm(capsys, step, "--url", a.url, "--out", str(out))
            assert code == 0, err
        yield out, a


@pytest.mark.parametrize("how", ["--port", "--url"])
def test_a_step_against_another_server_refuses_before_its_first_request(old, capsys, how: str) -> None:  # type: ignore[no-untyped-def]
    """The issue's input: `cp -a out old; voice-llm ttft --port OTHER --out old` (here OUT holds run A)."""
    out, _ = old
    before, earlier = snapshot(out), run_id(out)
    with fast(model="model-b") as b:
        where = b.url if how == "--url" else b.url.rsplit(":", 1)[1]
        code, printed, err = voice_llm(capsys, "ttft", how, where, "--out", str(out))
        asked = chats(b)
    assert code == EXIT_FAILURE and printed == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"voice-llm ttft: {out} holds run {earlier}, made against another server (")
    assert "model_sent: 'model-a' -> 'model-b'" in err
    assert err.rstrip().endswith("measure into another folder (--out) or replace that run (--new-run)")
    assert asked == 1  # the probe's one tiny stream (the run's identity), no ttft request
    assert snapshot(out) == before  # the earlier run as it was


def test_new_run_replaces_the_earlier_run_and_its_files(old, capsys) -> None:  # type: ignore[no-untyped-def]
    out, _ = old
    earlier = run_id(out)
    with fast(model="model-b") as b:
        code, printed, err = voice_llm(capsys, "ttft", "--url", b.url, "--out", str(out), "--new-run")
    assert code == 0, err
    assert f"started a new run {run_id(out)}" in err and "its files are removed" in err
    assert run_id(out) != earlier
    # run A's sse files are gone; what is left is run B's, and check finds one run.
    assert not (out / "chunks.json").exists() and not (out / "raw" / "sse.sse").exists()
    assert json.loads((out / "ttft.json").read_text())["run_id"] == run_id(out)
    one_run = next(c for c in run_checks(out) if c.name.startswith("one run"))
    assert one_run.label == "PASS", one_run.detail


@pytest.mark.parametrize("fails_after", [1, 2], ids=["at its first request", "after its first request"])
def test_a_failed_step_with_new_run_leaves_the_earlier_run_as_it_was(old, capsys, fails_after: int) -> None:  # type: ignore[no-untyped-def]
    out, _ = old
    before = snapshot(out)
    # It answers the probe's stream (and, the second time, the ttft's first request), then HTTP 500.
    with fast(model="model-c", fail_chats_after=fails_after) as broken:
        code, _, err = voice_llm(capsys, "ttft", "--url", broken.url, "--out", str(out), "--new-run")
    assert code == 1 and "500" in err and "Traceback" not in err
    after = snapshot(out)
    assert {name: digest for name, digest in after.items() if name in before} == before  # run.json too
    # The only new files: the evidence the failed request left, under its .partial name (no final name taken).
    assert all(name.startswith("raw/") and name.endswith(".sse.partial") for name in set(after) - set(before))


def test_a_step_against_the_same_server_joins_without_a_word(old, capsys) -> None:  # type: ignore[no-untyped-def]
    out, a = old
    earlier = run_id(out)
    code, _, err = voice_llm(capsys, "sentence", "--url", a.url + "/v1", "--out", str(out), "--repeat", "1")
    assert code == 0 and "new run" not in err
    assert run_id(out) == earlier


def test_load_into_a_folder_of_another_run_refuses_before_its_first_turn(old, capsys) -> None:  # type: ignore[no-untyped-def]
    """load goes through the same Session: the same rule, before Locust starts."""
    out, _ = old
    before, earlier = snapshot(out), run_id(out)
    with fast(model="model-b") as b:
        code, printed, err = voice_llm(capsys, "load", "--url", b.url, "--out", str(out), "--docs", "0")
        asked = chats(b)
    assert code == EXIT_FAILURE and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"voice-llm load: {out} holds run {earlier}, made against another")
    assert err.rstrip().endswith("(--new-run)") and asked == 1  # the probe's stream alone: no caller ever called
    assert snapshot(out) == before


def test_a_step_that_joins_keeps_the_failure_of_another_step(old, capsys) -> None:  # type: ignore[no-untyped-def]
    """run.json closes the steps that ran: an earlier lab's failure in cancel stays after ttft alone succeeds."""
    out, a = old
    run = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**run, "failed_step": "cancel", "failure": "interrupted"}))
    code, _, err = voice_llm(capsys, "ttft", "--url", a.url, "--out", str(out))
    assert code == 0, err
    after = json.loads((out / "run.json").read_text())
    assert after["run_id"] == run["run_id"] and (after["failed_step"], after["failure"]) == ("cancel", "interrupted")
