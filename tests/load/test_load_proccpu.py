"""Host CPU per process of a dialing sweep (voice_llm.capabilities.load.proccpu): which processes are whose, their trees' CPU
(live descendants and reaped children), a step's deltas and shares, and load.json/report.html carrying them. Fakes
for /proc and psutil (the real ones are exercised by the real dial sweep, tests/load/test_load_dial_real.py)."""

from __future__ import annotations

import json
from collections import namedtuple
from pathlib import Path

import pytest

from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.capabilities.load import proccpu, report
from voice_llm.capabilities.load.document import load_document, sweep_document
from voice_llm.capabilities.load.plan import SweepPlan
from voice_llm.capabilities.load.run import dial_caller
from voice_llm.capabilities.load.settings import LoadSettings

Times = namedtuple("Times", "user system children_user children_system")


class FakePsutil:
    """psutil's Process for a made-up tree: pid -> (cpu times, children pids); a pid in ``gone`` has exited."""

    class Error(Exception):
        pass

    def __init__(self, tree: dict[int, tuple[Times, list[int]]], gone: frozenset[int] = frozenset()) -> None:
        self.tree, self.gone = tree, gone
        fake = self

        class Process:
            def __init__(self, pid: int) -> None:
                if pid not in fake.tree or pid in fake.gone:
                    raise fake.Error(f"no process {pid}")
                self.pid = pid

            def cpu_times(self) -> Times:
                if self.pid in fake.gone:
                    raise fake.Error("gone")
                return fake.tree[self.pid][0]

            def children(self, recursive: bool = False) -> list[Process]:
                out, todo = [], list(fake.tree[self.pid][1])
                while todo:
                    pid = todo.pop(0)
                    out.append(Process.__new__(Process))
                    out[-1].pid = pid
                    if recursive:
                        todo.extend(fake.tree.get(pid, (None, []))[1])
                return out

        self.Process = Process


def test_the_processes_are_found_by_their_listening_ports_and_the_agents_command_line() -> None:
    listening = {18401: 11, 18400: 22}
    commands = {11: ["python", "-m", "voice_llm", "agent", "--listen", "127.0.0.1:18401", "--url",
                     "http://127.0.0.1:18400"]}
    found = {t.role: t for t in proccpu.find("ws://127.0.0.1:18401/", [31, 32], 40, listening.get,
                                             lambda pid: commands.get(pid, []))}
    assert [found[r].pids for r in proccpu.ROLES] == [(11,), (22,), (31, 32), (40,)]
    assert [found[r].tree for r in proccpu.ROLES] == [True, True, True, False]  # the workers are the master's children
    assert "port 18400" in found["server"].found and "port 18401" in found["agent"].found
    # --url=X on the agent's line, and its default (the managed port) when it names none
    assert proccpu.agent_llm_url(["agent", "--url=http://127.0.0.1:9/v1"]) == "http://127.0.0.1:9/v1"
    assert proccpu.agent_llm_url(["agent"]) == AgentSettings().url
    assert proccpu.agent_llm_url(["python", "-m", "voice_llm", "agent", "--settings", "/no/such/file"]) == \
        AgentSettings().url  # a line the agent could not read either: its default
    # an agent on another machine: neither it nor its server is this machine's to count; remote workers neither
    away = {t.role: t for t in proccpu.find("ws://10.0.0.5:18401/", [], 40, listening.get, lambda pid: [])}
    assert away["agent"].pids == () and away["server"].pids == () and away["workers"].pids == ()
    assert "not on this machine" in away["agent"].found and "remote workers" in away["workers"].found
    # the noise warning counts the same agent and its server as the run's own CPU (load.run.measured_stack_pids)
    from voice_llm.capabilities.load.run import measured_stack_pids

    readers = {"listener": listening.get, "command_line": lambda pid: commands.get(pid, [])}
    assert measured_stack_pids("ws://127.0.0.1:18401/", **readers) == {11, 22}
    assert measured_stack_pids("ws://10.0.0.5:18401/", **readers) == set()


def test_a_tree_counts_its_live_descendants_and_the_children_it_reaped() -> None:
    ps = FakePsutil({1: (Times(1.0, 0.5, 2.0, 0.5), [2]),  # a worker that has reaped calls worth 2.5 s
                     2: (Times(0.75, 0.25, 0.0, 0.0), [3]),  # a dial call running
                     3: (Times(0.5, 0.0, 0.0, 0.0), [])})
    assert proccpu.tree_cpu_s(1, ps) == pytest.approx(5.5)
    assert proccpu.tree_cpu_s(99, ps) is None  # gone: no reading, never 0
    assert proccpu.tree_cpu_s(1, ps, tree=False) == pytest.approx(1.5)  # the master: itself, not its workers
    # a child that exits between the listing and its reading is skipped (its time reaches the parent once reaped)
    assert proccpu.tree_cpu_s(1, FakePsutil(ps.tree, frozenset({3}))) == pytest.approx(5.0)


def test_a_steps_cpu_is_the_delta_over_its_window_and_a_missing_reading_stays_unknown() -> None:
    tracked = [proccpu.Tracked("agent", (11,), "x"), proccpu.Tracked("server", (), "none here"),
               proccpu.Tracked("workers", (31, 32), "x")]
    before = proccpu.snapshot(tracked, FakePsutil({11: (Times(10, 0, 0, 0), []), 31: (Times(1, 0, 0, 0), []),
                                                   32: (Times(2, 0, 0, 0), [])}))
    after = proccpu.snapshot(tracked, FakePsutil({11: (Times(40, 0, 0, 0), []), 31: (Times(4, 0, 1, 0), []),
                                                  32: (Times(5, 0, 0, 0), [])}))
    assert before == {"agent": 10.0, "server": None, "workers": 3.0}
    rows = proccpu.step_processes(tracked, before, after, 60.0)
    assert rows["wall_s"] == 60.0 and rows["agent"] == {"pids": [11], "cpu_s": 30.0, "share": 0.5}
    assert rows["workers"]["cpu_s"] == 7.0 and rows["workers"]["share"] == pytest.approx(7 / 60, abs=1e-4)
    assert rows["server"] == {"pids": [], "cpu_s": None, "share": None}


def test_load_json_and_the_report_carry_the_cpu_per_process(tmp_path: Path) -> None:
    caller, dial, _ = dial_caller(LoadSettings(dial="ws://127.0.0.1:9/"))
    plan = SweepPlan(caller=caller, callers=(1,), step_s=10.0, dial=dial)
    tracked = [proccpu.Tracked("agent", (11,), "listening on port 9"), proccpu.Tracked("workers", (31,), "local")]
    processes = proccpu.step_processes(tracked, {"agent": 1.0, "workers": 0.5}, {"agent": 7.0, "workers": 1.5}, 10.0)
    result = {"started": 0.0, "ended": 20.0, "workers": ["w1"], "stopped": None, "samples": [],
              "processes_found": proccpu.found_block(tracked),
              "steps": [{"step": 0, "callers": 1, "window": {"start": 0.0, "end": 10.0, "drain_s": 0.1}, "cpu": {},
                         "generator_bound": False, "host": {"cpu_busy": 0.5, "loadavg_1m": 1.0, "master_cpu_s": 0.1},
                         "processes": processes}]}
    sweep, _ = sweep_document(plan, result, None, dial.url)
    assert sweep["steps"][0]["processes"]["agent"]["share"] == 0.6
    assert sweep["processes_found"]["agent"] == {"pids": [11], "found": "listening on port 9"}
    assert "reaped" in sweep["processes_found"]["rule"]
    doc = load_document(LoadSettings(dial=dial.url, callers=(1,)), {"mode": "dial"}, [sweep])
    assert doc["load_schema_version"] == 5
    table = report._processes_table(json.loads(json.dumps(sweep)))
    assert "6.0 s (0.60 core)" in table and "1.0 s (0.10 core)" in table and "LLM server" not in table


def test_an_agent_started_with_a_settings_file_is_read_as_it_reads_it(tmp_path: Path) -> None:
    """The converse step starts its agent with --settings FILE, no --url on its line: its LLM server is the file's
    (a flag beside the file still wins, as for the agent)."""
    file = tmp_path / "settings.json"
    file.write_text(json.dumps({"url": "http://127.0.0.1:18555", "max_tokens": 12}))
    command = ["python", "-m", "voice_llm", "agent", "--settings", str(file)]
    assert proccpu.agent_llm_url(command) == "http://127.0.0.1:18555"
    assert proccpu.agent_llm_url([*command, "--url", "http://127.0.0.1:18556"]) == "http://127.0.0.1:18556"
