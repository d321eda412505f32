"""Evidence is never lost to a failed re-run (issue 20): a step that fails leaves its earlier artifact and every
raw file it rests on as they were, so `check` still verifies the earlier run; a successful re-run replaces them.
A real-looking folder is made by `voice-llm speak` against the fake server (espeak-ng: fast and deterministic)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fakeserver import FakeServer, Reply, at, llama_events, unused_port

from clihelpers import assert_clean_failure, cli

FIRST = ["Fast", " for", " 8", " hours.", " Drink", " only", " water.", " Arrive", " early."]
SECOND = ["Do", " not", " eat", " after", " midnight.", " Bring", " your", " card."]

pytestmark = [pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed"),
              pytest.mark.slow]  # a real speech engine


def speak(out: Path, env: dict[str, str], *replies: Reply, port: int) -> tuple[int, str]:
    """`speak` against a fake on ``port``: every re-run is against the same server, so it joins the run the folder
    holds (a folder made against another server is refused before anything is written, tests/run/test_identity_runs)."""
    with FakeServer(list(replies), port=port) as fake:
        result = cli("speak", "--url", fake.url, "--out", str(out), "-q", "--tts", "espeak", "--repeat", "1",
                     env=env)
    return result.returncode, result.stderr


# What check verifies from the files: the manifest, the raw streams behind audio.json, its timeline and WAVs (not
# the TTFA order of the strategies, a timing relation of the fake's instant answers).
FILE_CHECKS = ("one run: every file as the run wrote it", "audio: segments follow from the raw stream",
               "audio: timeline and medians follow from the segments", "audio: WAVs decode and last as stated")


def audio_lines(out: Path, env: dict[str, str]) -> dict[str, str]:
    """The status of check's lines about the run's files and the audio, by check name."""
    result = cli("check", str(out), env=env)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = {}
    for line in result.stdout.splitlines():
        status, _, rest = line.partition(" ")
        for name in FILE_CHECKS:
            if rest.strip().startswith(name + ":"):
                lines[name] = status
    assert set(lines) == set(FILE_CHECKS), result.stdout
    return lines


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_failed_speak_rerun_keeps_the_earlier_audio_and_its_raw_streams(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    port = unused_port()
    code, err = speak(out, env, Reply.stream(at(0.0, llama_events(FIRST))), port=port)
    assert code == 0, err
    before = audio_lines(out, env)
    assert set(before.values()) == {"PASS"}, before
    kept = {name: data for name, data in snapshot(out).items() if name.startswith(("raw/", "audio"))}

    # The re-run: its first answer (whole) completes with other words, the next one is cut by a reset.
    cut = at(0.0, llama_events(SECOND, done=False)[:3])
    code, err = speak(out, env, Reply.stream(at(0.0, llama_events(SECOND))), Reply.stream(cut, end="reset"), port=port)
    assert code != 0 and "Traceback" not in err, err
    after = snapshot(out)
    for name, data in kept.items():
        assert after[name] == data, f"{name} was changed by the failed re-run"
    # The failed attempt's evidence is under its own name: the complete whole answer and the cut one.
    assert b"midnight" in (out / "raw" / "speak-whole-1.sse.partial").read_bytes()
    assert (out / "raw" / "speak-brief_rule-1.sse.partial").is_file()  # the second strategy
    assert audio_lines(out, env) == before  # check still verifies the earlier run from its files

    # A successful re-run replaces the old raw files (after its audio.json) and verifies in turn.
    code, err = speak(out, env, Reply.stream(at(0.0, llama_events(SECOND))), port=port)
    assert code == 0, err
    assert b"midnight" in (out / "raw" / "speak-whole-1.sse").read_bytes()
    assert not list((out / "raw").glob("*.partial"))
    assert audio_lines(out, env) == before


def test_the_note_of_a_failed_speak_names_where_the_stream_is(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    with FakeServer(Reply.stream(at(0.0, llama_events(["...", " ", "!!"])))) as fake:
        result = cli("speak", "--url", fake.url, "--out", str(out), "-q", "--tts", "espeak", env=env)
    assert_clean_failure(result, "no speakable text", "speak-whole-1.sse.partial")
    assert (out / "raw" / "speak-whole-1.sse.partial").read_bytes().rstrip().endswith(b"data: [DONE]")
