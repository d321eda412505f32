"""Every request is bounded on the wall clock, and TLS mistakes fail fast (project issues 19 and 20).

A server that sends its status line and then one header byte a second, or an error body one byte every 0.5 s,
used to hold a request for ever: ``--timeout`` and ``--deadline`` were per-``recv`` socket timeouts, reset by
each byte. Now each read is given only the time left, so each of these ends at its limit with one line. The
bounds asserted ("ends within the deadline + 2 s") are about a hang, not speed; each test has its own pytest
timeout so that without the fix it fails instead of hanging the suite.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from clihelpers import assert_clean_failure, cli
from fakeserver import FakeServer, RawServer, Reply, at, llama_events

from voice_llm.core import sse
from voice_llm.core.client import api, capabilities
from voice_llm.core.client.api import ServerClient
from voice_llm.core.sse import (
    AnswerTooLargeError,
    DeadlineExceededError,
    HTTPStatusError,
    NoContentTimeoutError,
    NotTLSError,
    StreamTimeoutError,
    run_stream,
)

MESSAGES = [{"role": "user", "content": "Hi?"}]
SLACK_S = 2.0  # "ends within the limit + 2 s": generous on a loaded machine, far below the hang it replaces

# The status line at once, then a header line one byte a second for 40 s: each byte comes well within any
# per-read timeout, so only a wall-clock limit ends the wait.
TRICKLED_HEADERS = Reply(200, (("Content-Type", "text/event-stream"),), tuple(at(0.0, llama_events(["late"]))),
                         head_pieces=tuple(at(1.0, [b"X"] * 40)))
# HTTP 500 with a 100,000-byte body sent one byte every 0.5 s (14 hours in all).
TRICKLED_ERROR = Reply(500, (("Content-Type", "text/plain"),), tuple(at(0.5, [b"e"] * 100_000)), framing="length")
# A JSON answer whose 100,000-byte body comes one byte every 0.5 s.
TRICKLED_JSON = Reply(200, (("Content-Type", "application/json"),), tuple(at(0.5, [b" "] * 100_000)),
                      framing="length")


def _timed(call):  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    with pytest.raises(sse.StreamError) as info:
        call()
    return info.value, time.monotonic() - t0


# ---------------------------------------------------------------------------------------------------------------
# The stream: headers and an error body trickled
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_trickled_headers_end_at_the_no_content_timeout() -> None:
    with FakeServer(TRICKLED_HEADERS) as fake:
        exc, elapsed = _timed(lambda: run_stream(MESSAGES, base_url=fake.url, timeout=2, deadline_s=4))
    assert type(exc) is NoContentTimeoutError, exc
    assert "sent no answer within 2 s" in str(exc) and "\n" not in str(exc)
    assert elapsed < 2 + SLACK_S


@pytest.mark.timeout(60)
def test_trickled_headers_end_at_the_deadline_when_it_is_nearer() -> None:
    with FakeServer(TRICKLED_HEADERS) as fake:
        exc, elapsed = _timed(lambda: run_stream(MESSAGES, base_url=fake.url, timeout=30, deadline_s=2))
    assert type(exc) is DeadlineExceededError and "deadline of 2 s" in str(exc)
    assert elapsed < 2 + SLACK_S


@pytest.mark.timeout(60)
def test_trickled_error_body_ends_with_the_status_and_what_arrived() -> None:
    with FakeServer(TRICKLED_ERROR) as fake:
        exc, elapsed = _timed(lambda: run_stream(MESSAGES, base_url=fake.url, timeout=2, deadline_s=4))
    assert isinstance(exc, HTTPStatusError) and exc.status == 500
    message = str(exc)
    assert "HTTP 500" in message and "the body stopped after" in message and "time limit" in message
    assert "\n" not in message
    assert elapsed < 2 + SLACK_S


@pytest.mark.timeout(90)
@pytest.mark.parametrize("reply", [TRICKLED_HEADERS, TRICKLED_ERROR], ids=["headers", "error-body"])
def test_cli_sse_ends_within_the_deadline(reply: Reply, tmp_path: Path, env: dict[str, str]) -> None:
    """`voice-llm sse --timeout 2 --deadline 4`: the capability probe and /props answer at once (404), the
    step's own request trickles (a byte a second or every 0.5 s, each within the timeout). The whole command ends
    within the deadline + 2 s, with one line."""
    with FakeServer(reply) as fake:
        t0 = time.monotonic()
        result = cli("sse", "--url", fake.url, "--out", str(tmp_path / "out"), "-q", "--timeout", "2",
                     "--deadline", "4", env=env, timeout=60)
        elapsed = time.monotonic() - t0
    assert_clean_failure(result, "voice-llm sse:", fake.url)
    assert elapsed < 4 + SLACK_S, result.stderr


@pytest.mark.timeout(60)
def test_stand_alone_sse_py_is_bounded_too(tmp_path: Path) -> None:
    """sse.py copied alone (as into OUT) keeps the wall-clock limits: it imports nothing of the package."""
    import shutil
    import subprocess
    import sys

    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(sse.__file__, alone / "sse.py")
    with FakeServer(TRICKLED_HEADERS) as fake:
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-I", "sse.py", "--url", fake.url, "--timeout", "2", "--deadline", "4"],
                              cwd=alone, capture_output=True, text=True, timeout=40)
        elapsed = time.monotonic() - t0
    assert done.returncode == 1 and "no-content timeout" in done.stderr, done.stderr
    assert elapsed < 4 + SLACK_S


# ---------------------------------------------------------------------------------------------------------------
# GETs: /health, /props, the /slots poller, the probe's fetch
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reply", [TRICKLED_HEADERS, TRICKLED_JSON], ids=["headers", "body"])
def test_get_json_is_bounded_by_the_timeout(reply: Reply) -> None:
    with FakeServer(reply, script_props=True) as fake:
        exc, elapsed = _timed(lambda: ServerClient(fake.url, timeout=2, deadline_s=10).props())
    assert isinstance(exc, StreamTimeoutError) and "within 2 s" in str(exc), exc
    assert elapsed < 2 + SLACK_S


@pytest.mark.timeout(60)
def test_get_json_is_bounded_by_the_deadline_when_it_is_nearer() -> None:
    with FakeServer(TRICKLED_JSON) as fake:
        exc, elapsed = _timed(lambda: ServerClient(fake.url, timeout=30, deadline_s=2).health())
    assert type(exc) is DeadlineExceededError and "deadline of 2 s" in str(exc)
    assert elapsed < 2 + SLACK_S


@pytest.mark.timeout(60)
def test_the_slots_poller_is_bounded() -> None:
    with FakeServer([Reply.json(200, [{"id": 0, "is_processing": False}]), TRICKLED_JSON], keep_alive=100) as fake:
        with ServerClient(fake.url, timeout=2).poller() as slots:
            assert slots.get() == [{"id": 0, "is_processing": False}]
            exc, elapsed = _timed(slots.get)
    assert isinstance(exc, StreamTimeoutError)
    assert elapsed < 2 + SLACK_S


@pytest.mark.timeout(60)
def test_the_probe_fetch_honours_the_timeout() -> None:
    # It used to wait a fixed 10 s per GET whatever --timeout said, and read the body with no limit.
    with FakeServer([Reply.json(200, {"data": []}), TRICKLED_JSON], script_probe=True) as fake:
        client = ServerClient(fake.url, timeout=1.5)
        t0 = time.monotonic()
        found, body = capabilities.fetch(client, "/v1/models", probing=True)
        assert found.ok and body == b'{"data": []}'
        found, body = capabilities.fetch(client, "/v1/models", probing=True)
        elapsed = time.monotonic() - t0
    assert found.status is None and "within 1.5 s" in found.note and body == b""
    assert elapsed < 1.5 + SLACK_S


@pytest.mark.timeout(60)
def test_a_stalled_probe_get_waits_at_most_the_timeout() -> None:
    with FakeServer(Reply(200, (("Content-Type", "application/json"),), ((0.0, b"{}"),), framing="length",
                          stall_s=8.0), script_probe=True) as fake:
        t0 = time.monotonic()
        found, _ = capabilities.fetch(ServerClient(fake.url, timeout=1.0), "/metrics", probing=True)
        elapsed = time.monotonic() - t0
    assert found.status is None and "within 1 s" in found.note
    assert elapsed < 1 + SLACK_S


# ---------------------------------------------------------------------------------------------------------------
# Size caps
# ---------------------------------------------------------------------------------------------------------------


def _huge_models(framing: str) -> Reply:
    body = b'{"data": [' + b",".join(b'{"id": "m%07d"}' % i for i in range(600_000)) + b"]}"
    assert len(body) > api.MAX_ANSWER_BYTES
    if framing == "length":
        return Reply.body(200, body, "application/json")
    pieces = tuple((0.0, body[i:i + (1 << 20)]) for i in range(0, len(body), 1 << 20))
    return Reply(200, (("Content-Type", "application/json"),), pieces, framing="chunked")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_an_answer_over_the_cap_is_refused_with_one_line(framing: str) -> None:
    with FakeServer(_huge_models(framing), script_probe=True) as fake:
        with pytest.raises(AnswerTooLargeError) as info:
            ServerClient(fake.url, timeout=20).get_json("/v1/models")
        found, body = capabilities.fetch(ServerClient(fake.url, timeout=20), "/v1/models", probing=True)
    message = str(info.value)
    assert "8 MiB" in message and str(api.MAX_ANSWER_BYTES) in message and "\n" not in message
    assert len(message) < 300
    # The probe records it and reads nothing of it: no model ids, nothing copied into capabilities.json.
    assert found.status is None and "8 MiB" in found.note and body == b""


@pytest.mark.timeout(60)
def test_the_probe_with_an_answer_over_the_cap_writes_small_artifacts(tmp_path: Path) -> None:
    replies = [Reply.json(200, {"status": "ok"}), Reply.json(404, {}), Reply.json(404, {}), _huge_models("length"),
               Reply.json(404, {}), Reply.stream(b"".join(llama_events(["OK"])))]
    with FakeServer(replies, script_probe=True, script_props=True) as fake:
        caps = capabilities.probe(ServerClient(fake.url, timeout=20))
    assert caps.model_ids == () and caps.model is None
    assert len(repr(caps.as_dict())) < 10_000
    assert "8 MiB" in (caps.endpoint("/v1/models").note or "")


# ---------------------------------------------------------------------------------------------------------------
# TLS: an https URL to a plain HTTP server fails at the first request
# ---------------------------------------------------------------------------------------------------------------


HANDSHAKE_S = 1.0  # the handshake limit in these tests (5 s in use): how long each attempt waits is not what they test


@pytest.fixture
def short_handshake(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(sse, "TLS_HANDSHAKE_TIMEOUT_S", HANDSHAKE_S)  # the CLI runs in this process (clihelpers.cli)
    return HANDSHAKE_S


@pytest.mark.timeout(60)
def test_not_tls_is_remembered_so_later_requests_fail_at_once(short_handshake: float) -> None:
    with RawServer() as raw_server:  # never answers a handshake: each attempt would wait the handshake limit
        url = f"https://127.0.0.1:{raw_server.port}"
        with pytest.raises(NotTLSError):
            ServerClient(url, timeout=30).health()
        for request in (lambda: ServerClient(url, timeout=30).props(),
                        lambda: run_stream(MESSAGES, base_url=url, timeout=30),
                        lambda: ServerClient(url + "/v1", timeout=30).poller().get()):
            with pytest.raises(NotTLSError, match="does not speak TLS"):
                request()
        with pytest.raises(NotTLSError):
            capabilities.fetch(ServerClient(url, timeout=30), "/health", probing=True)
    assert raw_server.connections == 1  # only the first request connected


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", ["health", "sse"])
def test_cli_https_to_a_plain_server_ends_at_the_first_request(command: str, tmp_path: Path, env: dict[str, str],
                                                               short_handshake: float) -> None:
    """It used to take 41 s: 5 s of handshake for each of /props, the probe's five GETs and stream, the step."""
    with RawServer() as raw_server:
        port = raw_server.port
        url = f"https://127.0.0.1:{port}"
        t0 = time.monotonic()
        result = cli(command, "--url", url, "--out", str(tmp_path / "out"), "-q", env=env, timeout=80)
        elapsed = time.monotonic() - t0
    err = assert_clean_failure(result, "does not speak TLS", f"use http://127.0.0.1:{port}")
    assert raw_server.connections == 1, err
    assert elapsed < 2 * short_handshake + SLACK_S  # one handshake waited, not one for each of the 8 requests
