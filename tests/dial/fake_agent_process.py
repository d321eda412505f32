"""A stand-in for `voice-llm agent` as a process (for the converse step's lifecycle): serves the fake agent,
writes a ready line like the agent's, exits 0 on SIGTERM. argv: READY_FILE MODE (normal | ignore-term | die)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fakeagent import FakeAgent, Reply  # noqa: E402


def main() -> int:
    ready_file, mode = Path(sys.argv[1]), sys.argv[2]
    print("loading the engines (fake)", file=sys.stderr, flush=True)
    if mode == "die":
        print("cannot load the engines: no such model", file=sys.stderr, flush=True)
        return 3
    stop = threading.Event()
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FakeAgent([Reply(120, 300, "m1")]) as agent:
        line = json.dumps({"listen": f"ws://127.0.0.1:{agent.port}/", "protocol": "twilio", "rate": 8000,
                           "codec": "mulaw", "engine": "fake", "engines": {"stt": None}, "versions": {"fake": "1"},
                           "pid": os.getpid()})
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(line + "\n")
        os.replace(tmp, ready_file)
        print(line, flush=True)
        stop.wait(60)
    print("stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
