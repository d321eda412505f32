"""Security: loopback by default, no accidental network exposure, the API key passed to the server and sent on
every call, a missing or wrong key reported clearly, the key never written anywhere, no shell strings."""

from __future__ import annotations

import ast
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from voice_llm.core.server import lifecycle as server
from voice_llm.core.client.api import ServerClient
from voice_llm.core.server.config import ServerSettings
from voice_llm.core.errors import ConfigError

from conftest import free_port
from clihelpers import cli, cli_env
from fakeserver import serving

KEY = f"SECRET123-{secrets.token_hex(4)}"  # unique, so no other test's process can match it
SRC = Path(__file__).resolve().parents[2] / "src" / "voice_llm"




@dataclass
class KeyServer:
    port: int
    state: Path
    env: dict[str, str]  # without the key
    outputs: list[str] = field(default_factory=list)  # everything the CLI printed in this module

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run(self, *args: str, key_env: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "VOICE_LLM_API_KEY": KEY} if key_env else self.env
        result = cli(*args, env=env, timeout=timeout)
        self.outputs += [result.stdout, result.stderr]
        return result


@pytest.fixture(scope="module")
def key_server(tmp_path_factory: pytest.TempPathFactory, server_binary: Path, model_path: Path) -> Iterator[KeyServer]:
    """A real llama-server started the user's way: `voice-llm up --api-key SECRET123` (default host)."""
    state = tmp_path_factory.mktemp("state")
    ks = KeyServer(free_port(), state, cli_env(state))
    up = ks.run("up", "--port", str(ks.port), "--api-key", KEY, "-q", timeout=240)
    assert up.returncode == 0, up.stderr
    mp = pytest.MonkeyPatch()
    mp.setenv("VOICE_LLM_STATE", str(state))
    try:
        yield ks
    finally:
        down = ks.run("down", "--port", str(ks.port), timeout=60)
        mp.undo()
        assert down.returncode == 0, down.stderr


def _listening(port: int) -> list[tuple[str, str]]:
    """(table, local address hex) of every listening socket on ``port`` in /proc/net/tcp and tcp6."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":  # 0A = LISTEN
                found.append((table, address))
    return found


# ---------------------------------------------------------------------------------------------------------------
# Binding
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_default_bind_is_loopback_only(key_server: KeyServer) -> None:
    record = server.read_record(key_server.port)
    assert record is not None and record.host == "127.0.0.1" and record.api_key_set is True
    assert _listening(key_server.port) == [("tcp", "0100007F")]  # 127.0.0.1, nothing on 0.0.0.0 or ::
    cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[cmdline.index(b"--host") + 1] == b"127.0.0.1"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "clinic.example.org"])
@pytest.mark.parametrize("command", ["up", "lab"])
def test_non_loopback_host_without_a_key_is_refused(command: str, host: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = free_port()
    args = [command, "--host", host, "--port", str(port), "-q"]
    if command == "lab":
        args += ["--out", str(tmp_path / "out")]
    result = cli(*args, env=cli_env(state), timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"voice-llm {command}: --host {host} would open the model server to the network without a key: "
        "pass --api-key (or VOICE_LLM_API_KEY), or --allow-remote to do it anyway"
    )
    # Nothing was started or recorded, and nothing listens on that port.
    assert not list(state.rglob("server.json")) if state.exists() else True
    assert _listening(port) == []


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_hosts_need_no_key(host: str) -> None:
    assert ServerSettings(host=host).host == host


def test_non_loopback_host_is_accepted_with_a_key_or_when_forced() -> None:
    with pytest.raises(ConfigError, match="--allow-remote"):
        ServerSettings(host="0.0.0.0")
    keyed = ServerSettings(host="0.0.0.0", api_key=KEY)
    forced = ServerSettings(host="0.0.0.0", allow_remote=True)
    assert keyed.env({})["LLAMA_API_KEY"] == KEY and "LLAMA_API_KEY" not in forced.env({"LLAMA_API_KEY": "x"})


@pytest.mark.server
def test_allow_remote_really_binds_the_requested_host(tmp_path: Path, server_binary: Path, model_path: Path) -> None:
    env = cli_env(tmp_path / "state")
    port = free_port()
    up = cli("up", "--host", "0.0.0.0", "--allow-remote", "--port", str(port), "-q", env=env, timeout=240)
    try:
        assert up.returncode == 0, up.stderr
        assert _listening(port) == [("tcp", "00000000")]
    finally:
        down = cli("down", "--port", str(port), env=env, timeout=60)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert _listening(port) == []


# ---------------------------------------------------------------------------------------------------------------
# The key: passed to the server, enforced by it, sent by the client, reported clearly when missing or wrong
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_the_key_reaches_the_server_through_its_environment_not_its_command_line(key_server: KeyServer) -> None:
    record = server.read_record(key_server.port)
    assert record is not None
    environ = Path(f"/proc/{record.pid}/environ").read_bytes().split(b"\0")
    assert f"LLAMA_API_KEY={KEY}".encode() in environ
    assert KEY.encode() not in Path(f"/proc/{record.pid}/cmdline").read_bytes()
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, timeout=30)
    server_lines = [line for line in ps.stdout.splitlines() if line.split(None, 1)[0] == str(record.pid)]
    assert server_lines and KEY not in server_lines[0]


@pytest.mark.server
@pytest.mark.parametrize("key", [None, "WRONG-KEY"])
def test_a_missing_or_wrong_key_gets_the_servers_401_clearly(key: str | None, key_server: KeyServer,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "sse_raw.txt").write_bytes(b"data: [DONE]\n\n")  # a previous run's evidence
    args = ["sse", "--url", key_server.url, "--out", str(out), "-q"] + (["--api-key", key] if key else [])
    result = key_server.run(*args)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"voice-llm sse: {key_server.url}/v1/chat/completions answered HTTP 401 Unauthorized: ")
    assert "Invalid API Key" in err  # the server's own words
    assert "pass --api-key or set VOICE_LLM_API_KEY" in err
    assert (out / "sse_raw.txt").read_bytes() == b"data: [DONE]\n\n"
    assert not (out / "sse_raw.txt.partial").exists()
    # The JSON endpoints too (/health is open on llama-server, /props is not).
    health = key_server.run("health", "--url", key_server.url, "--out", str(out), "-q",
                            *(["--api-key", key] if key else []))
    assert health.returncode == 1 and "HTTP 401" in health.stderr and "/props" in health.stderr
    assert "--api-key" in health.stderr and "Traceback" not in health.stderr


@pytest.mark.server
def test_the_key_from_the_environment_or_the_flag_is_accepted(key_server: KeyServer, tmp_path: Path) -> None:
    # health reads /props, which the server guards with the key.
    from_env = key_server.run("health", "--url", key_server.url, "--out", str(tmp_path / "a"), "-q", key_env=True)
    assert from_env.returncode == 0, from_env.stderr
    from_flag = key_server.run("health", "--url", key_server.url, "--out", str(tmp_path / "b"), "--api-key", KEY, "-q")
    assert from_flag.returncode == 0, from_flag.stderr
    assert json.loads((tmp_path / "b" / "props.json").read_text())["default_generation_settings"]["n_ctx"] == 4096
    # A chat stream and /slots (used by the cancel step) as well, from the library (the CLI's sse step with the
    # key is run in test_the_key_is_written_nowhere).
    client = ServerClient(key_server.url, KEY, timeout=120)
    result = client.chat([{"role": "user", "content": "Say hi."}], max_tokens=4)
    assert result.done and result.chunks
    assert isinstance(client.slots(), list)


@pytest.mark.server
def test_status_uses_the_key_and_says_when_it_is_missing(key_server: KeyServer) -> None:
    keyed = key_server.run("status", "--port", str(key_server.port), "--json", key_env=True)
    assert keyed.returncode == 0, keyed.stderr
    st = json.loads(keyed.stdout)
    assert st["running"] is True and st["n_ctx"] == 4096 and st["note"] is None
    bare = key_server.run("status", "--port", str(key_server.port), "--json")
    st = json.loads(bare.stdout)
    assert st["running"] is True and st["health"] == {"status": "ok"} and st["n_ctx"] is None
    assert "HTTP 401" in st["note"] and "--api-key" in st["note"]


@pytest.mark.server
def test_the_key_is_written_nowhere(key_server: KeyServer, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for step in ("health", "sse"):
        result = key_server.run(step, "--url", key_server.url, "--out", str(out), key_env=True)
        assert result.returncode == 0, result.stderr
    key_server.run("status", "--port", str(key_server.port), key_env=True)
    key_server.run("status", "--port", str(key_server.port), "--json", key_env=True)
    key_server.run("log", "--port", str(key_server.port), "-n", "1000")
    record = server.read_record(key_server.port)
    assert record is not None

    places = [p for p in key_server.state.rglob("*") if p.is_file()] + [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "server.log" for p in places) and any(p.name == "server.json" for p in places)
    assert any(p.name == "sse_raw.txt" for p in places)
    for path in places:
        assert KEY.encode() not in path.read_bytes(), f"the API key is in {path}"
    for text in key_server.outputs:
        assert KEY not in text, text
    assert KEY.encode() not in Path(f"/proc/{record.pid}/cmdline").read_bytes()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30)
    assert KEY not in ps.stdout
    # Not in the objects' reprs either (a traceback or a debug print would show them).
    assert KEY not in repr(ServerSettings(api_key=KEY)) and KEY not in repr(ServerClient("http://x", KEY))


# ---------------------------------------------------------------------------------------------------------------
# The client sends the key on every call (a recording server, so every header can be seen)
# ---------------------------------------------------------------------------------------------------------------

SSE_BODY = (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{"content":"Hi."}}]}\n\n'
            b'data: {"choices":[{"index":0,"finish_reason":"stop","delta":{}}],'
            b'"timings":{"prompt_n":3,"prompt_ms":1.0,"predicted_n":1,"predicted_ms":1.0}}\n\n'
            b"data: [DONE]\n\n")
JSON_BODIES = {
    "/health": {"status": "ok"},
    "/props": {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1},
    "/slots": [{"id": 0, "is_processing": False}],
}


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._record()
        body = json.dumps(JSON_BODIES.get(self.path, {})).encode()
        self._send("application/json", body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._record()
        self._send("text/event-stream", SSE_BODY)

    def _record(self) -> None:
        seen = self.server.seen  # type: ignore[attr-defined]
        seen.append((self.command, self.path, self.headers.get("Authorization")))

    def _send(self, content_type: str, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True


@pytest.fixture
def recorder() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    httpd.seen = []  # type: ignore[attr-defined]
    with serving(httpd):
        yield httpd


def _url(httpd: ThreadingHTTPServer) -> str:
    return "http://127.0.0.1:%d" % httpd.server_address[1]


@pytest.mark.parametrize("key", [KEY, None], ids=["key", "none"])  # ids without the random key: one collection
def test_the_library_sends_the_key_on_every_call(key: str | None, recorder: ThreadingHTTPServer) -> None:
    client = ServerClient(_url(recorder), key, timeout=10)
    client.health()
    client.props()
    client.slots()
    result = client.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    assert result.text == "Hi." and result.done
    seen = recorder.seen  # type: ignore[attr-defined]
    assert [(method, path) for method, path, _ in seen] == [
        ("GET", "/health"), ("GET", "/props"), ("GET", "/slots"), ("POST", "/v1/chat/completions")]
    assert {auth for _, _, auth in seen} == {f"Bearer {key}" if key else None}


@pytest.mark.parametrize(("flag", "environ", "expected"), [
    (None, KEY, f"Bearer {KEY}"),             # VOICE_LLM_API_KEY
    (KEY, None, f"Bearer {KEY}"),             # --api-key
    (KEY, "OTHER", f"Bearer {KEY}"),          # the flag wins over the environment
    (None, None, None),                       # no key: no header at all
], ids=["environment", "flag", "flag-over-environment", "none"])
def test_the_cli_takes_the_key_from_the_flag_or_the_environment(
    flag: str | None, environ: str | None, expected: str | None, recorder: ThreadingHTTPServer, tmp_path: Path
) -> None:
    env = cli_env(tmp_path / "state")
    if environ:
        env["VOICE_LLM_API_KEY"] = environ
    args = ["sse", "--url", _url(recorder), "--out", str(tmp_path / "out"), "-q"]
    args += ["--api-key", flag] if flag else []
    result = cli(*args, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    health = cli("health", *args[1:], env=env, timeout=60)
    assert health.returncode == 0, health.stderr
    seen = recorder.seen  # type: ignore[attr-defined]
    # sse and health each ask /props once for the run's metadata first, and probe the server's capabilities
    # (five GETs and one tiny stream) before their step: the key goes with every one of those requests too.
    from voice_llm.core.client.capabilities import PROBED_PATHS

    assert len(seen) == 5 + 2 * (len(PROBED_PATHS) + 1) and {auth for _, _, auth in seen} == {expected}
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file() and flag:
            assert KEY.encode() not in path.read_bytes()


# ---------------------------------------------------------------------------------------------------------------
# No shell: every subprocess gets an argument list, never a string built from user input
# ---------------------------------------------------------------------------------------------------------------

SHELL_CALLS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput"),
               ("os", "execl"), ("os", "execlp"), ("os", "spawnl"), ("os", "spawnlp")}
SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output"}


def _sources() -> list[Path]:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 10
    return files


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_shell_in_the_source(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        where = f"{path.relative_to(SRC)}:{node.lineno}"
        for keyword in node.keywords:
            assert keyword.arg != "shell", f"{where}: shell= passed to a call"
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            assert (func.value.id, func.attr) not in SHELL_CALLS, f"{where}: {func.value.id}.{func.attr}"
            if func.value.id == "subprocess" and func.attr in SUBPROCESS_CALLS and node.args:
                first = node.args[0]
                assert not isinstance(first, (ast.Constant, ast.JoinedStr, ast.BinOp)), \
                    f"{where}: subprocess.{func.attr} given a command string, not an argument list"
    text = path.read_text(encoding="utf-8")
    assert "shell=True" not in text and "os.system(" not in text


@pytest.mark.server
def test_up_notices_a_changed_key_without_showing_either(key_server: KeyServer) -> None:
    same = key_server.run("up", "--port", str(key_server.port), "-q", key_env=True)
    assert same.returncode == 0 and "already running" in same.stdout, same.stderr
    none = key_server.run("up", "--port", str(key_server.port), "-q")
    assert none.returncode == 1 and "API key set -> none" in none.stderr and "--restart" in none.stderr
    other_key = f"OTHER-{secrets.token_hex(4)}"
    other = key_server.run("up", "--port", str(key_server.port), "--api-key", other_key, "-q")
    assert other.returncode == 1 and "API key -> a different one" in other.stderr
    assert other_key not in other.stderr + other.stdout and KEY not in other.stderr + other.stdout
    record = server.read_record(key_server.port)
    assert record is not None and record.api_key_set and record.api_key_hash
    assert KEY not in record.api_key_hash and KEY.encode().hex() not in record.api_key_hash
