"""Host CPU per process of a dialing sweep (``load --dial``): how much of this machine the agent, its LLM server
and the callers (the Locust workers with their `voice-llm dial` subprocesses) each took in a step's measured window.

Which processes (the rule, also in load.json's ``processes_found``):
* the agent: the process listening on the --dial URL's port, when that host is this machine (loopback);
* the LLM server: the process listening on the port of the agent's own URL (its command line, /proc/PID/cmdline,
  read as the agent reads it: --url, or its --settings file's; without one, the agent's default), when loopback;
* the workers: the local Locust worker processes the master started (remote workers run elsewhere: not here);
* the master: the sweep's own process alone (its children are the local workers, counted as theirs).

Each other role is counted as its process tree: the process, its live descendants, and the children it has reaped (psutil's
children_user / children_system, which is where a worker's finished dial calls land: each call is a subprocess
the worker waits for). A step's CPU is the tree's total at the window's end minus at its start, so a call that
straddles the start counts only its part after it. Shares are of ONE core (2.0 = two cores busy), over the window.
Pure apart from psutil and /proc: the master calls :func:`snapshot` at the window's edges.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil  # locust's own dependency (pyproject names it too); light: /proc readers

from voice_llm.capabilities.agent import AgentSettings, settings_of_command_line
from voice_llm.core.server.config import is_loopback
from voice_llm.core.util import procfs

ROLES = ("agent", "server", "workers", "master")
RULE = ("agent: the process listening on the --dial URL's port (loopback only); server: the process listening on "
        "the port of the agent's --url (its command line; default the managed port); workers: the local Locust "
        "workers; master: the sweep's process alone (its children are the workers). The others as process trees "
        "(live descendants and reaped children, where a worker's finished dial calls land); a step's CPU = the "
        "reading at the window's end minus at its start; share = CPU seconds / window seconds (1.0 = one core)")


@dataclass(frozen=True)
class Tracked:
    """The processes of one role, and why they are those (or why there is none)."""

    role: str
    pids: tuple[int, ...]
    found: str
    tree: bool = True  # the process tree; False: the process alone (the master, whose children are the workers)


def loopback_port(url: str) -> int | None:
    """The port of ``url`` when it is on this machine (a loopback host), else None."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or not is_loopback(parts.hostname):
        return None
    try:
        return parts.port or (443 if parts.scheme in ("https", "wss") else 80)
    except ValueError:
        return None


def agent_llm_url(command: Sequence[str]) -> str:
    """The LLM server URL the agent on this command line asks: read as the agent reads its own (its --url, or its
    --settings file's), else the agent's default."""
    settings = settings_of_command_line(command)
    return (settings or AgentSettings()).url


def find(dial_url: str, workers: Sequence[int], master: int,
         listener: Any = procfs.listener_pid, command_line: Any = procfs.command_line) -> list[Tracked]:
    """The processes of each role (:data:`RULE`); ``listener`` and ``command_line`` are /proc's, or a test's."""
    found: list[Tracked] = []
    port = loopback_port(dial_url)
    agent = listener(port) if port is not None else None
    found.append(Tracked("agent", (agent,) if agent else (),
                         f"listening on port {port}" if agent else
                         f"no process of this machine listens on {dial_url}'s port" if port is not None else
                         f"{dial_url} is not on this machine"))
    if agent:
        llm = agent_llm_url(command_line(agent))
        llm_port = loopback_port(llm)
        server = listener(llm_port) if llm_port is not None else None
        found.append(Tracked("server", (server,) if server else (),
                             f"listening on port {llm_port} (the agent's LLM {llm})" if server else
                             f"nothing of this machine listens at the agent's LLM {llm}"))
    else:
        found.append(Tracked("server", (), "the agent is not on this machine: its LLM server is not known"))
    found.append(Tracked("workers", tuple(workers), "the local Locust workers" if workers else
                         "remote workers: their CPU is their own machines'"))
    found.append(Tracked("master", (master,), "the sweep's own process alone", tree=False))
    return found


def _own(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system + getattr(times, "children_user", 0.0) +
                 getattr(times, "children_system", 0.0))


def tree_cpu_s(pid: int, psutil_module: Any = None, tree: bool = True) -> float | None:
    """The CPU seconds of ``pid``'s tree so far, or (``tree`` False) of the process alone, without its children
    (None: the process is gone or not ours to read)."""
    ps = psutil_module or psutil
    try:
        root = ps.Process(pid)
        if not tree:
            times = root.cpu_times()
            return float(times.user + times.system)
        total = _own(root)
        children = root.children(recursive=True)
    except (ps.Error, OSError):
        return None
    for child in children:
        try:
            total += _own(child)
        except (ps.Error, OSError):  # exited meanwhile: its time reaches its parent's children_* once reaped
            continue
    return total


def snapshot(tracked: Sequence[Tracked], psutil_module: Any = None) -> dict[str, float | None]:
    """Each role's CPU seconds so far (the sum over its pids; None when none of them could be read)."""
    out: dict[str, float | None] = {}
    for t in tracked:
        values = [v for v in (tree_cpu_s(pid, psutil_module, t.tree) for pid in t.pids) if v is not None]
        out[t.role] = sum(values) if values else None
    return out


def step_processes(tracked: Sequence[Tracked], before: Mapping[str, float | None],
                   after: Mapping[str, float | None], wall_s: float) -> dict[str, Any]:
    """A step's CPU per role over its measured window: {role: {pids, cpu_s, share}}, cpu_s/share None when the
    role has no process here or one of its two readings is missing."""
    rows: dict[str, Any] = {}
    for t in tracked:
        a, b = before.get(t.role), after.get(t.role)
        cpu = None if a is None or b is None else max(0.0, b - a)
        rows[t.role] = {"pids": list(t.pids), "cpu_s": None if cpu is None else round(cpu, 3),
                        "share": None if cpu is None or wall_s <= 0 else round(cpu / wall_s, 4)}
    return {"wall_s": round(wall_s, 3), **rows}


def found_block(tracked: Sequence[Tracked]) -> dict[str, Any]:
    """load.json's ``processes_found``: the rule and, per role, its pids and how they were found."""
    return {"rule": RULE, **{t.role: {"pids": list(t.pids), "found": t.found} for t in tracked}}


__all__ = ["RULE", "ROLES", "Tracked", "agent_llm_url", "find", "found_block", "snapshot", "step_processes",
           "tree_cpu_s"]
