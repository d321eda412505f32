"""Bad lines and bad agents: each one clear line (exit 1, no traceback), the partial call kept beside any earlier
dial.json (dial-partial.json, dial/partial-call.wav with a valid header), no hang past the deadline."""

from __future__ import annotations

import http.server
import socket
import threading
import time
import wave
from pathlib import Path

import pytest
from dialhelpers import context, tones, write_tone_wavs
from fakeagent import FakeAgent, Reply
from truth import measured_turns
from fakeserver import free_port

from voice_llm.cli.main import main
from voice_llm.capabilities.dial.call import DialError
from voice_llm.capabilities.dial.step import DialOptions, dial_step
from voice_llm.core.util.artifacts import read_json

REPLY = [Reply(100, 200, "m1")]


def quick(**extra: object) -> DialOptions:
    values = dict(stt="none", lead_ms=100.0, think_ms=60.0, reply_end_ms=200.0, barge_in_turns=(),
                  deadline_s=3.0)
    values.update(extra)
    return DialOptions(**values)  # type: ignore[arg-type]


def assert_partial(out: Path, *needles: str) -> dict:
    doc = read_json(out / "dial-partial.json")
    for needle in needles:
        assert needle in doc["error"], doc["error"]
    assert not (out / "dial.json").exists()
    with wave.open(str(out / "dial" / "partial-call.wav"), "rb") as wav:
        frame = doc["line"]["rate"] * doc["line"]["frame_ms"] // 1000
        assert wav.getnchannels() == 2 and wav.getnframes() == doc["playout"]["frames"] * frame
    assert not list((out / "dial").glob(".call-live-*"))
    return doc


def failing_call(out: Path, agent_url: str, options: DialOptions, *needles: str) -> tuple[dict, float]:
    t0 = time.perf_counter()
    with pytest.raises(DialError) as caught:
        dial_step(context(out), options, agent_url, caller=tones(1, rate=options.line_format().rate))
    elapsed = time.perf_counter() - t0
    message = str(caught.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    assert "dial-partial.json" in message
    return assert_partial(out, *needles), elapsed


def test_an_agent_that_never_answers_fails_the_turn_in_time(tmp_path):
    with FakeAgent(REPLY, mode="silent") as agent:
        doc, elapsed = failing_call(tmp_path, agent.url, quick(reply_wait_s=0.5), "no reply within 0.5 s in turn 1")
    assert elapsed < 3.0  # the reply wait, not the deadline nor a hang
    assert doc["turns"][0]["heard"]["first_sound_ms"] is None and "turns[0].heard" in doc["unknown"]


def test_an_agent_that_hangs_up_mid_call(tmp_path):
    with FakeAgent(REPLY, mode="close", close_after=8) as agent:
        doc, _ = failing_call(tmp_path, agent.url, quick(), "the agent hung up mid-call", "turn 1", "close code 1000")
    assert doc["playout"]["frames"] >= 8


def test_an_agent_at_its_call_limit_refuses(tmp_path):
    with FakeAgent(REPLY, mode="refuse") as agent:
        failing_call(tmp_path, agent.url, quick(), "the agent refused the call before turn 1", "close code 1013",
                     "at its limit", "try again later")


def test_an_agent_that_floods_the_line(tmp_path):
    with FakeAgent(REPLY, mode="flood", flood_s=3.0) as agent:
        doc, _ = failing_call(tmp_path, agent.url, quick(cap_s=1.0), "flooded the line", "more than 1 s")
    assert doc["playout"]["dropped_ms"] > 0


@pytest.mark.parametrize("mode", ["mark_flood", "empty_flood", "byte_flood"])
def test_a_flood_of_tiny_messages_ends_the_call_as_flooded_and_keeps_it(tmp_path, mode):
    """Issue 41 item 12: a mark flood took the dialer 75 -> 768 MB in 30 s (1.1M events), empty-media and 1-byte
    floods 341 and 521 MB. Now each is "the agent flooded the line" within the 1 s window's bound: the reply heard
    before it is kept, and the events kept stay within the bound (what the flood cost the dialer)."""
    from voice_llm.capabilities.dial import call as callmod

    with FakeAgent(REPLY, mode=mode) as agent:
        doc, _ = failing_call(tmp_path, agent.url, quick(), "the agent flooded the line in turn 1",
                              f"more than {callmod.FLOOD_PER_WINDOW} messages carrying next to no audio",
                              "the call kept up to it")
        sent = agent.flood_sent
    import json

    rows = [json.loads(line) for line in (tmp_path / "dial" / "partial-events.jsonl").read_text().splitlines()]
    floods = [row for row in rows if row.get("event") == "flood"]
    assert len(floods) == 1 and floods[0]["dir"] == "down"
    before = rows[:rows.index(floods[0])]
    tiny = [row for row in before if row.get("dir") == "down" and (row.get("event") == "mark" or (
        row.get("event") == "media" and row.get("samples", 0) < 8000 * callmod.FLOOD_AUDIO_MS / 1000))]
    # the window's bound, however many the agent managed to send: a 1-sample message costs 1 - 1/40 (a 5 ms
    # share), so at most 500 / 0.975 + 1 of them; plus the reply's own mark
    assert callmod.FLOOD_PER_WINDOW - 1 <= len(tiny) <= callmod.FLOOD_PER_WINDOW / 0.975 + 2 < sent
    heard = [row for row in before if row.get("dir") == "down" and row.get("event") == "media"
             and row.get("samples", 0) >= 80]
    assert heard, "the reply's audio before the flood is kept"


def test_a_slow_flood_under_the_window_is_bounded_over_the_call(tmp_path, monkeypatch):
    """A mark every 4 ms (250 a second: under the window's 500) for the rest of the call still ends it once the call's
    allowance (FLOOD_CALL_BASE + FLOOD_CALL_PER_S a second) is spent; both are lowered so a short call spends it."""
    from voice_llm.capabilities.dial import call as callmod

    monkeypatch.setattr(callmod, "FLOOD_CALL_BASE", 30)
    monkeypatch.setattr(callmod, "FLOOD_CALL_PER_S", 10)
    with FakeAgent(REPLY, mode="slow_marks") as agent:
        doc, _ = failing_call(tmp_path, agent.url, quick(deadline_s=8.0), "the agent flooded the line",
                              "messages carrying next to no audio in", "at most 30 plus 10 a second")
    assert doc["playout"]["frames"] > 0


def test_seconds_of_audio_at_once_in_small_chunks_are_no_flood(tmp_path):
    """The bound counts what carries next to no audio: a reply of 7 s sent at once in 10 ms chunks (700 messages
    within a few ms, over the window's 500 were every message counted) is a normal call."""
    with FakeAgent([Reply(100, 7000, "m1")]) as agent:
        dial_step(context(tmp_path), quick(deadline_s=8.0), agent.url, caller=tones(1))
    doc = read_json(tmp_path / "dial.json")
    # heard (its gap measured, unless a late tick nulled it with its reason: tests/truth.py) and played in full
    assert doc["turns"][0]["heard"]["first_sound_ms"] is not None and doc["playout"]["audio_frames"] >= 340
    measured_turns(doc, at_least=0)


def test_an_agent_message_over_the_dialers_cap_is_said_as_such(tmp_path):
    """A 50 MB message: the dialer's websockets closes the line with 1009 over its own 1 MiB max_size; said as
    what happened (the cap, the dialer's close), not "the agent hung up"; the call up to it is kept."""
    with FakeAgent(REPLY, mode="huge", huge_bytes=2 << 20) as agent:
        doc, _ = failing_call(tmp_path, agent.url, quick(), "the agent sent a message over the dialer's 1 MiB cap "
                              "(1009) in turn 1", "the call kept up to it")
    assert "hung up" not in doc["error"]
    import json

    rows = [json.loads(line) for line in (tmp_path / "dial" / "partial-events.jsonl").read_text().splitlines()]
    closed = [row for row in rows if row.get("event") == "closed"]
    assert [(row["dir"], row["how"][:15]) for row in closed] == [("up", "close code 1009")]
    before = rows[:rows.index(closed[0])]
    assert any(row.get("dir") == "down" and row.get("event") == "media" for row in before)  # the reply before it is kept


@pytest.mark.parametrize(("mode", "protocol", "needle"), [
    ("garbage", "twilio", "not a JSON message"),
    ("bad_base64", "twilio", "not base64"),
    ("binary", "twilio", "a binary frame of 160 bytes on a Twilio line"),
    ("odd_pcm", "pcm", "is not whole 16-bit samples"),
])
def test_what_the_line_does_not_carry(tmp_path, mode, protocol, needle):
    rate = 8000 if protocol == "twilio" else 16000
    with FakeAgent(REPLY, mode=mode, protocol=protocol, rate=rate) as agent:
        doc, _ = failing_call(tmp_path, agent.url, quick(protocol=protocol), "the agent sent what the line does not "
                              "carry in turn 1", needle)
    bad = [e for e in (tmp_path / "dial" / "partial-events.jsonl").read_text().splitlines() if '"bad"' in e]
    assert len(bad) == 1


class _Plain(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        body = b"<html>not a websocket</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


def _cli(capsys, *args: str) -> tuple[int, str]:
    status = main(["dial", *args, "--quiet"])
    return status, capsys.readouterr().err


def test_cli_a_url_that_is_not_a_websocket(tmp_path, capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, err = _cli(capsys, f"ws://127.0.0.1:{server.server_address[1]}/", "--out", str(tmp_path / "out"),
                           "--caller-audio", str(write_tone_wavs(tmp_path / "wavs", 1)), "--turns", "1",
                           "--barge-in-turns", "none", "--stt", "none", "--deadline", "3")
    finally:
        server.shutdown()
        server.server_close()
    assert status == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "does not answer as a WebSocket (HTTP 200)" in err
    assert read_json(tmp_path / "out" / "dial-partial.json")["playout"]["frames"] == 0


def test_cli_nothing_listening(tmp_path, capsys):
    status, err = _cli(capsys, f"ws://127.0.0.1:{free_port()}/", "--out", str(tmp_path / "out"),
                       "--caller-audio", str(write_tone_wavs(tmp_path / "wavs", 1)), "--turns", "1", "--barge-in-turns", "none", "--stt", "none")
    assert status == 1 and len(err.strip().splitlines()) == 1 and "nothing answers at ws://127.0.0.1:" in err, err


def _plain_tcp(reply: bytes) -> tuple[int, threading.Thread, socket.socket]:
    """A TCP server that answers one connection's first bytes with ``reply`` (not TLS) and closes it."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread, listener


@pytest.mark.parametrize("agent", ["websocket", "http"])
def test_cli_wss_to_an_agent_without_tls_says_why(tmp_path, capsys, agent):
    """wss:// to a plain ws:// agent: the TLS handshake fails (a websockets agent resets it: a ConnectionResetError
    with no text; an HTTP one answers plain text: an SSL error); said with the exception's class and the reason, never
    an empty "(HOST:PORT: )"."""
    common = ["--out", str(tmp_path / "out"), "--caller-audio", str(write_tone_wavs(tmp_path / "wavs", 1)),
              "--turns", "1", "--barge-in-turns", "none", "--stt", "none", "--deadline", "3"]
    if agent == "websocket":
        with FakeAgent(REPLY) as fake:
            status, err = _cli(capsys, fake.url.replace("ws://", "wss://"), *common)
        said = "ConnectionResetError"
    else:
        port, thread, listener = _plain_tcp(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        with listener:
            status, err = _cli(capsys, f"wss://127.0.0.1:{port}/stream", *common)
        thread.join(5)
        said = "SSLError: [SSL: WRONG_VERSION_NUMBER]"
    assert status == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "the TLS handshake failed" in err and said in err and "does not speak TLS" in err, err
    assert ": )" not in err and "ws://127.0.0.1:" in err  # the plain URL to try instead
    assert read_json(tmp_path / "out" / "dial-partial.json")["playout"]["frames"] == 0


def test_cli_a_failed_call_keeps_the_earlier_dial_json(tmp_path, capsys):
    """A good call, then one to the same agent (its URL: a re-dial of another is refused) that now never answers:
    dial.json and dial/call.wav stay as they were."""
    out, wavs = tmp_path / "out", write_tone_wavs(tmp_path / "wavs", 1)
    common = ["--out", str(out), "--caller-audio", str(wavs), "--turns", "1", "--barge-in-turns", "none", "--stt", "none", "--deadline", "3"]
    with FakeAgent(REPLY) as agent:
        status, err = _cli(capsys, agent.url, *common)
        port = agent.port
    assert status == 0, err
    before = {name: (out / name).read_bytes() for name in ("dial.json", "dial/call.wav", "dial/events.jsonl")}
    with FakeAgent(REPLY, mode="silent", port=port) as agent:
        status, err = _cli(capsys, agent.url, *common, "--reply-wait", "0.5")
    assert status == 1 and "no reply within 0.5 s in turn 1" in err and "Traceback" not in err, err
    assert {name: (out / name).read_bytes() for name in before} == before
    assert (out / "dial-partial.json").is_file() and (out / "dial" / "partial-call.wav").is_file()
    run = read_json(out / "run.json")
    assert "dial.json" in run["artifacts"] and run["failed_step"] == "dial"


def test_the_stt_failing_after_the_call_keeps_the_measurements(tmp_path):
    from voice_llm.capabilities.dial.step import Prepared
    from voice_llm.engines.speech_in.stt import STTError

    class Broken:
        def transcribe(self, samples, script):
            raise STTError("faster-whisper failed: RuntimeError: out of memory")

    with FakeAgent(REPLY) as agent:
        with pytest.raises(STTError) as caught:
            dial_step(context(tmp_path), quick(), agent.url, prepared=Prepared(tones(1), Broken(), None))
    assert "dial-partial.json" in " ".join(getattr(caught.value, "__notes__", []))
    doc = assert_partial(tmp_path, "out of memory")
    # what was heard is measured without the words (the gap, unless a late tick nulled it with its reason)
    assert doc["turns"][0]["heard"]["first_sound_ms"] is not None and measured_turns(doc, at_least=0) is not None
    assert doc["unknown"]["turns[0].heard.transcript"].startswith("not transcribed: faster-whisper failed")


def test_cli_the_callers_reply_end_and_think_time_are_set_and_kept(tmp_path, capsys):
    """--reply-end-ms and --think-ms reach the call: dial.json states them, and the second line starts no sooner
    than the first reply's last heard sound + both (the law `check` holds the call to, from the files)."""
    out, wavs = tmp_path / "out", write_tone_wavs(tmp_path / "wavs", 2)
    with FakeAgent(REPLY) as agent:
        status, err = _cli(capsys, agent.url, "--out", str(out), "--caller-audio", str(wavs), "--turns", "2",
                           "--barge-in-turns", "none", "--stt", "none", "--deadline", "5",
                           "--reply-end-ms", "450", "--think-ms", "120")
    assert status == 0, err
    doc = read_json(out / "dial.json")
    assert doc["settings"]["reply_end_ms"] == 450 and doc["settings"]["think_ms"] == 120
    first, second = doc["turns"]
    assert second["caller"]["offset_ms"] >= first["heard"]["last_sound_ms"] + 450 + 120 - doc["line"]["frame_ms"]
    # and sooner than the defaults would have let it (700 + 300 ms): on the call clock, counted in frames
    assert second["caller"]["offset_ms"] < first["heard"]["last_sound_ms"] + 700 + 300
    assert main(["check", str(out)]) == 0, capsys.readouterr().out


# --- bad flag values: usage errors (exit 2), refused before anything starts -------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["ws://127.0.0.1:9/", "--jitter-ms", "100000"], "--jitter-ms"),
    (["ws://127.0.0.1:9/", "--protocol", "pcm", "--rate", "1"], "--rate"),
    (["ws://127.0.0.1:9/", "--protocol", "pcm", "--rate", "999999"], "--rate"),
    (["ws://127.0.0.1:9/", "--codec", "pcm16"], "--codec pcm16"),
    (["http://127.0.0.1:9/"], "ws:// or wss://"),
    (["ws://127.0.0.1:0/"], "port 0"),
    (["ws://127.0.0.1:99999/"], "no valid port"),
    (["ws://127.0.0.1:9/", "--otlp", "nonsense"], "--otlp"),
    (["ws://127.0.0.1:9/", "--deadline", "1e300"], "86400"),
    (["ws://127.0.0.1:9/", "--think-ms", "1e12", "--deadline", "10"], "--deadline"),
    (["ws://127.0.0.1:9/", "--reply-wait", "100", "--deadline", "10"], "--deadline"),
])
def test_cli_a_bad_flag_value_is_a_usage_error(tmp_path, capsys, args, needle):
    with pytest.raises(SystemExit) as stop:
        main(["dial", *args, "--out", str(tmp_path / "out"), "--stt", "none", "--quiet"])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and needle in error_lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()

