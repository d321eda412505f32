"""Open report.html in a real headless Chromium and prove that every chart was drawn, not just written.

The page is rendered from ``fixtures/sample_run``, the files of a real lab run with the default three repeats on a
loaded 2-core machine (raw streams and server log left out), so it shows the run's metadata, the spread chart and
the noise warning. Two runs of Chromium on the rendered sample report: ``--dump-dom`` returns the DOM after the page's own probe
script has measured each chart's SVG (``data-rendered`` on <body>, ``data-box`` on each figure), and
``--screenshot`` gives the pixels, in which each chart's box must hold visible ink.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from voice_llm.core.analysis.compare import compare_runs
from voice_llm.core.report.compare_page import render_compare
from voice_llm.core.report.page import render_report

pytestmark = pytest.mark.browser

SAMPLE_RUN = Path(__file__).parents[1] / "fixtures" / "sample_run"
SAMPLE_AUDIO = Path(__file__).parents[1] / "fixtures" / "sample_audio" / "audio.json"  # the speak step's charts
CHARTS = ("sentence", "speak", "firstaudio", "ttft", "prefill", "cache", "cancel", "spread")
WINDOW = (1200, 8400)  # CSS px; with --force-device-scale-factor=1 the PNG has the same size


def find_chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path:
        return path
    message = "Chromium is missing: run `make test`, which installs it (scripts/ensure-chromium.sh)"
    if os.environ.get("VOICE_LLM_ALLOW_NO_BROWSER") == "1":
        pytest.skip(message)
    pytest.fail(message + "; set VOICE_LLM_ALLOW_NO_BROWSER=1 to skip this test instead")


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Flags keep Chromium offline and quiet: no sandbox (we run as root), no GPU, no background networking.
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
        f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=2000",
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"chromium failed ({result.returncode}): {result.stderr[-2000:]}"
    return result


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, str]:
    chromium = find_chromium()
    out = Path(shutil.copytree(SAMPLE_RUN, tmp_path_factory.mktemp("browser") / "out"))
    shutil.copy(SAMPLE_AUDIO, out / "audio.json")
    report = render_report(out)
    url = report.resolve().as_uri()
    dom = run_chromium(chromium, out.parent / "profile-dom", "--dump-dom", url).stdout
    png = out.parent / "report.png"
    run_chromium(chromium, out.parent / "profile-shot", f"--screenshot={png}", url)
    return dom, png, url


def chart_boxes(dom: str) -> dict[str, tuple[int, int, int, int]]:
    boxes = {}
    for tag in re.findall(r"<figure\b[^>]*>", dom):
        name = re.search(r'id="chart-([a-z]+)"', tag)
        box = re.search(r'data-box="(-?\d+),(-?\d+),(\d+),(\d+)"', tag)
        if name and box:
            boxes[name.group(1)] = tuple(int(v) for v in box.groups())
    return boxes


def test_every_chart_svg_has_a_layout_box(rendered: tuple[str, Path, str]) -> None:
    dom, _, _ = rendered
    body = re.search(r"<body\b[^>]*>", dom)
    assert body, "no <body> in the dumped DOM"
    rendered_count = re.search(r'data-rendered="(\d+)"', body.group(0))
    assert rendered_count, f"the page's render probe did not run: {body.group(0)}"
    assert int(rendered_count.group(1)) == len(CHARTS)
    assert sorted(chart_boxes(dom)) == sorted(CHARTS)


def test_screenshot_shows_ink_in_every_chart(rendered: tuple[str, Path, str]) -> None:
    dom, png, _ = rendered
    assert png.is_file() and png.stat().st_size > 20_000, "screenshot missing or trivially small"
    pixels = image.imread(png)[:, :, :3]  # floats in 0..1
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    assert pixels.std() > 0.05, "the screenshot is (nearly) blank"
    for name, (left, top, width, height) in chart_boxes(dom).items():
        assert width > 300 and height > 150, f"chart {name} is too small: {width}x{height}"
        assert top + height <= WINDOW[1], f"chart {name} lies below the screenshot; raise WINDOW"
        region = pixels[top : top + height, left : left + width]
        # A drawn chart has axes, text and data: a few percent of its pixels are clearly not white.
        inked = (region < 0.8).any(axis=2).mean()
        assert region.std() > 0.05 and inked > 0.02, f"chart {name} looks blank (ink {inked:.3f})"


def test_blank_region_check_would_catch_a_missing_chart(rendered: tuple[str, Path, str]) -> None:
    # Guards the guard: the page margin beside the 1000 px column is empty, so the ink test must reject it.
    _, png, _ = rendered
    margin = image.imread(png)[:, :, :3][:2000, :40]
    assert np.asarray(margin).std() < 0.01


def _section(dom: str, name: str) -> str:
    start = dom.index(f'<section id="section-{name}"')
    return dom[start : dom.index("</section>", start)]


def test_the_page_shows_the_run_metadata_and_the_noise_warning(rendered: tuple[str, Path, str]) -> None:
    dom, _, _ = rendered
    meta = _section(dom, "metadata")
    for label in ("run id", "voice-llm", "llama.cpp source", "server build_info", "model sha256", "n_ctx", "slots",
                  "threads", "KB", "CPU", "load average start", "load average end", "python", "started", "ended"):
        assert f"<th>{label}" in meta, label
    assert "SmolLM2" in meta and "…" in meta  # the model by name, hashes shortened
    noise = _section(dom, "noise")  # the fixture comes from a machine shared by several runs at once
    assert 'class="noise"' in noise and "the machine was noisy" in noise and "Numbers affected" in noise
    assert "first token" in noise


def test_the_compare_page_draws_both_runs(tmp_path: Path) -> None:
    chromium = find_chromium()
    a = Path(shutil.copytree(SAMPLE_RUN, tmp_path / "a"))
    b = Path(shutil.copytree(SAMPLE_RUN, tmp_path / "b"))
    page = render_compare(compare_runs(a, b))
    dom = run_chromium(chromium, tmp_path / "profile", "--dump-dom", page.resolve().as_uri()).stdout
    assert re.search(r'<body[^>]*data-rendered="1"', dom), "the spread chart of both runs did not lay out"
    assert "A: each sample" in dom and "B: each sample" in dom and 'class="verdicts"' in dom


def test_a_load_runs_report_and_the_compare_page_of_two_draw_their_charts(tmp_path: Path) -> None:
    """load's two charts (heard gap and goodput; the agent's stages) of a real dialing sweep, and its compare section,
    laid out by the browser (the pixels of each are the same SVG path as the lab's charts above)."""
    chromium = find_chromium()
    fixtures = Path(__file__).parents[1] / "fixtures"
    a = Path(shutil.copytree(fixtures / "load_dial_run", tmp_path / "a"))
    b = Path(shutil.copytree(fixtures / "load_dial_run", tmp_path / "b"))
    for page, charts in ((render_report(a), ("load", "loadstages")), (render_compare(compare_runs(a, b)), ("load",))):
        dom = run_chromium(chromium, tmp_path / f"profile-{page.stem}", "--dump-dom", page.resolve().as_uri()).stdout
        assert re.search(rf'<body[^>]*data-rendered="{len(charts)}"', dom), page
        assert sorted(chart_boxes(dom)) == sorted(charts)
