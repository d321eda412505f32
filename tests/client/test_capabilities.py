"""The capability probe against scripted servers: what each kind of server exposes, and what the lab infers.

The probe asks, in this order: GET /health, /props, /slots, /v1/models, /metrics, then one POST stream (and a
second one without stream_options when the first is refused), so a FakeServer scripted in that order plays a
server."""

from __future__ import annotations

import json
from pathlib import Path

from fakeserver import FakeServer, Reply, event, llama_events

from voice_llm.core.client import capabilities
from voice_llm.core.client.api import ServerClient
from voice_llm.core.client.capabilities import SOURCE_CLIENT, SOURCE_METRICS, SOURCE_SLOTS, SOURCE_TIMINGS, SOURCE_USAGE, probe
from voice_llm.core.lab.evidence import Evidence, generated_tokens, prompt_tokens
from voice_llm.core.sse import Chunk, StreamResult

NOT_FOUND = Reply.json(404, {"detail": "Not Found"})
MODELS = Reply.json(200, {"object": "list", "data": [{"id": "smol", "object": "model", "owned_by": "me"},
                                                      {"id": "other", "object": "model"}]})
PROPS = Reply.json(200, {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1})
SLOTS = Reply.json(200, [{"id": 0, "is_processing": False}])
METRICS = Reply.body(200, b"# HELP llamacpp:requests_processing x\n# TYPE llamacpp:requests_processing gauge\n"
                          b"llamacpp:requests_processing 0\n", "text/plain; version=0.0.4")


def plain_stream(texts=("OK", "."), *, crlf: bool = False, ping: bool = False, usage: dict | None = None) -> Reply:
    """An OpenAI-style stream with no timings, like llama-cpp-python's (optionally CRLF-framed, with a ping)."""
    events = llama_events(list(texts), timings=None)
    if usage is not None:
        events.insert(-1, event({"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}))
    if ping:
        events.insert(1, b": ping - 2026-11-30 08:00:00\n\n")
    body = b"".join(events)
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    return Reply.stream(body)


def llama_cpp_python_like(stream: Reply | None = None) -> list[Reply]:
    return [NOT_FOUND, NOT_FOUND, NOT_FOUND, MODELS, NOT_FOUND, stream or plain_stream()]


def test_llama_server_exposes_everything_and_the_lab_uses_its_timings(tmp_path: Path) -> None:
    replies = [Reply.json(200, {"status": "ok"}), PROPS, SLOTS, MODELS, METRICS, Reply.stream(b"".join(llama_events(["OK"])))]
    with FakeServer(replies, script_probe=True, script_props=True) as fake:
        caps = probe(ServerClient(fake.url), raw_out=tmp_path / "probe.sse")
        body = fake.requests[-1].json
    assert [r.path for r in fake.requests] == ["/health", "/props", "/slots", "/v1/models", "/metrics",
                                               "/v1/chat/completions"]
    assert body["model"] == "smol" and body["stream_options"] == {"include_usage": True}
    assert caps.model == "smol" and caps.model_source == "/v1/models" and caps.n_ctx == 4096
    assert caps.timing_field("cache_n") and caps.busy_gauge == "llamacpp:requests_processing"
    assert caps.prompt_tokens_source() == (SOURCE_TIMINGS, "")
    assert caps.cache_source()[0] == SOURCE_TIMINGS and caps.stop_source()[0] == SOURCE_SLOTS
    # Timings are there: no usage request, the brief's body plus the model name.
    assert caps.request_extra() == {"model": "smol"}
    doc = caps.as_dict()
    assert doc["inferred"]["server"] == "llama.cpp llama-server"
    assert doc["found"]["endpoints"]["/slots"]["status"] == 200
    assert (tmp_path / "probe.sse").read_bytes().endswith(b"data: [DONE]\n\n")
    json.dumps(doc)  # the artifact is plain JSON


def test_an_openai_only_server_gets_nulls_with_reasons() -> None:
    with FakeServer(llama_cpp_python_like(), script_probe=True, script_props=True) as fake:
        caps = probe(ServerClient(fake.url))
    assert not caps.has("/health") and not caps.has("/slots") and caps.has("/v1/models")
    assert caps.stream is not None and not caps.stream.timings and caps.stream.include_usage_accepted
    inferred = caps.as_dict()["inferred"]
    assert inferred["server"].startswith("OpenAI-compatible")
    assert inferred["health"] == {"source": "/v1/models", "reason": "/health answered HTTP 404; the server answered /v1/models"}
    assert inferred["prompt_tokens"]["source"] is None and "no timings.prompt_n" in inferred["prompt_tokens"]["reason"]
    assert inferred["cache_reuse"]["source"] is None and "client clock only" in inferred["cache_reuse"]["reason"]
    assert inferred["cancel_stop"]["source"] is None
    assert inferred["cancel_stop"]["reason"].startswith("server stop not observable")
    assert inferred["n_ctx"]["source"] is None and inferred["cache_off"]["shown"] is False
    assert inferred["generated_tokens"]["source"] == "client count of content chunks"
    # No timings but include_usage accepted: every lab request asks for usage.
    assert caps.request_extra() == {"model": "smol", "stream_options": {"include_usage": True}}


def test_usage_in_the_stream_is_the_prompt_token_source() -> None:
    usage = {"prompt_tokens": 31, "completion_tokens": 2, "total_tokens": 33}
    with FakeServer(llama_cpp_python_like(plain_stream(usage=usage)), script_probe=True, script_props=True) as fake:
        caps = probe(ServerClient(fake.url))
    assert caps.prompt_tokens_source() == (SOURCE_USAGE, "")
    assert caps.tokens_source() == SOURCE_USAGE
    assert caps.cache_source()[0] is None  # usage counts the whole prompt, cached or not


def test_a_server_refusing_stream_options_is_asked_again_without() -> None:
    refused = Reply.json(400, {"error": {"message": "Unrecognized request argument: stream_options"}})
    with FakeServer([*llama_cpp_python_like(refused), plain_stream()], script_probe=True, script_props=True) as fake:
        caps = probe(ServerClient(fake.url))
        bodies = [r.json for r in fake.requests if r.method == "POST"]
    assert len(bodies) == 2 and "stream_options" in bodies[0] and "stream_options" not in bodies[1]
    assert caps.stream is not None and caps.stream.include_usage_accepted is False
    assert caps.request_extra() == {"model": "smol"}


def test_the_named_model_wins_over_v1_models() -> None:
    with FakeServer(llama_cpp_python_like(), script_probe=True, script_props=True) as fake:
        caps = probe(ServerClient(fake.url), model="my-model")
        assert fake.requests[-1].json["model"] == "my-model"
    assert caps.model == "my-model" and caps.model_source == "--model" and caps.model_ids == ("smol", "other")


def test_metrics_without_slots_make_the_stop_observable() -> None:
    replies = [NOT_FOUND, NOT_FOUND, NOT_FOUND, MODELS, METRICS, plain_stream()]
    with FakeServer(replies, script_probe=True, script_props=True) as fake:
        caps = probe(ServerClient(fake.url))
    assert caps.stop_source() == (SOURCE_METRICS, "")
    assert capabilities.requests_in_flight("vllm:num_requests_running{model_name=\"m\"} 2.0\n",
                                           "vllm:num_requests_running") == 2.0
    assert capabilities.busy_gauge("vllm:num_requests_running{model_name=\"m\"} 0.0\n") == "vllm:num_requests_running"


def test_a_failing_stream_is_recorded_not_raised() -> None:
    with FakeServer([*llama_cpp_python_like(Reply.json(500, {"error": {"message": "boom"}}))], script_probe=True, script_props=True) as fake:
        caps = probe(ServerClient(fake.url))
    assert caps.stream is None and "boom" in (caps.stream_error or "")
    assert caps.prompt_tokens_source()[0] is None


def test_framing_is_read_from_the_raw_bytes(tmp_path: Path) -> None:
    with FakeServer(llama_cpp_python_like(plain_stream(crlf=True, ping=True)), script_probe=True, script_props=True) as fake:
        caps = probe(ServerClient(fake.url), raw_out=tmp_path / "p.sse")
    assert caps.stream is not None
    assert caps.stream.line_ending == "CRLF" and caps.stream.comment_lines == 1 and caps.stream.done
    assert caps.stream.role_chunk_first and caps.stream.content_chunks == 2
    assert capabilities.line_ending(b"data: x\n\n") == "LF"
    assert capabilities.line_ending(b"data: x\r\n\ndata: y\n\n") == "mixed"


def _result(timings=None, usage=None, chunks=2) -> StreamResult:
    return StreamResult(chunks=tuple(Chunk(10.0 * (i + 1), "a") for i in range(chunks)), total_ms=50.0,
                        timings=timings, first_event_ms=5.0, finish_reason="stop", usage=usage, request_body={},
                        received_bytes=100, done=True, closed_early=False)


def test_each_count_names_its_source() -> None:
    assert prompt_tokens(_result({"prompt_n": 12, "predicted_n": 3})) == (12, SOURCE_TIMINGS)
    assert prompt_tokens(_result(usage={"prompt_tokens": 30, "completion_tokens": 4})) == (30, SOURCE_USAGE)
    assert prompt_tokens(_result()) == (None, None)
    assert generated_tokens(_result({"predicted_n": 3})) == (3, SOURCE_TIMINGS)
    assert generated_tokens(_result(usage={"completion_tokens": 4})) == (4, SOURCE_USAGE)
    assert generated_tokens(_result(chunks=5)) == (5, "client count of content chunks")
    evidence = Evidence(None)
    evidence.client("ttft_ms")
    assert evidence.take("prompt_n", None, None, "no timings") is None
    assert evidence.take("cache_n", 0, SOURCE_TIMINGS, "unused") == 0
    assert evidence.as_dict() == {"sources": {"ttft_ms": SOURCE_CLIENT, "cache_n": SOURCE_TIMINGS},
                                  "unknown": {"prompt_n": "no timings"}}


def test_every_lab_request_names_the_model_and_asks_for_usage_where_timings_are_missing(tmp_path: Path, step_context) -> None:
    from voice_llm.core.scenario.kb import default_kb_dir

    with FakeServer(llama_cpp_python_like(), script_probe=True, script_props=True) as fake:
        caps = probe(ServerClient(fake.url))
    assert caps.request_options() == {"model": "smol", "include_usage": True}
    with FakeServer(plain_stream()) as fake:
        ctx = step_context(fake.url, timeout=10, kb_dir=default_kb_dir(), capabilities=caps)
        ctx.request("one", [{"role": "user", "content": "hi"}], max_tokens=8)
        body = fake.requests[-1].json
    assert body["model"] == "smol" and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 8 and (tmp_path / "raw" / "one.sse").is_file()
