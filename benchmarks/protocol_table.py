"""Real calls per line protocol and agent (issue 40's table): what the caller hears on each line an agent is
deployed on.

    nice -n 5 python benchmarks/protocol_table.py [--port 18490] [--out benchmarks/results/protocols]
                                                  [--cells builtin:twilio,builtin:pcm,pipecat:twilio,...]

Every cell is one real call of the four clinic lines (turn 3 cut into by line 4: a planned barge-in): `voice-llm
dial --protocol P` against `voice-llm agent --engine E --protocol P` on loopback, both on the managed llama-server
of the default model (`voice-llm up --port PORT`, stopped at the end). The built-in agent serves twilio and pcm;
pipecat serves twilio, the bridges (its own Telnyx, Plivo, Exotel and Vonage serializers) and webrtc (its
SmallWebRTC transport), and has no raw-PCM serializer. An agent that does not start fails its cell, not the table. One agent process per cell, started before its call and stopped after it. The agent exports its
spans to the dialer's receiver, so pipecat's own turn latency is put beside what was heard.

Read from each call's dial.json (benchmarks/line_matrix.py's `numbers`): heard median / p90, the agent's own number
and heard minus it, barge-in to heard silence, words heard at the barge-in, late frames, and the load average at
the call's start and end. Nothing is asserted: the table is printed and written to --out as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import line_matrix  # noqa: E402  (a sibling script, not a package)
from voice_llm.core.util.stats import median  # noqa: E402  (the one median rule, decision 0007)

# pipecat has no raw-PCM serializer of its own (its agent refuses --protocol pcm), so pcm is the built-in agent's
CELLS = ("builtin:twilio", "builtin:pcm", "pipecat:twilio", "pipecat:telnyx", "pipecat:plivo",
         "pipecat:exotel", "pipecat:vonage", "pipecat:webrtc")  # webrtc: pipecat's SmallWebRTC (the webrtc extra)


def words_heard(doc_path: str | None) -> str | None:
    """The words the caller heard before the barge-in's silence (the first barged-in turn's), from dial.json."""
    if not doc_path:
        return None
    doc = json.loads(Path(doc_path).read_text())
    for turn in doc.get("turns") or []:
        barge = turn.get("barge_in") or {}
        if barge.get("words_heard_count") is not None:
            return f"{barge.get('words_heard_count')} ({barge.get('words_heard')!r})"
    return None


def markdown(result: dict[str, Any]) -> str:
    fmt = line_matrix.fmt
    rows = ["| protocol | agent | heard median / p90 (ms) | agent's own median (ms) | heard − own (median ms) | "
            "barge-in heard silent after onset (ms) | words heard before it | late frames | load |",
            "|---|---|---|---|---|---|---|---|---|"]
    for cell in result["cells"]:
        call = cell["call"]
        if call.get("exit") != 0:
            rows.append(f"| {cell['protocol']} | {cell['agent']} | failed: {call.get('error')} | | | | | | "
                        f"{call.get('load_start')}→{call.get('load_end')} |")
            continue
        own = [x for x in call.get("reported_ms") or [] if x is not None]
        rows.append(f"| {cell['protocol']} | {cell['agent']} | {fmt(call.get('heard_median_ms'))} / "
                    f"{fmt(call.get('heard_p90_ms'))} | {fmt(median(own) if own else None)} | "
                    f"{fmt(call.get('heard_minus_reported_median_ms'))} | "
                    f"{fmt(call.get('barge_in_heard_after_onset_ms'))} | {cell.get('words_heard') or '—'} | "
                    f"{fmt(call.get('late_frames'))} | {call.get('load_start')}→{call.get('load_end')} |")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=18490, help="the managed llama-server's port")
    parser.add_argument("--cells", default=",".join(CELLS), help="agent:protocol, comma-separated")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "protocols")
    args = parser.parse_args(argv)
    cells = [tuple(cell.split(":", 1)) for cell in args.cells.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    calls = Path(tempfile.mkdtemp(prefix="protocols-"))
    url = f"http://127.0.0.1:{args.port}"
    result: dict[str, Any] = {"schema_version": 1, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "load_before": list(os.getloadavg()), "cpus": os.cpu_count(), "server": url,
                              "calls_folder": str(calls), "cells": []}
    print(f"calls in {calls}", file=sys.stderr)
    line_matrix.voice_llm("up", "--port", str(args.port))
    try:
        for engine, protocol in cells:
            otlp_port = line_matrix.free_port()
            name = f"{engine}-{protocol}"
            try:  # an agent that does not start fails its cell, not the table (the others' calls are kept)
                agent = line_matrix.Agent(engine, "silence", url, otlp_port, calls, protocol=protocol)
            except SystemExit as exc:
                call = {"exit": None, "error": str(exc), "load_start": line_matrix.load(), "load_end": line_matrix.load()}
            else:
                try:
                    print(f"{name}: calling (load {line_matrix.load()})", file=sys.stderr)
                    call = line_matrix.dial(agent, otlp_port, calls / name, "clean", [])
                finally:
                    agent.stop()
            cell = {"agent": engine, "protocol": protocol, "call": call, "words_heard": words_heard(call.get("dial_json"))}
            print(f"{name}: {json.dumps({k: call.get(k) for k in ('heard_gap_ms', 'reported_ms', 'error')})}",
                  file=sys.stderr)
            result["cells"].append(cell)
    finally:
        line_matrix.voice_llm("down", "--port", str(args.port), check=False)
    result["load_after"] = list(os.getloadavg())
    (args.out / "protocols.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    (args.out / "protocols.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
