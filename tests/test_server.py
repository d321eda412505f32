"""The managed server's lifecycle on the real llama-server: up, status, log, down (issue 2)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from voice_llm import server
from voice_llm.api import ServerClient
from clihelpers import cli

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
