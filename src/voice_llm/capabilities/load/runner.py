"""Run one sweep from the voice-llm process: the Locust master in a subprocess of its own, and its workers.

Why a subprocess (decision 0008): importing locust monkey-patches a process with gevent (sockets, threads, time.sleep); the CLI
process also starts and stops llama-server and writes the artifacts, and must stay an ordinary process. The
master (``python -m voice_llm.capabilities.load.sweep``) and the workers it starts share one process group, so stopping a
run (Ctrl-C, SIGTERM, a failure) stops them all: no Locust process outlives the command. On Ctrl-C or SIGTERM
the master is asked first (SIGTERM to it alone) to stop its workers and write what it measured; what it wrote
travels with the exception (:class:`SweepInterrupted`, :class:`LoadError`), so the command can keep it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from voice_llm.core.server.config import ENV_API_KEY
from voice_llm.core.errors import EXIT_INTERRUPTED, EXIT_OK, VoiceLLMError
from voice_llm.capabilities.load.plan import SweepPlan
from voice_llm.core.sse import parse_json
from voice_llm.core.util import children

MASTER_STOP_S = 15.0


class LoadError(VoiceLLMError):
    """The sweep could not be run to its end; the message says why (the master's own last line). ``partial``:
    what the master had measured before (its result, ``interrupted`` set), or None."""

    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a sweep. ``partial``: what the master had measured (None if it wrote nothing)."""

    def __init__(self, partial: dict[str, Any] | None) -> None:
        super().__init__()
        self.partial = partial


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the master's whole group (Locust workers quit on it), up to MASTER_STOP_S; then SIGKILL to
    whatever is left, and wait (in /proc, up to util.children.KILL_WAIT_S) until no member of the group lives.
    Bounded whatever the machine's load: each wait is a grace period that SIGKILL ends (util.children.stop_child).
    A second interrupt cuts the grace period short; the group is still killed (and the interrupt then goes on)."""
    children.stop_child(proc, MASTER_STOP_S, group=True)


def _stop_master(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the master alone: it stops its runner, lets its workers send their last samples and quit, and
    writes its result, within MASTER_STOP_S; then the group as :func:`_stop_group` does, whatever is left of it.
    Called while an interrupt is being handled: a further Ctrl-C only shortens the waits (the group is killed all
    the same) and is not raised again, so the caller still raises SweepInterrupted with what the master wrote."""
    try:
        children.stop_child(proc, MASTER_STOP_S, group=True, leader_first_s=MASTER_STOP_S)
    except KeyboardInterrupt:
        pass


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        result = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def run_sweep(plan: SweepPlan, api_key: str | None = None) -> dict[str, Any]:
    """Run the master subprocess to the end and return its result (raw samples, steps, windows). Raises
    :class:`SweepInterrupted` on Ctrl-C/SIGTERM and :class:`LoadError` when the sweep failed, each carrying what
    the master measured before."""
    env = dict(os.environ)
    env.pop(ENV_API_KEY, None)
    if api_key:
        env[ENV_API_KEY] = api_key  # inherited by the local workers; never on a command line
    with tempfile.TemporaryDirectory(prefix="voice-llm-load-") as tmp:
        plan_path, result_path = Path(tmp) / "plan.json", Path(tmp) / "result.json"
        plan_path.write_text(plan.to_json(), encoding="utf-8")
        proc = subprocess.Popen(
            [sys.executable, "-m", "voice_llm.capabilities.load.sweep", str(plan_path), str(result_path)],
            stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            _stop_master(proc)
            raise SweepInterrupted(_read_result(result_path)) from None
        except BaseException:
            _stop_group(proc)
            raise
        _signal_group(proc.pid, signal.SIGKILL)  # a worker that outlived its master (none expected) goes too
        result = _read_result(result_path)
        if code == EXIT_OK and result is not None and not result.get("interrupted"):
            return result
        if code == EXIT_INTERRUPTED and result is not None:  # the master itself was stopped by a signal
            raise SweepInterrupted(result)
        why = (result or {}).get("interrupted") or "see its message above"
        raise LoadError(f"the Locust master exited with status {code} ({why})", partial=result)
