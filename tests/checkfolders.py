"""Folders for check's tests, made from the saved fixtures of real runs (no server): a clean copy of a lab run,
and an audio.json whose synthesis came later, everything derived from those times recomputed as the speak step
writes it (consistent evidence of an honest run on a slower machine)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from voice_llm.capabilities.speak.artifact import summary
from voice_llm.engines.speech_out.timeline import AudioPiece, playback

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLE_RUN = FIXTURES / "sample_run"  # a real lab run's files (its raw/ folder not kept)
SAMPLE_AUDIO = FIXTURES / "sample_audio" / "audio.json"  # a real speak step's audio.json (no raw/, no WAVs)
SSE_MODULE = Path(__file__).parents[1] / "src" / "voice_llm" / "core" / "sse.py"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read(out: Path, name: str) -> Any:
    return json.loads((out / name).read_text())


def write(out: Path, name: str, doc: Any) -> None:
    (out / name).write_text(json.dumps(doc))


def clean_run(out: Path) -> Path:
    """sample_run with what its copy in the repository left out put back (sse.py) and its manifest naming only
    the files kept: a folder every check passes on, as the lab left it."""
    shutil.copytree(SAMPLE_RUN, out)
    shutil.copy(SSE_MODULE, out / "sse.py")
    run = read(out, "run.json")
    run["artifacts"] = {name: sha256(out / name) for name in run["artifacts"] if (out / name).is_file()}
    run["artifacts"]["sse.py"] = sha256(out / "sse.py")
    write(out, "run.json", run)
    return out


def reseal(out: Path, *names: str) -> None:
    """Record the files' new bytes in run.json's manifest, as if the run had written them so."""
    run = read(out, "run.json")
    for name in names:
        run["artifacts"][name] = sha256(out / name)
    write(out, "run.json", run)


def delay_synthesis(doc: dict[str, Any], strategy: str, delay_ms: float) -> None:
    """Every segment of ``strategy`` synthesized ``delay_ms`` later (the TTS slowed by the LLM still generating on
    the same cores), and the playback, overhead, handoff, summary and ttfa_ms recomputed from those times."""
    entry = doc["strategies"][strategy]
    for run in entry["runs"]:
        for segment in run["segments"]:
            for key in ("synth_start_ms", "first_audio_ms", "synth_end_ms"):
                segment[key] += delay_ms
            for piece in segment["audio"]:
                piece["ready_ms"] += delay_ms
        heard = playback([AudioPiece(s["index"], a["ready_ms"], a["audio_ms"]) for s in run["segments"]
                          for a in s["audio"]])
        run.update(heard.as_dict())
        first = run["segments"][0]
        run["overhead_ms"] = run["ttfa_ms"] - (first["text_ready_ms"] + run["first_segment_alone_ms"])
        run["handoff_ms"] = first["synth_start_ms"] - first["text_ready_ms"]
    entry["summary"] = summary(entry["runs"])
    doc["ttfa_ms"][strategy] = entry["summary"]["ttfa_ms"]["median"]


def whole_heard_first(doc: dict[str, Any]) -> float:
    """Delay `sentences` until it is heard at least 100 ms after `whole`; returns the delay. A run where `whole`
    was already heard first (a real lab on a busy machine: 1499 against 1695 ms) is delayed by nothing: moving
    synthesis earlier than its text would be inconsistent evidence, a FAIL, not the finding wanted."""
    delay = max(0.0, doc["ttfa_ms"]["whole"] - doc["ttfa_ms"]["sentences"] + 100.0)
    delay_synthesis(doc, "sentences", delay)
    return delay


def planned_by_step(out: Path) -> None:
    """run.json as the current lab writes it: which step leaves which file (the saved sample predates it)."""
    from voice_llm.core.lab.steps import CORE_STEPS

    run = read(out, "run.json")
    run["artifacts_by_step"] = {step.name: list(step.artifacts) for step in CORE_STEPS}
    write(out, "run.json", run)


def dial_alone(out: Path) -> Path:
    """A run of `voice-llm converse` alone into an empty OUT, as the step leaves it: dial.json and dial/ (a real call,
    from sample_out: `voice-llm converse --out TMP` on a real llama-server with SmolLM2-135M, dial against
    voice-llm's agent on loopback; its files copied, its run_id dropped as sample_out's files have none), and a
    run.json that plans converse, the one step that ran (a step alone plans itself: issue 41 item 25)."""
    from voice_llm.core.lab.steps import steps

    sample_out = FIXTURES / "sample_out"
    out.mkdir()
    shutil.copy(sample_out / "dial.json", out)
    shutil.copytree(sample_out / "dial", out / "dial")
    run = read(SAMPLE_RUN, "run.json")
    table = steps()
    planned = ["converse"]
    run.update(steps_planned=planned, expected_artifacts=[name for step in planned for name in table[step].artifacts],
               artifacts_by_step={step: list(table[step].artifacts) for step in planned},
               steps=[{"step": "converse", "wall_ms": 60000.0, "server_compute_ms": 900.0}],
               artifacts={p.relative_to(out).as_posix(): sha256(p) for p in sorted(out.rglob("*")) if p.is_file()})
    write(out, "run.json", run)
    return out
