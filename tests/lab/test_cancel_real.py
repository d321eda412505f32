"""The cancel step against the real llama-server: one kept-alive poller, the idle clock from the close, the log read
only when it is the answering server's. Relations only, never a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voice_llm.core.checks import core as check
from voice_llm.core.client.api import JSONPoller, ServerClient
from voice_llm.core.scenario.kb import default_kb_dir
from voice_llm.core.lab import cancel
from voice_llm.core.run.context import StepOptions

from clihelpers import cli
from conftest import RunningServer

pytestmark = pytest.mark.server


def test_cancel_polls_one_connection_and_check_bounds_it(module_server: RunningServer, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, step_context) -> None:
    pollers: list[JSONPoller] = []
    make_poller = ServerClient.poller

    def recorded(client: ServerClient, path: str = "/slots") -> JSONPoller:
        pollers.append(make_poller(client, path))
        return pollers[-1]

    monkeypatch.setattr(ServerClient, "poller", recorded)
    ctx = step_context(module_server.url, kb_dir=default_kb_dir(), server_log=module_server.log,
                       options=StepOptions(repeat=2))
    cancel.run(ctx)
    doc = json.loads((tmp_path / "cancel.json").read_text())
    # Per cut (a cut the busy machine made too early is made again), one poller for the idle wait before the cut
    # and after it (how often it reconnects depends on the machine's load, so it is not asserted here).
    cuts = 2 + sum(r["discarded_cuts"] for r in doc["repeats"])
    assert len(doc["repeats"]) == 2 and len(pollers) == cuts and all(p.connections >= 1 for p in pollers)
    assert doc["chunks"][-1]["t_ms"] <= doc["closed_at_ms"] and doc["slot_idle_after_ms"] >= 0
    assert doc["received_tokens"] == len(doc["chunks"]) and doc["cancel_logged"] is True
    assert (tmp_path / "raw" / "cancel.sse").is_file() and (tmp_path / "raw" / "cancel-r2.sse").is_file()
    assert not list(tmp_path.glob("raw/*.partial"))
    # The raw stream of the cut the document shows: the same tokens and no [DONE].
    check._cancel_raw(tmp_path, doc["received_tokens"], doc["raw"])
    # The idle bound itself (two of this answer's token times + 50 ms) is a time: check's tests cover it, and a
    # busy machine may break it honestly.


def test_cancel_against_a_server_voice_llm_did_not_start_there(module_server: RunningServer, tmp_path: Path,
                                                                env: dict[str, str], state_dir: Path) -> None:
    """``env`` has a state folder of its own: no record for this port. Before the fix the step crashed after
    measuring (no log file), and with an earlier server's log there it recorded cancel_logged false."""
    port = str(module_server.settings.port)
    out = tmp_path / "out"
    cancel_step(port, out, env)
    assert json.loads((out / "cancel.json").read_text())["cancel_logged"] is None
    old_log = state_dir / f"port-{port}" / "server.log"
    old_log.parent.mkdir(parents=True)
    old_log.write_text("srv  main: an earlier server's log, no cancel in it\n")
    cancel_step(port, out, env)
    assert json.loads((out / "cancel.json").read_text())["cancel_logged"] is None


def cancel_step(port: str, out: Path, env: dict[str, str], tries: int = 3) -> None:
    """`voice-llm cancel --port P --repeat 1`, run again when the step (after its own attempts) found the machine
    too busy to cut an answer that runs at its own speed; anything else fails at once."""
    for _ in range(tries):
        done = cli("cancel", "--port", port, "--out", str(out), "--repeat", "1", "-q", env=env)
        if done.returncode == 0 or "token(s) arrived in the first" not in done.stderr:
            break
    assert done.returncode == 0, done.stderr
