"""Writing and reading the lab's artifact files.

Every write is atomic: the content goes to a temporary file in the same folder, is flushed to disk, and is then
renamed over the target (``os.replace`` is atomic on POSIX). An interrupted run therefore leaves either the old
complete file or the new complete file, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from voice_llm.errors import ArtifactError, OutputDirError
from voice_llm.sse import parse_json

# The artifact file names of the brief, in the order the lab writes them.
HEALTH = "health.json"
PROPS = "props.json"
SSE_COPY = "sse.py"
SSE_RAW = "sse_raw.txt"
CHUNKS = "chunks.jsonl"
TTFT = "ttft.json"
PREFILL = "prefill.json"
CACHE = "cache.json"
SENTENCE = "sentence.json"
CANCEL = "cancel.json"
AUDIO = "audio.json"  # the speak step (voice_llm.tts), with its WAVs under AUDIO_DIR
AUDIO_DIR = "audio"
REPORT = "report.json"
RUN = "run.json"
SERVER_LOG = "server.log"
REPORT_HTML = "report.html"
RAW_DIR = "raw"  # raw/<request>.sse: every request's bytes as received
# Not in the lab by default: one call (`voice-llm call`) and calls under load (`voice-llm load`).
CALL = "call.json"
LOAD = "load.json"
LOAD_SAMPLES = "load_samples.csv"
CAPABILITIES = "capabilities.json"  # what the server exposed, probed before the steps

REQUIRED = (HEALTH, PROPS, SSE_RAW, CHUNKS, TTFT, PREFILL, CACHE, SENTENCE, CANCEL, REPORT)


def ensure_out_dir(out: Path) -> Path:
    """Create OUT if needed and prove it is writable before any request is made."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-", delete=True)
        probe.close()
    except OSError as exc:
        raise OutputDirError(f"cannot write to the output folder {out}: {exc.strerror or exc}") from exc
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files readable by the owner only; artifacts are ordinary files that others may read.
_FILE_MODE = 0o666 & ~_umask()


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file and rename, so readers never see a partial file."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _naming(exc, path) from exc
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        # Ctrl-C or a full disk: drop the temp file, keep whatever complete file was there.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise _naming(exc, path) from exc
        raise
    return path


def _naming(exc: OSError, path: Path) -> OSError:
    """The same error about ``path`` itself: the temp file it names is gone and means nothing to the user."""
    if isinstance(exc, IsADirectoryError):
        return IsADirectoryError(exc.errno, f"cannot replace a folder with a file ({exc.strerror})", str(path))
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def dumps_json(value: Any) -> str:
    """The one JSON layout of every artifact: indented, key order as built, UTF-8 kept readable."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def write_json(path: Path, value: Any) -> Path:
    return write_bytes_atomic(path, dumps_json(value).encode("utf-8"))


def jsonl_bytes(rows: Iterable[Mapping[str, Any]]) -> bytes:
    return "".join(json.dumps(dict(row), ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    return write_bytes_atomic(path, jsonl_bytes(rows))


def loads_json(text: str | bytes, what: str) -> Any:
    """Parse JSON from a saved file through the one guarded parser (:func:`voice_llm.sse.parse_json`); anything
    malformed, even nested too deeply for the parser, becomes an ArtifactError naming ``what``. Check and report
    parse saved evidence through this."""
    try:
        return parse_json(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{what} is not valid JSON: {exc}") from exc


def read_json(path: Path) -> Any:
    """Read one artifact, turning a missing or malformed file into an ArtifactError that names it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path.name} is missing in {path.parent}") from exc
    except OSError as exc:  # a folder where the file should be, no permission, ...
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path.name} is not valid JSON: {exc}") from exc
    return loads_json(text, path.name)


def read_jsonl(path: Path) -> list[Any]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path.name} is missing in {path.parent}") from exc
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path.name} is not UTF-8: {exc}") from exc
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        rows.append(loads_json(line, f"{path.name} line {number}"))
    return rows
