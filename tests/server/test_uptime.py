"""Issue 41 item 26: `voice-llm status` said "up 5703 s" for a server started 14 minutes earlier: the uptime was
the wall clock now minus the wall clock `up` wrote, and a VM's wall clock moves (set at boot, stepped by NTP).
The uptime is the server process's real age: /proc/PID/stat's start time against /proc/uptime, both since boot."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from fakeserver import free_port

from voice_llm.core.server import lifecycle, state as server_state
from voice_llm.core.server.config import ServerSettings
from voice_llm.core.util import procfs


def _fake_proc(root: Path, pid: int, start_ticks: int, since_boot_s: float) -> Path:
    (root / str(pid)).mkdir(parents=True)
    fields = ["S", "1", str(pid), str(pid)] + ["0"] * 15 + [str(start_ticks)] + ["0"] * 10
    (root / str(pid) / "stat").write_text(f"{pid} (llama (server)) {' '.join(fields)}\n")
    (root / "uptime").write_text(f"{since_boot_s:.2f} 1800.00\n")
    return root


def test_a_process_age_is_its_start_since_boot(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path / "proc", 4242, 5000 * procfs.CLOCK_TICKS, 5840.0)
    assert procfs.age_s(4242, proc) == 840.0  # started 5000 s after boot, 5840 s since boot: 14 minutes old
    assert procfs.age_s(4243, proc) is None  # no such process


def test_status_says_the_server_process_real_age(state_dir: Path) -> None:
    """A record whose wall clock says 5703 s ago, for a process (this test's own) much younger than that."""
    port, pid = free_port(), os.getpid()
    server_state.port_dir(port).mkdir(parents=True, exist_ok=True)
    server_state.write_record(server_state.ServerRecord(
        pid=pid, start_ticks=procfs.start_ticks(pid), host="127.0.0.1", port=port, url=f"http://127.0.0.1:{port}",
        binary="/llama-server", model="/m.gguf", ctx=4096, slots=1, started_at=time.time() - 5703.0,
        api_key_set=False))
    status = lifecycle.status(ServerSettings(port=port))
    # ps's elapsed time of the same process: another reading of its age than voice-llm's
    age = int(subprocess.run(["ps", "-o", "etimes=", "-p", str(pid)], capture_output=True, text=True,
                             check=True).stdout)
    assert status.running and status.uptime_s is not None
    assert abs(status.uptime_s - age) <= 2.0, (status.uptime_s, age)
