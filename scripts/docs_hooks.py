"""MkDocs hook (mkdocs.yml `hooks:`): puts into the site, at build time, the pages that live outside docs/.

- `benchmarks.md` is BENCHMARKS.md and `benchmarks-scripts.md` is benchmarks/README.md. Both stay where they are:
  the code cites BENCHMARKS.md's headings (tests/layout/test_citations.py) and results are appended to it there.
- `results/<name>.md`, one dated page per entry of benchmarks/results/ (a folder, or the files sharing one stem),
  and `results/index.md` listing them newest first. An entry's date is that of the last commit that changed it (an
  uncommitted entry: its newest file's mtime), so a re-run result shows its own day without a hand-kept list.

Links in those files are written from the repository's root (or the file's own folder); they are rewritten to the
site's pages, and a link to a file the site does not hold (a script, a JSON file) becomes its path as code, so
`mkdocs build --strict` fails only on a link that is broken in the repository too.

A page of docs/ links those files as they are in the repository (`../BENCHMARKS.md#targets`,
`../benchmarks/README.md`, `../benchmarks/results/`), so the link works on GitHub too; `on_page_markdown` points
such a link, one that leaves docs/, at the site's page (`benchmarks.md#targets`). Links within docs/ are MkDocs'.
"""

from __future__ import annotations

import datetime as _dt
import json
import posixpath
import re
import subprocess
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INCLUDED = {"BENCHMARKS.md": "benchmarks.md", "benchmarks/README.md": "benchmarks-scripts.md"}
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s#]*)(?P<anchor>#[^)\s]*)?\)")
# a JSON result inlined on its page up to this size; a larger one (a whole load.json) is only named
INLINE_JSON_BYTES = 16_000


def entries() -> dict[str, list[Path]]:
    """benchmarks/results/ as entries: a folder's files, or the top-level files that share a stem."""
    found: dict[str, list[Path]] = {}
    if not RESULTS.is_dir():
        return found
    for path in sorted(RESULTS.iterdir()):
        if path.name.startswith("."):
            continue
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            if files:
                found[path.name] = files
        elif path.is_file():
            found.setdefault(path.stem, []).append(path)
    return found


def entry_date(files: list[Path]) -> str:
    """The day of the last commit touching these files; for files not committed, the newest mtime's day."""
    try:
        day = subprocess.run(["git", "log", "-1", "--format=%cs", "--", *map(str, files)], cwd=ROOT,
                             capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        day = ""
    tracked = day and subprocess.run(["git", "ls-files", "--error-unmatch", *map(str, files)], cwd=ROOT,
                                     capture_output=True, timeout=30, check=False).returncode == 0
    if tracked:
        return day
    newest = max(p.stat().st_mtime for p in files)
    return _dt.datetime.fromtimestamp(newest, _dt.timezone.utc).date().isoformat()


def site_path(repo_path: str) -> str | None:
    """The site page a repository path is shown as, or None when the site does not hold it."""
    if repo_path in INCLUDED:
        return INCLUDED[repo_path]
    if repo_path == "benchmarks/results":  # the folder itself: its index of dated pages
        return "results/index.md"
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    if repo_path.startswith("benchmarks/results/"):
        name = repo_path[len("benchmarks/results/"):].split("/")[0]
        stem = name if (RESULTS / name).is_dir() else name.rsplit(".", 1)[0]
        return f"results/{stem}.md"
    return None


def rewrite(text: str, repo_file: str, page: str, outside_docs_only: bool = False) -> str:
    """``text`` of ``repo_file`` shown as the site's ``page``: its relative links pointed at the site's pages
    (with ``outside_docs_only``, only the links that leave docs/; those within it are left as written)."""
    base = posixpath.dirname(repo_file)

    def one(found: re.Match[str]) -> str:
        target, anchor = found["target"], found["anchor"] or ""
        if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):
            return found[0]  # an anchor on the same page, or a URL
        repo_path = posixpath.normpath(posixpath.join(base, target))
        if outside_docs_only and repo_path.startswith("docs/"):
            return found[0]
        shown = site_path(repo_path)
        if shown is None and outside_docs_only and not (ROOT / repo_path).exists():
            return found[0]  # broken in the repository too: left for MkDocs to name (a strict build fails)
        if shown is None:
            return f"{found['text']} (`{repo_path}`)"
        return f"[{found['text']}]({posixpath.relpath(shown, posixpath.dirname(page) or '.')}{anchor})"

    return LINK.sub(one, text)


def demoted(markdown: str) -> str:
    """Headings one level down (outside code fences): an included file's title sits under its page's title."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append("#" + line if not fenced and line.startswith("#") else line)
    return "\n".join(out)


def result_page(name: str, files: list[Path], day: str) -> str:
    parts = [f"# {name} ({day})", "",
             f"`benchmarks/results/{name}`, last changed {day}. The script that made it is named in",
             "[the benchmark scripts](../benchmarks-scripts.md).", ""]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if path.suffix == ".md":
            parts += [demoted(rewrite(path.read_text(encoding="utf-8"), rel, f"results/{name}.md")), ""]
    parts += ["## Files", ""]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        size = path.stat().st_size
        parts.append(f"- `{rel}` ({size:,} bytes)")
    for path in files:
        if path.suffix == ".json" and path.stat().st_size <= INLINE_JSON_BYTES:
            try:
                shown = json.dumps(json.loads(path.read_text(encoding="utf-8")), indent=1)
            except ValueError:
                continue
            parts += ["", f"### {path.name}", "", "```json", shown, "```"]
    return "\n".join(parts) + "\n"


def on_files(files: Files, config: object) -> Files:
    for repo_file, page in INCLUDED.items():
        source = ROOT / repo_file
        if source.is_file():
            files.append(File.generated(config, page, content=rewrite(source.read_text(encoding="utf-8"),
                                                                      repo_file, page)))
    rows = []
    for name, group in entries().items():
        day = entry_date(group)
        files.append(File.generated(config, f"results/{name}.md", content=result_page(name, group, day)))
        rows.append((day, name, group))
    rows.sort(key=lambda row: (row[0], row[1]), reverse=True)
    index = ["# Dated results", "",
             "One page per entry of `benchmarks/results/`, newest first, generated when the site is built.", "",
             "| date | result | files |", "| --- | --- | --- |"]
    index += [f"| {day} | [{name}]({name}.md) | {len(group)} |" for day, name, group in rows]
    files.append(File.generated(config, "results/index.md", content="\n".join(index) + "\n"))
    return files


def on_page_markdown(markdown: str, page: Any, config: object, files: Files) -> str:
    """A page of docs/ as the site shows it: its links to BENCHMARKS.md, benchmarks/README.md and
    benchmarks/results/ (written from docs/, so they work on GitHub) pointed at the pages ``on_files`` adds."""
    if page.file.generated_by is not None:  # a page this hook made: its links are the site's already
        return markdown
    return rewrite(markdown, f"docs/{page.file.src_uri}", page.file.src_uri, outside_docs_only=True)
