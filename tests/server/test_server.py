"""The managed server's lifecycle on the real llama-server: up, status, log, down (issue 2)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from voice_llm.core.server import lifecycle as server
from voice_llm.core.util import procfs
from voice_llm.core.client.api import ServerClient
from clihelpers import assert_clean_failure, cli
from conftest import free_port

pytestmark = pytest.mark.server




def _alive(pid: int) -> bool:
    return server._proc_start_ticks(pid) is not None


def test_up_status_log_down_on_the_real_server(env: dict[str, str], port: int, server_binary: Path, model_path: Path) -> None:
    up = cli("up", "--port", str(port), env=env)
    assert up.returncode == 0, up.stderr
    assert f"http://127.0.0.1:{port}" in up.stdout
    try:
        client = ServerClient(f"http://127.0.0.1:{port}")
        assert client.health() == {"status": "ok"}
        props = client.props()
        assert props["default_generation_settings"]["n_ctx"] == 4096
        assert props["total_slots"] == 1
        assert Path(props["model_path"]).name == model_path.name

        status = cli("status", "--port", str(port), "--json", env=env)
        assert status.returncode == 0, status.stderr
        st = json.loads(status.stdout)
        assert st["running"] is True and st["health"] == {"status": "ok"}
        assert (st["n_ctx"], st["total_slots"]) == (4096, 1)
        assert Path(st["model"]).name == model_path.name
        pid = st["pid"]
        assert _alive(pid)

        again = cli("up", "--port", str(port), env=env)
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stdout and str(pid) in again.stdout

        log = cli("log", "--port", str(port), "-n", "200", env=env)
        assert log.returncode == 0
        assert "listening on" in log.stdout or "model loaded" in log.stdout
    finally:
        down = cli("down", "--port", str(port), env=env)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not _alive(pid)
    assert server.port_is_free("127.0.0.1", port)
    stopped = cli("status", "--port", str(port), "--json", env=env)
    assert stopped.returncode != 0 and json.loads(stopped.stdout)["running"] is False
    second_down = cli("down", "--port", str(port), env=env)
    assert second_down.returncode == 0 and "no managed server" in second_down.stdout


def test_up_refuses_a_port_held_by_another_program(env: dict[str, str], port: int, server_binary: Path, model_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = cli("up", "--port", str(port), env=env)
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and "in use by another program" in result.stderr
    assert "Traceback" not in result.stderr


def test_second_install_uses_the_cache(env: dict[str, str], server_binary: Path, model_path: Path) -> None:
    result = cli("install", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert str(server_binary) in result.stdout and str(model_path) in result.stdout
    assert "Building" not in result.stderr


def _llama_servers_on(port: int) -> list[int]:
    """Pids of every living llama-server whose command line asks for ``port`` (whoever started it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and procfs.is_llama_server(int(entry.name)):
            argv = procfs.command_line(int(entry.name))
            if "--port" in argv and argv[argv.index("--port") + 1] == str(port) and _alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def test_commands_without_port_find_the_only_server_or_ask_which(env: dict[str, str], server_binary: Path,
                                                                  model_path: Path, tmp_path: Path) -> None:
    first, second = free_port(), free_port()
    out = tmp_path / "out"
    try:
        assert cli("up", "--port", str(first), "-q", env=env).returncode == 0
        status = cli("status", env=env)
        assert status.returncode == 0 and f"port {first}: running: http://127.0.0.1:{first}" in status.stdout
        log = cli("log", "-n", "200", env=env)
        assert log.returncode == 0 and str(first) in log.stdout  # the only server's log
        assert server.resolve_port(None) == first and server.resolve_port(second) == second
        step = cli("health", "--out", str(out), "-q", env=env)  # a lab step finds the only server too
        assert step.returncode == 0, step.stderr
        assert json.loads((out / "run.json").read_text())["metadata"]["server"]["url"] == f"http://127.0.0.1:{first}"

        assert cli("up", "--port", str(second), "-q", env=env).returncode == 0
        listing = cli("status", "--json", env=env)
        assert listing.returncode == 0
        assert [(s["port"], s["running"]) for s in json.loads(listing.stdout)] == sorted([(first, True), (second, True)])
        for command in ("down", "log", "health"):
            ambiguous = cli(command, "--out", str(out), env=env) if command == "health" else cli(command, env=env)
            err = assert_clean_failure(ambiguous, "2 managed llama-servers are running", "--port")
            assert "ports {}, {}".format(*sorted((first, second))) in err
        assert len(_llama_servers_on(first)) == len(_llama_servers_on(second)) == 1  # nothing was stopped

        stopped = cli("down", "--port", str(second), env=env)
        assert stopped.returncode == 0 and f"stopped llama-server on port {second}" in stopped.stdout
        only = cli("down", env=env)  # the one left
        assert only.returncode == 0 and f"stopped llama-server on port {first}" in only.stdout
        assert not _llama_servers_on(first) and not _llama_servers_on(second)
        none = cli("status", env=env)
        assert none.returncode == 1 and "no managed llama-server" in none.stdout
        again = cli("down", env=env)
        assert again.returncode == 0 and "no managed server is running" in again.stdout

        for port in (first, second):
            assert cli("up", "--port", str(port), "-q", env=env).returncode == 0
        every = cli("down", "--all", env=env)
        assert every.returncode == 0 and every.stdout.count("stopped llama-server") == 2, every.stdout
        assert not _llama_servers_on(first) and not _llama_servers_on(second)
    finally:
        cli("down", "--all", env=env)


def test_up_with_other_settings_refuses_or_restarts(env: dict[str, str], port: int, server_binary: Path,
                                                     model_path: Path) -> None:
    try:
        assert cli("up", "--port", str(port), "-q", env=env).returncode == 0
        before = server.read_record(port)
        assert before is not None
        changed = cli("up", "--port", str(port), "--ctx", "8192", "--slots", "2", "--threads", "1", "-q", env=env)
        err = assert_clean_failure(changed, f"llama-server on port {port} (pid {before.pid}) runs with other settings",
                                   "ctx 4096 -> 8192", "slots 1 -> 2", "threads default -> 1", "--restart")
        assert ServerClient(f"http://127.0.0.1:{port}").props()["default_generation_settings"]["n_ctx"] == 4096
        assert _llama_servers_on(port) == [before.pid], err

        restarted = cli("up", "--port", str(port), "--ctx", "8192", "--slots", "2", "--threads", "1", "--restart",
                        "-q", env=env)
        assert restarted.returncode == 0 and "ready" in restarted.stdout, restarted.stderr
        after = server.read_record(port)
        assert after is not None and after.pid != before.pid and not _alive(before.pid)
        assert (after.ctx, after.slots, after.threads) == (8192, 2, 1)
        argv = " ".join(procfs.command_line(after.pid))
        assert "-c 8192" in argv and "-np 2" in argv and "-t 1" in argv
        assert ServerClient(after.url).props()["total_slots"] == 2
        same = cli("up", "--port", str(port), "--ctx", "8192", "--slots", "2", "--threads", "1", "-q", env=env)
        assert same.returncode == 0 and "already running" in same.stdout and str(after.pid) in same.stdout
        assert _llama_servers_on(port) == [after.pid]
    finally:
        cli("down", "--port", str(port), env=env)
    assert not _llama_servers_on(port)


def test_two_ups_at_once_start_one_server(env: dict[str, str], port: int, server_binary: Path,
                                          model_path: Path) -> None:
    argv = [sys.executable, "-m", "voice_llm", "up", "--port", str(port), "-q"]
    try:
        for _round in range(2):
            procs = [subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(2)]
            outputs = [proc.communicate(timeout=240) for proc in procs]
            assert [proc.returncode for proc in procs] == [0, 0], outputs
            said = sorted("already running" if "already running" in out else "ready" if " ready on " in out else out
                          for out, _ in outputs)
            assert said == ["already running", "ready"], outputs
            pids = _llama_servers_on(port)
            record = server.read_record(port)
            assert record is not None and pids == [record.pid]
            status = cli("status", "--port", str(port), "--json", env=env)
            assert status.returncode == 0 and json.loads(status.stdout)["pid"] == record.pid
            down = cli("down", "--port", str(port), env=env)
            assert down.returncode == 0 and f"pid {record.pid}" in down.stdout
            assert not _llama_servers_on(port) and server.port_is_free("127.0.0.1", port)
    finally:
        cli("down", "--port", str(port), env=env)
        for pid in _llama_servers_on(port):  # an orphan would otherwise outlive the test
            os.kill(pid, signal.SIGKILL)
