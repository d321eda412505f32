"""A run's identity tells servers apart, and the pipeline leaves no half run.

Two OpenAI-compatible servers without /props (vLLM-shaped, so the old identity was all None but the KB hash) with
different model ids on two ports: a step against the other one refuses to mix the runs, or with --new-run starts a
new run, says so and removes the earlier run's files; against the same one it joins and brings report.json and
report.html up to date. A failed step against another server (--new-run) replaces nothing. A new lab's report draws no section from another run's file, and `check` names that file. A bad
--voice, or nothing listening at --url, fails before any file is written, with the right message.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from clihelpers import SHORT_KB, WITHOUT_THE_CALL, assert_clean_failure, cli, cli_env
from fakeserver import unused_port
from fakeshapes import VLLM, ShapedServer

from voice_llm.core.run import meta as runmeta

LAB_TIMEOUT_S = 600
# What these tests compare is which server and run a folder holds, never a time: one repeat and the short KB, for the
# lab and for every step that joins it (a step reads the KB its run was made with; the fake's prefill time grows
# with the documents' characters, and the cache step's default three repeats took ~10 s of the fake's waiting).
KB = ("--kb", str(SHORT_KB))
CACHE = ("--repeat", "1", *KB)


def load(out: Path, name: str):
    return json.loads((out / name).read_text())


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): digest(p) for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".voice-llm.lock"}


@pytest.fixture(scope="module")
def servers(vllm_shaped_lab):
    """Server A, the session's vLLM-shaped fake its lab ran against (tests/conftest.py), and B, another of the same
    shape with another model on another port."""
    _, _, a = vllm_shaped_lab
    with ShapedServer(VLLM, model="model-b") as b:
        yield a, b


@pytest.fixture(scope="module")
def module_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {**cli_env(tmp_path_factory.mktemp("state")), **WITHOUT_THE_CALL}  # identity, not the call


@pytest.fixture(scope="module")
def lab_a(vllm_shaped_lab) -> Path:
    """Run A: the session's whole lab against server A (one repeat, the short KB, without the call), shared with
    tests/run/test_identity_shapes.py; read only (out_a is a copy to change)."""
    out, done, _ = vllm_shaped_lab
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return out


@pytest.fixture
def out_a(lab_a: Path, tmp_path: Path) -> Path:
    """A copy of lab A's folder for a test to change."""
    out = tmp_path / "out"
    shutil.copytree(lab_a, out)
    return out


@pytest.mark.slow
def test_the_identity_names_the_server_and_the_model_sent(lab_a: Path, servers) -> None:
    a, _ = servers
    identity = load(lab_a, "run.json")["metadata"]["identity"]
    assert identity["base_url"] == a.url and identity["model_sent"] == a.model
    assert identity["server_header"] == "uvicorn" and len(identity["capabilities"]) == 16
    assert identity["server_build"] is None and identity["model"] is None  # no /props: these say nothing
    assert load(lab_a, "run.json")["schema_version"] == runmeta.SCHEMA_VERSION == 3


@pytest.mark.slow
def test_a_step_against_another_server_and_model_refuses_or_starts_a_new_run(out_a: Path, servers, module_env) -> None:
    a, b = servers
    before, snap = load(out_a, "run.json")["run_id"], snapshot(out_a)
    refused = cli("cache", "--url", b.url, "--out", str(out_a), *CACHE, "-q", env=module_env, timeout=300)
    err = assert_clean_failure(refused, f"holds run {before}, made against another server", "--new-run")
    assert f"model_sent: '{a.model}' -> 'model-b'" in err and "base_url:" in err
    assert snapshot(out_a) == snap
    done = cli("cache", "--url", b.url, "--out", str(out_a), "--new-run", *CACHE, "-q", env=module_env, timeout=300)
    assert done.returncode == 0, done.stderr
    after = load(out_a, "run.json")
    assert after["run_id"] != before
    assert f"started a new run {after['run_id']}" in done.stderr + done.stdout
    # Run A's files are gone with it: the folder holds one run, and check says so.
    assert not (out_a / "ttft.json").exists() and not (out_a / "report.html").exists()
    checked = cli("check", str(out_a), env=module_env, timeout=120)
    line = next(line for line in checked.stdout.splitlines() if "one run: every file as the run wrote it" in line)
    assert line.startswith("PASS"), line


@pytest.mark.slow
def test_the_same_model_name_on_another_port_is_another_server(out_a: Path, servers, module_env) -> None:
    a, _ = servers
    with ShapedServer(VLLM, model=a.model) as twin:
        done = cli("cache", "--url", twin.url, "--out", str(out_a), *CACHE, "-q", env=module_env, timeout=300)
    assert_clean_failure(done, "made against another server (base_url:", "--new-run")


@pytest.mark.slow
def test_a_step_against_the_same_server_joins_and_refreshes_the_report(out_a: Path, servers, module_env) -> None:
    a, _ = servers
    run_id = load(out_a, "run.json")["run_id"]
    report_before = load(out_a, "report.json")
    html_before = digest(out_a / "report.html")
    done = cli("cache", "--url", a.url + "/v1", "--out", str(out_a), *CACHE, "-q", env=module_env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "started a new run" not in done.stderr + done.stdout
    assert load(out_a, "run.json")["run_id"] == run_id
    # report.json follows the new cache.json (it is copied from it), and the page was drawn again.
    report = load(out_a, "report.json")
    assert report["cache_ttft_ms"] == load(out_a, "cache.json")["second"]["ttft_ms"] != report_before["cache_ttft_ms"]
    assert digest(out_a / "report.html") != html_before
    checked = cli("check", str(out_a), env=module_env, timeout=120)
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert "PASS  report equals its sources" in checked.stdout
    assert "PASS  one run: every file as the run wrote it" in checked.stdout


@pytest.mark.slow
def test_run_steps_joining_a_run_leaves_report_equal_to_its_sources(out_a: Path, servers) -> None:
    from voice_llm.core.checks.core import run_checks
    from voice_llm.core.lab import LabSettings, run_steps
    from voice_llm.core.run.context import StepOptions

    a, _ = servers
    result = run_steps(LabSettings(out=out_a, url=a.url, kb_dir=SHORT_KB, options=StepOptions(repeat=1)), ["cache"])
    assert result.note is None and (out_a / "report.json") in result.written
    report = next(c for c in run_checks(out_a) if c.name == "report equals its sources")
    assert report.label == "PASS", report.detail


@pytest.mark.slow
def test_a_failed_speak_against_another_server_replaces_nothing(out_a: Path, module_env) -> None:
    before = snapshot(out_a)
    # It answers the probe's stream, then breaks down: the first request of speak gets HTTP 500.
    with ShapedServer(VLLM, model="model-c", fail_chats_after=1) as broken:
        done = cli("speak", "--url", broken.url, "--out", str(out_a), "--repeat", "1", "--new-run", "-q",
                   env=module_env, timeout=300)
    assert done.returncode != 0 and "500" in done.stderr, done.stderr
    after = snapshot(out_a)
    # run.json and capabilities.json stay run A's; the only new file is the evidence the failed request left.
    assert after["run.json"] == before["run.json"] and after["capabilities.json"] == before["capabilities.json"]
    assert {name: h for name, h in after.items() if name in before} == before


@pytest.mark.slow
def test_a_new_labs_report_draws_nothing_from_another_runs_file(servers, module_env, tmp_path: Path) -> None:
    a, _ = servers
    out = tmp_path / "out"
    out.mkdir()
    # An earlier run's `load` left load.json here (a shape report.html would draw as "Calls under load").
    older = {"steps": [], "verdict": {"max_callers": 9}, "run_id": "20200101T000000Z-0a0a0a", "schema_version": 2}
    (out / "load.json").write_text(json.dumps(older))
    # Neither the call nor speech is what is tested (tts left out too: no Piper to load and run).
    done = cli("lab", "--url", a.url, "--out", str(out), "--repeat", "1", *KB,
               env={**module_env, "VOICE_LLM_WITHOUT": f"{WITHOUT_THE_CALL['VOICE_LLM_WITHOUT']},tts"},
               timeout=LAB_TIMEOUT_S)
    page = (out / "report.html").read_text()
    assert 'id="section-load"' not in page and 'id="section-ttft"' in page
    line = next(line for line in done.stdout.splitlines() if "one run: every file as the run wrote it" in line)
    assert line.startswith("FAIL") and "load.json (run 20200101T000000Z-0a0a0a)" in line, line
    assert done.returncode != 0
    assert (out / "load.json").read_text() == json.dumps(older)  # named, never removed
    # Without the call the lab ran without load as well (load requires dial), whose section could not have been
    # drawn at all: the page drawn again from these files with every capability registered leaves the file out
    # too, and check names it; the same file made this run's (its run_id) is drawn, so the page could have.
    every = cli_env(tmp_path / "state-every")
    redrawn = cli("report", "--out", str(out), "-q", env=every)
    page = (out / "report.html").read_text()
    assert 'id="section-load"' not in page and 'id="section-ttft"' in page, redrawn.stderr
    checked = cli("check", str(out), env=every)
    line = next(line for line in checked.stdout.splitlines() if "one run: every file as the run wrote it" in line)
    assert line.startswith("FAIL") and "load.json (run 20200101T000000Z-0a0a0a)" in line, line
    (out / "load.json").write_text(json.dumps({**older, "run_id": load(out, "run.json")["run_id"]}))
    cli("report", "--out", str(out), "-q", env=every)
    assert 'id="section-load"' in (out / "report.html").read_text()


def test_a_bad_voice_fails_before_the_server_is_asked_or_a_file_written(module_env, tmp_path: Path) -> None:
    out = tmp_path / "new"
    with ShapedServer(VLLM) as a:  # a fake of its own: `servers` holds the session's lab (slow)
        done = cli("lab", "--url", a.url, "--out", str(out), "--voice", str(tmp_path / "nope.onnx"), "-q",
                   env=module_env, timeout=120)
        assert_clean_failure(done, "nope.onnx")
        assert not out.exists()
        assert not a.requests
        done = cli("speak", "--url", a.url, "--out", str(out), "--voice", str(tmp_path / "nope.onnx"), "-q",
                   env=module_env, timeout=120)
    assert_clean_failure(done, "nope.onnx")
    assert not out.exists()


@pytest.mark.parametrize("command", ["lab", "ttft"])
def test_nothing_at_the_url_given_leaves_no_folder_and_says_so(command: str, module_env, tmp_path: Path) -> None:
    out = tmp_path / "new"
    url = f"http://127.0.0.1:{unused_port()}"
    done = cli(command, "--url", url, "--out", str(out), "-q", env=module_env, timeout=120)
    err = assert_clean_failure(done, f"nothing answers at the --url given, {url}", "connection refused")
    assert "pass --url" not in err
    assert not out.exists()


@pytest.mark.slow
def test_nothing_at_the_url_keeps_an_existing_folder_as_it_was(out_a: Path, module_env) -> None:
    before = snapshot(out_a)
    done = cli("cache", "--url", f"http://127.0.0.1:{unused_port()}", "--out", str(out_a), "-q", env=module_env,
               timeout=120)
    assert_clean_failure(done, "nothing answers at the --url given")
    assert snapshot(out_a) == before



def test_one_server_written_two_ways_is_one_identity() -> None:
    facts = runmeta.ServerFacts(url="http://localhost:8080/v1")
    same = runmeta.identity(facts, {}, {})
    assert same == runmeta.identity(runmeta.ServerFacts(url="http://127.0.0.1:8080"), {}, {})
    other = runmeta.identity(runmeta.ServerFacts(url="http://127.0.0.1:8081"), {}, {})
    assert runmeta.differences(same, other) == ["base_url: 'http://127.0.0.1:8080' -> 'http://127.0.0.1:8081'"]
