"""What Linux's /proc says about a process: is it (still) the one we started, which process listens on a TCP
port, and is it a llama-server. voice-llm needs Linux for this; nothing here signals anything."""

from __future__ import annotations

import os
from pathlib import Path

TCP_LISTEN = "0A"  # the socket state column of /proc/net/tcp for LISTEN
PROC = Path("/proc")


def _stat_fields(pid: int, proc: Path = PROC) -> list[str] | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    return stat[stat.rindex(")") + 2 :].split()


def start_ticks(pid: int, zombie: bool = False) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if there is no such (living) process.

    A zombie has exited (only its exit status is left): None, unless ``zombie`` asks for its start time too."""
    fields = _stat_fields(pid)
    if fields is None or (fields[0] == "Z" and not zombie):
        return None
    return int(fields[19])


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def age_s(pid: int, proc: Path = PROC) -> float | None:
    """How long ``pid`` has run, in seconds: the seconds since boot (/proc/uptime) minus its start (field 22 of
    /proc/PID/stat, in clock ticks since boot). Both count from boot, so a wall clock set or stepped since the
    process started (a VM's clock, NTP) does not enter; None when there is no such process or /proc says nothing."""
    fields = _stat_fields(pid, proc)
    try:
        since_boot = float((proc / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if fields is None:
        return None
    return max(0.0, round(since_boot - int(fields[19]) / CLOCK_TICKS, 2))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time ``pid`` has used so far (its threads included), or None if there is no such process."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15 of /proc/pid/stat)


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid`` (children, their children...), from each process's parent in /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def group_members(pgid: int) -> set[int]:
    """Every living process (not a zombie) whose process group is ``pgid`` (field 5 of /proc/PID/stat)."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[0] != "Z" and fields[2] == str(pgid):
                found.add(int(entry.name))
    return found


def is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] == "Z"


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes of every TCP socket (IPv4 and IPv6) listening on ``port``."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local_port = int(cols[1].rsplit(":", 1)[1], 16)
            if local_port == port and cols[3] == TCP_LISTEN:
                inodes.add(cols[9])
    return inodes


def listener_pid(port: int) -> int | None:
    """The pid of the process that holds a listening socket on ``port``, when /proc lets us see it."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not wanted:
        return None
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:  # gone, or another user's process
            continue
        with fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path) in wanted:
                        return int(entry.name)
                except OSError:
                    continue
    return None


def command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def executable(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def is_llama_server(pid: int) -> bool:
    """True when the process's executable or its argv[0] is named llama-server."""
    names = [executable(pid) or "", *(command_line(pid)[:1])]
    return any(Path(name.removesuffix(" (deleted)")).name == "llama-server" for name in names if name)


def describe(pid: int) -> str:
    """``pid 123, /usr/bin/python3 -m http.server`` (short), for messages."""
    shown = " ".join(command_line(pid)) or executable(pid) or "command not visible"
    return f"pid {pid}, {shown[:117] + '...' if len(shown) > 120 else shown}"
