"""Lifecycle of the managed llama-server: up, status, log, down. Nothing here measures anything.

Each port has its own state folder (``<state>/port-<N>/``) with ``server.json`` (pid, process start time,
binary, model, URL; never the API key) and ``server.log`` (everything the server printed). A pid is trusted
only while the process with that pid has the same start time as the one we launched, so a stale state file
whose pid now belongs to another program never leads to signalling that program.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from voice_llm import sse
from voice_llm.api import ServerClient
from voice_llm.artifacts import write_json
from voice_llm.config import ENV_STATE, ServerSettings, state_dir
from voice_llm.errors import PortInUseError, ServerError
from voice_llm.progress import NullProgress, Progress

HEALTH_POLL_S = 0.05
LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class ServerRecord:
    """What ``up`` wrote down about the process it started."""

    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: tells our process from a later one with the same pid
    host: str
    port: int
    url: str
    binary: str
    model: str
    ctx: int
    slots: int
    started_at: float  # time.time()
    api_key_set: bool


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def port_dir(port: int) -> Path:
    return state_dir() / f"port-{port}"


def log_path(port: int) -> Path:
    return port_dir(port) / "server.log"


def _record_path(port: int) -> Path:
    return port_dir(port) / "server.json"


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if there is no such (living) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited; only its exit status is left
        return None
    return int(fields[19])


def read_record(port: int) -> ServerRecord | None:
    try:
        data = json.loads(_record_path(port).read_text())
        return ServerRecord(**data)
    except (OSError, ValueError, TypeError):  # missing, unreadable (state path is a file) or not our JSON
        return None


def _is_ours(record: ServerRecord) -> bool:
    return _proc_start_ticks(record.pid) == record.start_ticks


def _reap(pid: int) -> None:
    """Collect the exit status if the server is our own child (tests start it in-process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


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


def up(
    settings: ServerSettings,
    binary: Path,
    model: Path,
    progress: Progress | None = None,
    load_timeout_s: float = 180.0,
) -> tuple[ServerRecord, bool]:
    """Start llama-server detached and wait until /health answers 200.

    Returns the record and whether the server was already running (then nothing is started). Raises
    :class:`PortInUseError` if another program holds the port, :class:`ServerError` if the server cannot be
    started or exits while loading (with the last lines of its log).
    """
    progress = progress or NullProgress()
    existing = read_record(settings.port)
    if existing is not None:
        if _is_ours(existing):
            return existing, True
        _record_path(settings.port).unlink(missing_ok=True)  # stale: that process is gone
    if not model.is_file():
        raise ServerError(f"model file not found: {model}")
    if not port_is_free(settings.host, settings.port):
        raise PortInUseError(
            f"port {settings.port} on {settings.host} is in use by another program; "
            "stop it or choose another --port"
        )
    directory = port_dir(settings.port)
    log = log_path(settings.port)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        log_file = open(log, "wb")
    except OSError as exc:
        raise ServerError(
            f"cannot write the server's state folder {directory}: {exc.strerror or exc} "
            f"(set {ENV_STATE} to a writable folder)"
        ) from exc
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
    ticks = _proc_start_ticks(proc.pid)
    record = ServerRecord(
        pid=proc.pid, start_ticks=ticks if ticks is not None else -1, host=settings.host, port=settings.port,
        url=settings.url, binary=str(binary), model=str(model), ctx=settings.ctx, slots=settings.slots,
        started_at=time.time(), api_key_set=bool(settings.api_key),
    )
    try:
        try:
            write_json(_record_path(settings.port), asdict(record))
        except OSError as exc:  # without its record the server could not be found again: do not leave it running
            raise ServerError(f"cannot write {_record_path(settings.port)}: {exc.strerror or exc}") from exc
        _wait_healthy(proc, settings, load_timeout_s, progress)
    except BaseException:
        _terminate(proc.pid)
        _record_path(settings.port).unlink(missing_ok=True)
        raise
    progress.finish(f"ready (pid {proc.pid}, model {model.name})")
    return record, False


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


def _terminate(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM the server's process group, wait, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            _reap(pid)
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap(pid)
            if _proc_start_ticks(pid) is None:
                return
            time.sleep(0.02)


def down(port: int, timeout_s: float = 10.0) -> str:
    """Stop the server started on ``port``. Idempotent; says what it did."""
    record = read_record(port)
    if record is None:
        return f"no managed server on port {port}"
    _record_path(port).unlink(missing_ok=True)
    if not _is_ours(record):
        return f"server on port {port} (pid {record.pid}) was not running any more; removed its stale state"
    _terminate(record.pid, timeout_s)
    return f"stopped llama-server on port {port} (pid {record.pid})"


def status(settings: ServerSettings) -> ServerStatus:
    record = read_record(settings.port)
    if record is None or not _is_ours(record):
        note = "stale state (process gone)" if record is not None else None
        return ServerStatus(running=False, url=settings.url, note=note)
    client = ServerClient(record.url, settings.api_key, timeout=5.0)
    health: Any = None
    n_ctx = slots = None
    note = None
    try:
        health = client.get_json("/health", accept_status=(200, 503))[1]
        props = client.props()
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        slots = props.get("total_slots")
    except sse.StreamError as exc:
        note = str(exc)
    return ServerStatus(
        running=True, url=record.url, pid=record.pid, model=record.model,
        uptime_s=round(time.time() - record.started_at, 1), health=health, n_ctx=n_ctx, total_slots=slots,
        log=str(log_path(settings.port)), note=note,
    )


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
