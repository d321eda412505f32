"""report.html from a synthetic but realistic OUT folder (tests/fixtures/sample_out), no server, no browser."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from voice_llm.core.util.artifacts import CACHE, CANCEL, PREFILL, PROPS, REPORT, REPORT_HTML, SENTENCE, TTFT
from voice_llm.core.checks.core import CheckResult
from voice_llm.core.errors import ArtifactError
from voice_llm.core.report.page import render_report

SAMPLE_OUT = Path(__file__).parents[1] / "fixtures" / "sample_out"
# The speak step's audio.json from a real run (one run per strategy), kept apart so check tests on sample_out
# need no WAVs or raw streams.
SAMPLE_AUDIO = Path(__file__).parents[1] / "fixtures" / "sample_audio" / "audio.json"
CHART_IDS = ("chart-sentence", "chart-speak", "chart-firstaudio", "chart-ttft", "chart-prefill", "chart-cache",
             "chart-cancel")
CHECKS = (
    CheckResult("ttft_p50 is the median of the five runs", "pass", "ttft_p50 61.7 ms = median of 5 runs"),
    CheckResult("slot idle soon after cancel", "fail", "idle after 38.6 ms, limit 30 ms"),
)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A private copy of the sample artifacts, so render_report writes report.html outside the repository."""
    out = Path(shutil.copytree(SAMPLE_OUT, tmp_path / "out"))
    shutil.copy(SAMPLE_AUDIO, out / "audio.json")
    return out


def render(out: Path, checks=CHECKS) -> str:
    return render_report(out, checks).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The sample folder and its page, rendered once with CHECKS for the tests that only read them (a page
    costs a second or more of matplotlib); no test may change that folder."""
    out = Path(shutil.copytree(SAMPLE_OUT, tmp_path_factory.mktemp("sample") / "out"))
    shutil.copy(SAMPLE_AUDIO, out / "audio.json")
    return out, render(out)


def figure_html(page: str, chart_id: str) -> str:
    match = re.search(rf'<figure class="chart" id="{chart_id}">(.*?)</figure>', page, re.S)
    assert match, f"{chart_id} is not in the page"
    return match.group(1)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_every_section_renders_a_chart_with_a_caption(sample: tuple[Path, str]) -> None:
    out, page = sample
    assert (out / REPORT_HTML).is_file()
    assert 'data-charts="10"' in page  # the brief's five, the spread, two of the speak step, two of dial's call
    for chart_id in CHART_IDS:
        figure = figure_html(page, chart_id)
        assert figure.lstrip().startswith("<svg"), chart_id
        assert figure.count("<svg") == 1
        assert re.search(r"<figcaption>[^<]{20,}</figcaption>", figure), chart_id
    assert "not available" not in page


def test_charts_have_axis_labels_with_units(sample: tuple[Path, str]) -> None:
    _, page = sample
    expected = {
        "chart-sentence": ["time since the request was sent (ms)", "characters received", "first token: 78 ms",
                           "brief's rule: 385 ms", "smart splitter: 359 ms", "end of answer: 955 ms"],
        "chart-ttft": ["time (ms)", "run", "median 62 ms", "median 1,188 ms"],
        "chart-prefill": ["prompt size (prompt_n, tokens)", "time (ms)", "12 docs"],
        "chart-cache": ["time (ms)", "tokens", "prompt_n (evaluated)", "cache_n (reused from cache)"],
        "chart-cancel": ["time since the request was sent (ms)", "18 of 256 tokens received", "client closed: 500 ms",
                         "slot idle: 539 ms", "18 chunks received"],
        "chart-speak": ["time since the request was sent (ms)", "playback", "synthesis", "text",
                        "whole answer: first audio", "first clause, then sentences: first audio"],
        "chart-firstaudio": ["time (ms)", "first audio (TTFA)", "first segment's text complete", "sentence by sentence"],
    }
    for chart_id, texts in expected.items():
        figure = figure_html(page, chart_id)
        for text in texts:
            assert text.replace("'", "&#x27;") in figure or text in figure, (chart_id, text)


def test_prefill_shows_the_fitted_rate(sample: tuple[Path, str]) -> None:
    out, page = sample
    rows = json.loads((out / PREFILL).read_text())
    slope = np.polyfit([r["prompt_n"] for r in rows], [r["prompt_ms"] for r in rows], 1)[0]
    figure = figure_html(page, "chart-prefill")
    assert f"{slope:.2f} ms/token" in figure
    assert f"{1000 / slope:,.0f} tokens/s" in figure
    assert "12 documents (2,297 prompt tokens) cost 6,561 ms before the first word" in figure


def test_header_shows_server_facts_and_key_numbers(sample: tuple[Path, str]) -> None:
    _, page = sample
    header = page[page.index("<header>") : page.index("</header>")]
    assert "qwen2.5-0.5b-instruct-q4_k_m.gguf" in header
    assert "/root/.cache" not in header  # the basename only
    assert "4,096 tokens" in header
    assert "b4589-1a2b3c4d" in header
    assert "median time to first token" in header and "61.7" not in header and "62 ms" in header
    assert "2,297 tokens" in header


def test_checks_table_marks_pass_and_fail(sample: tuple[Path, str]) -> None:
    _, page = sample
    assert "2 checks: 1 passed, 0 findings, 0 not checkable, 1 failed." in page
    assert re.search(r'<tr class="pass">.*PASS.*ttft_p50 is the median', page)
    assert re.search(r'<tr class="fail">.*FAIL.*slot idle soon after cancel', page)


def test_checks_none_says_not_run(out: Path) -> None:
    assert "checks not run" in render(out, checks=None)


def test_strings_from_artifacts_are_escaped(out: Path) -> None:
    evil = '<script>alert("chunk")</script>'

    def poison_sentence(data):
        data["chunks"][3]["text"] = evil
        data["text"] = data["text"] + evil
        data["first_sentence"] = "<b>bold</b>"

    edit_json(out / SENTENCE, poison_sentence)
    edit_json(out / PROPS, lambda d: d.update(model_path="/m/<img src=x onerror=alert(1)>.gguf", build_info="<i>"))
    page = render(out, [CheckResult("<u>name</u>", "pass", 'detail "<script>"')])
    assert page.count("<script>") == 1  # only the page's own render probe
    assert "&lt;script&gt;alert(&quot;chunk&quot;)&lt;/script&gt;" in page
    assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;.gguf" in page
    assert "<i>" not in page and "<u>" not in page


def test_missing_or_malformed_artifacts_blank_only_their_section(out: Path) -> None:
    (out / CACHE).unlink()
    (out / TTFT).write_text('{"runs": [', encoding="utf-8")
    edit_json(out / PREFILL, lambda rows: rows[1].pop("prompt_ms"))
    page = render(out)
    for name, reason in (
        ("cache", "cache.json is missing"),
        ("ttft", "ttft.json is not valid JSON"),
        ("prefill", "prefill.json has no field '[1].prompt_ms'"),  # the one parse's words (run/artifacts.py)
    ):
        section = page[page.index(f'<section id="section-{name}">') :]
        section = section[: section.index("</section>")]
        assert f"not available: {reason}".replace("'", "&#x27;") in section, section
        assert "<figure" not in section
    for chart_id in ("chart-sentence", "chart-cancel"):
        assert figure_html(page, chart_id).lstrip().startswith("<svg")
    assert 'data-charts="7"' in page  # sentence, cancel, spread, speak, first audio, dial's two


def test_wrongly_typed_values_are_reported_not_crashed(out: Path) -> None:
    edit_json(out / SENTENCE, lambda d: d.update(ttft_ms="fast"))
    (out / CANCEL).write_text("[1, 2]", encoding="utf-8")
    edit_json(out / PROPS, lambda d: d.update(total_slots=None, default_generation_settings="?"))
    page = render(out)
    # The one parse's words (voice_llm.core.run.artifacts), as check says them too.
    assert "not available: sentence.json: ttft_ms is &#x27;fast&#x27;, not a finite number" in page
    assert "not available: cancel.json is not an object: [1, 2]" in page
    assert page.count('<figure class="chart"') == 8


def test_empty_out_folder_still_gives_a_page(tmp_path: Path) -> None:
    page = render(tmp_path)
    # eight charts, server facts, key numbers (the call as heard is drawn only for a call of this run: optional)
    assert page.count("not available:") == 10
    assert '<figure class="chart"' not in page


def test_missing_out_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="does not exist"):
        render_report(tmp_path / "nope")


def test_optional_values_and_degenerate_prefill(out: Path) -> None:
    edit_json(out / SENTENCE, lambda d: d.update(first_sentence_ms=None, smart_first_sentence_ms=None))
    edit_json(out / CANCEL, lambda d: (d.pop("chunks"), d.update(slot_idle_after_ms=None)))

    def keep_only_zero_docs(rows):
        del rows[1:]

    edit_json(out / PREFILL, keep_only_zero_docs)
    edit_json(out / CACHE, lambda d: [case.pop("cache_n") for case in d.values()])
    page = render(out)
    assert 'data-charts="10"' in page
    assert "No whole sentence was found" in figure_html(page, "chart-sentence")
    assert "not seen idle" in figure_html(page, "chart-cancel")
    assert "no fit: needs at least two different prompt sizes" in figure_html(page, "chart-prefill")


def test_equal_prompt_sizes_do_not_break_the_fit(out: Path) -> None:
    edit_json(out / PREFILL, lambda rows: [row.update(prompt_n=800) for row in rows])
    assert "no fit: needs at least two different prompt sizes" in figure_html(render(out), "chart-prefill")


def test_page_is_self_contained_with_unique_ids(sample: tuple[Path, str]) -> None:
    _, page = sample
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<link" not in page and "@import" not in page and "<img" not in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "duplicate ids across the inlined SVGs"
    for ref in re.findall(r'(?:url\(#|href="#)([^")]+)', page):
        assert ref in ids, f"dangling reference #{ref}"
    assert "@media print" in page


def test_output_is_deterministic(out: Path, sample: tuple[Path, str]) -> None:
    first = render_report(out, CHECKS).read_bytes()
    second = render_report(out, CHECKS).read_bytes()
    assert first == second
    # The same sample rendered in another folder (the module's) gave the same bytes.
    assert (sample[0] / REPORT_HTML).read_bytes() == first
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # the atomic write left no temp file


def test_report_json_unknown_keys_are_shown(out: Path) -> None:
    edit_json(out / REPORT, lambda d: d.update(extra_metric="<odd>"))
    page = render(out)
    assert "extra_metric" in page and "&lt;odd&gt;" in page


def test_a_malformed_audio_json_blanks_only_the_speak_sections(out: Path) -> None:
    edit_json(out / "audio.json", lambda d: d.pop("strategies"))
    page = render(out)
    for name in ("speak", "firstaudio"):
        section = page[page.index(f'<section id="section-{name}">') :]
        assert "not available: audio.json is malformed" in section[: section.index("</section>")]
    assert 'data-charts="8"' in page  # the five of the brief, the spread and dial's two
