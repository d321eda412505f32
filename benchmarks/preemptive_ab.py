"""Preemptive reply A/B (issue 28 item 3): the built-in agent plain vs ``--preemptive``, heard at the caller's ear.

Two agents on one managed llama-server (same model, same settings but the flag), `voice-llm dial` calls alternating
between them (ABBA order, so a drift in the machine's load falls on both arms), the same caller lines, the agent's
OTLP spans received by each dial (its breakdown and preemptive counts per turn). Every ``--pause-every``-th pair of
calls uses the pause line (`--caller-lines pause`: a 600 ms pause mid-sentence, then one ordinary line) to count
cut-offs. Runs until ``--minutes`` of calls have been made, then stops the agents and prints the table.

    python benchmarks/preemptive_ab.py OUT --url http://127.0.0.1:18500 --ports 18501,18502,18503,18504

Any other pair of agent settings the same way: ``--a-args "..." --b-args "..."`` (arms ``a`` and ``b``, no
``--preemptive`` added), e.g. Piper's threads: ``--a-args "--tts-threads 1" --b-args "--tts-threads 2"``.

Nothing is computed from the design: every gain is a heard gap difference between the two arms' calls.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from voice_llm.capabilities.agent.server import PREEMPTIVE_KEYS
from voice_llm.core.util.artifacts import read_json, write_json
from voice_llm.core.util.stats import median, percentile

ARMS = ("plain", "preemptive")  # the default pair; --a-args/--b-args name theirs a and b


def agent(out: Path, arm: str, url: str, port: int, otlp_port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "voice_llm", "agent", "--listen", f"127.0.0.1:{port}", "--url", url,
            "--otlp", f"http://127.0.0.1:{otlp_port}", "--ready-file", str(out / f"{arm}.ready"), *extra]
    log = open(out / f"agent-{arm}.log", "wb")
    return subprocess.Popen(["nice", "-n", "10", *args], stdout=log, stderr=subprocess.STDOUT)


def dial(out: Path, name: str, port: int, otlp_port: int, lines: str, dial_args: list[str]) -> dict[str, Any] | None:
    folder = out / name
    args = ["nice", "-n", "10", sys.executable, "-m", "voice_llm", "dial", f"ws://127.0.0.1:{port}/", "--out",
            str(folder), "--otlp", f"127.0.0.1:{otlp_port}", *dial_args, "--caller-lines", lines, "-q"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        print(f"{name}: dial failed ({done.returncode}): {done.stderr.strip()[-300:]}", flush=True)
    found = folder / "dial.json"
    return read_json(found) if found.exists() else None


def turns_of(doc: dict[str, Any], arm: str, call: str, lines: str, load: float) -> list[dict[str, Any]]:
    rows = []
    for turn in doc.get("turns") or []:
        rows.append({"arm": arm, "call": call, "lines": lines, "index": turn["index"], "load": load,
                     "gap_ms": turn["heard"]["gap_ms"], "cut_off": turn.get("cut_off"),
                     "reported_ms": (turn.get("agent_reported") or {}).get("latency_ms"),
                     "breakdown": turn.get("agent_breakdown"), "preemptive": turn.get("agent_preemptive"),
                     "wer": turn.get("wer"), "script": turn.get("script"),
                     "agent_transcript": turn.get("agent_transcript")})
    return rows


def summary(rows: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    mine = [r for r in rows if r["arm"] == arm]
    clinic = [r for r in mine if r["lines"] == "clinic" and r["gap_ms"] is not None]
    gaps = [r["gap_ms"] for r in clinic]
    parts: dict[str, list[float]] = {}
    for r in clinic:
        for key, value in (r["breakdown"] or {}).items():
            parts.setdefault(key, []).append(value)
    pre: dict[str, float] = {key: 0 for key in PREEMPTIVE_KEYS}  # the agent's counts, prefill ahead's among them
    for r in mine:
        for key in pre:
            pre[key] += (r["preemptive"] or {}).get(key, 0)
    errors = sum((r["wer"] or {}).get("errors", 0) for r in mine if r["lines"] == "clinic")
    words = sum((r["wer"] or {}).get("words", 0) for r in mine if r["lines"] == "clinic")
    pause = [r for r in mine if r["lines"] == "pause"]
    loads = [r["load"] for r in mine if r.get("load") is not None]
    return {"arm": arm, "turns": len(gaps), "heard_median_ms": median(gaps) if gaps else None,
            "load_median": round(median(loads), 2) if loads else None,
            "load_range": [min(loads), max(loads)] if loads else None,
            "heard_p90_ms": percentile(gaps, 90) if gaps else None,
            "reported_median_ms": median([r["reported_ms"] for r in clinic if r["reported_ms"] is not None] or [0]),
            "breakdown_median_ms": {k: round(median(v), 1) for k, v in parts.items()},
            "preemptive": pre, "word_errors": errors, "words": words,
            "pause_turns": len(pause), "cut_offs": sum(1 for r in pause if r["cut_off"]),
            "cut_offs_clinic": sum(1 for r in mine if r["lines"] == "clinic" and r["cut_off"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--url", required=True, help="the managed llama-server")
    parser.add_argument("--ports", default="18501,18502,18503,18504",
                        help="plain agent, preemptive agent, their OTLP receivers (dial's --otlp)")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--pause-every", type=int, default=3, help="every Nth pair of calls uses the pause line")
    parser.add_argument("--dial-args", default="--barge-in-turns none --stt none",
                        help="the dialer's flags (default: no barge-in, no STT of the replies; the lab's call is "
                             "dial's defaults: '--barge-in-turns 3', its STT on)")
    parser.add_argument("--agent-args", default="", help="more flags for both agents (e.g. '--endpoint-ms 700')")
    parser.add_argument("--a-args", default=None, help="arm a's own flags (with --b-args: arms a and b, not plain "
                                                         "and preemptive)")
    parser.add_argument("--b-args", default=None, help="arm b's own flags")
    options = parser.parse_args()
    own = ({"a": (options.a_args or "").split(), "b": (options.b_args or "").split()}
           if options.a_args is not None or options.b_args is not None else {"plain": [], "preemptive": ["--preemptive"]})
    arms = tuple(own)
    out: Path = options.out
    out.mkdir(parents=True, exist_ok=True)
    plain_port, pre_port, plain_otlp, pre_otlp = (int(p) for p in options.ports.split(","))
    ports = dict(zip(arms, ((plain_port, plain_otlp), (pre_port, pre_otlp))))
    uptime = {"start": os.getloadavg()}
    agents = {arm: agent(out, arm, options.url, ports[arm][0], ports[arm][1], options.agent_args.split() + own[arm])
              for arm in arms}
    rows: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 180
        while not all((out / f"{arm}.ready").exists() for arm in arms):
            if time.monotonic() > deadline or any(a.poll() is not None for a in agents.values()):
                raise SystemExit("an agent did not start: see agent-*.log")
            time.sleep(0.5)
        started = time.monotonic()
        pair = 0
        while time.monotonic() - started < options.minutes * 60:
            pair += 1
            lines = "pause" if pair % options.pause_every == 0 else "clinic"
            order = arms if pair % 2 else arms[::-1]  # ABBA
            for arm in order:
                name = f"{pair:02d}-{arm}-{lines}"
                doc = dial(out, name, ports[arm][0], ports[arm][1], lines, options.dial_args.split())
                if doc is not None:
                    rows.extend(turns_of(doc, arm, name, lines, round(os.getloadavg()[0], 2)))
                gaps = [r["gap_ms"] for r in rows if r["call"] == name]
                print(f"{name}: heard gaps {gaps} load {os.getloadavg()[0]:.1f}", flush=True)
        uptime["end"] = os.getloadavg()
    finally:
        for process in agents.values():
            process.send_signal(signal.SIGTERM)
        for process in agents.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    result = {"schema_version": 1, "settings": {"url": options.url, "agent_args": options.agent_args,
                                                "dial_args": options.dial_args,
                                                "pause_every": options.pause_every, "minutes": options.minutes,
                                                "arms": own},
              "loadavg": uptime, "summary": [summary(rows, arm) for arm in arms], "turns": rows}
    write_json(out / "ab.json", result)
    for s in result["summary"]:
        print(json.dumps(s), flush=True)
    print(f"load average start {uptime['start']} end {uptime.get('end')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
