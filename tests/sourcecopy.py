"""How a test proves that a default has one place: the package copied, one line changed in the copy for each
default, and a script run on the copy by a fresh interpreter says where the change reached
(tests/agent/test_agent_settings.py: the agent's settings; tests/load/test_load_dial_settings.py: the call a load
caller makes). The same script on the tree as it is says the defaults as they are, so a number the copy says is
the edit's, not the script's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"  # the tree as it is


def changed_copy(folder: Path, *changes: tuple[str, str, str]) -> Path:
    """A copy of the package in ``folder``/src with ``changes`` made, each (its file under voice_llm/, a multi-line
    regex that must match exactly once, what replaces the match): the ``src`` to run a script on."""
    src = folder / "src"
    shutil.copytree(SRC / "voice_llm", src / "voice_llm", ignore=shutil.ignore_patterns("__pycache__"))
    for name, pattern, new in changes:
        path = src / "voice_llm" / name
        changed, count = re.subn(pattern, new, path.read_text(encoding="utf-8"), flags=re.M)
        assert count == 1, (path, pattern)
        path.write_text(changed, encoding="utf-8")
    return src


def run_script(src: Path, script: str) -> dict[str, Any]:
    """What ``script`` prints as a JSON object, run on the tree ``src`` with no VOICE_LLM_* setting of whoever runs
    the tests (a model or a left-out capability of theirs would change what it says)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("VOICE_LLM_")}
    env["PYTHONPATH"] = str(src)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=src.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout)
    return found
