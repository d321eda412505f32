"""Render ``report.html``: one self-contained page of charts drawn from the saved artifacts alone.

Charts are drawn with matplotlib's object API (``matplotlib.figure.Figure``, never pyplot, so there is no global
figure state and no GUI backend is ever chosen) and inlined as SVG markup: the page needs no network, no CDN and
no image files, and prints as vectors. A missing or malformed artifact only blanks its own section.

Three ways a section can be without its chart, each said in the section itself:
- "not available": the artifact is missing or malformed (the reason names the file and the field);
- "no data": the step ran but saved nothing to draw (an empty list, a null or NaN where the number goes);
  a result, not a failure;
- "could not be drawn": the drawing code itself raised (a bug). The page is still written with every other
  section, and then :class:`ReportIncompleteError` is raised so the command says so in one line and exits with
  its own status (voice_llm.cli.main.EXIT_REPORT_INCOMPLETE); every measurement was saved before the page was drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

from voice_llm import __version__

from voice_llm.core import registry
from voice_llm.core.registry import SectionEntry
from voice_llm.core.analysis import metrics, noise
from voice_llm.core.analysis.keynumbers import all_key_numbers
from voice_llm.core.analysis.keynumbers import headline as keynumbers_headline
from voice_llm.core.analysis.keynumbers import labels as keynumbers_labels
from voice_llm.core.checks.core import FAIL, FINDING, NOT_CHECKABLE, PASS, CheckResult
from voice_llm.core.checks.core import counts as check_counts
from voice_llm.core.checks.core import ran_steps
from voice_llm.core.client.api import ServerProps
from voice_llm.core.errors import ArtifactError, ReportIncompleteError
from voice_llm.core.report import charts, style
from voice_llm.core.report.capability_table import read_capability_rows
from voice_llm.core.report.style import NoDataError
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util.artifacts import (CACHE, CANCEL, PREFILL, PROPS, REPORT, REPORT_HTML, RUN, SENTENCE, TTFT,
                                      write_bytes_atomic)

__all__ = ["CORE_SECTIONS", "NoDataError", "metadata_rows", "render_report", "sections"]


def render_report(out: RunFolder | Path, checks: Sequence[CheckResult] | None = None) -> Path:
    """Write ``out/report.html`` from the artifacts in ``out`` and return its path.

    Only a missing ``out`` folder is an error (and a folder of a newer artifact schema, refused in one line); a
    missing or malformed artifact shows "not available" in its own section. ``checks`` are the results of
    ``voice-llm check``; ``None`` means they were not run. ``out`` may be the RunFolder check read: each file is
    then parsed once for both.
    """
    folder = RunFolder.of(out)
    out = folder.path
    if not out.is_dir():
        raise ArtifactError(f"the output folder {out} does not exist; run `voice-llm lab` first")
    folder.require_known_schema()
    run = folder.require_one_run()  # never draw one page from the files of different runs
    failures: list[tuple[str, str]] = []
    ran = ran_steps(folder)
    not_run: list[str] = []  # the steps whose sections are left out: they did not run in this folder
    drawn = []
    with style.drawing():
        for section in sections():
            # An optional artifact another run left in the folder (an earlier `load`) is not this run's section.
            if section.optional and section.artifact is not None and not (
                    folder.exists(section.artifact) and run.belongs(section.artifact)):
                continue
            step = _step_not_run(folder, section, ran)
            if step is not None:
                not_run.append(step)
                continue
            drawn.append(_render_section(folder, section, failures))
    not_run = _in_plan_order(folder, not_run)
    header = style.guarded("header", "Server and key numbers",
                           lambda: _header_html(folder, _noise_html(noise.assess(folder)) + _not_run_html(not_run),
                                                ran), failures)
    capabilities = style.guarded("capabilities", "Server capabilities", lambda: _capabilities_html(folder), failures)
    page = _page(header + capabilities, _checks_html(checks), drawn)
    path = write_bytes_atomic(out / REPORT_HTML, page.encode("utf-8"))
    if failures:
        raise ReportIncompleteError(path, tuple(failures))
    return path


# --- sections: the core's and every capability's ------------------------------------------------------------


def _render_section(folder: RunFolder, section: SectionEntry, failures: list[tuple[str, str]]) -> str:
    kind = charts.KIND_OF.get(section.builder)  # a core chart draws its file's typed value (one parse per folder)
    try:
        if section.artifact is None:
            data: Any = folder
        else:
            data = folder.json(section.artifact) if kind is None else folder.artifact(kind)
    except NoDataError as exc:
        return _missing_section_html(section, str(exc), "no data")
    except ArtifactError as exc:
        return _missing_section_html(section, str(exc))
    try:
        chart = section.build(data)
    except NoDataError as exc:
        return _missing_section_html(section, str(exc), "no data")
    except ArtifactError as exc:
        return _missing_section_html(section, str(exc))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        # Validation above covers the documented shapes; this catches shapes nobody foresaw.
        return _missing_section_html(section, f"{section.artifact} is malformed ({type(exc).__name__}: {exc})")
    except Exception as exc:  # noqa: BLE001 - the drawing code raised: said in the section and after the page
        return style.failed_section(section.name, section.title, exc, failures)
    if isinstance(chart, str):  # the builder wrote its section itself
        return chart
    try:
        return style.chart_section_html(section.name, section.title, chart)
    except Exception as exc:  # noqa: BLE001 - matplotlib failed to lay out or save the figure
        return style.failed_section(section.name, section.title, exc, failures)


def _missing_section_html(section: SectionEntry, reason: str, what: str = "not available") -> str:
    return style.missing_section_html(section.name, section.title, reason, what)


# --- what ran here: a page draws the sections it has data for and names the steps that did not run -------------


def _producers(folder: RunFolder, source: str) -> list[str]:
    """The steps that leave ``source``: run.json's plan (artifacts_by_step), else the registered capabilities' steps;
    a core file no plan names is its step's own name (ttft.json: ttft)."""
    record = folder.record
    by_step = record.doc.get("artifacts_by_step") if record is not None else None
    found = [step for step, files in by_step.items() if isinstance(files, list) and source in files] \
        if isinstance(by_step, Mapping) else []
    found += [step.name for c in registry.capabilities() for step in c.steps if source in step.artifacts]
    return list(dict.fromkeys(found)) or [PurePath(source).stem]


def _section_steps() -> dict[str, tuple[str, ...]]:
    """Each capability's section (by name) -> that capability's steps (none: it draws from every step's files)."""
    return {entry.name: tuple(step.name for step in c.steps) for c in registry.capabilities() for entry in c.sections}


def _step_not_run(folder: RunFolder, section: SectionEntry, ran: Sequence[str] | None) -> str | None:
    """The step whose data ``section`` draws when that step did not run in this folder (its section is left out and
    the step named), else None. Without a plan (no run.json: an older folder) every section is drawn or says why
    not; a step that ran but whose file is gone keeps its section, which says "not available"."""
    if ran is None:
        return None
    if section.artifact is None:
        steps = _section_steps().get(section.name, ())
        if steps:
            return steps[0] if not any(step in ran for step in steps) else None
        # A section of no step of its own draws from every step's numbers (the spread): it has data when one of
        # the metrics' files is here; else it is left out with the steps named.
        sources = list(dict.fromkeys(m.source for m in metrics.all_metrics()))
        if any(folder.exists(source) for source in sources):
            return None
        return _producers(folder, sources[0])[0] if sources else None
    if folder.exists(section.artifact):
        return None
    producers = _producers(folder, section.artifact)
    return None if any(step in ran for step in producers) else producers[0]


def _in_plan_order(folder: RunFolder, steps: Sequence[str]) -> list[str]:
    """Each step once, in the order of run.json's plan (steps it does not plan after them)."""
    record = folder.record
    planned = record.doc.get("steps_planned") if record is not None else None
    order = [step for step in planned if isinstance(step, str)] if isinstance(planned, list) else []
    unique = list(dict.fromkeys(steps))
    return sorted(unique, key=lambda step: (order.index(step) if step in order else len(order), unique.index(step)))


def _not_run_html(steps: Sequence[str]) -> str:
    if not steps:
        return ""
    listed = ", ".join(steps)
    return (f'<p class="notrun" id="not-run">Not run in this folder: <strong>{style.esc(listed)}</strong>; their '
            "sections are left out (run those steps with <code>--out</code> here to add them).</p>\n")


# The core's sections, in page order, as a capability registers its own (voice_llm.core.registry.SectionEntry, the
# builder the function itself); each capability's are placed among them by their ``after``.
CORE_SECTIONS: tuple[SectionEntry, ...] = (
    SectionEntry("sentence", "Sentence stream: when could speech start?", SENTENCE, charts.sentence_chart),
    SectionEntry("ttft", "Time to first token, five runs", TTFT, charts.ttft_chart),
    SectionEntry("prefill", "Prefill: what documents in the prompt cost", PREFILL, charts.prefill_chart),
    SectionEntry("cache", "Prompt cache", CACHE, charts.cache_chart),
    SectionEntry("cancel", "Cancellation (barge-in)", CANCEL, charts.cancel_chart),
)


def sections() -> tuple[SectionEntry, ...]:
    """The page's sections: the core's, then every registered capability's in registry order, each placed right
    after the section its ``after`` names (at the end without one, or when that section is not on the page: its
    capability was left out). A capability's builder is imported when its section is drawn (a failure to import
    is that section's)."""
    placed = list(CORE_SECTIONS)
    last_after: dict[str, str] = {}  # an anchor -> the last section placed behind it (several keep their order)
    for capability in registry.capabilities():
        for entry in capability.sections:
            names = [s.name for s in placed]
            anchor = last_after.get(entry.after, entry.after) if entry.after else None
            if anchor in names:
                placed.insert(names.index(anchor) + 1, entry)
                last_after[entry.after] = entry.name
            else:
                placed.append(entry)
    return tuple(placed)


# --- noise, run metadata ------------------------------------------------------------------------------------


def _noise_html(assessment: Mapping[str, Any]) -> str:
    if not assessment.get("noisy"):
        return ('<section id="section-noise" class="quiet">\n<p>The machine was quiet enough: the load from other '
                "processes stayed under half the cores and no number spread by more than 20 % over its repeats."
                "</p>\n</section>\n")
    labels = [metrics.label_of(k) for k in assessment.get("affected") or []]
    reasons = "".join(f"<li>{style.esc(reason)}</li>\n" for reason in assessment.get("reasons") or [])
    return (
        '<section id="section-noise" class="noise">\n<h2>Warning: the machine was noisy during this run</h2>\n'
        f"<p>Numbers affected: <strong>{style.esc('; '.join(labels) or 'none named')}</strong>. Rerun on a quieter machine "
        "(or with more <code>--repeat</code>) before trusting or comparing them.</p>\n"
        f"<ul>\n{reasons}</ul>\n</section>\n"
    )


def _short_sha(value: Any) -> str:
    return f"{value[:12]}…" if isinstance(value, str) and len(value) > 12 else str(value if value is not None else "—")


def metadata_rows(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, text) for the run's metadata table, from run.json."""
    meta = run.get("metadata") or {}
    server, model, kb = meta.get("server") or {}, meta.get("model") or {}, meta.get("kb") or {}
    machine = meta.get("machine") or {}
    size = model.get("size")
    loads = lambda key: " / ".join(f"{v:.2f}" for v in run.get(key) or []) or "—"  # noqa: E731
    rows = [
        ("run id", run.get("run_id")),
        ("voice-llm", meta.get("voice_llm")),
        ("llama.cpp source", meta.get("llama_cpp_source") or "custom or remote server"),
        ("server build_info", server.get("build_info")),
        ("model", model.get("file")),
        ("model size", f"{size / 1e6:,.1f} MB" if isinstance(size, (int, float)) else None),
        ("model sha256", _short_sha(model.get("sha256"))),
        ("n_ctx", server.get("n_ctx")),
        ("slots", server.get("total_slots")),
        ("threads", server.get("threads")),
        ("KB", f"{kb.get('files')} files in {kb.get('dir')}, sha256 {_short_sha(kb.get('sha256'))}" if kb else None),
        ("prompts sha256", _short_sha((meta.get("prompts") or {}).get("sha256"))),
        ("CPU", f"{machine.get('cpu_model') or '—'}, {machine.get('cores') or '?'} cores"),
        ("load average start (1/5/15 min)", loads("load_average_start")),
        ("load average end (1/5/15 min)", loads("load_average_end")),
        ("python", meta.get("python")),
        ("started", run.get("started_at")),
        ("ended", run.get("ended_at")),
    ]
    return [(label, "—" if value is None else str(value)) for label, value in rows]


def _metadata_html(out: RunFolder) -> str:
    if not out.is_file(RUN):
        reason = "no run.json in this folder (written before run ids, or not by a lab run)"
    else:
        try:
            run = style.mapping(out.json(RUN), RUN)
        except ArtifactError as exc:
            reason = str(exc)
        else:
            body = _table([(label, f"<td>{style.esc(text)}</td>") for label, text in metadata_rows(run)], "meta")
            return f'<section id="section-metadata">\n<h2>Run metadata</h2>\n{body}</section>\n'
    return (f'<section id="section-metadata">\n<h2>Run metadata</h2>\n<p class="missing">no run metadata: '
            f"{style.esc(reason)}</p>\n</section>\n")


# --- header, checks and page ---------------------------------------------------------------------------------

def _value_cell(value: Any, unit: str) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        shown = style.ms(float(value)) if unit == "ms" else style.count(value)
        return f'<td class="num">{shown} {style.esc(unit)}</td>'
    return f"<td>{style.esc('—' if value is None else value)}</td>"


def _table(rows: Sequence[tuple[str, str]], css_class: str) -> str:
    body = "".join(f"<tr><th>{style.esc(label)}</th>{cell}</tr>\n" for label, cell in rows)
    return f'<table class="{css_class}"><tbody>\n{body}</tbody></table>\n'


def _server_facts_html(out: RunFolder, ran: Sequence[str] | None = None) -> str:
    if ran is not None and "health" not in ran and not out.exists(PROPS):
        return ('<p class="notrun">the health step did not run in this folder: the server is named in the run '
                "metadata below</p>\n")
    try:
        props = style.mapping(out.json(PROPS), PROPS)
    except ArtifactError as exc:
        return f'<p class="missing">server facts not available: {style.esc(exc)}</p>\n'
    facts = ServerProps.parse(props)  # the one reader of /props: n_ctx where the server's version puts it
    rows = [
        ("model", f"<td>{style.esc(PurePath(facts.model_path).name if facts.model_path else '—')}</td>"),
        ("context (n_ctx)", _value_cell(facts.n_ctx, "tokens")),
        ("slots", _value_cell(facts.total_slots, "")),
        ("llama.cpp build", f"<td>{style.esc(facts.build_info or '—')}</td>"),
    ]
    return _table(rows, "facts")


def _key_numbers_html(out: RunFolder, ran: Sequence[str] | None = None) -> str:
    if ran is not None and "report" not in ran and not out.exists(REPORT):
        return ('<p class="notrun">the report step did not run in this folder (<code>voice-llm report --out</code> '
                "writes report.json from the files here)</p>\n")
    try:
        numbers = style.mapping(out.json(REPORT), REPORT)
    except ArtifactError as exc:
        return f'<p class="missing">key numbers not available: {style.esc(exc)}</p>\n'
    rows = []
    found = metrics.measure_all(out)
    labels = keynumbers_labels(out)  # "cache not disabled" where the run's server ignored cache_prompt
    unknown = numbers.get("unknown") if isinstance(numbers.get("unknown"), Mapping) else {}
    metric_of = {number.key: number.metric_key for number in all_key_numbers()}
    for key, value in numbers.items():
        if isinstance(value, (Mapping, list)) or key in _NOT_NUMBERS:  # noise is shown on its own; ids below
            continue
        label, unit = labels.get(key, (key, ""))
        if value is None and isinstance(unknown.get(key), str):  # a step not run here: the page names it once
            continue
        rows.append((label, _value_cell(value, unit) + _range_cell(found.get(metric_of.get(key, key)), unit)))
    return _table(rows, "numbers")


_NOT_NUMBERS = frozenset({"run_id", "schema_version"})


def _range_cell(measured: metrics.Measured | None, unit: str) -> str:
    """The min..max of the samples a key number is the median of (empty for a single sample)."""
    if measured is None or len(measured.samples) < 2 or unit != "ms":
        return "<td></td>"
    low, high = min(measured.samples), max(measured.samples)
    return f'<td class="range">{style.ms(low)}–{style.ms(high)} over {len(measured.samples)}</td>'


# What the page answers, under its title; the line after it is the answer itself (the caller's number), above the
# noise warning and every table.
SUBTITLE = ("When does the caller hear the assistant after they stop talking, measured at the caller's ear on a real "
            "line, and how much of that is the llama.cpp server's first token and first sentence: drawn from the "
            "saved artifacts.")


def _header_html(out: RunFolder, banner: str = "", ran: Sequence[str] | None = None) -> str:
    return (
        "<header>\n<h1>voice-llm report</h1>\n"
        f'<p class="lede">{style.esc(SUBTITLE)}</p>\n'
        f'<p class="headline" id="headline">{style.esc(keynumbers_headline(out).sentence())}</p>\n{banner}'
        '<div class="columns">\n'
        f"<div><h2>Server</h2>\n{_server_facts_html(out, ran)}</div>\n"
        f"<div><h2>Key numbers</h2>\n{_key_numbers_html(out, ran)}</div>\n"
        f"</div>\n{_metadata_html(out)}</header>\n"
    )


def _capabilities_html(out: RunFolder) -> str:
    """What this server exposed and what the lab inferred (capabilities.json); nothing for an older run."""
    try:
        rows = read_capability_rows(out)
    except ArtifactError as exc:
        return f'<section id="section-capabilities">\n<h2>Server capabilities</h2>\n<p class="missing">{style.esc(exc)}</p>\n</section>\n'
    if not rows:
        return ""
    body = "".join(f"<tr><th>{style.esc(a)}</th><td>{style.esc(b)}</td><td>{style.esc(c)}</td></tr>\n" for a, b, c in rows)
    return (
        '<section id="section-capabilities">\n<h2>Server capabilities</h2>\n'
        "<p>What this server exposed when probed before the steps, and what each number therefore rests on. "
        "A number the server did not expose is null in its artifact, with the reason.</p>\n"
        '<table class="capabilities"><thead><tr><th>probed</th><th>found</th><th>the lab\'s numbers rest on</th>'
        f"</tr></thead><tbody>\n{body}</tbody></table>\n</section>\n"
    )


_STATUS_CLASS = {PASS: "pass", FAIL: "fail", NOT_CHECKABLE: "unknown", FINDING: "finding"}
_FINDINGS_NOTE = (" A finding (FIND) is an expectation that depends on this machine or model and did not hold here, with"
                  " its numbers; it never fails the run.")


def _checks_html(checks: Sequence[CheckResult] | None) -> str:
    if checks is None:
        return '<section id="section-checks">\n<h2>Checks</h2>\n<p class="missing">checks not run</p>\n</section>\n'
    unknown = sum(1 for c in checks if c.status == NOT_CHECKABLE)
    rows = "".join(
        f'<tr class="{_STATUS_CLASS[c.status]}"><td><span class="badge">{style.esc(c.label)}</span></td>'
        f"<td>{style.esc(c.name)}</td><td>{style.esc(c.detail)}</td></tr>\n"
        for c in checks
    )
    return (
        f'<section id="section-checks">\n<h2>Checks</h2>\n<p>{len(checks)} checks: {style.esc(check_counts(checks))}{f" ({unknown} not checkable from these files)" if unknown else ""}.{_FINDINGS_NOTE if any(c.status == FINDING for c in checks) else ""}</p>\n'
        '<table class="checks"><thead><tr><th>result</th><th>check</th><th>detail</th></tr></thead><tbody>\n'
        f"{rows}</tbody></table>\n</section>\n"
    )


def _page(header: str, checks: str, sections: Sequence[str]) -> str:
    drawn = sum(section.count('<figure class="chart"') for section in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>voice-llm report</title>\n<style>{style.CSS}</style>\n<script>{style.RENDER_PROBE}</script>\n</head>\n"
        f'<body data-charts="{drawn}" data-rendered="0">\n{header}{checks}{"".join(sections)}'
        f"<footer>voice-llm {style.esc(__version__)}: rendered from the artifact files alone; "
        "no server was queried.</footer>\n</body>\n</html>\n"
    )
