"""OUT is a jail for writes (issue 20): a symbolic link planted in the output folder never makes voice-llm write
outside it. The lock, the raw streams (partial and final), the capability probe's stream, atomic artifact writes
and WAVs all refuse a link in one line naming it, and the link's target keeps its bytes. OUT itself may be a link
the user made to a real folder: it is resolved once; a raw/ or audio/ inside OUT that is a link is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeserver import FakeServer, Reply, at, llama_events

from voice_llm.core.util import artifacts
from voice_llm.core.errors import OutputDirError
from voice_llm.core.run.lock import LOCK_NAME, locked_out

from clihelpers import assert_clean_failure, cli

SECRET = b"a file outside OUT that must keep its bytes\n"
REFUSED = "is a symbolic link: voice-llm does not write through links in an output folder"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    target = tmp_path / "elsewhere" / "victim.txt"
    target.parent.mkdir()
    target.write_bytes(SECRET)
    return target


def plant(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def stream() -> Reply:
    return Reply.stream(at(0.0, llama_events(["Bring", " your", " card."])))


# --- the lock --------------------------------------------------------------------------------------------------


def test_a_link_at_the_lock_is_refused_and_its_target_untouched(tmp_path: Path, victim: Path,
                                                               env: dict[str, str]) -> None:
    out = tmp_path / "out"
    link = plant(out / LOCK_NAME, victim)
    with FakeServer(stream()) as fake:  # never reached: the lock is taken first
        result = cli("ttft", "--url", fake.url, "--out", str(out), "-q", env=env)
        assert fake.requests == []
    assert_clean_failure(result, str(link), REFUSED)
    assert victim.read_bytes() == SECRET and link.is_symlink()  # the link is left for the user to look at


def test_the_lock_refuses_a_link_in_the_library_and_a_fifo(tmp_path: Path, victim: Path) -> None:
    import os

    plant(tmp_path / "a" / LOCK_NAME, victim)
    with pytest.raises(OutputDirError, match=REFUSED):
        with locked_out(tmp_path / "a", "test"):
            pass
    (tmp_path / "b").mkdir()
    os.mkfifo(tmp_path / "b" / LOCK_NAME)
    with pytest.raises(OutputDirError, match="is not a regular file"):
        with locked_out(tmp_path / "b", "test"):
            pass
    assert victim.read_bytes() == SECRET


# --- raw streams -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ttft-1.sse.partial", "ttft-1.sse", "capabilities-probe.sse"])
def test_a_link_in_raw_is_refused_and_its_target_untouched(name: str, tmp_path: Path, victim: Path,
                                                           env: dict[str, str]) -> None:
    out = tmp_path / "out"
    link = plant(out / "raw" / name, victim)
    # script_probe: the capability probe's tiny stream is answered too, so it has bytes to save
    with FakeServer(stream(), script_probe=True) as fake:
        result = cli("ttft", "--url", fake.url, "--out", str(out), "-q", env=env)
    assert_clean_failure(result, str(link), REFUSED)
    assert victim.read_bytes() == SECRET and link.is_symlink()


def test_a_raw_folder_that_is_a_link_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plant(out / "raw", elsewhere)
    with FakeServer(stream()) as fake:
        result = cli("ttft", "--url", fake.url, "--out", str(out), "-q", env=env)
    assert_clean_failure(result, str(out / "raw"), REFUSED)
    assert list(elsewhere.iterdir()) == []


def test_a_stale_partial_is_replaced_not_written_through(tmp_path: Path, step_context) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "one.sse.partial").write_bytes(b"an earlier attempt's bytes, much longer than this one")
    with FakeServer(stream()) as fake:
        ctx = step_context(fake.url, timeout=10)
        ctx.request("one", [{"role": "user", "content": "hi"}], max_tokens=8)
    assert (tmp_path / "raw" / "one.sse").read_bytes().rstrip().endswith(b"data: [DONE]")
    assert b"earlier attempt" not in (tmp_path / "raw" / "one.sse").read_bytes()
    assert not (tmp_path / "raw" / "one.sse.partial").exists()


# --- artifacts, WAVs, temp files --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["chunks.jsonl", "sse_raw.txt", "sse.py"])
def test_a_link_at_an_artifact_is_refused_through_the_cli(name: str, tmp_path: Path, victim: Path,
                                                          env: dict[str, str]) -> None:
    out = tmp_path / "out"
    link = plant(out / name, victim)
    with FakeServer(stream()) as fake:
        result = cli("sse", "--url", fake.url, "--out", str(out), "-q", env=env)
    assert_clean_failure(result, str(link), REFUSED)
    assert victim.read_bytes() == SECRET and link.is_symlink()


@pytest.mark.parametrize("writer", [
    lambda p: artifacts.write_json(p, {"a": 1}),
    lambda p: artifacts.write_jsonl(p, [{"a": 1}]),
    lambda p: artifacts.write_bytes_atomic(p, b"x"),
])
def test_every_atomic_writer_refuses_a_link_at_its_target(writer, tmp_path: Path, victim: Path) -> None:  # type: ignore[no-untyped-def]
    link = plant(tmp_path / "report.json", victim)
    with pytest.raises(OutputDirError, match=REFUSED):
        writer(link)
    assert victim.read_bytes() == SECRET and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "report.json"]  # no temp file left


def test_wavs_never_go_through_a_linked_audio_folder(tmp_path: Path, step_context) -> None:
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plant(out / "audio", elsewhere)
    ctx = step_context(out=out)
    with pytest.raises(OutputDirError, match=REFUSED):
        ctx.write_bytes("audio/whole-heard.wav", b"RIFF")
    assert list(elsewhere.iterdir()) == []


def test_the_report_page_and_load_samples_refuse_a_link(tmp_path: Path, victim: Path) -> None:
    from voice_llm.capabilities.load.samples import write_samples

    link = plant(tmp_path / "load_samples.csv", victim)
    with pytest.raises(OutputDirError, match=REFUSED):
        write_samples(link, [])
    assert victim.read_bytes() == SECRET


# --- OUT itself a link: resolved once ----------------------------------------------------------------------------


def test_an_out_folder_given_as_a_link_is_resolved_once(tmp_path: Path, env: dict[str, str]) -> None:
    real = tmp_path / "real"
    real.mkdir()
    out = plant(tmp_path / "out-link", real)
    assert artifacts.ensure_out_dir(out) == real.resolve()
    with FakeServer(stream()) as fake:
        result = cli("sse", "--url", fake.url, "--out", str(out), "-q", env=env)
    assert result.returncode == 0, result.stderr
    assert (real / "sse_raw.txt").read_bytes().rstrip().endswith(b"data: [DONE]")
    assert (real / "chunks.jsonl").is_file() and out.is_symlink()
