"""`voice-llm up --slots 4` and then `voice-llm load` with its defaults, on the real llama-server: -c 4096 split over
4 slots leaves 1024 tokens per slot (its /props says so), and the clinic call's last turn needs about 3500. Both
ways a newcomer points load at that server are refused in seconds, before any turn, with the per-slot numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from clihelpers import assert_clean_failure, cli, cli_env
from conftest import free_port
from fakeserver import RecordingProxy

pytestmark = pytest.mark.server


def test_up_four_slots_then_load_is_refused_before_any_turn(tmp_path: Path, server_binary: Path, model_path: Path) -> None:
    env = cli_env(tmp_path / "state")
    port = free_port()
    started = cli("up", "--slots", "4", "--port", str(port), "--threads", "1", "-q", env=env, timeout=300)
    assert started.returncode == 0, started.stderr
    try:
        with RecordingProxy(f"http://127.0.0.1:{port}") as proxy:
            proxy_port = proxy.port
            by_url = cli("load", "--url", proxy.url, "--out", str(tmp_path / "a"), "-q", env=env)
        sent = b"".join(proxy.upstream)
        by_port = cli("load", "--port", str(port), "--out", str(tmp_path / "b"), "-q", env=env)
    finally:
        cli("down", "--port", str(port), env=env)
    err = assert_clean_failure(by_url, "gives each slot 1024 tokens (4 slots)", "counted by the server's tokenizer",
                               f"voice-llm up --port {proxy_port} --slots 4 --ctx 16384 --restart", "--docs")
    assert "clinic call's longest request (turn 6 of 6" in err
    assert b"/tokenize" in sent and b"/chat/completions" not in sent, "counted, and no turn was sent"
    # `load --port P` with no --slots sweeps the managed server running there as it is: the same refusal, before
    # any turn, naming that server and how to restart it with room for the call
    assert_clean_failure(by_port, "gives each slot 1024 tokens (4 slots)", f"the server at http://127.0.0.1:{port} ",
                         f"voice-llm up --port {port} --slots 4 --ctx 16384 --restart")
    for out in (tmp_path / "a", tmp_path / "b"):
        assert not (out / "load.json").exists() and not (out / "load_samples.csv").exists()


def test_a_managed_server_with_the_same_slots_is_checked_not_swept(tmp_path: Path, server_binary: Path,
                                                                   model_path: Path) -> None:
    """The managed server load would start itself (1 slot, 4096 tokens) already runs: load reuses it, and its
    preflight refuses 24 documents (about 6000 tokens) before any turn, naming the managed server's numbers."""
    from builders import big_kb

    env = cli_env(tmp_path / "state")
    port = free_port()
    started = cli("up", "--slots", "1", "--port", str(port), "--threads", "1", "-q", env=env, timeout=300)
    assert started.returncode == 0, started.stderr
    try:
        result = cli("load", "--port", str(port), "--slots", "1", "--threads", "1", "--kb", str(big_kb(tmp_path / "kb")),
                     "--docs", "24", "--out", str(tmp_path / "out"), "-q", env=env)
        still_up = cli("status", "--port", str(port), env=env)
    finally:
        cli("down", "--port", str(port), env=env)
    assert_clean_failure(result, f"the managed server on port {port} gives each slot 4096 tokens (1 slot)",
                         "24 KB documents", "--ctx", "--docs, now 24")
    assert not (tmp_path / "out" / "load.json").exists()
    assert str(port) in still_up.stdout, "the server load found running is left running"
