"""The context check made before the first request: the lab's longest prompt against the server's n_ctx.

Real llama-server (its own chat template and tokenizer count the prompt) for the counts and for the steps that
call the check when run alone; a scripted server for a server without /tokenize."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voice_llm.core.scenario import prompts
from voice_llm.core.client.api import ServerClient
from voice_llm.core.server.config import ServerSettings
from voice_llm.core.errors import ContextLimitError
from voice_llm.core.scenario.kb import default_kb_dir, load_kb
from voice_llm.core.run import preflight
from voice_llm.core.run.context import StepOptions

from builders import big_kb
from clihelpers import assert_clean_failure, cli
from conftest import RunningServer, free_port
from fakeserver import FakeServer, Reply, at, llama_events


def test_the_first_twelve_of_a_larger_kb_are_the_lab_s_documents(tmp_path: Path) -> None:
    kb = big_kb(tmp_path / "kb", copies=3)
    docs = load_kb(kb, need=12)
    assert len(docs) == 36
    names = {m["content"] for _, messages in preflight.longest_requests(docs) for m in messages}
    text = "\n".join(names)
    assert all(doc.name in text for doc in docs[:12]) and not any(doc.name in text for doc in docs[12:])


def test_a_server_without_tokenize_gets_an_estimate(tmp_path: Path) -> None:
    docs = load_kb(default_kb_dir())
    replies = [Reply.json(200, {"default_generation_settings": {"n_ctx": 512}}), Reply.json(404, {"error": {
        "code": 404, "message": "File Not Found", "type": "not_found_error"}})]
    with FakeServer(replies, script_props=True) as fake:
        with pytest.raises(ContextLimitError) as caught:
            preflight.check_context_fits(ServerClient(fake.url, timeout=5), docs)
    message = str(caught.value)
    assert "estimated: the server has no /tokenize" in message and "512 tokens per slot" in message
    assert docs[0].name in message and docs[11].name in message and "--ctx" in message


def test_a_server_that_does_not_say_its_context_is_not_refused() -> None:
    with FakeServer(Reply.json(200, {"default_generation_settings": {}}), script_props=True) as fake:
        assert preflight.check_context_fits(ServerClient(fake.url, timeout=5), load_kb(default_kb_dir())) is None
        assert len(fake.requests) == 1  # /props only


@pytest.mark.server
def test_the_count_is_the_server_s_own(module_server: RunningServer) -> None:
    """The count is what the server itself computes for the same request (prompt_n, cache off); one document
    keeps the request short on a busy machine."""
    client = ServerClient(module_server.url)
    docs = load_kb(default_kb_dir())
    fit = preflight.check_context_fits(client, docs)
    assert fit is not None and fit.counted and fit.n_ctx == 4096 and fit.request.startswith("cache changed")
    messages = prompts.chat(prompts.with_docs(prompts.ONE_SENTENCE_SYSTEM, docs[:1]), prompts.SATURDAY_QUESTION)
    counted, exact = preflight.count_prompt_tokens(client, messages)
    result = client.chat(messages, max_tokens=1, cache_prompt=False)
    assert exact and counted == result.timings["prompt_n"] < fit.prompt_tokens < fit.n_ctx


@pytest.fixture
def small_ctx_server(state_dir: Path, server_binary: Path, model_path: Path):
    """A server whose context is too small for the 12 bundled documents."""
    from voice_llm.core.server import lifecycle as server

    settings = ServerSettings(port=free_port(), ctx=1024)
    record, _ = server.up(settings, server_binary, model_path)
    try:
        yield RunningServer(settings, record)
    finally:
        server.down(settings.port)


@pytest.mark.server
@pytest.mark.parametrize("step", ["prefill", "cache"])
def test_a_step_run_alone_refuses_before_its_first_request(small_ctx_server: RunningServer, tmp_path: Path,
                                                          env: dict[str, str], step: str) -> None:
    out = tmp_path / "out"
    result = cli(step, "--url", small_ctx_server.url, "--out", str(out), "-q", env=env)
    err = assert_clean_failure(result, "context is 1024 tokens per slot", "12 KB documents", "--ctx")
    assert "01-opening-hours.md" in err
    assert not list((out / "raw").glob("*.sse*"))  # no request was made


def test_cache_attaches_the_same_twelve_documents_as_prefill(tmp_path: Path) -> None:
    """A KB of 24 documents: the cache step used to attach all of them (on a real server: HTTP 400, context
    overflow after the earlier steps' minutes). What it sends is read off a scripted server."""
    from voice_llm.core.lab import LabSettings, run_steps

    kb = big_kb(tmp_path / "kb", copies=2)
    docs = load_kb(kb)
    with FakeServer(Reply.stream(at(0.0, llama_events(["Nine", "to", "noon."])))) as fake:
        run_steps(LabSettings(out=tmp_path / "out", url=fake.url, kb_dir=kb, options=StepOptions(repeat=1)), ["cache"])
    systems = [json.loads(r.body)["messages"][0]["content"] for r in fake.requests if r.path.endswith("/completions")]
    long_ones = systems[1:]  # after the short request that empties the slot
    assert len(long_ones) == 4
    for system in long_ones:
        assert all(f"## {doc.name}" in system for doc in docs[:12])
        assert not any(f"## {doc.name}" in system for doc in docs[12:])
    assert json.loads((tmp_path / "out" / "cache.json").read_text())["order"] == [
        "hi", "first", "second", "changed_suffix", "changed_prefix"]
