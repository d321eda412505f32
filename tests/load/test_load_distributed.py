"""`voice-llm load --master` with workers started apart (`voice-llm load --worker --master-host H`), as across
machines, on loopback. The server is the scripted fake: this tests the Locust plumbing (spawn messages carry the
callers' settings, raw samples reach the master, every process ends), not llama-server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clihelpers import cli_env
from conftest import free_port
from fakeserver import FakeServer, Reply, at, llama_events

pytestmark = pytest.mark.slow  # Locust master and workers


def test_master_and_two_remote_style_workers(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "state")
    port = str(free_port())
    out = tmp_path / "out"
    with FakeServer(Reply.stream(at(0.02, llama_events(["Bring", " your card.", " Thanks."])))) as fake:
        master = subprocess.Popen(
            [sys.executable, "-m", "voice_llm", "load", "--master", "--expect-workers", "2", "--master-bind-host",
             "127.0.0.1", "--master-port", port, "--url", fake.url, "--callers", "1,2", "--step-s", "3",
             "--warmup-s", "1", "--think-scale", "0.01", "--docs", "0", "--out", str(out), "-q"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        workers = [subprocess.Popen([sys.executable, "-m", "voice_llm", "load", "--worker", "--master-host", "127.0.0.1",
                                     "--master-port", port], env=env, stdin=subprocess.DEVNULL)
                   for _ in range(2)]
        try:
            stdout, _ = master.communicate(timeout=120)
            codes = [worker.wait(timeout=30) for worker in workers]
        finally:
            for proc in (master, *workers):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert master.returncode == 0 and codes == [0, 0]
    assert "max callers = 2" in stdout
    doc = json.loads((out / "load.json").read_text())
    (sweep,) = doc["sweeps"]
    assert doc["workers"] == "remote" and len(sweep["workers"]) == 2
    assert sweep["steps"][1]["workers"] == sweep["workers"], "both workers ran callers at the 2-caller step"
    # The callers' settings came from the master: the fake saw the dialogue's first line and its system prompt.
    first = next(r for r in fake.requests if r.path.endswith("/chat/completions")).json  # after GET /v1/models
    assert first["messages"][0]["content"].startswith("You are a clinic phone assistant")
    assert first["messages"][1]["content"].startswith("Hi, I'd like to come in")
    assert 'id="section-load"' in (out / "report.html").read_text(), "the load section is drawn"
