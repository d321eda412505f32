"""Calls under load, against the real llama-server: the Locust sweep (master + 2 worker processes on loopback), its
agreement with the lab at one caller, and the one-caller `call` step with the cache on and off."""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from clihelpers import cli, cli_env
from conftest import free_port
from voice_llm.capabilities.conversation import CAPABILITY as CALL_CAPABILITY
from voice_llm.capabilities.load import CAPABILITY as LOAD_CAPABILITY
from voice_llm.capabilities.load import stats
from voice_llm.core.errors import EXIT_NO_VERDICT
from voice_llm.capabilities.load.samples import read_samples
from voice_llm.core.sse import SSEDecoder

LOAD_CHECKS = tuple((entry.name, entry.run) for entry in LOAD_CAPABILITY.checks)  # (name, check) of each
CALL_CHECKS = tuple((entry.name, entry.run) for entry in CALL_CAPABILITY.checks)

pytestmark = pytest.mark.server


def _locust_processes(state: str) -> list[str]:
    """The Locust master and workers still running that this module's commands started: those whose environment
    holds this module's VOICE_LLM_STATE (a worker outliving its load is reparented, so ancestry cannot say; another
    session's Locust on the same machine is not this test's leftover)."""
    found = subprocess.run(["pgrep", "-af", "locust_users.py|voice_llm.capabilities.load.sweep"], capture_output=True, text=True)
    ours = []
    for line in found.stdout.splitlines():
        pid = line.split(" ", 1)[0]
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone since pgrep listed it
            continue
        if f"VOICE_LLM_STATE={state}".encode() in environ:
            ours.append(line)
    return ours


@pytest.fixture(scope="module")
def four_slots(tmp_path_factory: pytest.TempPathFactory, server_binary: Path, model_path: Path) -> Iterator[tuple[dict[str, str], int]]:
    """One managed 4-slot server for the module, started and stopped through the CLI like a user would."""
    env = cli_env(tmp_path_factory.mktemp("state"))
    port = free_port()
    # one server thread: on a shared 2-core machine a spinning 2-thread pool next to other servers collapses
    started = cli("up", "--port", str(port), "--slots", "4", "--ctx", "16384", "--threads", "1", "-q", env=env, timeout=300)
    assert started.returncode == 0, started.stderr
    try:
        yield env, port
    finally:
        cli("down", "--port", str(port), env=env)
        assert not _locust_processes(env["VOICE_LLM_STATE"])


def test_sweep_with_two_workers_writes_goodput_per_step_and_a_verdict(four_slots: tuple[dict[str, str], int],
                                                                     tmp_path: Path) -> None:
    env, port = four_slots
    result = cli("load", "--port", str(port), "--slots", "4", "--threads", "1", "--workers", "2", "--callers", "1,4",
                 "--step-s", "10", "--warmup-s", "2", "--docs", "0", "--max-tokens", "12", "--think-scale", "0",
                 "--barge-in", "0.2",
                 # every step runs whatever the machine's load (no timed assertion); no think time and short
                 # answers, so that even a slow shared machine starts turns in each short window (which ends
                 # sooner once 20 judged turns are in). Two steps: one caller (on one worker), then four over both
                 # workers (a 2-caller step between them proved nothing more, ~7 s of the test)
                 "--no-stop", "--out", str(tmp_path), "-q", env=env, timeout=400)
    assert result.returncode in (0, EXIT_NO_VERDICT), result.stderr
    assert not _locust_processes(env["VOICE_LLM_STATE"])
    doc = json.loads((tmp_path / "load.json").read_text())
    (sweep,) = doc["sweeps"]
    assert sweep["slots"] == 4 and len(sweep["workers"]) == 2
    assert [s["callers"] for s in sweep["steps"]] == [1, 4]
    for step in sweep["steps"]:
        assert step["turns"] > 0 and step["goodput"] is not None and step["errors"] == 0
        assert step["cpu"], "each worker reports its CPU over the measured window"
    samples = read_samples(tmp_path / "load_samples.csv")
    measured = [s for s in samples if s["phase"] == "measure"]
    assert {s["worker"] for s in measured} == set(sweep["workers"]), "samples from both workers"
    assert {s["worker"] for s in measured if s["step"] == 1} == set(sweep["workers"])
    assert any(s["phase"] == "warmup" for s in samples), "warm-up turns are kept in the CSV, not counted"
    assert max(s["turn"] for s in samples) > 1, "callers go on with their conversation"
    assert any(s["cache_n"] for s in samples if s["turn"] > 1), "later turns reuse the cached conversation"
    verdict = sweep["verdict"]
    # a step passes on enough judged turns only (stats.MIN_JUDGED_TURNS), and fails on them or early (more misses
    # than 1 in 20); with no step judged, no verdict and exit status 5
    enough = [s for s in sweep["steps"] if stats.decided(s, True)]
    assert all(s["window"]["ended"] in ("judged", "failed early", "step_s") for s in sweep["steps"])
    if enough:
        assert result.returncode == 0
        passing = [s["callers"] for s in enough if s["judged"] >= stats.MIN_JUDGED_TURNS and s["goodput"] >= 0.95]
        assert verdict["max_callers"] == max(passing, default=0)
        assert f"max callers = {verdict['max_callers']}" in result.stdout
    else:
        assert verdict["max_callers"] is None and "no verdict" in result.stdout
    for name, check in LOAD_CHECKS:
        check(tmp_path)


def _server_prompt_ms(raw: Path) -> float:
    """The server's own prompt evaluation time, from the timings of a saved raw stream."""
    decoder = SSEDecoder()
    payloads = [json.loads(e.data) for e in decoder.feed(raw.read_bytes()) + decoder.end() if e.data != "[DONE]"]
    return float([p["timings"] for p in payloads if "timings" in p][-1]["prompt_ms"])


def _lab_ttft_runs(env: dict[str, str], port: int, out: Path) -> list[tuple[float, float]]:
    """(client TTFT, server prompt evaluation) for each of `voice-llm ttft`'s five runs."""
    lab = cli("ttft", "--port", str(port), "--out", str(out), "-q", env=env)
    assert lab.returncode == 0, lab.stderr
    runs = json.loads((out / "ttft.json").read_text())["runs"]
    return [(run["ttft_ms"], _server_prompt_ms(out / "raw" / f"ttft-{number}.sse")) for number, run in enumerate(runs, 1)]


def _locust_ttfts(env: dict[str, str], port: int, out: Path) -> list[tuple[float, float]]:
    """The lab's ttft request (same prompt, cache off), one Locust caller, back to back. Its answers are cut at 8
    tokens instead of 64: the time to the first token and the server's prompt evaluation are the same (the cap
    only ends each answer sooner). The window ends at its 20th turn (~11 s here); 24 s is room for a machine
    twice as slow to give them all."""
    load = cli("load", "--port", str(port), "--slots", "4", "--threads", "1", "--workers", "1", "--callers", "1",
               "--dialogue", "lab-ttft", "--max-tokens", "8", "--step-s", "24", "--warmup-s", "1", "--think-scale",
               "0", "--barge-in", "0", "--out", str(out), "-q", env=env, timeout=300)
    assert load.returncode in (0, EXIT_NO_VERDICT), load.stderr  # up to 20 turns: a verdict or not, enough here
    return [(s["ttft_ms"], s["prompt_ms"]) for s in read_samples(out / "load_samples.csv") if s["phase"] == "measure"]


def test_one_locust_caller_agrees_with_the_lab_ttft(four_slots: tuple[dict[str, str], int], tmp_path: Path) -> None:
    env, port = four_slots
    # Blocks in turn, lab / Locust / lab, so that a machine whose load drifts (shared cores) weighs on both sides
    # alike; each side's median is over all of its blocks (10 lab runs, up to 20 Locust turns). Two blocks more
    # (lab / Locust / lab / Locust / lab) cost ~23 s of the test's 55 for a margin it does not need: the compared
    # medians (below) were 4-7 ms in every block, lab and Locust alike, against a tolerance of ~37 ms.
    lab = _lab_ttft_runs(env, port, tmp_path / "lab0")
    locust = _locust_ttfts(env, port, tmp_path / "locust1")
    lab += _lab_ttft_runs(env, port, tmp_path / "lab1")
    assert len(locust) >= 12
    lab_p50 = statistics.median(ttft for ttft, _ in lab)
    # The same 34-token prompt takes the one-thread server 230 to 400 ms to evaluate from one request to the next
    # (its own prompt_ms, on a 2-core VM), in runs of fast and slow requests: medians of 25 and 60 such requests
    # were seen 15 % apart both ways (Locust faster in CI, the lab faster here) with each side's client adding the
    # same few ms. What the measuring path decides is TTFT less the server's own evaluation of the prompt:
    # that is compared, against the tolerance (10 % of the lab's TTFT, or 5 ms).
    lab_added = statistics.median(ttft - prompt_ms for ttft, prompt_ms in lab)
    locust_added = statistics.median(ttft - prompt_ms for ttft, prompt_ms in locust)
    print(f"TTFT median: Locust {statistics.median(t for t, _ in locust):.1f} ms over {len(locust)} turns, "
          f"lab {lab_p50:.1f} ms over {len(lab)} runs; beyond the server's prompt evaluation: "
          f"Locust {locust_added:.1f} ms, lab {lab_added:.1f} ms")
    assert all(prompt_ms is not None for _, prompt_ms in locust), "each Locust sample keeps the server's prompt_ms"
    assert abs(locust_added - lab_added) <= max(0.10 * lab_p50, 5.0), (locust_added, lab_added, lab, locust)


def test_call_keeps_later_turns_fast_with_the_cache(shared_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The session's default server (one slot, a thread per core), not the module's one-thread 4-slot server kept
    # for Locust: one conversation needs one slot, and the cache-off prefills are most of the test (32 s -> 19-22 s in CI).
    env = cli_env(tmp_path / "state")
    # Twelve tiny documents (a name and three words each): the step is the real one (12 documents, 6 turns, cache on
    # then off) but the prompt stays small. The cache-off run's prefills are most of the test: measured on a busy
    # 2-core box, 58 of its 80 s with notes of a sentence each (first prompt 456 tokens), 60 s in all with these
    # (234 tokens); the relation keeps a wide margin: turns 2-6's median first token 0.47 s with the cache against
    # 5.6 s without (0.41 against 10.3 with the longer notes).
    kb = tmp_path / "kb"
    kb.mkdir()
    for number in range(1, 13):
        (kb / f"{number:02d}.md").write_text(f"Open at {number + 6}.\n")
    result = cli("call", "--url", shared_server.url, "--kb", str(kb), "--out", str(tmp_path / "out"), "-q", env=env,
                 timeout=600)
    assert result.returncode == 0, result.stderr
    doc = json.loads((tmp_path / "out" / "call.json").read_text())
    assert len(doc["docs"]) == 12 and len(doc["cache_on"]) == len(doc["cache_off"]) == 6
    for name, check in CALL_CHECKS:
        check(tmp_path / "out")
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert "call" in run["steps_planned"]
