"""The whole lab and `check` against servers shaped like vLLM (empty /health, no /props, /slots or timings, usage
only when asked) and Ollama (no /health, /v1/models, role beside every content): every relation passes or is
"not checkable", none fails. Also the warm-up before the ttft runs, and "cache not disabled" where the server may
have ignored cache_prompt: false."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from clihelpers import SHORT_KB, WITHOUT_THE_CALL, cli, cli_env
from conftest import FAKE_TOKEN_S
from fakeshapes import OLLAMA, Shape, ShapedServer

from voice_llm.core.checks import core as check

# The relations that rest on llama-server-only evidence (/props, timings, /slots): not checkable, never FAIL.
NOT_CHECKABLE = (
    "props: context size",
    "prefill: server prefill time grows 0 -> 4 -> 12 docs",
    "cache hit far below miss: prompt tokens",
    "cancel: the server stopped (slot went idle)",
)
LAB_TIMEOUT_S = 600  # a lab against the fake takes ~30 s with Piper; a loaded machine gets generous slack


def load(out: Path, name: str):
    return json.loads((out / name).read_text())


def _lab(shape: Shape, tmp_path_factory: pytest.TempPathFactory, **fake: object) -> Iterator[tuple[Path, subprocess.CompletedProcess[str], ShapedServer]]:
    # The summary's rows on one line each; the server's shape, not the caller's turn, is what is tested (nor the
    # documents' length: the short KB, as the vLLM-shaped lab's).
    env = {**cli_env(tmp_path_factory.mktemp("state")), "COLUMNS": "240", **WITHOUT_THE_CALL}
    out = tmp_path_factory.mktemp(f"{shape.name}-lab") / "out"
    with ShapedServer(shape, model=f"{shape.name}-model", token_s=FAKE_TOKEN_S, **fake) as server:
        done = cli("lab", "--url", server.url, "--out", str(out), "--repeat", "1", "--kb", str(SHORT_KB), env=env,
                   timeout=LAB_TIMEOUT_S)
        yield out, done, server


@pytest.fixture(scope="module")
def vllm_lab(vllm_shaped_lab):
    # The session's vLLM-shaped lab (tests/conftest.py), run A of tests/run/test_identity_runs.py too; its first
    # real answer is slow (cold_start_s 1.0), as llama-server's first right after `up`.
    return vllm_shaped_lab


@pytest.fixture(scope="module")
def ollama_lab(tmp_path_factory):
    yield from _lab(OLLAMA, tmp_path_factory)


def _assert_checks_pass(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")], done.stdout[-4000:]
    assert re.search(r"\d+ passed, \d+ findings?, \d+ not checkable, 0 failed", done.stdout)
    for name in NOT_CHECKABLE:
        line = next(line for line in lines if f"  {name}: " in line)
        assert line.startswith("N/C "), line
    return lines


@pytest.mark.slow
def test_the_whole_lab_passes_against_a_vllm_shaped_server(vllm_lab) -> None:
    out, done, server = vllm_lab
    lines = _assert_checks_pass(done)
    health = next(line for line in lines if "server answered (health)" in line)
    assert health.startswith("PASS") and "/health answered HTTP 200 with an empty body" in health
    doc = load(out, "health.json")
    assert (doc["route"], doc["http_status"], doc["body_text"], doc["server_header"]) == ("/health", 200, "", "uvicorn")
    assert "status" not in doc  # nothing the server did not say
    assert (out / "audio.json").is_file() and (out / "report.html").is_file()
    # The server sent usage only where it was asked for, and the lab asked for it (no timings in the stream).
    chats = server.chat_bodies()
    assert chats and all(body.get("stream_options") == {"include_usage": True} for body in chats)
    assert load(out, "prefill.json")[-1]["sources"]["prompt_n"] == "usage"


@pytest.mark.slow
def test_the_whole_lab_passes_against_an_ollama_shaped_server(ollama_lab) -> None:
    out, done, _ = ollama_lab
    lines = _assert_checks_pass(done)
    health = next(line for line in lines if "server answered (health)" in line)
    assert health.startswith("PASS") and "no health route (/health HTTP 404); /v1/models answered HTTP 200" in health
    doc = load(out, "health.json")
    assert doc["route"] == "/v1/models" and doc["http_status"] == 200 and doc["model_ids"] == ["ollama-model"]
    assert doc["tried"] == [{"route": "/health", "http_status": 404, "body_text": "404 page not found"}]
    # No role-only chunk: the first content came with the role and was counted as the first token.
    # A server's shape, not bad evidence: a finding (check_chunks still verifies exactly the content was counted).
    sse_line = next(line for line in lines if "  sse_raw:" in line)
    assert sse_line.startswith("FIND") and "carries content with the role" in sse_line, sse_line
    first = json.loads((out / "chunks.jsonl").read_text().splitlines()[0])
    assert first["text"] == "Please"


@pytest.mark.parametrize("shape, said", [
    (Shape("json-empty", "json", "uvicorn", True), "a body"),  # `{}`: no "status": "ok", still HTTP 200
    (Shape("text", "text", None, True), "a body"),  # "OK" as text/plain
])
def test_health_any_200_body_passes(shape: Shape, said: str, tmp_path: Path, state_dir: Path) -> None:
    out = tmp_path / "out"
    with ShapedServer(shape) as server:
        done = cli("health", "--url", server.url, "--out", str(out), "-q", env=cli_env(state_dir), timeout=120)
    assert done.returncode == 0, done.stderr
    doc = load(out, "health.json")
    assert doc["route"] == "/health" and doc["http_status"] == 200
    assert ("body_text" in doc) == (shape.health == "text")
    assert check.check_health(out) == f"/health answered HTTP 200 with {said}"


def test_health_that_says_not_ok_or_an_error_status_fails(tmp_path: Path) -> None:
    (tmp_path / "health.json").write_text(json.dumps({"route": "/health", "http_status": 200, "status": "loading"}))
    with pytest.raises(check.CheckFailed, match="says status 'loading'"):
        check.check_health(tmp_path)
    (tmp_path / "health.json").write_text(json.dumps({"route": "/v1/models", "http_status": 200, "model_ids": []}))
    with pytest.raises(check.CheckFailed, match="lists no model"):
        check.check_health(tmp_path)
    # A folder from before health.json recorded the route: llama-server's body alone, as the brief saved it.
    (tmp_path / "health.json").write_text(json.dumps({"status": "ok"}))
    assert check.check_health(tmp_path) == "status ok (from /health)"


@pytest.mark.slow
def test_the_warm_up_keeps_the_cold_first_answer_out_of_the_five_runs(vllm_lab) -> None:
    out, _, _ = vllm_lab
    ttft = load(out, "ttft.json")
    assert len(ttft["runs"]) == 5
    # The fake's first real answer waited 1 s more: the warm-up took it, none of the five did.
    assert ttft["warmup"]["ttft_ms"] >= 1000.0
    assert all(run["ttft_ms"] < ttft["warmup"]["ttft_ms"] - 500.0 for run in ttft["runs"])
    assert ttft["warmup"]["raw"] == "raw/ttft-warmup.sse" and (out / "raw" / "ttft-warmup.sse").is_file()
    assert "raw/ttft-warmup.sse" in load(out, "run.json")["artifacts"]


@pytest.mark.slow
def test_a_cache_off_number_whose_condition_did_not_hold_says_so(vllm_lab, tmp_path: Path, state_dir: Path) -> None:
    out, done, _ = vllm_lab
    assert "cache_off" in load(out, "ttft.json")["unknown"]
    # The summary's headline, the report's key numbers table and compare never claim "cache off" for it.
    assert "first token (p50, cache not disabled)" in done.stdout and "(p50, cache off)" not in done.stdout
    page = (out / "report.html").read_text()
    assert "median time to first token (cache not disabled)" in page
    other = tmp_path / "copy"
    shutil.copytree(out, other)
    compared = cli("compare", str(out), str(other), env=cli_env(state_dir), timeout=120)
    assert compared.returncode == 0, compared.stderr
    assert "first token (cache not disabled) " in compared.stdout
    assert "first token, 12 documents (cache not disabled) " in compared.stdout
