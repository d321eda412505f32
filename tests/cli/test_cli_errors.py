"""`voice-llm` failures as a user sees them: a non-zero exit, one clear line on stderr, no traceback, and no
complete artifact from an earlier run replaced by a failed one. No real server is needed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from clihelpers import cli, cli_process
from fakeserver import UNAUTHORIZED, FakeServer, Reply, llama_events, unused_port


def voice_llm(*args: str, tmp_path: Path, process: bool = False) -> subprocess.CompletedProcess[str]:
    """In this process (clihelpers.cli), or as `python -m voice_llm` where the entry point itself is shown."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICE_LLM_")}
    env["VOICE_LLM_STATE"] = str(tmp_path / "state")  # never touch the developer's managed server
    return (cli_process if process else cli)(*args, env=env, cwd=tmp_path, timeout=60)


def one_error_line(done: subprocess.CompletedProcess[str], command: str) -> str:
    """The run failed with exactly one line on stderr, in the CLI's own words; return that line."""
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{done.stderr}"
    assert lines[0].startswith(f"voice-llm {command}: "), lines[0]
    return lines[0]


def test_refused(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    done = voice_llm("sse", "-q", "--url", url, "--out", str(tmp_path / "out"), tmp_path=tmp_path, process=True)
    line = one_error_line(done, "sse")
    assert done.returncode == 1
    assert url in line and "refused" in line
    assert "voice-llm up" in line
    # Nothing arrived: no empty evidence file is left behind.
    assert not (tmp_path / "out" / "sse_raw.txt").exists()
    assert not (tmp_path / "out" / "sse_raw.txt.partial").exists()


def test_refused_without_quiet_still_ends_with_one_error_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    done = voice_llm("sse", "--url", url, "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("voice-llm sse: ")]
    assert errors == [lines[-1]] and url in lines[-1]


def test_html_answer(tmp_path: Path) -> None:
    with FakeServer(Reply.html()) as fake:
        done = voice_llm("ttft", "-q", "--url", fake.url, "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    line = one_error_line(done, "ttft")
    assert fake.url in line
    assert "text/html" in line and "text/event-stream" in line
    assert len(fake.requests) == 1  # it stopped at the first bad answer, no five retries


def test_401_mentions_the_api_key(tmp_path: Path) -> None:
    with FakeServer(Reply.json(401, UNAUTHORIZED)) as fake:
        done = voice_llm("sse", "-q", "--url", fake.url, "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    line = one_error_line(done, "sse")
    assert "401" in line and "Invalid API Key" in line
    assert "--api-key" in line


def test_api_key_flag_is_sent(tmp_path: Path) -> None:
    with FakeServer(Reply.json(401, UNAUTHORIZED)) as fake:
        voice_llm("sse", "-q", "--url", fake.url, "--api-key", "k-123", "--out", str(tmp_path / "out"),
                  tmp_path=tmp_path)
    assert fake.requests[0].headers.get("authorization") == "Bearer k-123"


def test_check_empty_dir_says_there_is_nothing_to_check(tmp_path: Path) -> None:
    """An empty folder is no run with failures (it used to list the brief's ten files as missing, 19 FAILs): one
    line, exit 1, as a folder that is not there (tests/checks/test_check_nothing_to_check.py)."""
    out = tmp_path / "empty"
    out.mkdir()
    done = voice_llm("check", str(out), tmp_path=tmp_path)
    line = one_error_line(done, "check")
    assert done.returncode == 1 and done.stdout == ""
    assert f"nothing to check in {out}: no step finished there" in line


def test_check_missing_dir(tmp_path: Path) -> None:
    done = voice_llm("check", str(tmp_path / "nowhere"), tmp_path=tmp_path)
    line = one_error_line(done, "check")
    assert str(tmp_path / "nowhere") in line


@pytest.mark.parametrize("where", ["proc", "file"])
def test_out_not_writable(tmp_path: Path, where: str) -> None:
    if where == "proc":
        out = Path("/proc/forbidden")
    else:  # an existing file where the folder should be: unwritable even for root
        out = tmp_path / "a-file"
        out.write_text("not a folder")
    with FakeServer(Reply.stream(b"".join(llama_events(["x"])))) as fake:
        done = voice_llm("sse", "-q", "--url", fake.url, "--out", str(out), tmp_path=tmp_path)
    line = one_error_line(done, "sse")
    said = "cannot write" if where == "proc" else "OUT is a file, not a folder"  # the file in the way is named
    assert str(out) in line and said in line, line
    assert fake.requests == []  # refused before any request was made


def test_failed_rerun_keeps_the_earlier_artifacts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    old_raw = b"data: {\"sentinel\": true}\n\ndata: [DONE]\n\n"
    old_chunks = b'{"t_ms": 1.0, "text": "sentinel"}\n'
    (out / "sse_raw.txt").write_bytes(old_raw)
    (out / "chunks.jsonl").write_bytes(old_chunks)

    events = llama_events(["Bring", " your"], done=False)
    partial = b"".join(events[:3]) + events[3][:20]  # role, two tokens, then half a line and the socket goes
    with FakeServer(Reply.stream([(0.0, b"".join(events[:3])), (0.05, events[3][:20])], end="cut")) as fake:
        done = voice_llm("sse", "-q", "--url", fake.url, "--out", str(out), tmp_path=tmp_path)
    line = one_error_line(done, "sse")
    assert "stream ended early" in line and fake.url in line

    assert (out / "sse_raw.txt").read_bytes() == old_raw
    assert (out / "chunks.jsonl").read_bytes() == old_chunks
    kept = out / "sse_raw.txt.partial"
    assert kept.read_bytes() == partial
    assert str(kept) in line
    assert f"{len(partial)} bytes" in line
