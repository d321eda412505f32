"""How late llama-server lets go of a request whose connection the agent closed (issue 39 item 3).

The agent's ``--preemptive`` reply is a chat request started before the endpoint and closed (sse.StreamCancel: the
socket shut down at once) when the caller speaks on. This probe replays that on a running server with the agent's
own prompt (the clinic dialogue, 4 docs, a cached history), and times the request that follows it: the endpoint's
reply. Scenarios (each ``--repeats`` times, in turn, so a drift in the load falls on all):

- ``alone``: the reply's request by itself (its first token after a warm history): the baseline.
- ``drop_prefill``: a preemptive request closed ``--close-ms`` after it was sent (inside its prefill), the reply's
  request sent ``--gap-ms`` after the close.
- ``drop_streaming``: the preemptive request closed after its third token, then the reply's request.
- ``drop_queued``: two preemptive requests (the second sent before the first was let go: a second pause), each closed
  in its prefill, then the reply's request.

For each: the reply's first token from its send. When the server let go of each closed request is in its own log
(benchmarks/slot_log.py: launch -> cancel -> release). Prints one JSON line per run and a median table; ``--json``
keeps them.

    python benchmarks/cancel_probe.py --url http://127.0.0.1:18710 --repeats 6 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

from voice_llm.core.client.api import ServerClient
from voice_llm.core.scenario.dialogue import load_dialogue, system_prompt
from voice_llm.core.scenario.kb import default_kb_dir, load_kb
from voice_llm.core.sse import StreamCancel
from voice_llm.core.util.stats import median

HISTORY = [{"role": "user", "content": "Hi, I'd like to book an appointment."},
           {"role": "assistant", "content": "Of course. What day works for you?"}]
PARTIAL = "Next Tuesday, if possible, and"  # what a pause mid-line transcribes to
FULL = "Next Tuesday, if possible, and in the morning please."
SCENARIOS = ("alone", "drop_prefill", "drop_streaming", "drop_queued")


def request(client: ServerClient, system: str, text: str, cancel: StreamCancel | None = None,
            close_after_tokens: int | None = None) -> dict[str, Any]:
    tokens = []

    def seen(_chunk: Any) -> None:
        tokens.append(time.perf_counter())
        if close_after_tokens is not None and len(tokens) >= close_after_tokens and cancel is not None:
            cancel.cancel()
    sent = time.perf_counter()
    result = client.chat([{"role": "system", "content": system}, *HISTORY, {"role": "user", "content": text}], 48,
                         True, on_chunk=seen, cancel=cancel)
    return {"sent": sent, "first_token": tokens[0] if tokens else None, "tokens": len(tokens),
            "closed_early": result.closed_early, "timings": result.timings}


def in_background(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(fn(*args, **kwargs)), daemon=True)
    thread.start()
    return thread, out


def run_once(client: ServerClient, system: str, scenario: str, close_ms: float, gap_ms: float) -> dict[str, Any]:
    request(client, system, "Hello again.")  # the slot's KV holds the history, as between two turns
    time.sleep(0.3)
    closed = None
    threads: list[threading.Thread] = []
    # the requests closed in their prefill: one (a pause), or two in a row (two pauses)
    dropped = {"drop_prefill": (PARTIAL,), "drop_queued": (PARTIAL, PARTIAL + " maybe")}.get(scenario, ())
    for text in dropped:
        cancel = StreamCancel()
        thread, _ = in_background(request, client, system, text, cancel)
        threads.append(thread)
        time.sleep(close_ms / 1000)
        cancel.cancel()
        closed = time.perf_counter()
    if scenario == "drop_streaming":
        cancel = StreamCancel()
        request(client, system, PARTIAL, cancel, close_after_tokens=3)
        closed = cancel.requested_at
    if closed is not None:
        time.sleep(gap_ms / 1000)
    reply = request(client, system, FULL)
    for thread in threads:
        thread.join(30)
    first = (reply["first_token"] - reply["sent"]) * 1000 if reply["first_token"] else None
    return {"scenario": scenario, "reply_first_token_ms": round(first, 1) if first else None,
            "reply_prompt_n": (reply["timings"] or {}).get("prompt_n"),
            "reply_prompt_ms": (reply["timings"] or {}).get("prompt_ms"),
            "load": round(os.getloadavg()[0], 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--close-ms", type=float, default=40.0, help="a preemptive request closed this long after "
                                                                     "its send (inside its prefill)")
    parser.add_argument("--gap-ms", type=float, default=30.0, help="the reply's request this long after the close")
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    client = ServerClient(options.url, None, 60.0, 120.0)
    dialogue = load_dialogue("clinic")
    system = system_prompt(dialogue, load_kb(default_kb_dir(), need=4)[:4])
    request(client, system, "Hello.")  # the system prompt's prefix cached
    rows = []
    for _ in range(options.repeats):
        for scenario in SCENARIOS:
            row = run_once(client, system, scenario, options.close_ms, options.gap_ms)
            rows.append(row)
            print(json.dumps(row), flush=True)
    table = {}
    for scenario in SCENARIOS:
        mine = [r for r in rows if r["scenario"] == scenario]
        firsts = [r["reply_first_token_ms"] for r in mine if r["reply_first_token_ms"] is not None]
        table[scenario] = {"runs": len(mine), "reply_first_token_median_ms": median(firsts) if firsts else None,
                           "reply_first_token_max_ms": max(firsts) if firsts else None}
        print(scenario, json.dumps(table[scenario]), flush=True)
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"settings": vars(options), "table": table, "runs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
