"""Run folders and inputs built in code, shared by the test packages (a test module never imports another)."""

from __future__ import annotations

import json
from pathlib import Path

from voice_llm.capabilities.load.document import load_document, sweep_document
from voice_llm.capabilities.load.settings import LoadSettings
from voice_llm.capabilities.load.plan import CallerConfig, SweepPlan
from voice_llm.capabilities.load.samples import write_samples
from voice_llm.core.scenario.kb import default_kb_dir

SLO = 1000.0


def load_sample(step: int, first: float | None, *, phase: str = "measure", error: str | None = None,
           cancelled: bool = False, worker: str = "w1", start: float = 105.0, ttft: float = 50.0) -> dict:
    return {"step": step, "callers": 2 ** step, "phase": phase, "worker": worker, "caller": f"{worker}/1", "call": 1,
            "turn": 1, "start": start + step * 100, "ttft_ms": None if error else ttft, "first_sentence_ms": first,
            "e2e_ms": None if error else 1500.0, "tokens": 0 if error else 30, "itl_p50_ms": None if error else 20.0,
            "itl_p99_ms": None if error else 40.0, "prompt_n": 10, "cache_n": 0, "error": error,
            "cancelled": cancelled, "prompt_ms": None if error else 31.25}


def fake_load_run(tmp_path: Path) -> Path:
    """load.json + CSV as the command writes them, from a made-up master result."""
    plan = SweepPlan(caller=CallerConfig(url="http://x", system="s", turns=("a",)), callers=(1, 2), step_s=10.0)
    rows = [load_sample(0, 300.0, phase="warmup", start=95.0), load_sample(0, 300.0), load_sample(0, 500.0),
            load_sample(1, 400.0, worker="w2"), load_sample(1, 900.0), load_sample(1, 950.0, phase="drain", start=211.0)]
    result = {"started": 0.0, "ended": 300.0, "workers": ["w1", "w2"], "stopped": None, "samples": rows,
              "steps": [{"step": i, "callers": 2 ** i, "window": {"start": 100.0 + 100 * i, "end": 110.0 + 100 * i,
                         "drain_s": 0.5}, "cpu": {"w1": {"cpu_s": 1.0, "wall_s": 10.0, "share": 0.1}},
                         "generator_bound": False, "host": {"cpu_busy": 0.5, "loadavg_1m": 1.0, "master_cpu_s": 0.1}}
                        for i in range(2)]}
    sweep, samples = sweep_document(plan, result, 4, "http://x")
    args = LoadSettings(slo_first_sentence_ms=SLO, step_s=10.0, warmup_s=5.0, callers=(1, 2), stop_on_budget=True,
                        master=False, workers=2)
    (tmp_path / "load.json").write_text(json.dumps(load_document(args, {"dialogue": "clinic"}, [sweep])))
    write_samples(tmp_path / "load_samples.csv", samples)
    return tmp_path


def big_kb(folder: Path, copies: int = 2) -> Path:
    """The bundled KB repeated: 12 x ``copies`` documents, the first 12 the bundled ones in their order."""
    folder.mkdir()
    for path in sorted(default_kb_dir().glob("*.md")):
        for copy in range(copies):
            (folder / (f"more-{copy}-{path.name}" if copy else path.name)).write_text(path.read_text())
    return folder
