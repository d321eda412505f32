"""`voice-llm load --dial` for real: a tiny sweep (1 then 2 callers) of real dial callers against `voice-llm agent`
(Silero, tiny.en, Piper) on the session's real llama-server, over Locust (master + 1 worker process).

The agent takes one call at a time (--max-calls 1), so the 2-caller step has a caller refused (close code 1013)
while the other is on the line: the refusals are counted as errors with the agent's reason, never as slow turns.
What must hold is structure and relations inside the run (heard gaps per step, goodput in [0, 1] and equal to
the samples' share within the SLO, refusals = 1013 errors, the checks pass), never a time: the shared machine's
load decides how long every reply takes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clihelpers import cli, cli_env, wait_for_ready
from conftest import RunningServer
from fakeserver import free_port
from voice_llm.core.errors import EXIT_NO_VERDICT
from voice_llm.capabilities.load import CAPABILITY as LOAD_CAPABILITY
from voice_llm.capabilities.load import stats
from voice_llm.capabilities.load.dialing import LATE_TICK
from voice_llm.capabilities.load.samples import read_samples


def _dialers(state: Path) -> list[str]:
    """The processes this command started that are still running: every one of them (the Locust master and
    workers, each dial call) inherits its environment, whose VOICE_LLM_STATE is this test's own folder. Why not by
    name: other load runs on a shared machine (another test, another user) run Locust workers and dials too."""
    tag = f"VOICE_LLM_STATE={state}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if tag in (entry / "environ").read_bytes():
                found.append(f"{entry.name} {(entry / 'cmdline').read_bytes().replace(bytes(1), b' ').decode()}")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.mark.slow
@pytest.mark.server
def test_a_tiny_dial_sweep_measures_heard_gaps_and_counts_refusals(shared_server: RunningServer,
                                                                    tmp_path: Path) -> None:
    port = free_port()
    ready_file = tmp_path / "ready.json"
    agent = subprocess.Popen(
        ["nice", "-n", "10", sys.executable, "-m", "voice_llm", "agent", "--listen", f"127.0.0.1:{port}",
         "--url", shared_server.url, "--max-calls", "1", "--max-tokens", "8", "--stt-threads", "1",
         "--ready-file", str(ready_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        ready = wait_for_ready(agent, ready_file, 180)
        url = ready["listen"]
        out, state = tmp_path / "out", tmp_path / "state"
        # every step runs whatever the machine's load (--no-stop); as short as what it shows allows: one short line
        # per call (the load lines) and short replies (--max-tokens 8 above), so a call is a few seconds and the
        # drain waits for little; a 10 s window holds a turn or more of the 1-caller step (a turn counts in the
        # window it started in, and a call took 3-7 s at load 3), and the 2-caller step ends early on its refusals
        # (two of them are more misses than the target allows). 20 s windows after 5 s warm-ups made the test 55 s.
        result = cli("load", "--dial", url, "--callers", "1,2", "--step-s", "10", "--warmup-s", "2",
                     "--dial-turns", "1", "--workers", "1", "--no-stop", "--out", str(out), "-q",
                     env=cli_env(state), timeout=600)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.communicate(timeout=120)
    assert result.returncode in (0, EXIT_NO_VERDICT), result.stderr
    assert not _dialers(state), "no dial call, master or worker outlives the command"
    doc = json.loads((out / "load.json").read_text())
    assert (doc["mode"], doc["metric"], doc["slo_heard_ms"]) == ("dial", "heard_gap_ms", 1500.0)
    assert doc["caller"]["lines"] == "load" and doc["caller"]["turns"] == 1
    (sweep,) = doc["sweeps"]
    assert sweep["url"] == url and [s["callers"] for s in sweep["steps"]] == [1, 2]
    samples = read_samples(out / "load_samples.csv")
    for step in sweep["steps"]:
        measured = [s for s in samples if s["step"] == step["step"] and s["phase"] == "measure"]
        heard = [s for s in measured if s["heard_gap_ms"] is not None]
        # dial's LATE_TICK_RULE: the reply heard, its gap not timed (a loaded machine's dialer): unjudged, no error
        late = [s for s in measured if s["unjudged"] == LATE_TICK]
        assert all(s["late_frames"] > 0 and s["first_sound_ms"] is not None and not s["error"] for s in late), late
        assert step["unjudged"] == len(late)
        # a step ends early once it missed more than the target allows (stats.failed_early): the 2-caller step
        # can end on its refusals alone, before a turn of the caller on the line ends in its window
        assert heard or late or (stats.failed_early(step) and step["refused"] > stats.ALLOWED_MISSES), \
            f"{step['callers']} callers: no heard gap measured"
        if heard:  # nearest rank: one of the samples
            assert step["heard_gap_ms"]["p50"] in [s["heard_gap_ms"] for s in heard]
        assert 0.0 <= step["goodput"] <= 1.0
        judged = [s for s in measured if s["error"] or s["heard_gap_ms"] is not None]
        assert step["goodput"] == sum(1 for s in judged if not s["error"] and s["heard_gap_ms"] <= 1500.0) / len(judged)
        assert step["calls"] >= 1 and step["call_frames"] > 0 and step["late_frames"] >= 0
        assert step["refused"] == sum(1 for s in measured if s["refused"])
        for s in heard:
            assert s["first_sound_ms"] - s["speech_end_ms"] == pytest.approx(s["heard_gap_ms"], abs=0.01)
    one, two = sweep["steps"]
    one_late = [s for s in samples if s["step"] == one["step"] and s["phase"] == "measure" and s["unjudged"]]
    assert one["heard_gap_ms"]["p50"] is not None or one_late, "the 1-caller step heard the agent"
    assert one["refused"] == 0, "one caller on a one-call agent is never refused"
    assert two["refused"] >= 1, "two callers on a one-call agent: the second is refused while the first is on the line"
    refusals = [s for s in samples if s["refused"]]
    assert all(s["error"].startswith("refused: close code 1013") and s["heard_gap_ms"] is None for s in refusals)
    assert two["error_reasons"][refusals[0]["error"]] >= 1 and "--max-calls" in refusals[0]["error"]
    assert "limit" in " ".join(two["error_reasons"])
    # the host CPU per process of each step: the agent (listening on the dialled port) and the local worker are this
    # machine's processes, so both have a reading; the LLM server is the agent's --url (the session's server)
    found = sweep["processes_found"]
    assert found["agent"]["pids"] == [ready["pid"]]
    for step in sweep["steps"]:
        cpu = step["processes"]
        assert cpu["agent"]["cpu_s"] is not None and cpu["agent"]["cpu_s"] > 0, cpu
        assert cpu["workers"]["cpu_s"] is not None and cpu["wall_s"] > 0
        assert cpu["agent"]["share"] == pytest.approx(cpu["agent"]["cpu_s"] / cpu["wall_s"], abs=1e-3)
    for entry in LOAD_CAPABILITY.checks:
        assert entry.run(out), entry.name
    verdict = sweep["verdict"]
    assert verdict["judged_per_step"] == [s["judged"] for s in sweep["steps"]]
    assert verdict == stats.verdict(sweep["steps"], None, early=True)
    assert verdict["max_callers"] is not None or not any(stats.decided(s, True) for s in sweep["steps"])
