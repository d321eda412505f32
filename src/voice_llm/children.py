"""Child processes this program started: stop one for sure, politely first."""

from __future__ import annotations

import subprocess
from typing import Any

STOP_TIMEOUT_S = 5.0


def stop_child(proc: subprocess.Popen[Any], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL: the process is gone (and reaped) when this returns."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
