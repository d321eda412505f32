"""Writing and reading the lab's artifact files: the output folder OUT is a jail (decision 0009).

Every write is atomic: the content goes to a temporary file in the same folder, is flushed to disk, and is then
renamed over the target (``os.replace`` is atomic on POSIX). An interrupted run therefore leaves either the old
complete file or the new complete file, never half of one.

No write follows a symbolic link: the folder is opened with ``O_NOFOLLOW``, the temp file is created in it with
``O_CREAT | O_EXCL | O_NOFOLLOW`` and renamed by the folder's descriptor, and a link planted at the target (or,
with ``out``, at a folder on the way inside OUT) is refused in one line naming it; the link's target is never
opened. OUT itself may be a link the user made to a real folder: :func:`ensure_out_dir` resolves it once.

Every read of a run folder goes through :func:`read_artifact_bytes`: a path inside OUT (:func:`inside`: no
absolute path, no ``..``, no link on the way), opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO cannot hang it),
a regular file only (never a device or a /proc or /sys file), at most :data:`MAX_ARTIFACT_BYTES`.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from voice_llm.core.errors import ArtifactError, OutputDirError
from voice_llm.core import sse
from voice_llm.core.sse import parse_json

# The one table of artifact file names: every module names a file of a run folder through these (a test in
# tests/layout/ finds any other literal of them). The brief's, in the order the lab writes them.
HEALTH = "health.json"
PROPS = "props.json"
SSE_COPY = "sse.py"
SSE_RAW = sse.RAW_FILE  # "sse_raw.txt": sse.py, which stands alone, writes it under this name itself
CHUNKS = sse.CHUNKS_FILE  # "chunks.jsonl"
TTFT = "ttft.json"
PREFILL = "prefill.json"
CACHE = "cache.json"
SENTENCE = "sentence.json"
CANCEL = "cancel.json"
AUDIO = "audio.json"  # the speak step (voice_llm.capabilities.speak), with its WAVs under AUDIO_DIR
AUDIO_DIR = "audio"
REPORT = "report.json"
RUN = "run.json"
SERVER_LOG = "server.log"
REPORT_HTML = "report.html"
RAW_DIR = "raw"  # raw/<request>.sse: every request's bytes as received
# Not in the lab by default: one call (`voice-llm call`) and calls under load (`voice-llm load`).
CALL = "call.json"
DIAL = "dial.json"  # a call on a real line, measured at the caller's ear (voice_llm.capabilities.dial); call.wav, events under DIAL_DIR
DIAL_DIR = "dial"
DIAL_PARTIAL = "dial-partial.json"  # a dropped or failed call: what was heard until then, beside the last good one
LOAD = "load.json"
LOAD_SAMPLES = "load_samples.csv"
CAPABILITIES = "capabilities.json"  # what the server exposed, probed before the steps
COMPARE_HTML = "compare.html"  # `voice-llm compare A B --html`: written beside, not into, a run folder

REQUIRED = (HEALTH, PROPS, SSE_RAW, CHUNKS, TTFT, PREFILL, CACHE, SENTENCE, CANCEL, REPORT)


def file_in_the_way(out: Path) -> str | None:
    """A file where the folder OUT (or one above it) should be, said: "OUT is a file, not a folder" or "X, above
    OUT, is a file, not a folder"; None when there is none."""
    blocking = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocking is None:
        return None
    return f"{'OUT' if blocking == out else f'{blocking}, above OUT,'} is a file, not a folder"


def ensure_out_dir(out: Path) -> Path:
    """Create OUT if needed and prove it is writable before any request is made. OUT given as a symbolic link
    to a folder is resolved here, once: the run writes into that real folder even if the link changes later."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        if out.is_symlink():
            out = out.resolve(strict=True)
        probe = tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-", delete=True)
        probe.close()
    except OSError as exc:
        # A file where the folder (or one above it) should be: say which, not only "File exists" / "Not a directory".
        blocking = file_in_the_way(out)
        if blocking is not None:
            raise OutputDirError(f"cannot use {out} as the output folder: {blocking}; "
                                 "give --out a folder (a new one is created)") from exc
        raise OutputDirError(f"cannot write to the output folder {out}: {exc.strerror or exc}") from exc
    return out


# --- the jail: paths inside OUT ---------------------------------------------------------------------------------


def _link_refused(path: Path) -> OutputDirError:
    return OutputDirError(f"{path} is a symbolic link: voice-llm does not write through links in an output "
                          "folder; remove it")


def inside(out: Path, rel: str | PurePath) -> Path:
    """``out / rel`` when ``rel`` names a file inside OUT: a relative path without ``..``, no symbolic link on
    the way below OUT, and (resolved) still under OUT. Anything else is an ArtifactError naming ``rel``: a path
    field of an artifact must never make check or report read a file elsewhere on the machine."""
    text = os.fspath(rel) if isinstance(rel, (str, PurePath)) else None
    if not text or "\0" in text:
        raise ArtifactError(f"{rel!r} is not a file name inside {out}")
    pure = PurePosixPath(text)
    if pure.is_absolute() or ".." in pure.parts:
        raise ArtifactError(f"{text} is not inside the output folder {out}: an artifact may only name its own files")
    path = out / pure
    here = out
    for part in pure.parts:
        here = here / part
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                raise ArtifactError(f"{text} in {out} goes through the symbolic link {here}: refused")
        except FileNotFoundError:
            break  # nothing further to follow; reading it says it is missing
    try:
        root = out.resolve()
        if not path.resolve().is_relative_to(root):
            raise ArtifactError(f"{text} resolves outside the output folder {out}")
    except (OSError, RuntimeError) as exc:
        raise ArtifactError(f"cannot resolve {text} in {out}: {exc}") from exc
    return path


def _refuse_links_on_the_way(out: Path, path: Path) -> None:
    """Every folder between OUT and ``path`` is a real folder, not a link (OUT itself may be one)."""
    try:
        rel = path.relative_to(out)
    except ValueError:
        raise OutputDirError(f"{path} is not inside the output folder {out}") from None
    here = out
    for part in rel.parts[:-1]:
        here = here / part
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                raise _link_refused(here)
        except FileNotFoundError:
            return


# --- reading: regular files only, bounded ---------------------------------------------------------------------

# The largest file a run folder holds is a few MB (a WAV of the heard answer is about 1 MB, load_samples.csv of a
# long sweep a few MB): 64 MiB is ten times that and still fits in memory on a small machine, so a planted
# /dev/zero-sized file is refused at once instead of filling memory.
MAX_ARTIFACT_BYTES = 64 << 20


def _pseudo_fs_devices() -> frozenset[int]:
    """The st_dev of /proc and /sys: their files say S_ISREG and size 0 but are generated (pagemap is huge)."""
    devices = set()
    for root in ("/proc", "/sys"):
        try:
            devices.add(os.stat(root).st_dev)
        except OSError:
            pass
    return frozenset(devices)


_PSEUDO_FS = _pseudo_fs_devices()


def read_artifact_bytes(path: Path, limit: int = MAX_ARTIFACT_BYTES, follow_links: bool = False) -> bytes:
    """The bytes of one artifact file: not through a link at its name, a regular file (never a FIFO, device,
    folder or /proc file: none can hang or flood the reader), at most ``limit`` bytes. Any refusal is an
    ArtifactError naming the file. ``follow_links``: for the user's own input files (a KB document, a dialogue)
    outside any run folder, where a link the user made is theirs to make."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path.name} is missing in {path.parent}") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ArtifactError(f"{path} is a symbolic link: refused (an output folder holds its own files)") from exc
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ArtifactError(f"cannot read {path}: Is a directory")
        if not stat.S_ISREG(info.st_mode) or info.st_dev in _PSEUDO_FS:
            raise ArtifactError(f"{path} is not a regular file (a device, FIFO, socket or /proc file): refused")
        if info.st_size > limit:
            raise ArtifactError(f"{path} is {info.st_size} bytes, more than the {limit} bytes an artifact may have")
        parts = []
        size = 0
        while size <= limit:
            block = os.read(fd, min(1 << 20, limit + 1 - size))
            if not block:
                break
            parts.append(block)
            size += len(block)
        if size > limit:  # it grew while being read
            raise ArtifactError(f"{path} is more than the {limit} bytes an artifact may have")
        return b"".join(parts)
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def read_artifact_text(path: Path, limit: int = MAX_ARTIFACT_BYTES) -> str:
    """:func:`read_artifact_bytes` decoded as UTF-8; a file that is not UTF-8 is an ArtifactError naming it."""
    try:
        return read_artifact_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path.name} is not UTF-8 text: {exc}") from exc


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files readable by the owner only; artifacts are ordinary files that others may read.
_FILE_MODE = 0o666 & ~_umask()


def open_folder(folder: Path) -> int:
    """A descriptor of ``folder`` itself, refused when it is a symbolic link: files are then made and renamed
    by this descriptor, so nothing swapped in on the way can redirect them."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and folder.is_symlink():
            raise _link_refused(folder) from exc
        raise


def refuse_link(dir_fd: int, name: str, path: Path) -> os.stat_result | None:
    """lstat of ``name`` in the folder: None when absent; a symbolic link there is refused naming ``path``."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise _link_refused(path)
    return info


def create_exclusive(dir_fd: int, name: str, path: Path) -> int:
    """A new file ``name`` in the folder, opened for writing; never through a link, never an existing file.
    A leftover regular file of that name (a stale own temp or partial file) is removed first; a link is refused."""
    info = refuse_link(dir_fd, name, path)
    if info is not None and stat.S_ISREG(info.st_mode):
        os.unlink(name, dir_fd=dir_fd)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _FILE_MODE,
                     dir_fd=dir_fd)
    except FileExistsError as exc:  # something else was put there meanwhile, or a folder of that name
        raise OutputDirError(f"cannot create {path}: something else is in its place") from exc
    os.fchmod(fd, _FILE_MODE)
    return fd


def write_bytes_atomic(path: Path, data: bytes, out: Path | None = None) -> Path:
    """Write ``data`` to ``path`` via a temp file and rename, so readers never see a partial file. Neither the
    temp file nor the target is ever opened through a link; a link at ``path`` is refused (its target stays
    untouched), and with ``out`` every folder between OUT and ``path`` must be a real folder too."""
    if out is not None:
        _refuse_links_on_the_way(out, path)
    try:
        dir_fd = open_folder(path.parent)
    except OSError as exc:
        raise _naming(exc, path) from exc
    tmp = f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        refuse_link(dir_fd, path.name, path)
        try:
            fd = create_exclusive(dir_fd, tmp, path.parent / tmp)
        except OSError as exc:
            raise _naming(exc, path) from exc
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException as exc:
            # Ctrl-C or a full disk: drop the temp file, keep whatever complete file was there.
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            if isinstance(exc, OSError):
                raise _naming(exc, path) from exc
            raise
    finally:
        os.close(dir_fd)
    return path


def _naming(exc: OSError, path: Path) -> OSError:
    """The same error about ``path`` itself: the temp file it names is gone and means nothing to the user."""
    if isinstance(exc, IsADirectoryError):
        return IsADirectoryError(exc.errno, f"cannot replace a folder with a file ({exc.strerror})", str(path))
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def dumps_json(value: Any) -> str:
    """The one JSON layout of every artifact: indented, key order as built, UTF-8 kept readable."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def write_json(path: Path, value: Any, out: Path | None = None) -> Path:
    return write_bytes_atomic(path, dumps_json(value).encode("utf-8"), out)


def jsonl_bytes(rows: Iterable[Mapping[str, Any]]) -> bytes:
    return "".join(json.dumps(dict(row), ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]], out: Path | None = None) -> Path:
    return write_bytes_atomic(path, jsonl_bytes(rows), out)


def loads_json(text: str | bytes, what: str) -> Any:
    """Parse JSON from a saved file through the one guarded parser (:func:`voice_llm.core.sse.parse_json`); anything
    malformed, even nested too deeply for the parser, becomes an ArtifactError naming ``what``. Check and report
    parse saved evidence through this."""
    try:
        return parse_json(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{what} is not valid JSON: {exc}") from exc


def read_json(path: Path) -> Any:
    """Read one artifact (through :func:`read_artifact_bytes`), turning a missing, refused or malformed file into
    an ArtifactError that names it."""
    data = read_artifact_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path.name} is not valid JSON: {exc}") from exc
    return loads_json(text, path.name)


def read_jsonl(path: Path) -> list[Any]:
    try:
        lines = read_artifact_bytes(path).decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path.name} is not UTF-8: {exc}") from exc
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        rows.append(loads_json(line, f"{path.name} line {number}"))
    return rows
