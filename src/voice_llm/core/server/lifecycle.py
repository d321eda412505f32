"""Lifecycle of the managed llama-server: up, status, log, down. Nothing here measures anything.

The state of each port (record, log, lock) is kept by :mod:`voice_llm.core.server.state`; what the process table says
comes from :mod:`voice_llm.core.util.procfs` (so voice-llm needs Linux). ``up`` and ``down`` hold the port's lock, so two
of them on one port never race; ``up`` compares the settings of a running server with the ones asked for.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from voice_llm.core import sse
from voice_llm.core.util import children, procfs
from voice_llm.core.client.api import ServerClient
from voice_llm.core.server.config import DEFAULT_HOST, ServerSettings, state_dir
from voice_llm.core.errors import PortInUseError, ServerError
from voice_llm.core.util.progress import NullProgress, Progress
from voice_llm.core.server.state import (
    ServerRecord, hash_key, is_alive, key_matches, log_path, port_dir, port_lock, previous_log_path, read_record,
    record_path, recorded_ports, remove_record, rotate_log, state_folder_error, write_record,
)

__all__ = [
    "ServerRecord", "ServerStatus", "Started", "down", "down_all", "explain_death", "follow_log", "log_path",
    "port_dir", "previous_log_path", "read_record", "resolve_port", "running_ports", "start", "status",
    "statuses", "up",
]

HEALTH_POLL_S = 0.05
LOG_TAIL_LINES = 15

# Kept for callers written before the split into server_state / procfs.
_record_path = record_path
_proc_start_ticks = procfs.start_ticks
_is_ours = is_alive


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    url: str
    pid: int | None = None
    model: str | None = None
    uptime_s: float | None = None
    health: Any = None
    n_ctx: int | None = None
    total_slots: int | None = None
    log: str | None = None
    note: str | None = None
    port: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Started:
    """What ``start`` did: the running server's record, whether it was already running, and, when the server
    before it had died, what is known about that and where its log was kept."""

    record: ServerRecord
    already_running: bool
    previous_death: str | None = None
    previous_log: Path | None = None


def _reap(pid: int) -> int | None:
    """Collect the wait status if the server is our own child (tests start it in-process); None otherwise."""
    try:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return wait_status if done == pid else None


def _reap_dying(pid: int, timeout_s: float = 2.0) -> int | None:
    # A killed multi-threaded process shows as a zombie while its other threads are still exiting, and cannot
    # be waited for until they have: give it a moment.
    deadline = time.monotonic() + timeout_s
    while (wait_status := _reap(pid)) is None and procfs.is_zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return wait_status


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise ServerError(f"cannot use {host}:{port}: {exc.strerror}") from exc
    return True


def log_tail(port: int, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_path(port).read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class Listener:
    """What listens on a port voice-llm has no living record for."""

    pid: int | None  # None when /proc does not show it (another user's process)
    is_llama_server: bool
    words: str


def unmanaged_listener(port: int) -> Listener | None:
    """What listens on ``port`` (when voice-llm has no living record there); None if nothing does."""
    pid = procfs.listener_pid(port)
    if pid is None:
        if port_is_free(DEFAULT_HOST, port):
            return None
        return Listener(None, False, "a program whose process voice-llm cannot see")
    if procfs.is_llama_server(pid):
        return Listener(pid, True, f"a llama-server voice-llm has no record of ({procfs.describe(pid)})")
    return Listener(pid, False, f"another program ({procfs.describe(pid)})")


# ---------------------------------------------------------------------------------------------------------------
# up
# ---------------------------------------------------------------------------------------------------------------


def differences(record: ServerRecord, settings: ServerSettings, binary: Path, model: Path) -> list[str]:
    """What the running server was started with that differs from what is asked for now, in words."""
    diffs = []
    for name, had, want in (("host", record.host, settings.host), ("ctx", record.ctx, settings.ctx),
                            ("slots", record.slots, settings.slots), ("threads", record.threads, settings.threads)):
        if had != want:
            diffs.append(f"{name} {had if had is not None else 'default'} -> {want if want is not None else 'default'}")
    for name, had_path, want_path in (("model", record.model, model), ("binary", record.binary, binary)):
        if Path(had_path).resolve() != Path(want_path).resolve():
            diffs.append(f"{name} {had_path} -> {want_path}")
    if record.api_key_set != bool(settings.api_key):
        diffs.append(f"API key {'set' if record.api_key_set else 'none'} -> {'set' if settings.api_key else 'none'}")
    elif settings.api_key and record.api_key_hash and not key_matches(settings.api_key, record.api_key_hash):
        diffs.append("API key -> a different one")
    return diffs


def start(
    settings: ServerSettings,
    binary: Path,
    model: Path,
    progress: Progress | None = None,
    load_timeout_s: float = 180.0,
    restart: bool = False,
) -> Started:
    """Start llama-server detached on ``settings.port`` and wait until /health answers 200.

    Holds the port's lock, so a second ``start`` on the same port waits and then finds this server running. A
    server already running with the same settings is kept; with other settings :class:`ServerError` names the
    differences, unless ``restart``. Raises :class:`PortInUseError` if another program holds the port.
    """
    progress = progress or NullProgress()
    with port_lock(settings.port, progress):
        existing = read_record(settings.port)
        death = None
        if existing is not None and is_alive(existing):
            diffs = differences(existing, settings, binary, model)
            if not diffs:
                return Started(existing, True)
            if not restart:
                raise ServerError(
                    f"llama-server on port {settings.port} (pid {existing.pid}) runs with other settings: "
                    f"{'; '.join(diffs)}. Add --restart to restart it with the new settings, "
                    f"or `voice-llm down --port {settings.port}` first"
                )
            progress.start(f"Stopping llama-server on port {settings.port} (pid {existing.pid}) to restart it")
            _stop_recorded(existing, 10.0)
            progress.finish(f"stopped (changed: {'; '.join(diffs)})")
        elif existing is not None:
            death = _death_message(existing, with_log=False)
            remove_record(settings.port, existing.pid)
        _check_can_start(settings, model)
        try:
            previous_log = rotate_log(settings.port)
        except OSError as exc:
            raise state_folder_error(port_dir(settings.port), exc) from exc
        record = _launch(settings, binary, model, progress, load_timeout_s)
        return Started(record, False, death, previous_log if death else None)


def up(settings: ServerSettings, binary: Path, model: Path, progress: Progress | None = None,
       **options: Any) -> tuple[ServerRecord, bool]:
    """:func:`start` (same options), returning the record and whether the server was already running."""
    started = start(settings, binary, model, progress, **options)
    return started.record, started.already_running


def _check_can_start(settings: ServerSettings, model: Path) -> None:
    if not model.is_file():
        raise ServerError(f"model file not found: {model}")
    if not port_is_free(settings.host, settings.port):
        holder = unmanaged_listener(settings.port)
        hint = f"`voice-llm down --port {settings.port}` stops it" if holder and holder.is_llama_server else "stop it"
        raise PortInUseError(
            f"port {settings.port} on {settings.host} is in use by {holder.words if holder else 'another program'}; "
            f"{hint} or choose another --port"
        )


def _launch(settings: ServerSettings, binary: Path, model: Path, progress: Progress, timeout_s: float) -> ServerRecord:
    log = log_path(settings.port)
    try:
        log_file = open(log, "wb")
    except OSError as exc:
        raise state_folder_error(port_dir(settings.port), exc) from exc
    progress.start(f"Starting llama-server on {settings.url}")
    with log_file:
        try:
            proc = subprocess.Popen(
                settings.argv(binary, model),
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env=settings.env(), start_new_session=True,  # survives the CLI; its own process group
            )
        except OSError as exc:
            raise ServerError(f"cannot run the llama-server binary {binary}: {exc.strerror or exc}") from exc
    ticks = procfs.start_ticks(proc.pid)
    record = ServerRecord(
        pid=proc.pid, start_ticks=ticks if ticks is not None else -1, host=settings.host, port=settings.port,
        url=settings.url, binary=str(binary), model=str(model), ctx=settings.ctx, slots=settings.slots,
        started_at=time.time(), api_key_set=bool(settings.api_key), threads=settings.threads,
        api_key_hash=hash_key(settings.api_key) if settings.api_key else None,
    )
    try:
        write_record(record)  # without its record the server could not be found again: do not leave it running
        _wait_healthy(proc, settings, timeout_s, progress)
    except BaseException:
        _terminate(proc.pid)
        remove_record(settings.port, proc.pid)
        raise
    progress.finish(f"ready (pid {proc.pid}, model {model.name})")
    return record


def _wait_healthy(proc: subprocess.Popen[bytes], settings: ServerSettings, timeout_s: float, progress: Progress) -> None:
    client = ServerClient(settings.url, settings.api_key, timeout=5.0)
    t0 = time.monotonic()
    while True:
        code = proc.poll()
        if code is not None:
            raise ServerError(
                f"llama-server exited with code {code} while loading; last lines of {log_path(settings.port)}:\n"
                f"{log_tail(settings.port)}"
            )
        try:
            status, _ = client.get_json("/health", accept_status=(200, 503))
            if status == 200:
                return
            progress.update("loading the model")
        except sse.StreamError:
            progress.update("waiting for the port")
        if time.monotonic() - t0 > timeout_s:
            raise ServerError(
                f"llama-server did not become healthy within {timeout_s:g} s; last lines of its log:\n"
                f"{log_tail(settings.port)}"
            )
        time.sleep(HEALTH_POLL_S)


# ---------------------------------------------------------------------------------------------------------------
# down
# ---------------------------------------------------------------------------------------------------------------


def _terminate(pid: int, timeout_s: float = 10.0, group: bool = True) -> None:
    """Stop the server (its process group when it leads one) through the one stopper; raise if it survives."""
    try:
        gone = children.stop_pid(pid, timeout_s, group=group)
    except PermissionError as exc:
        raise ServerError(f"not allowed to stop llama-server (pid {pid}): {exc.strerror}") from exc
    if not gone:
        raise ServerError(f"llama-server (pid {pid}) is still running after SIGKILL")


def _wait_port_released(host: str, port: int, timeout_s: float = 2.0) -> None:
    # The process is gone (a zombie counts as gone), but its last threads may still be exiting and hold the
    # listening socket for a moment: `down` returns once an `up` on the same port can bind it. Best effort; an
    # `up` that still finds the port taken says so itself.
    deadline = time.monotonic() + timeout_s
    while not port_is_free(host, port) and time.monotonic() < deadline:
        time.sleep(0.01)


def _stop_recorded(record: ServerRecord, timeout_s: float) -> None:
    # Signal first; the record goes only once the process is gone, so a failed stop leaves it findable.
    _terminate(record.pid, timeout_s)
    remove_record(record.port, record.pid)
    _wait_port_released(record.host, record.port)


def _leads_its_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def down(port: int, timeout_s: float = 10.0) -> str:
    """Stop the server on ``port``: the one voice-llm started, or else a llama-server listening there that
    voice-llm has no record of (its state folder was deleted). Idempotent; says what it did."""
    with port_lock(port, required=False):
        record = read_record(port)
        said = ""
        if record is not None and is_alive(record):
            _stop_recorded(record, timeout_s)
            return f"stopped llama-server on port {port} (pid {record.pid})"
        if record is not None:
            remove_record(port, record.pid)
            said = f"server on port {port} (pid {record.pid}) was not running any more; removed its stale state"
        orphan = unmanaged_listener(port)
        if orphan is not None and orphan.pid is not None and orphan.is_llama_server:
            described = procfs.describe(orphan.pid)
            _terminate(orphan.pid, timeout_s, group=_leads_its_group(orphan.pid))
            _wait_port_released(DEFAULT_HOST, port)
            return f"stopped llama-server on port {port} ({described}) that voice-llm had no record of"
        return said or f"no managed server on port {port}"


def running_ports() -> list[int]:
    """Ports of the managed servers that run now."""
    return [port for port in recorded_ports() if (r := read_record(port)) is not None and is_alive(r)]


def down_all(timeout_s: float = 10.0) -> list[str]:
    """Stop every managed server (and clear every stale record)."""
    return [down(port, timeout_s) for port in recorded_ports()]


def resolve_port(port: int | None) -> int:
    """The port a command acts on: the one given, else the only managed server running.

    Raises :class:`ServerError` when none runs, or when several do (naming them, asking for ``--port``).
    """
    if port is not None:
        return port
    ports = running_ports()
    if len(ports) == 1:
        return ports[0]
    if not ports:
        raise ServerError("no managed llama-server is running: start one with `voice-llm up`, or name one "
                          "with --port (the lab's steps also take --url for any server)")
    listed = ", ".join(str(p) for p in ports)
    raise ServerError(f"{len(ports)} managed llama-servers are running (ports {listed}): say which one with --port")


def resolve_log_port(port: int | None) -> int:
    """Like :func:`resolve_port`, but with none running, the only port that has a log (a server that died)."""
    if port is not None or running_ports():
        return resolve_port(port)
    try:
        logged = sorted(int(p.parent.name[5:]) for p in state_dir().glob("port-*/server.log"))
    except (OSError, ValueError):
        logged = []
    if len(logged) == 1:
        return logged[0]
    return resolve_port(None)


# ---------------------------------------------------------------------------------------------------------------
# what happened to it
# ---------------------------------------------------------------------------------------------------------------


def _death_message(record: ServerRecord, with_log: bool = True) -> str:
    # Only our own zombie child with the recorded start time has an exit status to collect here.
    ours = procfs.start_ticks(record.pid, zombie=True) == record.start_ticks
    wait_status = _reap_dying(record.pid) if ours else None
    if wait_status is not None and os.WIFSIGNALED(wait_status):
        how = f"was killed by signal {signal.Signals(os.WTERMSIG(wait_status)).name}"
    elif wait_status is not None:
        how = f"exited with status {os.WEXITSTATUS(wait_status)}"
    else:  # started detached by an earlier voice-llm: its exit status went to init, not to us
        how = "died (its exit status is not visible to voice-llm)"
    text = f"llama-server on port {record.port} (pid {record.pid}) {how}"
    if with_log:
        text += f"; last lines of its log {log_path(record.port)}:\n{log_tail(record.port)}"
    return text


def explain_death(port: int) -> str | None:
    """If the managed server on ``port`` has died (its record is there, its process is gone), say so: how it
    ended when that is visible, and the last lines of its log. None when it runs or was never started."""
    record = read_record(port)
    if record is None or is_alive(record):
        return None
    return _death_message(record)


def status(settings: ServerSettings) -> ServerStatus:
    record = read_record(settings.port)
    if record is None or not is_alive(record):
        notes = [f"stale state (process gone): {_death_message(record, with_log=False)}; its log: "
                 f"{log_path(settings.port)}"] if record is not None else []
        holder = unmanaged_listener(settings.port)
        if holder:
            stop = f"; `voice-llm down --port {settings.port}` stops it" if holder.is_llama_server else ""
            notes.append(f"port {settings.port} is answered by {holder.words}{stop}")
        return ServerStatus(running=False, url=settings.url, note="; ".join(notes) or None, port=settings.port)
    client = ServerClient(record.url, settings.api_key, timeout=5.0)
    health: Any = None
    n_ctx = slots = None
    note = None
    try:
        health = client.get_json("/health", accept_status=(200, 503))[1]
        props = client.server_props()  # any shape of answer: its fields are None, never a traceback
        n_ctx, slots = props.n_ctx, props.total_slots
    except sse.StreamError as exc:
        note = str(exc)
    # The process's own age from /proc (since boot), not the wall clock now minus the one `up` wrote: a VM's wall
    # clock steps (boot, NTP), and a server started 14 minutes earlier was said "up 5703 s". The wall clock only
    # when /proc cannot tell (the process ended just now).
    age = procfs.age_s(record.pid)
    return ServerStatus(
        running=True, url=record.url, pid=record.pid, model=record.model,
        uptime_s=round(age if age is not None else max(0.0, time.time() - record.started_at), 1), health=health, n_ctx=n_ctx, total_slots=slots,
        log=str(log_path(settings.port)), note=note, port=settings.port,
    )


def statuses(api_key: str | None = None) -> list[ServerStatus]:
    """The status of every port voice-llm has a record for (running or died)."""
    return [status(ServerSettings(port=port, api_key=api_key)) for port in recorded_ports()]


def follow_log(port: int, lines: int, poll_s: float = 0.2, follow: bool = False) -> Iterator[str]:
    """The last ``lines`` lines of the log, then (with ``follow``) new lines as they are written."""
    path = log_path(port)
    if not path.exists():
        raise ServerError(f"no server log for port {port} yet ({path}); start one with `voice-llm up`")
    with open(path, errors="replace") as fh:
        yield from fh.read().splitlines(keepends=True)[-lines:] if lines > 0 else []
        while follow:
            line = fh.readline()
            if line:
                yield line
            else:
                time.sleep(poll_s)
