"""load.json: the document `load` writes, every number in it recomputed from the raw samples (as `check` does)."""

from __future__ import annotations

from typing import Any

from voice_llm.capabilities.load import stats
from voice_llm.capabilities.load.doc import DIAL_MODE, LOAD_SCHEMA_VERSION, TEXT_MODE, LoadDoc
from voice_llm.capabilities.load.plan import SweepPlan
from voice_llm.capabilities.load.settings import LoadSettings
from voice_llm.core.util.artifacts import LOAD_SAMPLES


def sweep_document(plan: SweepPlan, result: dict[str, Any], slots: int | None, url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One sweep of load.json, every number recomputed from the raw samples (as `check` will)."""
    samples = [{**s, "slots": slots} for s in result["samples"]]
    samples.sort(key=lambda s: (s["start"], str(s["caller"])))
    steps = []
    for live in result["steps"]:
        window = live["window"]
        measured = [s for s in samples if s["step"] == live["step"] and s["phase"] == "measure"]
        summary = stats.summarize_step(measured, plan.slo_ms, window["end"] - window["start"], plan.metric)
        steps.append({"step": live["step"], "callers": live["callers"], "window": window, "cpu": live["cpu"],
                      "generator_bound": stats.generator_bound(live["cpu"], summary), "host": live["host"],
                      **summary, **({"processes": live["processes"]} if "processes" in live else {})})
    doc = {
        "slots": slots, "url": url, "workers": result["workers"], "stopped": result["stopped"],
        "started": result["started"], "ended": result["ended"], "master_port": result.get("master_port"),
        "interrupted": result.get("interrupted"), "steps": steps,
        # dialing callers: whose CPU each step's ``processes`` holds and how they were found (load.proccpu)
        **({"processes_found": result["processes_found"]} if "processes_found" in result else {}),
        "verdict": stats.verdict(steps, slots, plan.decide_early),
    }
    return doc, samples




def load_document(settings: LoadSettings, described: dict[str, Any], sweeps: list[dict[str, Any]],
                  interrupted: str | None = None) -> dict[str, Any]:
    """load.json, built as its type (voice_llm.capabilities.load.doc.LoadDoc: what its sweeps are judged on is read back from
    the same fields)."""
    dial = settings.dial is not None
    return LoadDoc(
        load_schema_version=LOAD_SCHEMA_VERSION,
        # text: callers are LLM requests judged on the first sentence; dial: real calls on the line to the agent
        # at dial_url, judged on the gap each caller heard (metric: the samples' column a turn is judged on)
        mode=DIAL_MODE if dial else TEXT_MODE,
        metric=stats.DIAL_METRIC if dial else stats.TEXT_METRIC,
        dial_url=settings.dial,
        slo_heard_ms=settings.slo_heard_ms if dial else None,
        late_frames_share=stats.LATE_FRAMES_SHARE if dial else None,
        # when a measured window ends (both modes): once min_judged_turns judged turns of it were reported, once
        # more missed than the target allows, or at step_s (the longest), whichever comes first;
        # each step's window.ended says which ("judged", "failed early", "step_s")
        window_ends=("at step_s, at min_judged_turns judged turns, or once more turns missed than the goodput "
                     "target allows in min_judged_turns (the step then fails early)"),
        # text callers: the warm-up lasts warmup_s, and then until each caller has finished a turn of the step
        warmup_ends=None if dial else ("after warmup_s, once each caller finished a turn that started in it (the "
                                       "measured window never opens on a caller's first turn of the step)"),
        slo_first_sentence_ms=settings.slo_first_sentence_ms,
        goodput_target=stats.GOODPUT_TARGET,
        max_error_rate=stats.MAX_ERROR_RATE,
        generator_bound_share=stats.GENERATOR_BOUND_SHARE,
        min_judged_turns=stats.MIN_JUDGED_TURNS,
        step_s=settings.step_s, warmup_s=settings.warmup_s, callers=tuple(settings.callers),
        stop_on_budget=settings.stop_on_budget,
        workers="remote" if settings.master else settings.workers,
        caller=described,
        samples_csv=LOAD_SAMPLES,
        # null: every planned sweep ran to its end; else why it ended early (the sweeps and steps here are complete)
        interrupted=interrupted,
        sweeps=tuple(sweeps),
    ).as_dict()
