"""Where the managed servers are written down: one folder per port (``<state>/port-<N>/``) with

* ``server.json``: what ``up`` started (pid, process start time, binary, model, settings; never the API key,
  only a salted hash of it, so a changed key can be noticed),
* ``server.log``: what the current (or last) server printed; the one before it is kept as ``server.log.1``,
* ``.lock``: held by ``up`` and ``down`` for the port while they work, so two of them never race.

A pid is trusted only while the process with that pid has the start time we recorded, so a stale record whose
pid now belongs to another program never leads to signalling that program.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import os
from collections.abc import Iterator
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from voice_llm.core.util import procfs
from voice_llm.core.util.artifacts import SERVER_LOG, read_json, write_json
from voice_llm.core.server.config import ENV_STATE, state_dir
from voice_llm.core.errors import ArtifactError, ServerError
from voice_llm.core.util.progress import NullProgress, Progress

KEY_HASH_ITERATIONS = 100_000


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
    # Added later; a record written before has none of them (its server is still found and stopped).
    threads: int | None = None
    api_key_hash: str | None = None  # "salt$pbkdf2-sha256" of the key, to tell a changed key from the same one


def port_dir(port: int) -> Path:
    return state_dir() / f"port-{port}"


def log_path(port: int) -> Path:
    return port_dir(port) / SERVER_LOG  # the same name as its copy in OUT


def previous_log_path(port: int) -> Path:
    return port_dir(port) / "server.log.1"


def record_path(port: int) -> Path:
    return port_dir(port) / "server.json"


# The JSON type of each field of server.json; a record with another type anywhere is not one ``up`` wrote.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "pid": (int,), "start_ticks": (int,), "host": (str,), "port": (int,), "url": (str,), "binary": (str,),
    "model": (str,), "ctx": (int,), "slots": (int,), "started_at": (int, float), "api_key_set": (bool,),
    "threads": (int, type(None)), "api_key_hash": (str, type(None)),
}


def _well_formed(data: object) -> bool:
    if not isinstance(data, dict):
        return False
    for f in fields(ServerRecord):
        if f.name not in data:
            if f.default is MISSING:
                return False
            continue
        value = data[f.name]
        if isinstance(value, bool) and bool not in _FIELD_TYPES[f.name]:
            return False  # JSON true is no pid
        if not isinstance(value, _FIELD_TYPES[f.name]):
            return False
    return data["pid"] > 0  # never 0 or negative: a signal to those would reach a whole process group


def read_record(port: int) -> ServerRecord | None:
    """The port's record, or None when there is none or it is not one ``up`` wrote (unreadable, not JSON, nested
    too deeply, a field of the wrong type): a corrupt record is never trusted, and never a traceback."""
    try:
        data = read_json(record_path(port))  # bounded, never a FIFO or device, nesting an ArtifactError
    except ArtifactError:
        return None
    if not _well_formed(data):
        return None
    known = {f.name for f in fields(ServerRecord)}
    return ServerRecord(**{k: v for k, v in data.items() if k in known})


def write_record(record: ServerRecord) -> None:
    try:
        write_json(record_path(record.port), asdict(record))
    except OSError as exc:
        raise ServerError(f"cannot write {record_path(record.port)}: {exc.strerror or exc}") from exc


def remove_record(port: int, pid: int) -> None:
    """Remove the record of ``pid`` only: a process never removes a record another process wrote."""
    record = read_record(port)
    if record is None or record.pid == pid:
        record_path(port).unlink(missing_ok=True)


def is_alive(record: ServerRecord) -> bool:
    """The recorded process still runs (same pid and same start time)."""
    return procfs.start_ticks(record.pid) == record.start_ticks


def recorded_ports() -> list[int]:
    """Every port that has a record, running or not, in order."""
    try:
        folders = list(state_dir().glob("port-*"))
    except OSError:
        return []
    ports = [int(p.name[5:]) for p in folders if p.name[5:].isdigit() and (p / "server.json").is_file()]
    return sorted(port for port in ports if 0 < port < 65536)


def rotate_log(port: int) -> Path | None:
    """Keep the last server's log as ``server.log.1`` before a new one starts; returns where it went."""
    current = log_path(port)
    if not current.is_file() or current.stat().st_size == 0:
        return None
    os.replace(current, previous_log_path(port))
    return previous_log_path(port)


def state_folder_error(directory: Path, exc: OSError) -> ServerError:
    return ServerError(
        f"cannot write the server's state folder {directory}: {exc.strerror or exc} "
        f"(set {ENV_STATE} to a writable folder)"
    )


@contextlib.contextmanager
def port_lock(port: int, progress: Progress | None = None, required: bool = True) -> Iterator[None]:
    """Hold the port's lock: one ``up``/``down`` per port at a time; a second one waits, saying so.

    With ``required=False`` (``down``) a port folder that does not exist or cannot hold a lock is no reason to
    fail: the command goes on unlocked.
    """
    progress = progress or NullProgress()
    directory = port_dir(port)
    if not required and not directory.is_dir():  # nothing recorded there to protect
        yield
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / ".lock", "a")
    except OSError as exc:
        if required:
            raise state_folder_error(directory, exc) from exc
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress.start(f"Waiting for another voice-llm up/down on port {port}")
            fcntl.flock(handle, fcntl.LOCK_EX)
            progress.finish("its turn now")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def hash_key(key: str, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", key.encode(), salt, KEY_HASH_ITERATIONS)
    return f"{salt.hex()}${digest.hex()}"


def key_matches(key: str, stored: str) -> bool:
    salt, _, _ = stored.partition("$")
    try:
        return hmac.compare_digest(hash_key(key, bytes.fromhex(salt)), stored)
    except ValueError:
        return False
