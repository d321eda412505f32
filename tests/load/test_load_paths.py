"""`voice-llm load` on the paths a newcomer takes, against a fake llama-server that answers by path (/props,
/v1/models, /apply-template, /tokenize, the chat stream): a context per slot too small for the call is refused
before any turn; a step without data is a result; an interrupted or failed sweep keeps what it measured; the
verdict names the turns it rests on; --master-port is honoured; every request names the served model.

The Locust plumbing is real (master subprocess, local worker processes); only the server is scripted, because a
real one cannot be made to refuse every turn or to answer too slowly for a step on demand."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from clihelpers import assert_clean_failure, cli, cli_env
from conftest import free_port
from fakeserver import llama_events
from voice_llm.core.errors import EXIT_NO_VERDICT, EXIT_OK
from voice_llm.core.util import procfs
from voice_llm.core.checks.base import NotCheckable
from voice_llm.capabilities.load import CAPABILITY as LOAD_CAPABILITY
from voice_llm.core.client.capabilities import PROBE_MESSAGES
from voice_llm.capabilities.load.samples import read_samples
from voice_llm.core.errors import EXIT_NO_VERDICT

LOAD_CHECKS = tuple((entry.name, entry.run) for entry in LOAD_CAPABILITY.checks)  # (name, check) of each

MODEL_ID = "fake-model.gguf"
FAST = ["--think-scale", "0", "--barge-in", "0", "--workers", "1", "-q"]


class RoutingFake(ThreadingHTTPServer):
    """A llama-server stand-in: /props says ``n_ctx`` per slot and ``slots`` (or 404 when ``props`` is False),
    /tokenize counts a token per 4 bytes, the chat stream answers after ``delay_s`` (or with ``chat_status``)."""

    daemon_threads = True

    def __init__(self, n_ctx: int = 8192, slots: int = 4, props: bool = True, delay_s: float = 0.0,
                 chat_status: int = 200) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.n_ctx, self.slots, self.has_props, self.delay_s, self.chat_status = n_ctx, slots, props, delay_s, chat_status
        self.chats: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> RoutingFake:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RoutingFake

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, value: Any) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_GET(self) -> None:
        fake = self.server
        if self.path == "/props" and fake.has_props:
            self._json(200, {"default_generation_settings": {"n_ctx": fake.n_ctx}, "total_slots": fake.slots})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def do_POST(self) -> None:
        fake = self.server
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/apply-template" and fake.has_props:
            self._json(200, {"prompt": "".join(f"<{m['role']}>{m['content']}" for m in body["messages"])})
        elif self.path == "/tokenize" and fake.has_props:
            self._json(200, {"tokens": list(range(len(body["content"].encode()) // 4))})
        elif self.path.endswith("/chat/completions"):
            with fake.lock:
                fake.chats.append(body)
            if fake.chat_status != 200:
                self._json(fake.chat_status, {"error": {"code": fake.chat_status, "message": "scripted refusal",
                                                        "type": "exceed_context_size_error"}})
                return
            time.sleep(fake.delay_s)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for piece in llama_events(["Bring", " your card.", " Thanks."]):
                self.wfile.write(piece)
                self.wfile.flush()
            self.close_connection = True
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return cli_env(tmp_path / "state")


def _doc(out: Path) -> dict[str, Any]:
    return json.loads((out / "load.json").read_text())


# --- 1. the context per slot, before any turn ---------------------------------------------------------------


def test_a_context_per_slot_too_small_for_the_call_is_refused_before_any_turn(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    with RoutingFake(n_ctx=1024, slots=4) as fake:
        result = cli("load", "--url", fake.url, "--callers", "1", "--step-s", "1", "--warmup-s", "0", "--out", str(out),
                     *FAST, env=env)
    err = assert_clean_failure(result, "gives each slot 1024 tokens (4 slots)", "clinic call's longest request",
                               "12 KB documents", "--slots 4 --ctx 12288 --restart", "--docs")
    assert "counted by the server's tokenizer" in err
    assert fake.chats == [], "no turn was sent"
    assert not out.joinpath("load.json").exists() and not out.joinpath("load_samples.csv").exists()


def test_the_managed_sweeps_still_to_come_are_checked_with_the_first_server(tmp_path: Path) -> None:
    """Without --url each slot count gets its own server; a too small context of a later one (here --ctx is the
    same for both, so 4 slots get a quarter of it) is refused before the first sweep's first turn."""
    from voice_llm.core.errors import ContextLimitError
    from voice_llm.capabilities.load import run as command

    from voice_llm.core.client.api import ServerClient

    args = command.LoadSettings(url=None, port=free_port(), ctx=8192, docs=12, timeout=10.0, slots=(1, 4),
                                dialogue="clinic", caller_words_per_s=2.5, think_scale=1.0, barge_in=0.1)
    caller, described = command.caller_config(args, "", tmp_path)
    with RoutingFake(n_ctx=8192, slots=1) as fake:
        later = [(4, command.managed_settings(args, 4).ctx // 4)]
        assert later == [(4, 4096)]
        client = ServerClient(fake.url, None, timeout=10.0)
        assert command.check_context(args, client, fake.url, 1, caller, described, later) is None  # 4096 per slot fits
        with pytest.raises(ContextLimitError, match="the 4 slots sweep gives each slot 2048 tokens"):
            command.check_context(args, client, fake.url, 1, caller, described, [(4, 2048)])
    assert fake.chats == []


@pytest.mark.slow
def test_a_server_that_does_not_say_its_context_is_not_checkable_and_is_swept(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    with RoutingFake(props=False) as fake:
        result = subprocess.run(
            [sys.executable, "-m", "voice_llm", "load", "--url", fake.url, "--callers", "1", "--step-s", "2",
             "--warmup-s", "0", "--docs", "0", "--out", str(out), "--think-scale", "0", "--barge-in", "0",
             "--workers", "1"], env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "not checkable" in result.stderr and "Traceback" not in result.stderr
    assert result.returncode in (EXIT_OK, EXIT_NO_VERDICT), result.stderr
    assert fake.chats and _doc(out)["sweeps"][0]["steps"]


# --- 2. a step with no data is a result -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_step_with_zero_turns_writes_load_json_and_the_report(tmp_path: Path, env: dict[str, str]) -> None:
    """A 1 s window after the warm-up (which lasts until the caller has finished its first turn): no turn starts
    in it, because the caller then listens to the answer and says its long second line, at 10 times the time
    speaking takes (tens of seconds), while its first line, "Hi.", is said in 4-8 s. At the default think scale that
    wait is ~1 s, and on a busy machine a turn started inside the window (seen in a `.ci/run` with the fast tier
    beside it: 1 turn)."""
    out = tmp_path / "out"
    dialogue = tmp_path / "short-then-long.json"
    dialogue.write_text(json.dumps({"name": "short-then-long", "system": "You are a clinic's phone assistant.",
                                    "turns": ["Hi.", " ".join(["I would like to ask about my appointment"] * 4)]}))
    with RoutingFake() as fake:
        result = cli("load", "--url", fake.url, "--callers", "1", "--step-s", "1", "--warmup-s", "0", "--docs", "0",
                     "--dialogue", str(dialogue), "--think-scale", "10", "--workers", "1", "-q", "--out", str(out),
                     env=env)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == EXIT_NO_VERDICT, (result.stdout, result.stderr)  # measured, but no verdict
    doc = _doc(out)
    (step,) = doc["sweeps"][0]["steps"]
    assert step["turns"] == 0 and doc["sweeps"][0]["verdict"]["max_callers"] is None
    assert (out / "load_samples.csv").is_file()
    page = (out / "report.html").read_text()
    assert 'id="section-load"' in page and "no data" in page and "no turn started" in page
    assert "no verdict" in result.stdout and "--step-s" in result.stdout and "--think-scale" in result.stdout
    run = json.loads((out / "run.json").read_text())
    assert run["started_at"] < run["ended_at"], "the start is recorded when load starts, not when it saves"
    not_checkable, passed = [], []
    for name, check in LOAD_CHECKS:
        try:
            check(out)
            passed.append(name)
        except NotCheckable:  # a relation on no measured turn rests on nothing: not checkable, never a pass
            not_checkable.append(name)
    # The verdict rests on no measured turn: not checkable. The relations on the raw samples hold on what the CSV
    # has: the warm-up (it lasts until the caller has finished a turn) left that turn there, which they check.
    assert "load: verdict and stop rule follow from the steps" in not_checkable, passed
    rows = (out / "load_samples.csv").read_text().splitlines()[1:]
    assert passed and len(rows) >= 1 and all(",warmup," in row for row in rows), (passed, rows)
    assert doc["sweeps"][0]["steps"][0]["window"]["warmup_s"] >= 1.0  # the caller's lead-in and first turn


@pytest.mark.slow
def test_a_step_where_every_turn_fails_is_drawn_as_no_data(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    with RoutingFake(chat_status=400) as fake:
        result = cli("load", "--url", fake.url, "--callers", "1", "--step-s", "2", "--warmup-s", "0", "--docs", "0",
                     "--out", str(out), *FAST, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    # Two failed turns in the window fail the step early (the verdict 0: no step passed); fewer leave no verdict.
    # Which one depends on how many turns the machine fits in 2 s, so both are right, each with its own verdict.
    assert result.returncode in (0, EXIT_NO_VERDICT), (result.stdout, result.stderr)
    (sweep,) = _doc(out)["sweeps"]
    (step,) = sweep["steps"]
    assert step["turns"] > 0 and step["errors"] == step["turns"]
    assert sweep["verdict"]["max_callers"] == (0 if result.returncode == 0 else None), sweep["verdict"]
    page = (out / "report.html").read_text()
    assert "no data" in page and "measured turns failed" in page


def test_a_report_that_cannot_be_drawn_is_one_line_after_the_files(tmp_path: Path) -> None:
    """Whatever breaks while drawing, load.json and the CSV are written first and the exit status says so."""
    from fakeshapes import VLLM, ShapedServer

    from voice_llm.core.errors import EXIT_REPORT_INCOMPLETE
    from voice_llm.capabilities.load import cli as command, run as loadrun

    calls: list[str] = []

    def broken_render(out: Path) -> Path:
        calls.append("render")
        assert (out / "load.json").is_file() and (out / "load_samples.csv").is_file()
        raise ValueError("Data cannot be log-scaled because all values are <= 0.")

    def no_sweep(plan: Any, settings: Any, run: loadrun.LoadRun, *rest: Any) -> None:
        run.described = {"dialogue": "clinic", "think": {"think_scale": 1.0}}  # nothing measured, nothing failed

    monkey = pytest.MonkeyPatch()
    monkey.setattr(loadrun, "_sweep", no_sweep)
    monkey.setattr(loadrun, "_render", broken_render)
    try:
        import contextlib
        import io

        err = io.StringIO()
        with ShapedServer(VLLM) as fake, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            values = {"out": tmp_path, "url": fake.url, "wait": False, "slo_first_sentence_ms": 1000.0, "step_s": 1.0,
                      "warmup_s": 0.0, "callers": (1,), "no_stop": False, "master": False, "workers": 1,
                      "quiet": True, "docs": 0}
            code = command.main(command.settings_from(values), None)
    finally:
        monkey.undo()
    assert calls == ["render"] and code == EXIT_REPORT_INCOMPLETE
    (line,) = err.getvalue().strip().splitlines()
    assert "measurements are saved" in line and "log-scaled" in line


# --- 3. nothing measured is lost ----------------------------------------------------------------------------------


def _living_descendants(pid: int) -> dict[int, int]:
    """pid -> start time of each living process below ``pid``. One that has already ended (a zombie, or gone by
    the time its start time is read: a short helper such as the ``uname -p`` that platform.platform() runs) is
    left out: recorded with no start time it would never count as gone, and the test would fail by chance."""
    found = {child: procfs.start_ticks(child) for child in procfs.descendants(pid)}
    return {child: ticks for child, ticks in found.items() if ticks is not None}


def _descendants_gone(pids: dict[int, int]) -> bool:
    return all(procfs.start_ticks(pid) != ticks for pid, ticks in pids.items())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.slow
def test_an_interrupted_sweep_keeps_its_completed_steps(tmp_path: Path, env: dict[str, str], sig: int) -> None:
    out = tmp_path / "out"
    with RoutingFake(delay_s=0.02) as fake:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voice_llm", "load", "--url", fake.url, "--callers", "1,2,4,8", "--step-s", "2",
             "--warmup-s", "0", "--docs", "0", "--no-stop", "--out", str(out), "--think-scale", "0", "--barge-in", "0",
             "--workers", "1"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen: list[str] = []
        children: dict[int, int] = {}
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # the master's progress lines: interrupt once step 2 is under way
                seen.append(line)
                children.update(_living_descendants(proc.pid))
                if line.startswith("load: step 2:"):
                    break
            else:
                pytest.fail("".join(seen))
            proc.send_signal(sig)
            stdout, rest = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted; kept" in err and "load.json" in err and "load_samples.csv" in err, err
    doc = _doc(out)
    assert doc["interrupted"] and doc["interrupted"].startswith("interrupted (SIGINT or SIGTERM)"), doc["interrupted"]
    (sweep,) = doc["sweeps"]
    assert [s["callers"] for s in sweep["steps"]] == [1], "the completed step is kept, the interrupted one is not"
    assert sweep["interrupted"]
    samples = read_samples(out / "load_samples.csv")
    assert any(s["step"] == 0 for s in samples) and len(samples) >= sweep["steps"][0]["turns"]
    run = json.loads((out / "run.json").read_text())
    assert run["failed_step"] == "load" and "interrupted" in run["failure"]
    for name, check in LOAD_CHECKS:
        check(out)
    deadline = time.monotonic() + 30
    while not _descendants_gone(children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _descendants_gone(children), "no Locust process outlives the command"


@pytest.mark.slow
def test_a_worker_killed_during_a_sweep_keeps_the_completed_steps(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    with RoutingFake(delay_s=0.02) as fake:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voice_llm", "load", "--url", fake.url, "--callers", "1,2,4,8", "--step-s", "2",
             "--warmup-s", "0", "--docs", "0", "--no-stop", "--out", str(out), "--think-scale", "0", "--barge-in", "0",
             "--workers", "1"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen: list[str] = []
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                seen.append(line)
                if line.startswith("load: step 2:"):
                    break
            workers = [pid for pid in procfs.descendants(proc.pid) if "--worker" in procfs.command_line(pid)]
            assert workers, "".join(seen)
            for pid in workers:
                procfs_kill(pid)
            stdout, rest = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = "".join(seen) + rest
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert "a Locust worker exited" in err and "kept" in err and "marked failed" in err, err
    doc = _doc(out)
    assert doc["interrupted"].startswith("failed") and [s["callers"] for s in doc["sweeps"][0]["steps"]] == [1]


def procfs_kill(pid: int) -> None:
    import os

    os.kill(pid, signal.SIGKILL)


# --- 4. the verdict rests on enough turns; 6. --master-port; 7. the model name -------------------------------------


@pytest.mark.slow
def test_the_verdict_names_its_turns_the_port_and_the_model(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    master_port = free_port()
    with RoutingFake(delay_s=0.01) as fake:
        result = cli("load", "--url", fake.url, "--callers", "1", "--step-s", "4", "--warmup-s", "0", "--docs", "0",
                     "--master-port", str(master_port), "--out", str(out), *FAST, env=env)
    assert result.returncode == 0, result.stderr
    (sweep,) = _doc(out)["sweeps"]
    verdict = sweep["verdict"]
    assert verdict["max_callers"] == 1 and verdict["judged_turns"] >= 20
    assert f"{verdict['judged_turns']} judged turns at 1 caller" in result.stdout
    assert sweep["master_port"] == master_port, "local workers connected to --master-port"
    assert fake.chats and all(chat.get("model") == MODEL_ID for chat in fake.chats)
    # The noise evidence: load samples of the run itself, the measured server's CPU (this process: the fake
    # listens here, on loopback) counted as the run's own.
    (step,) = [s for s in json.loads((out / "run.json").read_text())["steps"] if s["step"] == "load"]
    assert step["load_samples"] and all(set(s) == {"at", "load", "own"} for s in step["load_samples"])
    # the step ends at its 20th judged turn, seconds in: a sample may come before the fake has used measurable CPU
    assert all(isinstance(s["own"], (int, float)) and s["own"] >= 0 for s in step["load_samples"])


@pytest.mark.slow
def test_a_taken_master_port_is_one_clear_line(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    with socket.socket() as taken, RoutingFake() as fake:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("load", "--url", fake.url, "--callers", "1", "--step-s", "1", "--warmup-s", "0", "--docs", "0",
                     "--master-port", str(port), "--out", str(out), *FAST, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen for workers on 127.0.0.1:{port}" in result.stderr
    assert [c for c in fake.chats if c["messages"] != list(PROBE_MESSAGES)] == [] and not (out / "load.json").exists()


# --- 5. the noise warning's load samples -------------------------------------------------------------------------


@pytest.fixture
def busy_child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_the_sampler_reads_the_load_during_the_run_and_counts_the_server_as_its_own(busy_child: subprocess.Popen[bytes]) -> None:
    from voice_llm.core.analysis import noise

    with noise.LoadSampler(lambda: {busy_child.pid}, every_s=0.2) as sampler:
        deadline = time.monotonic() + 30
        while len(sampler.samples) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(sampler.samples) >= 5  # four during the run, one at its end
    assert [s["at"] for s in sampler.samples] == sorted(s["at"] for s in sampler.samples)
    assert sampler.samples[-1]["own"] > 0, "the spinning process's CPU is the run's own"
    run = {"metadata": {"machine": {"cores": 2}}, "load_average_start": [0.5, 0.5, 0.5],
           "steps": [{"step": "load", "wall_ms": 1000.0, "server_compute_ms": None,
                      "load_samples": [{"at": 5.0, "load": 3.0, "own": 2.0}, {"at": 10.0, "load": 2.5, "own": 2.0}]}]}
    samples = noise.load_samples(run)
    assert [s["load"] - s["own"] for s in samples] == [0.5, 1.0, 0.5]


def test_call_refuses_a_slot_too_small_for_its_last_turn_before_any_turn(tmp_path: Path, env: dict[str, str]) -> None:
    """3000 tokens per slot hold the lab's longest prompt (the cache step's, ~2600 by this fake's count) but not the
    call's last turn with room for its six answers (~3050): `call` is refused by the same preflight, in seconds."""

    out = tmp_path / "out"
    with RoutingFake(n_ctx=3000, slots=1) as fake:
        result = cli("call", "--url", fake.url, "--out", str(out), "-q", env=env)
    assert_clean_failure(result, "clinic call's longest request (turn 6 of 6", "3000 tokens per slot", "--ctx")
    assert [c for c in fake.chats if c["messages"] != list(PROBE_MESSAGES)] == [], "no turn of the call was sent"
    assert not (out / "call.json").exists()


def test_a_loaded_machine_during_load_flags_the_load_numbers_not_the_lab_s(tmp_path: Path) -> None:
    from voice_llm.core.analysis import noise

    run = {"metadata": {"machine": {"cores": 2}}, "load_average_start": [0.2, 0.2, 0.2],
           "steps": [{"step": "ttft", "wall_ms": 1000.0, "server_compute_ms": 900.0, "load_average": [0.4, 0.4, 0.4]},
                     {"step": "load", "wall_ms": 1000.0, "server_compute_ms": None,
                      "load_samples": [{"at": 5.0, "load": 4.0, "own": 1.5}]}]}
    assessed = noise.assess(tmp_path, run)
    assert assessed["noisy"] and assessed["affected"] == ["load.json (measured while the machine was loaded)"]
    assert "after load +5 s" in assessed["reasons"][0] and "2.50 of it from other processes" in assessed["reasons"][0]


@pytest.mark.slow
def test_no_locust_process_outlives_a_killed_load(tmp_path: Path, env: dict[str, str]) -> None:
    """SIGKILL leaves `voice-llm load` no chance to stop its master (in a session of its own): the master notices
    its parent is gone and stops itself and its workers, instead of running the sweep on for minutes."""
    with RoutingFake(delay_s=0.02) as fake:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voice_llm", "load", "--url", fake.url, "--callers", "1,2,4,8", "--step-s", "20",
             "--warmup-s", "0", "--docs", "0", "--no-stop", "--out", str(tmp_path / "out"), "--think-scale", "0",
             "--workers", "1"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        children: dict[int, int] = {}
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if line.startswith("load: step 1:"):
                    break
            children = _living_descendants(proc.pid)
            assert len(children) >= 2, "a master and a worker"
            proc.kill()
            proc.wait()
            deadline = time.monotonic() + 40  # the master's notice (0.5 s) and its workers' stop (at most 10 s)
            while not _descendants_gone(children) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _descendants_gone(children)
        finally:
            for pid, ticks in children.items():  # never leave one behind, even when the test fails
                if procfs.start_ticks(pid) == ticks:
                    procfs_kill(pid)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
