"""benchmarks/bench.py runs end to end on a tiny setting against a real server.

The benchmark is not a timed test: these tests check that it runs and what bench.json holds, never a number.
They do not need the peer libraries (openai, httpx, requests, aiohttp): a missing one is skipped and said so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench.py"
PEERS = ("openai", "httpx", "requests", "requests_none", "aiohttp")
FLOOR_AND_OURS = ("raw", "voice_llm", "voice_llm_on_chunk")

pytestmark = pytest.mark.server


def run_bench(args: list[str], *, block: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run the script as a user would; ``block`` makes those imports fail, as if the library were missing."""
    if block:
        code = (
            "import runpy, sys\n"
            f"for name in {block!r}: sys.modules[name] = None\n"
            f"sys.argv = [{str(BENCH)!r}] + {args!r}\n"
            f"runpy.run_path({str(BENCH)!r}, run_name='__main__')\n"
        )
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, str(BENCH), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)


def assert_rows_recorded(per_client: dict, chunk_ms: dict | None, rounds: int, rows: list[str]) -> None:
    for row in rows:
        assert per_client[row]["rounds_ok"] == rounds, (row, per_client[row])
        if chunk_ms is not None:
            assert len(chunk_ms[row]) == rounds
            assert all(times for times in chunk_ms[row]), f"{row} recorded no chunks in some round"


def test_bench_runs_on_a_tiny_setting(module_server, tmp_path: Path) -> None:
    out = tmp_path / "results"
    # The replayed answer's chunks 2 ms apart instead of the default 10: every stream of the replay and control
    # phases (each client, a warm-up round and the rounds) lasts a fifth as long. What is asserted is that every
    # client's lateness is recorded against the send times, never how late it was.
    done = run_bench(["--url", module_server.url, "--rounds", "2", "--replay-rounds", "2", "--control-rounds", "1",
                      "--replay-interval-ms", "2", "--cancel-runs", "1", "--skip-lab", "--out", str(out), "--quiet"])
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((out / "bench.json").read_text())
    markdown = (out / "bench.md").read_text()
    assert markdown.strip() in done.stdout  # the table is printed too
    assert "## Client overhead" in markdown and "## Cancellation" in markdown and "## Targets" in markdown

    assert set(data) == {"meta", "targets", "overhead", "replay", "control", "cancel"}  # no lab: --skip-lab
    meta = data["meta"]
    assert meta["machine"]["nproc"] >= 1 and meta["machine"]["cpu_model"] and meta["machine"]["python"]
    assert meta["server"]["url"] == module_server.url and not meta["server"]["managed"]
    assert "build_info" in meta["server"]
    assert meta["request_body"]["cache_prompt"] is True and meta["request_body"]["stream"] is True

    overhead = data["overhead"]
    rows = list(overhead["per_client"])
    for name in FLOOR_AND_OURS:
        assert name in rows
    for peer in PEERS:  # measured, or skipped with the reason
        assert peer in rows or peer in meta["skipped_clients"], peer
    assert not overhead["errors"], overhead["errors"]
    assert_rows_recorded(overhead["per_client"], overhead["chunk_ms"], 2, rows)
    for row in rows:
        stats = overhead["per_client"][row]
        for key in ("ttft_ms", "first_chunk_overhead_ms", "chunk_delay_ms"):
            assert set(stats[key]) >= {"n", "median", "p90"} and stats[key]["n"] > 0, (row, key)
        assert stats["same_tokens_as_floor"] == 2  # temperature 0, seed 7: the same answer every time
    assert overhead["per_client"]["raw"]["first_chunk_overhead_ms"]["median"] == 0.0
    # Wire timing needs root on Linux; either it ran or the reason is recorded.
    if overhead["wire"] is None:
        assert overhead["wire_unavailable"]
    else:
        assert set(overhead["wire"]) == set(rows)

    for phase in ("replay", "control"):
        section = data[phase]
        assert set(section["per_client"]) == set(rows), phase
        assert_rows_recorded(section["per_client"], None, section["rounds"], rows)
        for stats in section["per_client"].values():
            assert stats["chunk_lateness_ms"]["n"] > 0 and stats["first_chunk_lateness_ms"]["median"] is not None
    assert data["replay"]["framing"] == "chunked" and data["control"]["framing"] == "close"
    assert data["replay"]["interval_ms"] == data["control"]["interval_ms"] == 2.0

    (run,) = data["cancel"]["runs"]
    assert run["slot_idle_after_ms"] >= 0 and run["predicted_per_token_ms"] > 0 and run["received_tokens"] >= 0

    assert data["targets"] and all({"target", "measured", "ok"} <= set(t) for t in data["targets"])


def test_bench_runs_without_the_peers(module_server, tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = run_bench(["--url", module_server.url, "--rounds", "1", "--skip-replay", "--cancel-runs", "0",
                      "--skip-lab", "--no-wire", "--out", str(out)],
                     block=("openai", "httpx", "requests", "aiohttp"))
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((out / "bench.json").read_text())
    skipped = data["meta"]["skipped_clients"]
    assert set(skipped) == set(PEERS) and all("not installed" in why for why in skipped.values())
    assert set(data["overhead"]["per_client"]) == set(FLOOR_AND_OURS)
    assert_rows_recorded(data["overhead"]["per_client"], data["overhead"]["chunk_ms"], 1, list(FLOOR_AND_OURS))
    assert data["overhead"]["wire_unavailable"] == "--no-wire"
    assert "skipping openai" in done.stderr and "Skipped clients" in done.stdout
