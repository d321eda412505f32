"""Step 8: report.json, copied from the files of the earlier steps (never from memory), and what it means."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.core.analysis import metrics, noise
from voice_llm.core.checks.core import CANCEL_IDLE_SLACK_MS, CheckFailed, cancel_idle_limit, ran_steps
from voice_llm.core.errors import ArtifactError
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util.artifacts import CACHE, CANCEL, DIAL, PREFILL, REPORT, SENTENCE, TTFT
from voice_llm.core.analysis.keynumbers import build_report
from voice_llm.core.analysis.metrics import CACHE_NOT_DISABLED, cache_not_disabled
from voice_llm.core.run.context import LabContext
from voice_llm.core.lab.steps import steps as registered_steps


def run(ctx: LabContext) -> list[Path]:
    # Nothing is written before it is known the page can be drawn from these files: the refusals of
    # voice_llm.core.report.page.render_report (a newer schema, files of another run among this run's) come first, read
    # against the run.json this command is about to save (the record in memory), not the one on disk.
    folder = RunFolder(ctx.out, record=ctx.run)
    folder.require_known_schema()
    if ctx.run is not None:
        folder.require_one_run(replacing=(REPORT,))
    report = build_report(folder)
    # Beside the brief's fields: was the machine quiet enough to trust them (run.json is not saved yet: the
    # run's record in memory holds the load so far).
    report["noise"] = noise.assess(folder, ctx.run.doc if ctx.run is not None else None)
    return [ctx.write_json(REPORT, report)]


@dataclass(frozen=True)
class Finding:
    label: str
    value: str
    meaning: str


_TTFA = ("ttfa_", "_ms")  # report.json's first-audio medians, one per strategy (the speak step's key numbers)


def _first_audio(report: Mapping[str, Any]) -> list[Finding]:
    """The speak step's row, when it ran: what the caller hears first with the strategy that was fastest here
    (the one a voice agent would pick: `clauses` in most runs, the caller's turn's default), the others beside it."""
    heard = {key: value for key, value in report.items() if key.startswith(_TTFA[0]) and key.endswith(_TTFA[1])
             and isinstance(value, (int, float)) and not isinstance(value, bool)}
    if not heard:
        return []
    fastest = min(heard, key=lambda key: heard[key])
    strategy = fastest[len(_TTFA[0]):-len(_TTFA[1])]
    name = lambda key: key[len(_TTFA[0]):-len(_TTFA[1])]  # noqa: E731 - the strategy, as --strategy names it
    others = "; ".join(f"{name(key)} {_ms(value)}" for key, value in heard.items() if key != fastest)
    stall = report.get(f"stall_ms_{strategy}")
    silence = f"; silence after the start {_ms(stall)}" if isinstance(stall, (int, float)) else ""
    return [Finding(f"first audio (TTS, fastest: {strategy}, p50)", _ms(heard[fastest]),
                    f"when the caller hears the first sound ({metrics.label_of(fastest)}){silence}; other "
                    f"strategies: {others or 'none measured'}")]


HEARD_LABEL = "what the caller hears (mouth to ear, median / p90)"


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _heard(folder: RunFolder) -> Finding:
    """The row report.html leads with: the heard mouth-to-ear median and p90 over the call's turns (dial.json's
    summary.heard_gap_ms), when this run made the call; "not run" otherwise, so a lab without its converse step
    does not read as a lab whose caller heard nothing. A dial.json no step of this run wrote (another run's, left in
    OUT) is not this run's number."""
    writers = [name for name, step in registered_steps().items() if DIAL in step.artifacts]
    ran = ran_steps(folder)
    if not folder.is_file(DIAL) or (ran is not None and not any(step in ran for step in writers)):
        return Finding(HEARD_LABEL, "not run", "the call was not made in this run: the lab's converse step (dial "
                                               "against voice-llm's agent on loopback) measures what the caller hears")
    try:
        doc = folder.json(DIAL)
    except ArtifactError as exc:
        return Finding(HEARD_LABEL, "n/a", f"cannot be read: {exc}")
    summary = doc.get("summary") if isinstance(doc, Mapping) else None
    block = summary.get("heard_gap_ms") if isinstance(summary, Mapping) else None
    if not isinstance(block, Mapping):
        return Finding(HEARD_LABEL, "n/a", f"{DIAL} has no summary.heard_gap_ms: `voice-llm check` says why")
    median, p90, n = block.get("median"), block.get("p90"), block.get("n")
    if not _is_time(median):
        return Finding(HEARD_LABEL, "n/a", f"no turn's reply reached the caller ({DIAL} summary.heard_gap_ms)")
    turns = f", over {n} turns" if isinstance(n, int) and not isinstance(n, bool) else ""
    over = block.get("talked_over")
    if isinstance(over, int) and not isinstance(over, bool) and over > 0:  # dial's talked_over_rule: left out
        turns += f" ({over} turn{'s' if over != 1 else ''} talked over left out: the agent's audio still playing)"
    return Finding(HEARD_LABEL, f"{median:.0f} / {p90:.0f} ms" if _is_time(p90) else f"{median:.0f} ms / n/a",
                   f"the silence from the end of the caller's speech to the first sound they heard, on a real "
                   f"line{turns}")


def _ms(value: Any) -> str:
    return f"{value:.0f} ms" if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def _barge_in(cancel: Any, idle: Any) -> str:
    """What the slot idle time means, by the bound ``check`` holds it to (checks.core.cancel_idle_limit): the words
    never say "at once" beside a number the check flags."""
    reasons = cancel.get("unknown") if isinstance(cancel, Mapping) else None
    said = reasons.get("slot_idle_after_ms") if isinstance(reasons, Mapping) else None
    if not isinstance(idle, (int, float)) or isinstance(idle, bool):
        return said or "the slot was not seen idle after the close: how soon generation stopped is not known"
    try:
        limit = cancel_idle_limit(cancel) if isinstance(cancel, dict) else None
    except (CheckFailed, ArtifactError, KeyError, TypeError):
        limit = None
    if limit is None:
        return "closing the connection stopped generation; how soon cannot be judged (no token time to bound it by)"
    bound, token_ms = limit
    if idle <= bound:
        return (f"closing the connection stops generation within two token times (limit {bound:.0f} ms); only "
                "stopping reading does not")
    return (f"the slot stayed busy {idle:.0f} ms after the close, above two token times ({token_ms:.0f} ms each) + "
            f"{CANCEL_IDLE_SLACK_MS:.0f} ms = {bound:.0f} ms (a finding of check): the server went on generating "
            "for a while on this machine; closing still stops it, only stopping reading does not")


def findings(out: Path) -> list[Finding]:
    """The key numbers with one plain sentence each on what they mean for composing a voice prompt, for the steps
    whose files are in ``out`` (a run of some steps shows their rows), led by what the caller hears ("not run"
    without the call). A number the server did not expose shows as n/a, and its sentence says why."""
    folder = RunFolder(out)
    report = folder.json(REPORT)
    report = report if isinstance(report, dict) else {}
    docs = {name: folder.json(name) if folder.exists(name) else None for name in (TTFT, PREFILL, CACHE, CANCEL)}
    found: list[Finding] = [_heard(folder)]
    if docs[TTFT] is not None:
        # "cache off" only where it held: a server that ignores cache_prompt (ttft.json says so) served hits.
        found.append(Finding(f"first token (p50, {CACHE_NOT_DISABLED if cache_not_disabled(docs[TTFT]) else 'cache off'})",
                             _ms(report.get("ttft_p50_ms")),
                             f"the floor for a short prompt; a whole answer took {_ms(report.get('total_p50_ms'))}"))
    if folder.exists(SENTENCE):
        found.append(Finding("first sentence", _ms(report.get("first_sentence_ms")),
                             "when speech can start if the assistant speaks sentence by sentence instead of waiting "
                             "for the end"))
    found += _first_audio(report)
    prefill = docs[PREFILL]
    if isinstance(prefill, list) and prefill and isinstance(prefill[0], Mapping):
        tokens = report.get("prompt_n_12docs")
        found.append(Finding(f"12 documents ({tokens if tokens is not None else 'n/a'} prompt tokens)",
                             _ms(report.get("ttft_12docs_ms")),
                             f"before the first word, against {_ms(prefill[0].get('ttft_ms'))} with none: every "
                             "attached document is paid for in prefill"))
    cache = docs[CACHE]
    if isinstance(cache, Mapping):
        suffix, prefix = cache.get("changed_suffix") or {}, cache.get("changed_prefix") or {}
        found += [
            Finding("same long prompt, cached", _ms(report.get("cache_ttft_ms")),
                    "keep the long fixed part identical and first, and the cache skips its prefill"),
            Finding("time line at the end / at the front", f"{_ms(suffix.get('ttft_ms'))} / {_ms(prefix.get('ttft_ms'))}",
                    "put what changes per call (time, caller, turn) last; a change at the front recomputes everything"),
        ]
    if docs[CANCEL] is not None:
        idle = report.get("cancel_idle_ms")
        found.append(Finding("barge-in: slot idle after close", _ms(idle), _barge_in(docs[CANCEL], idle)))
    return found
