"""The docs site builds offline with `mkdocs build --strict` (issue 42 item 6): a broken link, a nav entry with no
page or a page the hook fails to generate fails here, not on a reader. A build takes about a second, so it stays in
the fast tier; it runs in a child process, as `make docs` does."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=300, check=False)


def copy_of_the_docs(tmp_path: Path) -> Path:
    """mkdocs.yml and docs/ copied beside each other, the hook still the repository's (it reads BENCHMARKS.md and
    benchmarks/results/ from the repository)."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    text = (ROOT / "mkdocs.yml").read_text().replace("  - scripts/docs_hooks.py",
                                                     f"  - {ROOT / 'scripts' / 'docs_hooks.py'}")
    (tmp_path / "mkdocs.yml").write_text(text)
    return tmp_path / "mkdocs.yml"


def test_the_site_builds_strict_with_every_page(tmp_path: Path) -> None:
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    site = tmp_path / "site"
    for page in sorted((ROOT / "docs").rglob("*.md")):
        assert (site / page.relative_to(ROOT / "docs").with_suffix(".html")).is_file(), page
    # the pages the hook adds from outside docs/
    assert "Capacity as heard" in (site / "benchmarks.html").read_text()
    assert "line_matrix.py" in (site / "benchmarks-scripts.html").read_text()
    results = (site / "results" / "index.html").read_text()
    for entry in (ROOT / "benchmarks" / "results").iterdir():
        if entry.is_dir() and any(p.is_file() for p in entry.rglob("*")):
            assert (site / "results" / f"{entry.name}.html").is_file(), entry.name
            assert f"{entry.name}.html" in results, entry.name
    assert (site / "terminal-progress.png").is_file()  # the screenshots the lab page shows


def test_a_planted_broken_link_fails_the_build(tmp_path: Path) -> None:
    config = copy_of_the_docs(tmp_path)
    assert build(config, tmp_path / "site").returncode == 0  # the copy builds as the original does
    with (tmp_path / "docs" / "lab.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    done = build(config, tmp_path / "site2")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_a_nav_entry_without_its_page_fails_the_build(tmp_path: Path) -> None:
    config = copy_of_the_docs(tmp_path)
    (tmp_path / "docs" / "agent.md").unlink()
    done = build(config, tmp_path / "site")
    assert done.returncode != 0
    assert "agent.md" in done.stderr


def test_the_hook_points_repository_links_at_the_sites_pages() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_hooks
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    rewrite = docs_hooks.rewrite
    # BENCHMARKS.md (shown as benchmarks.md) links a result file from the repository's root
    assert rewrite("[eval](benchmarks/results/sentence_eval.md)", "BENCHMARKS.md", "benchmarks.md") == \
        "[eval](results/sentence_eval.md)"
    assert rewrite("[line](../docs/line.md#clocks)", "benchmarks/README.md", "benchmarks-scripts.md") == \
        "[line](line.md#clocks)"
    # a file the site does not hold becomes its path; URLs and anchors are left alone
    assert rewrite("[the script](bench.py)", "benchmarks/README.md", "benchmarks-scripts.md") == \
        "the script (`benchmarks/bench.py`)"
    assert rewrite("[x](https://example.org/a.md) [y](#top)", "BENCHMARKS.md", "benchmarks.md") == \
        "[x](https://example.org/a.md) [y](#top)"
    # from a results page one folder down
    assert rewrite("[b](../../../BENCHMARKS.md#targets)", "benchmarks/results/x/x.md", "results/x.md") == \
        "[b](../benchmarks.md#targets)"


def test_docs_pages_link_the_benchmarks_as_the_repository_holds_them(tmp_path: Path) -> None:
    """A page of docs/ reads as it is on GitHub too: it links ../BENCHMARKS.md, ../benchmarks/README.md and
    ../benchmarks/results/, never the pages only the built site has (benchmarks.md, benchmarks-scripts.md,
    results/), and the hook points those links at the site's pages, heading anchors kept."""
    site_only = re.compile(r"\]\((?:\./)?(?:benchmarks\.md|benchmarks-scripts\.md|results/)")
    written = [f"{page.relative_to(ROOT)}:{n}" for page in sorted((ROOT / "docs").rglob("*.md"))
               for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if site_only.search(line)]
    assert written == []
    assert "](../BENCHMARKS.md#the-caller-on-a-real-line)" in (ROOT / "docs" / "dial.md").read_text()
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
    assert 'href="benchmarks.html#the-caller-on-a-real-line"' in (tmp_path / "site" / "dial.html").read_text()
    index = (tmp_path / "site" / "index.html").read_text()
    assert 'href="benchmarks-scripts.html"' in index and 'href="results/index.html"' in index


def test_the_hook_points_docs_links_that_leave_docs_at_the_sites_pages() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_hooks
    finally:
        sys.path.remove(str(ROOT / "scripts"))

    def shown(markdown: str, src_uri: str = "index.md") -> str:
        page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri=src_uri, generated_by=None))
        return docs_hooks.on_page_markdown(markdown, page, {}, None)

    assert shown("[b](../BENCHMARKS.md#targets) [s](../benchmarks/README.md) [r](../benchmarks/results/)") == \
        "[b](benchmarks.md#targets) [s](benchmarks-scripts.md) [r](results/index.md)"
    assert shown("[b](../../BENCHMARKS.md#targets)", "decisions/0001-x.md") == "[b](../benchmarks.md#targets)"
    # links within docs/ are MkDocs' own, as written; a link broken in the repository too is left for MkDocs to name
    assert shown("[l](line.md#clocks) [x](./lab.md) [n](../no-such-file.md)") == \
        "[l](line.md#clocks) [x](./lab.md) [n](../no-such-file.md)"
    assert shown("[s](../benchmarks/bench.py)") == "s (`benchmarks/bench.py`)"
    made = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="benchmarks.md", generated_by="<unknown>"))
    assert docs_hooks.on_page_markdown("[r](results/x.md)", made, {}, None) == "[r](results/x.md)"
