"""One guarded JSON parser for every server answer and artifact, and hostile shapes as one line (issues 19, 20).

A 100,000-deep answer makes Python's parser raise RecursionError; the probe and a few readers parsed without the
guard and gave a traceback. Every answer now goes through :func:`voice_llm.core.sse.parse_json` (the package's
:func:`voice_llm.core.util.artifacts.loads_json` delegates to it). Odd shapes the probe and the cancel step read (a first
stream event ``{"choices": [1]}``, a string ``delta``, /slots answering a number, a /metrics gauge that is not a
number) are clear one-line errors or ignored, never a TypeError/AttributeError.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from clihelpers import assert_clean_failure, cli
from fakeserver import DONE, FakeServer, Reply, event, llama_events

from voice_llm.core import sse
from voice_llm.core.client import capabilities
from voice_llm.core.util import artifacts
from voice_llm.core.client.api import ServerClient
from voice_llm.core.errors import ArtifactError, MeasurementError
from voice_llm.core.lab import cancel

DEEP = ("[" * 100_000 + "]" * 100_000).encode()
DEEP_ANSWER = Reply.body(200, DEEP, "application/json")
NOT_FOUND = Reply.json(404, {"error": {"message": "File Not Found"}})
STREAM = Reply.stream(b"".join(llama_events(["OK"])))


def _probe(replies: list[Reply]) -> capabilities.Capabilities:
    with FakeServer(replies, script_probe=True, script_props=True) as fake:
        return capabilities.probe(ServerClient(fake.url, timeout=10))


# The probe asks, in order: /health, /props, /slots, /v1/models, /metrics, then one tiny stream.
@pytest.mark.parametrize("deep_path", ["/props", "/v1/models"])
def test_the_probe_takes_a_deeply_nested_answer(deep_path: str) -> None:
    answers = {"/health": Reply.json(200, {"status": "ok"}), "/props": Reply.json(200, {"n_ctx": 4096}),
               "/slots": NOT_FOUND, "/v1/models": Reply.json(200, {"data": [{"id": "m"}]}), "/metrics": NOT_FOUND}
    answers[deep_path] = DEEP_ANSWER
    caps = _probe([*answers.values(), STREAM])
    assert caps.has(deep_path)  # it answered 200; what it said is not JSON the probe can use
    if deep_path == "/v1/models":
        assert caps.model_ids == () and caps.model is None
    if deep_path == "/props":
        assert caps.n_ctx is None
    assert caps.stream is not None and caps.stream.done


@pytest.mark.timeout(120)
def test_cli_health_against_a_server_answering_deep_json_everywhere(tmp_path: Path, env: dict[str, str]) -> None:
    # The probe parses /props and /v1/models (it used to crash with RecursionError there); the step's /health
    # is then refused in one line.
    with FakeServer(DEEP_ANSWER, script_probe=True, script_props=True) as fake:
        result = cli("health", "--url", fake.url, "--out", str(tmp_path / "out"), "-q", env=env, timeout=100)
    assert_clean_failure(result, "voice-llm health:", "nested too deeply")


@pytest.mark.parametrize("first", [{"choices": [1]}, {"choices": [{"delta": "text"}]}, {"choices": "x"},
                                   {"choices": [{"delta": ["role"]}]}],
                         ids=["number-choice", "string-delta", "string-choices", "list-delta"])
def test_the_probe_takes_any_first_event(first: object) -> None:
    body = event(first) + b"".join(llama_events(["OK"])[1:])
    replies = [NOT_FOUND] * 5 + [Reply.stream(body)]
    caps = _probe(replies)
    assert caps.stream is not None and caps.stream_error is None
    assert caps.stream.role_chunk_first is False and caps.stream.done


# ---------------------------------------------------------------------------------------------------------------
# The cancel step's /slots and /metrics
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("slots", [5, "idle", {"0": {"is_processing": True}}, None],
                         ids=["number", "string", "object", "null"])
def test_slots_that_are_not_a_list_are_one_line(slots: object) -> None:
    with FakeServer(Reply.json(200, slots), keep_alive=100) as fake:
        with ServerClient(fake.url, timeout=5).poller("/slots") as poller:
            with pytest.raises(MeasurementError, match="not the list of slots") as info:
                cancel.wait_until_idle(poller, time.perf_counter())
    assert "\n" not in str(info.value)


def test_a_metrics_gauge_that_is_not_a_number_is_one_line(step_context) -> None:
    page = b"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing abc\n"
    with FakeServer(Reply.body(200, page, "text/plain; version=0.0.4")) as fake:
        ctx = step_context(fake.url, timeout=5)
        with pytest.raises(MeasurementError, match="not a number: 'abc'") as info:
            cancel.wait_until_no_request(ctx, "llamacpp:requests_processing", time.perf_counter())
    assert "/metrics" in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# Artifacts and saved raw streams: the same parser
# ---------------------------------------------------------------------------------------------------------------


def test_artifacts_parse_through_the_one_guarded_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = sse.parse_json

    def spy(text):  # type: ignore[no-untyped-def]
        seen.append(len(text))
        return real(text)

    monkeypatch.setattr(artifacts, "parse_json", spy)
    (tmp_path / "ttft.json").write_bytes(DEEP)
    with pytest.raises(ArtifactError, match="ttft.json is not valid JSON: nested too deeply"):
        artifacts.read_json(tmp_path / "ttft.json")
    assert seen == [len(DEEP)]


def test_a_deep_event_in_a_saved_raw_stream_is_an_artifact_error(tmp_path: Path) -> None:
    from voice_llm.capabilities.speak import checks

    raw = tmp_path / "speak-whole-1.sse"
    raw.write_bytes(b"data: " + DEEP + b"\n\n" + DONE)
    with pytest.raises(ArtifactError, match="speak-whole-1.sse is not valid JSON: nested too deeply"):
        checks._raw_content(raw)


def test_a_deep_audio_json_gives_the_default_speech_rate(tmp_path: Path) -> None:
    from voice_llm.capabilities.load.speech import answer_speech_rate

    (tmp_path / "audio.json").write_bytes(DEEP)
    rate, source = answer_speech_rate(tmp_path)
    assert rate > 0 and "no readable audio.json" in source
