"""`voice-llm compare` on two real runs: a cheap run on the session's shared server (default threads: ttft, sentence
with the default three repeats, cancel) against one on a one-thread server (ttft and sentence with two), then on
tampered copies of the second run. The session lab is compared only with itself: it reads the short KB, and compare
(rightly) refuses runs whose documents differ."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from clihelpers import LAB_REPEAT, assert_clean_failure, cli, cli_env
from conftest import free_port

from voice_llm.core.util.stats import median

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def one_thread_run(tmp_path_factory: pytest.TempPathFactory, server_binary: Path, model_path: Path) -> Iterator[Path]:
    env = cli_env(tmp_path_factory.mktemp("state-1t"))
    out = tmp_path_factory.mktemp("run-1t")
    port = str(free_port())
    started = cli("up", "--port", port, "--threads", "1", "-q", env=env, timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        for step, repeat in (("ttft", ()), ("sentence", ("--repeat", "2"))):  # ttft keeps the brief's five runs
            done = cli(step, "--port", port, "--out", str(out), *repeat, "-q", env=env, timeout=600)
            assert done.returncode == 0, done.stderr
        yield out
    finally:
        cli("down", "--port", port, env=env, timeout=60)


@pytest.fixture(scope="module")
def default_threads_run(tmp_path_factory: pytest.TempPathFactory, shared_server) -> Path:
    env = cli_env(tmp_path_factory.mktemp("state-default"))
    out = tmp_path_factory.mktemp("run-default")
    for step in ("ttft", "sentence", "cancel"):  # cancel: a metric only this run has
        done = cli(step, "--url", shared_server.url, "--out", str(out), "-q", env=env, timeout=600)
        assert done.returncode == 0, done.stderr
    return out


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return cli_env(tmp_path / "state")


def test_compare_prints_a_verdict_per_shared_metric(default_threads_run: Path, one_thread_run: Path,
                                                    env: dict[str, str]) -> None:
    lab_out = default_threads_run
    done = cli("compare", str(lab_out), str(one_thread_run), env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("set-up differs:") and "threads" in line for line in lines), done.stdout
    first_token = next(line for line in lines if line.startswith("first token ") and " -> " in line)
    assert "Mann-Whitney p=" in first_token and "5 vs 5" in first_token  # ttft keeps five runs a side
    sentence = next(line for line in lines if line.startswith("first sentence "))
    assert "3 vs 2" in sentence and ("significant" in sentence or "within the noise" in sentence)
    assert any(line.startswith("measured in one run only:") and "slot idle after cancel" in line for line in lines)
    assert lines[-1].startswith("a listener would notice:")

    as_json = json.loads(cli("compare", str(lab_out), str(one_thread_run), "--json", env=env).stdout)
    rows = {row["key"]: row for row in as_json["metrics"]}
    assert set(rows) == {"ttft_p50_ms", "total_p50_ms", "first_sentence_ms", "sentence_total_ms"}
    for row in rows.values():
        assert row["ratio"] == pytest.approx(row["b"] / row["a"]) and row["line"]
    assert len(rows["ttft_p50_ms"]["a_samples"]) == 5 and len(rows["first_sentence_ms"]["a_samples"]) == 3
    assert {"field": "threads", "a": as_json_threads(lab_out), "b": 1} in as_json["metadata_differences"]


def as_json_threads(out: Path) -> int | None:
    return json.loads((out / "run.json").read_text())["metadata"]["server"]["threads"]


def _tampered(source: Path, dest: Path, path: tuple[str, ...], value: str) -> Path:
    out = Path(shutil.copytree(source, dest))
    doc = json.loads((out / "run.json").read_text())
    target = doc["metadata"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    (out / "run.json").write_text(json.dumps(doc))
    return out


def test_compare_refuses_other_documents_prompts_and_mixed_folders(one_thread_run: Path, default_threads_run: Path,
                                                                   tmp_path: Path, env: dict[str, str]) -> None:
    other_kb = _tampered(one_thread_run, tmp_path / "kb", ("kb", "sha256"), "0" * 64)
    refused = cli("compare", str(one_thread_run), str(other_kb), env=env)
    assert_clean_failure(refused, "KB documents differ", "--force")
    forced = cli("compare", str(one_thread_run), str(other_kb), "--force", env=env)
    assert forced.returncode == 0 and "forced past: the KB documents differ" in forced.stdout

    other_prompts = _tampered(one_thread_run, tmp_path / "prompts", ("prompts", "sha256"), "1" * 64)
    assert_clean_failure(cli("compare", str(other_prompts), str(one_thread_run), env=env), "prompts differ")

    mixed = Path(shutil.copytree(one_thread_run, tmp_path / "mixed"))
    shutil.copy(default_threads_run / "ttft.json", mixed / "ttft.json")  # one file of another run
    for extra in ((), ("--force",)):
        assert_clean_failure(cli("compare", str(one_thread_run), str(mixed), *extra, env=env), "mixes runs", "ttft.json")


def test_report_compare_puts_both_runs_on_one_page(default_threads_run: Path, one_thread_run: Path, tmp_path: Path,
                                                   env: dict[str, str]) -> None:
    a = Path(shutil.copytree(default_threads_run, tmp_path / "a"))  # the module's run is shared: read-only
    done = cli("report", "--out", str(a), "--compare", str(one_thread_run), env=env)
    assert done.returncode == 0, done.stderr
    page = (a / "compare.html").read_text()
    assert done.stdout.strip() == f"report: {a / 'compare.html'}"
    for run in (a, one_thread_run):
        assert json.loads((run / "run.json").read_text())["run_id"] in page
    assert 'id="chart-spread"' in page and 'class="verdicts"' in page and "threads" in page
    for artifact in default_threads_run.rglob("*"):  # nothing was measured or rewritten: only compare.html is new
        if artifact.is_file():
            assert (a / artifact.relative_to(default_threads_run)).read_bytes() == artifact.read_bytes(), artifact
    assert {p.name for p in a.iterdir()} - {p.name for p in default_threads_run.iterdir()} == {"compare.html"}


def test_the_lab_keeps_every_repeat_and_reports_medians_spread_and_noise(lab_run) -> None:
    out, done = lab_run
    load = lambda name: json.loads((out / name).read_text())  # noqa: E731
    prefill, cache, sentence, cancel = (load(n) for n in ("prefill.json", "cache.json", "sentence.json", "cancel.json"))
    assert isinstance(prefill, list) and [row["docs"] for row in prefill] == [0, 4, 12]  # the brief's shape stays
    for row in prefill:
        assert len(row["repeats"]) == LAB_REPEAT and row["ttft_ms_min"] <= row["ttft_ms"] <= row["ttft_ms_max"]
        assert row["ttft_ms"] == median([r["ttft_ms"] for r in row["repeats"]])
    assert len(cache["repeats"]) == LAB_REPEAT and set(cache["repeats"][0]) == {"first", "second", "changed_suffix",
                                                                              "changed_prefix"}
    for repeat in cache["repeats"]:  # each repeat in the brief's order, each with its own hit and miss
        assert repeat["second"]["prompt_n"] <= 2 < repeat["first"]["prompt_n"] * 0.9 <= repeat["changed_prefix"]["prompt_n"]
    assert len(sentence["repeats"]) == LAB_REPEAT and sentence["first_sentence_ms_min"] <= sentence["first_sentence_ms"]
    assert len(cancel["repeats"]) == LAB_REPEAT and cancel["slot_idle_after_ms"] == median(
        [r["slot_idle_after_ms"] for r in cancel["repeats"]])
    report = load("report.json")
    assert isinstance(report["noise"]["noisy"], bool) and "ttft_p50_ms" in report["noise"]["spread"]
    if report["noise"]["noisy"]:
        assert "warning: the machine was noisy" in done.stdout
    steps = load("run.json")["steps"]
    assert all(len(step["load_average"]) == 3 for step in steps)
    page = (out / "report.html").read_text()
    for marker in ('id="section-metadata"', 'id="chart-spread"', 'id="section-noise"', "n_ctx", "model sha256"):
        assert marker in page, marker
