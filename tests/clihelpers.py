"""Running the `voice-llm` CLI the way a user does, and what every failure must look like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Settings a developer may have exported that would change what a test means.
USER_SETTINGS = ("VOICE_LLM_API_KEY", "LLAMA_API_KEY", "VOICE_LLM_MODEL", "VOICE_LLM_SERVER_BIN")


def cli_env(state_dir: Path) -> dict[str, str]:
    """This environment without the user's voice-llm settings, with a private state folder."""
    environ = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    return {**environ, "VOICE_LLM_STATE": str(state_dir)}


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "voice_llm", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def assert_clean_failure(result: subprocess.CompletedProcess[str], *needles: str, one_line: bool = True) -> str:
    """Non-zero exit, no traceback, one line on stderr (unless a log tail follows), the needles in it."""
    err = result.stderr
    assert result.returncode != 0, (result.stdout, err)
    assert "Traceback" not in err and "Traceback" not in result.stdout, err
    if one_line:
        assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def make_kb(folder: Path, count: int = 12) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, count + 1):
        (folder / f"{i:02d}-doc.md").write_text(f"# Doc {i}\n\nThe clinic opens at {8 + i % 3} am.\n", encoding="utf-8")
    return folder
