"""How long llama-server held its slot for requests whose connection was closed, read off its own log.

llama-server logs (warn level, on by default) ``srv stop: cancel task, id_task = N`` when its HTTP thread notices a
closed connection, and ``slot release: ... task N | stop processing`` when the slot lets go. With the launch line
(``slot launch_slot_: id S | task N``) that gives, per closed request: launch -> cancel (how late the close was
noticed) and cancel -> release (the batch under way when it was: a prefill batch is not interrupted), and whether
the next request launched at once after such a release (it was queued behind the closed one). The log's time stamps
are minutes.seconds.milliseconds.microseconds since the server started (the log `voice-llm up` keeps).

    python benchmarks/slot_log.py SERVER_LOG [--from-byte N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from voice_llm.core.util.stats import median

QUEUED_MS = 5.0  # a launch this soon after a release was waiting for that slot


def seconds(stamp: str) -> float:
    minutes, secs, ms, us = (int(part) for part in stamp.split("."))
    return minutes * 60 + secs + ms / 1e3 + us / 1e6


def tasks_of(text: str) -> list[dict[str, Any]]:
    tasks: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    last_release: tuple[float, bool] | None = None
    for line in text.splitlines():
        found = re.match(r"(\d+\.\d+\.\d+\.\d+) \w (.*)", line)
        if not found:
            continue
        at, rest = seconds(found.group(1)), found.group(2)
        if launch := re.search(r"launch_slot_: id +(\d+) \| task (\d+)", rest):
            task = int(launch.group(2))
            tasks[task] = {"task": task, "slot": int(launch.group(1)), "launch": at,
                           "after_closed_release_ms": (round((at - last_release[0]) * 1000, 1)
                                                       if last_release and last_release[1] else None)}
            order.append(task)
        elif cancel := re.search(r"cancel task, id_task = (\d+)", rest):
            tasks.setdefault(int(cancel.group(1)), {})["cancel"] = at
        elif release := re.search(r"release: id +\d+ \| task (\d+)", rest):
            task = int(release.group(1))
            tasks.setdefault(task, {})["release"] = at
            last_release = (at, "cancel" in tasks[task])
        elif prompt := re.search(r"task (\d+) \| prompt eval time = +([\d.]+) ms / +(\d+) tokens", rest):
            tasks.setdefault(int(prompt.group(1)), {}).update(prompt_ms=float(prompt.group(2)),
                                                              prompt_n=int(prompt.group(3)))
    return [tasks[t] for t in order]


def summary(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    closed = [t for t in tasks if "cancel" in t and "release" in t]
    noticed = sorted(round((t["cancel"] - t["launch"]) * 1000) for t in closed)
    released = sorted(round((t["release"] - t["cancel"]) * 1000) for t in closed)
    queued = [t for t in tasks if t["after_closed_release_ms"] is not None and t["after_closed_release_ms"] < QUEUED_MS]
    # closed before its first token: noticed by the 1 s poll (HTTP_POLLING_SECONDS), within 1000-1100 ms of launch
    polled = [n for n in noticed if 1000 <= n < 1100]
    return {"requests": len(tasks), "closed": len(closed), "launch_to_cancel_ms": noticed,
            "cancel_to_release_ms": released,
            "cancel_to_release_median_ms": median(released) if released else None,
            "noticed_by_the_1s_poll": len(polled), "launched_straight_after_a_closed_release": len(queued)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("--from-byte", type=int, default=0, help="read the log from here (one run's part of it)")
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args()
    text = options.log.read_bytes()[options.from_byte:].decode("utf-8", "replace")
    tasks = tasks_of(text)
    found = summary(tasks)
    print(json.dumps(found))
    if options.json:
        options.json.write_text(json.dumps({"summary": found, "tasks": tasks}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
