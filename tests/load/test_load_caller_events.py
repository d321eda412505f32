"""What the Locust users report to Locust for each turn (its request event): a failed turn is a failure with no
time, never a 0.0 ms request that pulls the run's response times down. The users run in a child process:
importing locust gevent-patches the whole interpreter, and this one must stay unpatched. No Locust runner is
started, no server, no dialer: the turn's stream and the dial subprocess are stubbed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# The child: one VoiceCaller turn whose stream fails, and one DialCaller call whose dialer exits 1 with nothing
# written; every request event it fires is printed as one JSON line.
CHILD = textwrap.dedent("""
    import json
    from voice_llm.capabilities.load import locust_users as vc
    from locust.env import Environment
    from voice_llm.core import sse
    from voice_llm.capabilities.dial import DialOptions
    from voice_llm.capabilities.load.plan import CallerConfig

    env = Environment(user_classes=[vc.VoiceCaller, vc.DialCaller])
    fired = []
    env.events.request.add_listener(lambda **kw: fired.append(
        {"type": kw["request_type"], "response_time": kw["response_time"],
         "exception": None if kw["exception"] is None else str(kw["exception"])}))

    def dead_line(*args, **kwargs):
        raise sse.StreamError("the line went dead")

    vc.sse.run_stream = dead_line
    vc.STATE.config = CallerConfig(url="http://127.0.0.1:9", system="s", turns=("hello",))
    caller = vc.VoiceCaller(env)
    caller.on_start()
    caller._turn([{"role": "user", "content": "hello"}], 1)

    class DeadDialer:
        returncode = 1
        def __init__(self, *args, **kwargs): pass
        def communicate(self): return b"", b"nothing answers\\n"
        def poll(self): return 1

    vc.subprocess.Popen = DeadDialer
    vc.dial_config = lambda environment: vc.STATE.dial
    import tempfile
    from pathlib import Path
    vc.STATE.dial = DialOptions(url="ws://127.0.0.1:9", stt="none")
    vc.REFUSED_PAUSE_S = 0.0
    vc.STATE.tmp = Path(tempfile.mkdtemp(dir="."))
    dialer = vc.DialCaller.__new__(vc.DialCaller)
    vc.User.__init__(dialer, env)
    dialer.config, dialer.worker, dialer.name, dialer.calls = vc.STATE.dial, "local", "local/2", 0
    dialer.call()
    for event in fired:
        print(json.dumps(event))
""")


def test_a_failed_turn_is_a_locust_failure_with_no_time(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [e["type"] for e in events] == ["SSE", "DIAL"], done.stdout
    for event in events:
        assert event["exception"], event  # a failure ...
        assert event["response_time"] is None, event  # ... with no time: Locust counts it apart from the timed
